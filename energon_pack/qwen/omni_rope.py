"""Qwen-Omni time-aligned 3-D rope positions (TMRoPE) for one unpacked sample.

Reproduces the thinkers' ``get_rope_index`` (transformers 5.24) for one sample without padding:
``Qwen2_5OmniThinkerForConditionalGeneration`` (``"qwen2.5-omni"``) and
``Qwen3OmniMoeThinkerForConditionalGeneration`` (``"qwen3-omni"``):

- a sample without image and video grids (text, audio) gets ``0, 1, ..., L-1`` on all three rows;
- otherwise the media spans are visited in token order. Each block of positions starts one past
  the largest position of the block before it (``start``). Text and the span markers
  (``<|vision_bos|>`` / ``<|audio_bos|>`` before a span, ``<|vision_eos|>`` / ``<|audio_eos|>``
  after it; Qwen3-Omni names them ``<|vision_start|>`` / ``<|audio_start|>`` ...) advance one
  position per token;
- an audio span holds `audio_token_count` tokens at ``start, start + 1, ...`` on all three rows;
- an image or video of merged grid (t, gh, gw) gets rows ``(start + temporal(i), start + row,
  start + col)``, ``temporal(i) = i * position_id_per_seconds * seconds`` (images: 1 s; videos:
  their seconds per grid step, float32 as the processor returns them); Qwen2.5-Omni truncates it
  to an integer, Qwen3-Omni keeps the float (integral for the released constants: 13 * 2 s = 26);
- a video with its sound (``use_audio_in_video``): its two span markers before the span and the
  two after it (Qwen2.5-Omni: both at one position each; Qwen3-Omni: one position each), and the
  video and audio positions, both from the same start, interleaved as the processor interleaves
  the tokens: Qwen2.5-Omni cuts both into chunks of ``position_id_per_seconds * seconds_per_chunk``
  positions, video chunk then audio chunk; Qwen3-Omni merges them by position, a video token
  before an audio token at the same position. The markers after the span sit one past the
  largest position in it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from energon_pack.qwen.family import Family, family_of_model_config, processor_family
from energon_pack.qwen.rope import RopeSpec
from energon_pack.qwen.sound_count import audio_token_count

__all__ = ["OmniMedia", "OmniRopeSpec", "audio_token_count", "omni_position_ids"]

#: The released checkpoints' audio-side constants (``thinker_config``; ``n_window``: the audio
#: tower's window, Qwen3-Omni's token rule; None for Qwen2.5-Omni's rule).
_RELEASED: dict[str, dict[str, Any]] = {
    "qwen2.5-omni": dict(
        audio_token_id=151646, vision_start_token_id=151652, audio_start_token_id=151647,
        position_id_per_seconds=25, seconds_per_chunk=2, n_window=None,
    ),
    "qwen3-omni": dict(
        audio_token_id=151675, vision_start_token_id=151652, audio_start_token_id=151669,
        position_id_per_seconds=13, seconds_per_chunk=2, n_window=50,
    ),
}


@dataclass(frozen=True, kw_only=True)
class OmniRopeSpec:
    """Model constants of a Qwen-Omni thinker's rope: ``vision`` (family, spatial merge size, image
    and video token ids, as for the Qwen-VL rope), the audio and span-start token ids,
    ``position_id_per_seconds`` (25 / 13 released), ``seconds_per_chunk`` (Qwen2.5-Omni's
    interleave, 2) and ``n_window`` (Qwen3-Omni's audio token rule, 50; None for Qwen2.5-Omni)."""

    vision: RopeSpec
    audio_token_id: int
    vision_start_token_id: int
    audio_start_token_id: int
    position_id_per_seconds: float
    seconds_per_chunk: float
    n_window: int | None

    @property
    def family(self) -> Family:
        """The Omni family (``vision.family``)."""
        return self.vision.family

    def audio_tokens(self, feature_frames: int) -> int:
        """LLM tokens of an audio of ``feature_frames`` mel frames (`audio_token_count`)."""
        return audio_token_count(feature_frames, self.n_window)

    @classmethod
    def released(cls, family: Family) -> OmniRopeSpec:
        """The released checkpoints' constants. Example: ``released("qwen3-omni").audio_token_id`` -> 151675."""
        return cls(vision=RopeSpec(family=family), **_RELEASED[family])

    @classmethod
    def from_model_config(cls, config: Any) -> OmniRopeSpec:
        """From a ``Qwen2_5OmniConfig`` / ``Qwen3OmniMoeConfig`` (their ``thinker_config``) or a thinker
        config; what transformers 5.24's thinker configs lack (``vision_start_token_id``,
        ``seconds_per_chunk``) is the released value."""
        family = family_of_model_config(config)
        thinker = getattr(config, "thinker_config", config)
        released = _RELEASED[family]
        return cls(
            vision=RopeSpec.from_model_config(config),
            audio_token_id=int(thinker.audio_token_id),
            vision_start_token_id=int(getattr(thinker, "vision_start_token_id", released["vision_start_token_id"])),
            audio_start_token_id=int(thinker.audio_start_token_id),
            position_id_per_seconds=thinker.position_id_per_seconds,
            seconds_per_chunk=getattr(thinker, "seconds_per_chunk", released["seconds_per_chunk"]),
            n_window=None if released["n_window"] is None else int(thinker.audio_config.n_window),
        )

    @classmethod
    def from_processor(cls, processor: Any) -> OmniRopeSpec:
        """From the model config ``load_processor(path)`` kept beside a processor, else from the
        processor's token ids, ``position_id_per_seconds``, ``seconds_per_chunk`` and (Qwen3-Omni) ``n_window``."""
        config = getattr(processor, "energon_pack_model_config", None)
        if config is not None:
            return cls.from_model_config(config)
        tokens = processor.tokenizer.convert_tokens_to_ids
        windowed = _RELEASED[processor_family(processor)]["n_window"] is not None
        return cls(
            vision=RopeSpec.from_processor(processor),
            audio_token_id=int(processor.audio_token_id),
            vision_start_token_id=int(tokens(processor.vision_bos_token)),
            audio_start_token_id=int(tokens(processor.audio_bos_token)),
            position_id_per_seconds=processor.position_id_per_seconds,
            seconds_per_chunk=processor.seconds_per_chunk,
            n_window=int(processor.n_window) if windowed else None,
        )




@dataclass(frozen=True, kw_only=True)
class OmniMedia:
    """The media of one Omni sample, each kind in token order: patch grids int [n, 3] (None: no such
    medium), the mel frames of each heard sound (a video's sound track included), the seconds per
    temporal grid step of each video (None: 1.0 s) and the record's ``use_audio_in_video``."""

    image_grid_thw: torch.Tensor | None = None
    video_grid_thw: torch.Tensor | None = None
    audio_feature_lengths: Sequence[int] | torch.Tensor | None = None
    video_second_per_grid: Sequence[float] | torch.Tensor | None = None
    use_audio_in_video: bool = False


def _arange(start: int, length: int) -> np.ndarray:
    return np.broadcast_to(np.arange(start, start + length, dtype=np.int64), (3, length))


def _vision_block(start: int, temporal: np.ndarray, gh: int, gw: int) -> np.ndarray:
    """[3, t*gh*gw] positions of one image/video in raster order, offset by ``start``."""
    t = temporal.size
    rows = np.stack([
        np.repeat(temporal, gh * gw),
        np.tile(np.repeat(np.arange(gh), gw), t),
        np.tile(np.arange(gw), t * gh),
    ])
    return rows.astype(np.int64) + start


def _chunks(values: np.ndarray, per_chunk: int, base: int) -> list[tuple[int, int]]:
    """(start, end) slices of ascending ``values`` cut where ``value - base`` reaches each multiple of
    ``per_chunk``. Example: values [0, 0, 30, 60], per_chunk 50, base 0 -> [(0, 3), (3, 4)]."""
    slices, start, chunk = [], 0, 1
    for index, value in enumerate(values.tolist()):
        if value - base >= chunk * per_chunk:
            slices.append((start, index))
            start, chunk = index, chunk + 1
    slices.append((start, len(values)))
    return slices


def _merged(video: np.ndarray, sound: np.ndarray) -> list[np.ndarray]:
    """Qwen3-Omni's interleave: the columns of ``video`` and ``sound`` (both ascending on row 0)
    merged by temporal position, a video column first on ties, as two blocks: up to the last
    column of the kind that runs out first, then the other kind's rest (the marker after the span
    sits one past the largest position of that rest, as in ``get_rope_index``).

    Example (row 0): video [2, 2, 28], sound [2, 3] -> [2, 2, 2, 3] and [28].
    """
    both = np.concatenate([video, sound], axis=1)
    order = np.argsort(both[0], kind="stable")
    is_video = order < video.shape[1]
    split = int(np.flatnonzero(is_video != is_video[-1]).max(initial=-1)) + 1
    return [block for block in (both[:, order[:split]], both[:, order[split:]]) if block.shape[1]]


def _chunked(video: np.ndarray, sound: np.ndarray, per_chunk: int, start: int) -> list[np.ndarray]:
    """Qwen2.5-Omni's interleave: video and sound cut into chunks of ``per_chunk`` positions from
    ``start``, video chunk then sound chunk."""
    video_chunks, sound_chunks = _chunks(video[0], per_chunk, start), _chunks(sound[0], per_chunk, start)
    blocks = []
    for j in range(max(len(video_chunks), len(sound_chunks))):
        for chunks, block in ((video_chunks, video), (sound_chunks, sound)):
            if j < len(chunks):
                blocks.append(block[:, chunks[j][0] : chunks[j][1]])
    return blocks


def omni_position_ids(input_ids: torch.Tensor, media: OmniMedia, *, spec: OmniRopeSpec) -> torch.Tensor:
    """Qwen-Omni rope positions of one unpacked sample: CPU int64 [3, L] (module docstring).

    Example (A = audio token, B/E = audio bos/eos; one audio of 9 frames -> 2 tokens, no grids)::

        [5, B, A, A, E, 6] -> [[0, 1, 2, 3, 4, 5]] * 3
    """
    ids = input_ids.detach().cpu().numpy().reshape(-1)
    if media.image_grid_thw is None and media.video_grid_thw is None:
        return torch.from_numpy(np.ascontiguousarray(_arange(0, ids.size)))
    qwen3 = spec.family == "qwen3-omni"
    tokens = ids.tolist()
    merge = spec.vision.spatial_merge_size
    images = [] if media.image_grid_thw is None else torch.as_tensor(media.image_grid_thw).tolist()
    videos = [] if media.video_grid_thw is None else torch.as_tensor(media.video_grid_thw).tolist()
    lengths = media.audio_feature_lengths
    audios = [] if lengths is None else [int(n) for n in torch.as_tensor(lengths).tolist()]
    per_grid = media.video_second_per_grid
    seconds = torch.as_tensor(per_grid if per_grid is not None else [1.0] * len(videos))
    image_id, video_id, audio_id = spec.vision.image_token_id, spec.vision.video_token_id, spec.audio_token_id
    heard = media.use_audio_in_video
    starts = np.flatnonzero(ids == spec.vision_start_token_id)
    after = ids[np.minimum(starts + 1, ids.size - 1)]
    remain = {
        "image": int((after == image_id).sum()),
        "video": int((after == (spec.audio_start_token_id if heard else video_id)).sum()),
        "audio": int((ids == spec.audio_start_token_id).sum()),
    }
    media_spans = remain["image"] + remain["audio"] + (0 if heard else remain["video"])
    used = {"image": 0, "video": 0, "audio": 0}
    blocks: list[np.ndarray] = []

    def next_start() -> int:
        return int(blocks[-1].max()) + 1 if blocks else 0

    def add(block: np.ndarray) -> None:
        if block.shape[1]:
            blocks.append(block)

    def add_markers(count: int) -> None:
        start = next_start()  # Qwen3-Omni: one position each; Qwen2.5-Omni: all at one
        blocks.append(_arange(start, count) if qwen3 else np.concatenate([_arange(start, 1)] * count, axis=1))

    def find(token: int, kind: str, position: int) -> int:
        if remain[kind] > 0 and token in tokens[position:]:
            return tokens.index(token, position)
        return len(tokens) + 1

    def temporal(kind: str, index: int, steps: int) -> np.ndarray:
        step = torch.tensor(1) if kind == "image" else seconds[index].float()
        times = torch.arange(steps) * step * spec.position_id_per_seconds
        if not qwen3:
            return times.long().numpy()
        if not bool((times == times.floor()).all()):
            raise ValueError(
                f"Qwen3-Omni video {index}: temporal positions {times.tolist()} are not whole numbers (seconds per grid "
                f"step {float(seconds[index])} * position_id_per_seconds {spec.position_id_per_seconds}); rows carry "
                "int64 positions; fix: sample frames so that their product is whole (the processor's default fps)"
            )
        return times.long().numpy()

    position = 0
    for _ in range(media_spans):
        found = {kind: find(token, kind, position) for kind, token in (
            ("image", image_id), ("video", video_id), ("audio", audio_id))}
        kind = min(("audio", "image", "video"), key=lambda k: (found[k], ("audio", "image", "video").index(k)))
        markers = 2 if kind == "video" and heard else 1
        add(_arange(next_start(), found[kind] - position - markers))
        add_markers(markers)
        start = next_start()
        if kind == "audio":
            length = spec.audio_tokens(audios[used["audio"]])
            add(_arange(start, length))
            used["audio"] += 1
        else:
            grids = images if kind == "image" else videos
            t, h, w = grids[used[kind]]
            vision = _vision_block(start, temporal(kind, used[kind], t), h // merge, w // merge)
            length = vision.shape[1]
            if kind == "video" and heard:
                sound = _arange(start, spec.audio_tokens(audios[used["audio"]]))
                per_chunk = int(spec.position_id_per_seconds * spec.seconds_per_chunk)
                blocks.extend(_merged(vision, sound) if qwen3 else _chunked(vision, sound, per_chunk, start))
                length += sound.shape[1]
                used["audio"] += 1
                remain["audio"] -= 1
            else:
                add(vision)
            used[kind] += 1
        add_markers(markers)
        position = found[kind] + length + markers
        remain[kind] -= 1
    if position < len(tokens):
        add(_arange(next_start(), len(tokens) - position))
    out = np.concatenate(blocks, axis=1) if blocks else np.zeros((3, 0), dtype=np.int64)
    if out.shape[1] != ids.size:
        raise ValueError(
            f"Qwen-Omni positions cover {out.shape[1]} tokens but the sample has {ids.size}: the media spans "
            "and the grids / audio lengths disagree; fix: pass the grids and audio_feature_lengths of this sample"
        )
    return torch.from_numpy(np.ascontiguousarray(out))
