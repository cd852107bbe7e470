"""Qwen2.5-Omni time-aligned 3-D rope positions (TMRoPE) for one unpacked sample.

Reproduces ``Qwen2_5OmniThinkerForConditionalGeneration.get_rope_index`` (transformers 5.24)
for one sample without padding:

- a sample without image and video grids (text, audio) gets ``0, 1, ..., L-1`` on all three rows;
- otherwise the media spans are visited in token order. Each block of positions starts one past
  the largest position of the block before it (``start``). Text and the span markers
  (``<|vision_bos|>`` / ``<|audio_bos|>`` before a span, ``<|vision_eos|>`` / ``<|audio_eos|>``
  after it) advance one position per token;
- an audio span of F feature frames holds ``((F - 1) // 2 + 1 - 2) // 2 + 1`` tokens at
  ``start, start + 1, ...`` on all three rows;
- an image or video of merged grid (t, gh, gw) gets rows ``(start + temporal(i), start + row,
  start + col)``, ``temporal(i) = long(i * position_id_per_seconds * seconds)`` (images: 1 s;
  videos: their seconds per grid step, float32 as the processor returns them);
- a video with its sound (``use_audio_in_video``): both its span markers sit at one position
  each (two tokens at ``start``, two at the end), and the video and audio positions, both from
  ``start + 1``, are cut into chunks of ``position_id_per_seconds * seconds_per_chunk`` positions
  and interleaved video chunk, audio chunk, video chunk, ... as the processor interleaves the
  tokens. The marker after the span sits one past the last chunk's largest position.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["OmniRopeSpec", "audio_token_count", "omni_position_ids"]


@dataclass(frozen=True, kw_only=True)
class OmniRopeSpec:
    """Model constants of Qwen2.5-Omni's rope (``Qwen2_5OmniThinkerConfig``; the defaults are
    the released checkpoints'): token ids, ``position_id_per_seconds`` (25), ``seconds_per_chunk``
    (2) and the vision ``spatial_merge_size`` (2)."""

    image_token_id: int = 151655
    video_token_id: int = 151656
    audio_token_id: int = 151646
    vision_start_token_id: int = 151652
    audio_start_token_id: int = 151647
    position_id_per_seconds: float = 25
    seconds_per_chunk: float = 2
    spatial_merge_size: int = 2

    @classmethod
    def from_model_config(cls, config: Any) -> OmniRopeSpec:
        """From a ``Qwen2_5OmniConfig`` (its ``thinker_config``) or a ``Qwen2_5OmniThinkerConfig``."""
        thinker = getattr(config, "thinker_config", config)
        return cls(
            image_token_id=int(thinker.image_token_id),
            video_token_id=int(thinker.video_token_id),
            audio_token_id=int(thinker.audio_token_id),
            vision_start_token_id=int(thinker.vision_start_token_id),
            audio_start_token_id=int(thinker.audio_start_token_id),
            position_id_per_seconds=thinker.position_id_per_seconds,
            seconds_per_chunk=thinker.seconds_per_chunk,
            spatial_merge_size=int(thinker.vision_config.spatial_merge_size),
        )

    @classmethod
    def from_processor(cls, processor: Any) -> OmniRopeSpec:
        """From the model config ``load_processor(path)`` kept beside a processor, else from the
        processor's token ids and its ``position_id_per_seconds`` / ``seconds_per_chunk``."""
        config = getattr(processor, "energon_pack_model_config", None)
        if config is not None:
            return cls.from_model_config(config)
        tokens = processor.tokenizer.convert_tokens_to_ids
        return cls(
            image_token_id=int(processor.image_token_id),
            video_token_id=int(processor.video_token_id),
            audio_token_id=int(processor.audio_token_id),
            vision_start_token_id=int(tokens(processor.vision_bos_token)),
            audio_start_token_id=int(tokens(processor.audio_bos_token)),
            position_id_per_seconds=processor.position_id_per_seconds,
            seconds_per_chunk=processor.seconds_per_chunk,
            spatial_merge_size=int(processor.image_processor.merge_size),
        )


def audio_token_count(feature_frames: int) -> int:
    """LLM tokens of an audio of ``feature_frames`` mel frames (the audio tower's two stride-2 steps).

    Example: 100 frames (1 s) -> 25; 3000 -> 750; 3 -> 1; 1 or 2 (under 30 ms) -> 0.
    """
    return ((feature_frames - 1) // 2 + 1 - 2) // 2 + 1


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


def omni_position_ids(
    input_ids: torch.Tensor,
    *,
    spec: OmniRopeSpec,
    image_grid_thw: torch.Tensor | None = None,
    video_grid_thw: torch.Tensor | None = None,
    audio_feature_lengths: Sequence[int] | torch.Tensor | None = None,
    video_second_per_grid: Sequence[float] | torch.Tensor | None = None,
    use_audio_in_video: bool = False,
) -> torch.Tensor:
    """Qwen2.5-Omni rope positions of one unpacked sample: CPU int64 [3, L] (module docstring).

    ``audio_feature_lengths``: mel frames per audio in token order (a video's sound included);
    ``video_second_per_grid``: seconds per temporal grid step per video.

    Example (A = audio token, B/E = audio bos/eos; one audio of 9 frames -> 2 tokens, no grids)::

        [5, B, A, A, E, 6] -> [[0, 1, 2, 3, 4, 5]] * 3
    """
    ids = input_ids.detach().cpu().numpy().reshape(-1)
    if image_grid_thw is None and video_grid_thw is None:
        return torch.from_numpy(np.ascontiguousarray(_arange(0, ids.size)))
    tokens = ids.tolist()
    merge = spec.spatial_merge_size
    images = [] if image_grid_thw is None else torch.as_tensor(image_grid_thw).tolist()
    videos = [] if video_grid_thw is None else torch.as_tensor(video_grid_thw).tolist()
    audios = [] if audio_feature_lengths is None else [int(n) for n in torch.as_tensor(audio_feature_lengths).tolist()]
    seconds = torch.as_tensor(video_second_per_grid if video_second_per_grid is not None else [1.0] * len(videos))
    starts = np.flatnonzero(ids == spec.vision_start_token_id)
    after = ids[np.minimum(starts + 1, ids.size - 1)]
    remain = {
        "image": int((after == spec.image_token_id).sum()),
        "video": int((after == (spec.audio_start_token_id if use_audio_in_video else spec.video_token_id)).sum()),
        "audio": int((ids == spec.audio_start_token_id).sum()),
    }
    media_spans = remain["image"] + remain["audio"] + (0 if use_audio_in_video else remain["video"])
    used = {"image": 0, "video": 0, "audio": 0}
    blocks: list[np.ndarray] = []

    def next_start() -> int:
        return int(blocks[-1].max()) + 1 if blocks else 0

    def add(block: np.ndarray) -> None:
        if block.shape[1]:
            blocks.append(block)

    def find(token: int, kind: str, position: int) -> int:
        if remain[kind] > 0 and token in tokens[position:]:
            return tokens.index(token, position)
        return len(tokens) + 1

    def temporal(kind: str, index: int, steps: int) -> np.ndarray:
        step = torch.tensor(1) if kind == "image" else seconds[index].float()
        return (torch.arange(steps) * step * spec.position_id_per_seconds).long().numpy()

    position = 0
    for _ in range(media_spans):
        found = {kind: find(token, kind, position) for kind, token in (
            ("image", spec.image_token_id), ("video", spec.video_token_id), ("audio", spec.audio_token_id))}
        kind = min(("audio", "image", "video"), key=lambda k: (found[k], ("audio", "image", "video").index(k)))
        markers = 2 if kind == "video" and use_audio_in_video else 1
        add(_arange(next_start(), found[kind] - position - markers))
        start = next_start()
        for _ in range(markers):
            blocks.append(_arange(start, 1))
        start = next_start()
        if kind == "audio":
            length = audio_token_count(audios[used["audio"]])
            add(_arange(start, length))
            used["audio"] += 1
        else:
            grids = images if kind == "image" else videos
            t, h, w = grids[used[kind]]
            vision = _vision_block(start, temporal(kind, used[kind], t), h // merge, w // merge)
            length = vision.shape[1]
            if kind == "video" and use_audio_in_video:
                sound = _arange(start, audio_token_count(audios[used["audio"]]))
                per_chunk = int(spec.position_id_per_seconds * spec.seconds_per_chunk)
                video_chunks = _chunks(vision[0], per_chunk, start)
                audio_chunks = _chunks(sound[0], per_chunk, start)
                for j in range(max(len(video_chunks), len(audio_chunks))):
                    for chunks, block in ((video_chunks, vision), (audio_chunks, sound)):
                        if j < len(chunks):
                            blocks.append(block[:, chunks[j][0] : chunks[j][1]])
                length += sound.shape[1]
                used["audio"] += 1
                remain["audio"] -= 1
            else:
                add(vision)
            used[kind] += 1
        end = next_start()
        for _ in range(markers):
            blocks.append(_arange(end, 1))
        position = found[kind] + length + markers
        remain[kind] -= 1
    if position < len(tokens):
        add(_arange(next_start(), len(tokens) - position))
    out = np.concatenate(blocks, axis=1) if blocks else np.zeros((3, 0), dtype=np.int64)
    if out.shape[1] != ids.size:
        raise ValueError(
            f"Qwen2.5-Omni positions cover {out.shape[1]} tokens but the sample has {ids.size}: the media spans "
            "and the grids / audio lengths disagree; fix: pass the grids and audio_feature_lengths of this sample"
        )
    return torch.from_numpy(np.ascontiguousarray(out))
