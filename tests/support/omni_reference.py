"""Test helpers: Qwen-Omni samples with generated media, and the Hugging Face reference for one
sample alone: the processor's outputs and the thinker's ``get_rope_index`` positions (Qwen2.5-Omni
and Qwen3-Omni: the thinker class follows the config)."""

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
from transformers import Qwen2_5OmniThinkerForConditionalGeneration, Qwen3OmniMoeThinkerConfig, Qwen3OmniMoeThinkerForConditionalGeneration
from transformers.video_utils import VideoMetadata

from energon_pack.core.conversation import normalize_conversation
from energon_pack.data.synthetic import encode_image
from energon_pack.qwen.audio import decode_audio
from tests.support.audio_media import encode_audio, encode_video_with_sound, tone


def chat_message(role: str, *parts: Any, **fields: Any) -> dict[str, Any]:
    """A chat message as a record gives it: text-only as a string (the released Qwen3-Omni templates
    tell a user query by it), else typed parts (a ``str`` part is text); ``fields`` added
    (``reasoning_content``, ``tool_calls``)."""
    if all(isinstance(p, str) for p in parts):
        return {"role": role, "content": "".join(parts), **fields}
    return {"role": role, "content": [{"type": "text", "text": p} if isinstance(p, str) else p for p in parts], **fields}


@dataclass(frozen=True)
class Sound:
    """An audio file: codec (``audio_media.CODECS``), seconds, sample rate, channels."""

    codec: str
    seconds: float
    rate: int = 16000
    channels: int = 1


@dataclass(frozen=True)
class OmniCase:
    """One sample: messages, images (height, width), videos (frames, height, width, fps,
    seconds of sound or None), audios, the record's ``use_audio_in_video`` and its ``tools``."""

    key: str
    conversation: list[dict[str, Any]]
    images: list[tuple[int, int]] = field(default_factory=list)
    videos: list[tuple[int, int, int, int, float | None]] = field(default_factory=list)
    audios: list[Sound] = field(default_factory=list)
    use_audio_in_video: bool = False
    tools: list[dict[str, Any]] | None = None


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


def typed_conversation(case: OmniCase, media: OmniMedia) -> list[dict[str, Any]]:
    """The case's messages as the loader hands them on: parsed into typed messages."""
    return normalize_conversation(
        case.conversation, num_images=len(media.images), num_videos=len(media.videos), num_audios=len(media.audios)
    )


def decode_frames(data: bytes, indices: tuple[int, ...]) -> np.ndarray:
    """Frames ``indices`` of the first video stream, decoded with PyAV as rgb24 [n, H, W, 3]."""
    with av.open(io.BytesIO(data)) as container:
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    return np.stack([frames[i] for i in indices])


def reference_omni_inputs(
    processor: Any, case: OmniCase, media: OmniMedia, prepared: Any, waveforms: list[np.ndarray]
) -> Any:
    """``Qwen2_5OmniProcessor`` outputs of ``case`` alone: images as PIL (under the prepared sample's
    own pixel limit when ``on_overlong="shrink"`` set one), video frames at the prepared indices
    (``do_sample_frames=False``), ``waveforms`` (one per heard sound, token order) with
    ``audio_from_video_indices`` and ``load_audio_from_video`` = the record's flag."""
    kwargs: dict[str, Any] = {}
    if media.images:
        kwargs["images"] = [Image.open(io.BytesIO(data)).convert("RGB") for data in media.images]
        if prepared.image_max_pixels is not None:
            kwargs["images_kwargs"] = {"size": {**dict(processor.image_processor.size), "longest_edge": prepared.image_max_pixels}}
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
    text = processor.apply_chat_template(case.conversation, tools=case.tools)
    return processor(text=[text], return_tensors="pt", **kwargs)


def reference_rope(config: Any, inputs: Any, use_audio_in_video: bool) -> torch.Tensor:
    """The thinker's ``get_rope_index`` of one sample (``Qwen2_5OmniThinkerForConditionalGeneration``,
    or ``Qwen3OmniMoeThinkerForConditionalGeneration`` for a Qwen3-Omni config): int64 [3, L]
    (called on a holder of the config: the method reads nothing else of the model; Qwen3-Omni's
    float positions are whole numbers, checked)."""
    qwen3 = isinstance(config, Qwen3OmniMoeThinkerConfig)
    model = Qwen3OmniMoeThinkerForConditionalGeneration if qwen3 else Qwen2_5OmniThinkerForConditionalGeneration
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
    positions = positions[:, 0]
    assert torch.equal(positions, positions.round()), "get_rope_index gave fractional positions"
    return positions.long()


@dataclass(frozen=True)
class PackedOmni:
    """A packed row of Omni cases and, per segment, the HF processor's inputs for the sample alone."""

    row: dict[str, Any]
    references: list[Any]


def pack_omni_cases(processor: Any, cases: list[OmniCase], *, seq_length: int, pad_to_multiple_of: int) -> PackedOmni:
    """``cases`` through the plugin's task encoder into one THD row, and each case's HF reference."""
    from energon_pack.core.samples import QwenVLChatSample
    from tests.support.model_oracle import oracle_encoder, packed_row

    encoder = oracle_encoder(processor, seq_length, pad_to_multiple_of)
    prepared, references = [], []
    for index, case in enumerate(cases):
        media = make_omni_media(case, seed=index)
        sample = QwenVLChatSample(
            __key__=case.key, __restore_key__=(), __subflavors__=None, __sources__=None,
            conversation=typed_conversation(case, media), images=media.images, videos=media.videos,
            audios=media.audios or None, use_audio_in_video=case.use_audio_in_video,
        )
        ready = encoder.preencode_sample(sample)
        assert ready.skip_reason is None, f"{case.key}: {ready.skip_reason} {ready.skip_detail}"
        prepared.append(ready)
        sources = [media.audios[s] if s >= 0 else media.videos[-1 - s] for s in ready.audio_sources or []]
        references.append(reference_omni_inputs(processor, case, media, ready, [decode_audio(d) for d in sources]))
    return PackedOmni(row=packed_row(encoder, prepared), references=references)


@torch.no_grad()
def packed_omni_logits(thinker: Any, row: dict[str, Any]) -> torch.Tensor:
    """Logits [n_real, V] of a packed row's real tokens from one thinker forward over the row: the
    row's sounds through the audio tower as they are (``feature_lens`` = ``audio_feature_lengths``,
    no padding), their embeddings placed at the row's audio tokens, the row's pixels, explicit 3-D
    positions and the THD block-diagonal mask."""
    from tests.support.tiny_qwen import real_token_positions, thd_attention_bias

    cu_real, cu_padded = row["cu_seqlens_q"], row["cu_seqlens_q_padded"]
    input_ids = row["input_ids"]
    embeds = thinker.get_input_embeddings()(input_ids)
    audio = row.get("audio_inputs")
    if audio is not None:
        sounds = thinker.model.audio_tower(audio.input_features, feature_lens=audio.audio_feature_lengths).last_hidden_state
        mask = (input_ids == thinker.config.audio_token_id)[..., None].expand_as(embeds)
        embeds = embeds.masked_scatter(mask, sounds.to(embeds.dtype))
    out = thinker(
        input_ids=input_ids,
        inputs_embeds=embeds,
        position_ids=row["mrope_position_ids"],
        attention_mask=thd_attention_bias(cu_real, cu_padded, input_ids.shape[1]),
        **row["visual_inputs"].normalized_for_model(),
        use_cache=False,
    )
    return out.logits[0, real_token_positions(cu_real, cu_padded)]


@torch.no_grad()
def unpacked_omni_logits(thinker: Any, inputs: Any, use_audio_in_video: bool) -> torch.Tensor:
    """Logits [L, V] of one sample alone: the HF processor's inputs (300-s padded features and their
    mask) and the thinker's own positions."""
    return thinker(**inputs, use_audio_in_video=use_audio_in_video, use_cache=False).logits[0]
