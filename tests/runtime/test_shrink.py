"""``on_overlong="shrink"``: a sample too big for a row is shrunk, and equals the Hugging Face
processor called with the sample's lowered limits (images' pixel budget, videos' frame count).

Golden: for Qwen2.5-VL and Qwen3-VL, samples with big images, a long video, and both, packed
into rows too narrow (or under a vision budget too small) for them: preencode lowers the limits,
the token count then fits the row, and ids, grids and pixels equal the processor's output for
the same chat with ``size["longest_edge"]`` = the sample's image pixel limit and frames sampled
with the sample's frame limit.
"""

from __future__ import annotations

import functools
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
import torch

from energon_pack.core.alignment import aligned_length
from energon_pack.config import PackingConfig
from energon_pack.rows.encoded import PreparedSample
from energon_pack.qwen.geometry import VisionSpec
from energon_pack.runtime.task_encoder import QwenVLPackingTaskEncoder
from tests.support.golden_media import FAMILY_FACTORS, GoldenSample, chat_sample, make_image, make_video
from tests.support.hf_reference import hf_reference

FAMILIES = ("qwen2.5-vl", "qwen3-vl")
#: Row width per sample kind, as 1 / this share of the unshrunk token count: a third leaves room
#: for the images once shrunk; a quarter (an eighth next to an image) leaves too little room for
#: the video's frames even with images at their minimum.
WIDTH_SHARE = {"images": 3, "video": 4, "image_and_video": 8}


def _processor(request: pytest.FixtureRequest, family: str) -> Any:
    return request.getfixturevalue("processor_qwen3" if family == "qwen3-vl" else "processor")


def _chat(num_images: int, num_videos: int, text: str) -> list[dict[str, Any]]:
    parts = [{"type": "image"}] * num_images + [{"type": "video"}] * num_videos + [{"type": "text", "text": text}]
    return [
        {"role": "user", "content": parts},
        {"role": "assistant", "content": [{"type": "text", "text": "A short answer about the media."}]},
    ]


@functools.lru_cache(maxsize=None)
def _samples(family: str) -> dict[str, GoldenSample]:
    """Big images, a 30 s video, and an image with a video (deterministic)."""
    rng = np.random.default_rng(5)
    factor = FAMILY_FACTORS[family]
    big = [make_image(rng, factor, size=(1500, 1100), kind=("PNG", "RGB")),
           make_image(rng, factor, size=(1000, 1500), kind=("JPEG", "RGB"))]
    video = make_video(rng, num_frames=360, rate=Fraction(12), size=(160, 224))
    return {
        "images": GoldenSample(_chat(2, 0, "Compare the two pictures."), big, []),
        "video": GoldenSample(_chat(0, 1, "What happens in the clip?"), [], [video]),
        "image_and_video": GoldenSample(_chat(1, 1, "Does the picture appear in the clip?"), big[:1], [video]),
    }


def _encoder(processor: Any, **config: Any) -> QwenVLPackingTaskEncoder:
    """An encoder emitting float32 pixels, the Hugging Face processor's own payload."""
    return QwenVLPackingTaskEncoder(PackingConfig(pixel_dtype="float32", **config), processor)


def _assert_equals_hf(processor: Any, golden: GoldenSample, prepared: PreparedSample, encoder) -> None:
    """ids, grids and pixels of preencode + postencode equal HF called with the sample's limits."""
    reference = hf_reference(
        processor,
        golden.messages,
        golden.images,
        golden.videos,
        image_max_pixels=prepared.image_max_pixels,
        max_frames=prepared.video_max_frames,
    )
    assert torch.equal(prepared.input_ids, reference["input_ids"][0])
    visual = encoder.postencode_sample(prepared).segment.visual
    for name in ("image_grid_thw", "video_grid_thw", "pixel_values", "pixel_values_videos"):
        ours, theirs = getattr(visual, name), reference.get(name)
        assert (ours is None) == (theirs is None), name
        assert ours is None or torch.equal(ours, theirs), name
    if "second_per_grid_ts" in reference:
        assert torch.allclose(visual.second_per_grid_ts, reference["second_per_grid_ts"].float())


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", ["images", "video", "image_and_video"])
def test_shrunk_sample_fits_the_row_and_equals_hf_with_its_limits(request, family: str, kind: str) -> None:
    processor = _processor(request, family)
    spec = VisionSpec.from_processor(processor)
    golden = _samples(family)[kind]
    sample = chat_sample(golden, kind)
    full = _encoder(processor, seq_length=1 << 20).preencode_sample(sample)
    assert full.skip_reason is None and full.image_max_pixels is None
    width = aligned_length(full.num_tokens // WIDTH_SHARE[kind], 64)
    encoder = _encoder(processor, seq_length=width, on_overlong="shrink")
    prepared = encoder.preencode_sample(sample)
    assert prepared.tokens_before_shrink == full.num_tokens > width
    assert prepared.num_tokens <= width, f"shrunk to {prepared.num_tokens} tokens, row is {width}"
    if kind == "images":  # images alone give way: videos keep the processor's frame limit
        assert prepared.video_max_frames == spec.max_frames
        assert spec.image_min_pixels < prepared.image_max_pixels < spec.image_max_pixels
    else:  # the video is too long even with images at their minimum: it loses frames
        assert prepared.video_max_frames < len(full.video_timings[0].frame_indices)
        assert len(prepared.video_timings[0].frame_indices) <= prepared.video_max_frames
    _assert_equals_hf(processor, golden, prepared, encoder)
    # Without "shrink" the same sample is left as it is (the packing stage skips it as overlong).
    assert _encoder(processor, seq_length=width).preencode_sample(sample).num_tokens == full.num_tokens


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_shrink_to_a_vision_budget_equals_hf(request, family: str) -> None:
    processor = _processor(request, family)
    golden = _samples(family)["image_and_video"]
    sample = chat_sample(golden, "vision")
    full = _encoder(processor, seq_length=1 << 20).preencode_sample(sample)
    budget = full.vision_patches // 4
    encoder = _encoder(processor, seq_length=1 << 20, max_row_vision_patches=budget, on_overlong="shrink")
    prepared = encoder.preencode_sample(sample)
    assert prepared.tokens_before_shrink == full.num_tokens
    assert prepared.vision_patches <= budget < full.vision_patches
    _assert_equals_hf(processor, golden, prepared, encoder)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_sample_that_cannot_fit_even_at_the_minimum_is_left_whole(request, family: str) -> None:
    processor = _processor(request, family)
    rng = np.random.default_rng(2)
    video = make_video(rng, num_frames=40, rate=Fraction(10), size=(64, 64))
    golden = GoldenSample(_chat(0, 1, "Describe."), [], [video])
    sample = chat_sample(golden, "tiny_row")
    full = _encoder(processor, seq_length=1 << 20).preencode_sample(sample)
    # A row narrower than the text alone: no media setting helps.
    prepared = _encoder(processor, seq_length=16, on_overlong="shrink").preencode_sample(sample)
    assert prepared.skip_reason is None and prepared.tokens_before_shrink is None
    assert prepared.num_tokens == full.num_tokens and prepared.image_max_pixels is None
