"""The tiny-model oracle's cases and runs: chat samples with synthetic media, a packed THD row
built as the plugin builds it, and the logits of the packed row and of each sample alone.
Used by the Qwen2.5-VL oracle (``tests/golden/test_model_oracle.py``) and the Qwen3.5 one."""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any

import av
import numpy as np
import torch
from PIL import Image
from transformers.video_utils import VideoMetadata

from energon_pack.config import PackingConfig
from energon_pack.core.samples import QwenVLChatSample
from energon_pack.data.synthetic import encode_image, encode_video
from energon_pack.rows.encoded import PreparedSample
from energon_pack.runtime.task_encoder import QwenVLPackingTaskEncoder
from tests.support.tiny_qwen import real_token_positions, thd_attention_bias

# Small pixel limits keep the video tokens few (the default video minimum is 100352 pixels/frame).
MIN_PIXELS, MAX_PIXELS = 56 * 56, 224 * 224


@dataclass(frozen=True)
class Video:
    """A synthetic MP4 of ``frames`` random frames at ``fps``; ``indices``: hand-computed sampled frames."""

    frames: int
    height: int
    width: int
    fps: int
    indices: tuple[int, ...]


@dataclass(frozen=True)
class Case:
    """One chat sample: typed messages, images as (height, width, format, PIL mode), videos."""

    key: str
    conversation: list[dict[str, Any]]
    images: list[tuple[int, int, str, str]] = field(default_factory=list)
    videos: list[Video] = field(default_factory=list)


def _text(text: str) -> dict[str, str]:
    return {"type": "text", "text": text}


def _message(role: str, *parts: Any) -> dict[str, Any]:
    return {"role": role, "content": [_text(p) if isinstance(p, str) else p for p in parts]}


IMAGE, VIDEO = {"type": "image"}, {"type": "video"}

# Frame indices (docs/batch_contract.md): n = T / fps * 2 clamped to [4, T], floored to even,
# indices round(linspace(0, T - 1, n)).
#  10 frames at 4 fps: n = 5 -> 4 frames, linspace(0, 9, 4) = 0, 3, 6, 9; second_per_grid_ts =
#  2 / (4 / 10 * 4) = 1.25, so the two temporal grid steps sit at long(i * 2 * 1.25) = 0, 2.
#  8 frames at 3 fps: n = 5.33 -> 4 frames, linspace(0, 7, 4) = 0, 2.33, 4.67, 7 -> 0, 2, 5, 7;
#  second_per_grid_ts = 2 / (4 / 8 * 3) = 1.33 -> temporal steps 0, 2.
MULTIMODAL_CASES = [
    Case("one_image", [_message("user", IMAGE, "What is this?"), _message("assistant", "A picture.")],
         images=[(56, 84, "PNG", "RGB")]),
    Case("text_only", [_message("system", "Be brief."), _message("user", "Hello there, how are you?"),
                       _message("assistant", "Fine."), _message("user", "Sure?"), _message("assistant", "Yes.")]),
    Case("video", [_message("user", VIDEO, "Describe the clip."), _message("assistant", "Noise.")],
         videos=[Video(frames=10, height=64, width=96, fps=4, indices=(0, 3, 6, 9))]),
    Case("multi_image", [_message("user", IMAGE, "and", IMAGE, "differ?"), _message("assistant", "Yes, two.")],
         images=[(224, 168, "JPEG", "RGB"), (84, 112, "PNG", "RGBA")]),
    Case("image_and_video", [_message("user", IMAGE, VIDEO, "Same scene?"), _message("assistant", "No.")],
         images=[(70, 100, "JPEG", "L")],
         videos=[Video(frames=8, height=56, width=56, fps=3, indices=(0, 2, 5, 7))]),
]

TEXT_CASES = [
    Case("t0", [_message("user", "Count to three."), _message("assistant", "One, two, three.")]),
    Case("t1", [_message("system", "You answer in French."), _message("user", "Good morning!"),
                _message("assistant", "Bonjour !")]),
    Case("t2", [_message("user", "2+2?"), _message("assistant", "4"), _message("user", "And 3+3?"),
                _message("assistant", "6, of course.")]),
]


@dataclass(frozen=True)
class Media:
    """Compressed media bytes of a case (what the dataset stores)."""

    images: list[bytes]
    videos: list[bytes]


def make_media(case: Case, rng: np.random.Generator) -> Media:
    images = [
        encode_image(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), fmt, mode) for h, w, fmt, mode in case.images
    ]
    videos = [
        encode_video(rng.integers(0, 256, (v.frames, v.height, v.width, 3), dtype=np.uint8), v.fps)
        for v in case.videos
    ]
    return Media(images=images, videos=videos)


@dataclass(frozen=True)
class PackedCase:
    """A packed row and, per segment, the prepared sample and the unpacked HF inputs (row order)."""

    row: dict[str, Any]
    prepared: list[PreparedSample]
    references: list[Any]


def oracle_encoder(
    processor: Any, seq_length: int, pad_to_multiple_of: int, pixel_dtype: str = "float32", **config: Any
) -> QwenVLPackingTaskEncoder:
    """The plugin's task encoder for rows of width ``seq_length``, segments aligned to ``pad_to_multiple_of``
    (``config``: more ``PackingConfig`` keys, e.g. ``loss_reduction``)."""
    config = PackingConfig(seq_length=seq_length, pad_to_multiple_of=pad_to_multiple_of, pixel_dtype=pixel_dtype, **config)
    return QwenVLPackingTaskEncoder(config, processor)


def packed_row(encoder: QwenVLPackingTaskEncoder, prepared: list[PreparedSample]) -> dict[str, Any]:
    """The THD row of ``prepared`` samples, built as the plugin's packing stage does."""
    return encoder.batch([encoder.pack_selected_samples([encoder.postencode_sample(p) for p in prepared])])


def pack_cases(
    processor: Any, cases: list[Case], *, seq_length: int, pad_to_multiple_of: int,
    sources: list[int] | None = None, **config: Any,
) -> PackedCase:
    """Encode ``cases`` with the plugin's task encoder into one row; build each unpacked reference.
    ``sources``: each case's blend entry (its sample then carries Energon's blend restore key
    ``("BlendDataset", source, ...)``); ``config``: more ``PackingConfig`` keys."""
    encoder = oracle_encoder(processor, seq_length, pad_to_multiple_of, **config)
    rng = np.random.default_rng(0)
    prepared, references = [], []
    for index, case in enumerate(cases):
        media = make_media(case, rng)
        sample = QwenVLChatSample(
            __key__=case.key,
            __restore_key__=() if sources is None else ("BlendDataset", sources[index], "Webdataset", case.key),
            __subflavors__=None,
            __sources__=None,
            conversation=case.conversation,
            images=media.images,
            videos=media.videos,
        )
        ready = encoder.preencode_sample(sample)
        assert ready.skip_reason is None, f"{case.key}: {ready.skip_reason}"
        timings = [(t.total_frames, t.fps, t.frame_indices) for t in ready.video_timings or []]
        assert timings == [(v.frames, v.fps, v.indices) for v in case.videos], case.key
        prepared.append(ready)
        references.append(reference_inputs(processor, case, media))
    return PackedCase(row=packed_row(encoder, prepared), prepared=prepared, references=references)


def _decode_frames(data: bytes, indices: tuple[int, ...]) -> np.ndarray:
    """All frames of the first video stream decoded with PyAV as rgb24, then the chosen ones [n, H, W, 3]."""
    with av.open(io.BytesIO(data)) as container:
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    return np.stack([frames[i] for i in indices])


def reference_inputs(processor: Any, case: Case, media: Media) -> Any:
    """The HF processor's inputs for ``case`` alone (docs/batch_contract.md reference call)."""
    kwargs: dict[str, Any] = {}
    if media.images:
        kwargs["images"] = [Image.open(io.BytesIO(data)) for data in media.images]
    if media.videos:
        kwargs["videos"] = [_decode_frames(data, v.indices) for data, v in zip(media.videos, case.videos)]
        kwargs["video_metadata"] = [
            VideoMetadata(total_num_frames=v.frames, fps=v.fps, frames_indices=list(v.indices)) for v in case.videos
        ]
        kwargs["do_sample_frames"] = False
    text = processor.apply_chat_template(case.conversation)
    return processor(text=[text], return_tensors="pt", **kwargs)


def packed_inputs(row: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    """The model's keyword arguments for one forward over the whole row [1, W] (host tensors) that
    returns the logits of the row's real tokens only.

    Default: ``mrope_position_ids`` [3, 1, W] and the THD block-diagonal causal mask;
    ``overrides`` replace ``position_ids`` / ``attention_mask``.
    """
    width = row["input_ids"].shape[1]
    cu_real, cu_padded = row["cu_seqlens_q"], row["cu_seqlens_q_padded"]
    inputs = dict(
        input_ids=row["input_ids"],
        position_ids=row["mrope_position_ids"],
        attention_mask=thd_attention_bias(cu_real, cu_padded, width),
    )
    inputs.update(overrides)
    return {
        **inputs,
        **row["visual_inputs"].normalized_for_model(),
        "logits_to_keep": real_token_positions(cu_real, cu_padded),
        "use_cache": False,
    }


@torch.no_grad()
def packed_logits(model: torch.nn.Module, row: dict[str, Any], **overrides: Any) -> torch.Tensor:
    """Logits [n_real, V] of the row's real tokens, from one forward over the whole row [1, W]
    (`packed_inputs`)."""
    return model(**packed_inputs(row, **overrides)).logits[0]


@torch.no_grad()
def unpacked_logits(model: torch.nn.Module, inputs: Any) -> torch.Tensor:
    """Logits [L, V] of one sample run alone with the model's own positions."""
    return model(**inputs, use_cache=False).logits[0]


def split_logits(logits: torch.Tensor, row: dict[str, Any]) -> list[torch.Tensor]:
    """Real-token logits [n_real, V] -> one [L_i, V] block per segment."""
    cu_real = row["cu_seqlens_q"]
    return list(torch.split(logits, (cu_real[1:] - cu_real[:-1]).tolist()))
