"""Test helpers: Qwen2.5-Omni samples with generated media, and the Hugging Face reference for one
sample alone: the processor's outputs and the thinker's ``get_rope_index`` positions."""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from functools import partial
from types import SimpleNamespace
from typing import Any

import av
import numpy as np
import torch
from PIL import Image
from transformers import Qwen2_5OmniThinkerForConditionalGeneration
from transformers.video_utils import VideoMetadata

from energon_pack.data.synthetic import encode_image
from tests.support.audio_media import encode_audio, encode_video_with_sound, tone


@dataclass(frozen=True)
class Sound:
    """An audio file: codec (``audio_media.CODECS``), seconds, sample rate, channels."""

    codec: str
    seconds: float
    rate: int = 16000
    channels: int = 1


@dataclass(frozen=True)
class OmniCase:
    """One sample: typed messages, images (height, width), videos (frames, height, width, fps,
    seconds of sound or None), audios, and the record's ``use_audio_in_video``."""

    key: str
    conversation: list[dict[str, Any]]
    images: list[tuple[int, int]] = field(default_factory=list)
    videos: list[tuple[int, int, int, int, float | None]] = field(default_factory=list)
    audios: list[Sound] = field(default_factory=list)
    use_audio_in_video: bool = False


@dataclass(frozen=True)
class OmniMedia:
    images: list[bytes]
    videos: list[bytes]
    audios: list[bytes]


def make_omni_media(case: OmniCase, seed: int = 0) -> OmniMedia:
    """Compressed media of ``case`` (random pixels, chirp sounds)."""
    rng = np.random.default_rng(seed)
    images = [encode_image(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "PNG", "RGB") for h, w in case.images]
    videos = [
        encode_video_with_sound(
            rng.integers(0, 256, (n, h, w, 3), dtype=np.uint8), fps, None if sound is None else tone(sound, 16000, seed=n)
        )
        for n, h, w, fps, sound in case.videos
    ]
    audios = [encode_audio(tone(s.seconds, s.rate, s.channels, seed=i), s.rate, s.codec) for i, s in enumerate(case.audios)]
    return OmniMedia(images=images, videos=videos, audios=audios)


def decode_frames(data: bytes, indices: tuple[int, ...]) -> np.ndarray:
    """Frames ``indices`` of the first video stream, decoded with PyAV as rgb24 [n, H, W, 3]."""
    with av.open(io.BytesIO(data)) as container:
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    return np.stack([frames[i] for i in indices])


def reference_omni_inputs(
    processor: Any, case: OmniCase, media: OmniMedia, prepared: Any, waveforms: list[np.ndarray]
) -> Any:
    """``Qwen2_5OmniProcessor`` outputs of ``case`` alone: images as PIL, video frames at the
    prepared indices (``do_sample_frames=False``), ``waveforms`` (one per heard sound, token order)
    with ``audio_from_video_indices`` and ``load_audio_from_video`` = the record's flag."""
    kwargs: dict[str, Any] = {}
    if media.images:
        kwargs["images"] = [Image.open(io.BytesIO(data)).convert("RGB") for data in media.images]
    if media.videos:
        timings = prepared.video_timings
        kwargs["videos"] = [decode_frames(data, t.frame_indices) for data, t in zip(media.videos, timings)]
        kwargs["video_metadata"] = [
            VideoMetadata(total_num_frames=t.total_frames, fps=t.fps, frames_indices=list(t.frame_indices)) for t in timings
        ]
        kwargs["do_sample_frames"] = False
    if waveforms:
        kwargs["audio"] = waveforms
    if case.use_audio_in_video:
        kwargs["load_audio_from_video"] = True
        kwargs["audio_from_video_indices"] = [None if s >= 0 else -1 - s for s in prepared.audio_sources]
    text = processor.apply_chat_template(case.conversation)
    return processor(text=[text], return_tensors="pt", **kwargs)


def reference_rope(config: Any, inputs: Any, use_audio_in_video: bool) -> torch.Tensor:
    """``Qwen2_5OmniThinkerForConditionalGeneration.get_rope_index`` of one sample: int64 [3, L]
    (called on a holder of the config: the method reads nothing else of the model)."""
    model = Qwen2_5OmniThinkerForConditionalGeneration
    holder = SimpleNamespace(config=config, spatial_merge_size=config.vision_config.spatial_merge_size)
    holder.get_llm_pos_ids_for_vision = partial(model.get_llm_pos_ids_for_vision, holder)
    holder.get_chunked_index = partial(model.get_chunked_index, holder)
    mask = inputs.get("feature_attention_mask")
    positions, _ = model.get_rope_index(
        holder,
        inputs["input_ids"],
        inputs.get("image_grid_thw"),
        inputs.get("video_grid_thw"),
        inputs["attention_mask"],
        use_audio_in_video,
        None if mask is None else mask.sum(-1),
        inputs.get("video_second_per_grid"),
    )
    return positions[:, 0]
