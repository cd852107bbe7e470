"""Fit-to-budget geometry (energon_pack.qwen.fit) and the placeholder token arithmetic it relies on."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from energon_pack.core.conversation import Message
from energon_pack.qwen.fit import MediaGeometry, MediaLimits, media_geometry, shrink_limits
from energon_pack.qwen.geometry import VisionSpec, image_grid, image_token_count, smart_resize
from energon_pack.qwen.media import FRAME_LIST, ImageInfo, VideoInfo
from energon_pack.qwen.template import (
    MediaExpansion,
    expand_media_placeholders,
    placeholder_token_count,
    render_conversation,
)
from tests.support.golden_media import FAMILY_FACTORS, GoldenSample, golden_sample, make_image, make_video
from tests.support.vision_specs import QWEN3, QWEN25


def _image(height: int, width: int) -> ImageInfo:
    return ImageInfo(width=width, height=height, format="PNG", mode="RGB")


def _video(num_frames: int, fps: float, height: int, width: int) -> VideoInfo:
    return VideoInfo(num_frames=num_frames, fps=fps, width=width, height=height, codec="h264")


def test_media_geometry_docstring_example() -> None:
    geometry = media_geometry([_image(480, 640)], [], QWEN25)
    assert geometry.image_grid_thw.tolist() == [[1, 34, 46]] and geometry.video_grid_thw is None
    assert geometry.vision_patches == 1564 and geometry.timings == ()


def test_media_geometry_of_videos() -> None:
    # 3 s at 10 fps -> 6 sampled frames; second per grid step = 2 / (6 / 30 * 10) = 1.0.
    geometry = media_geometry([], [_video(30, 10.0, 480, 640)], QWEN25)
    assert geometry.timings[0].frame_indices == (0, 6, 12, 17, 23, 29)
    assert geometry.video_grid_thw.tolist() == [[3, 34, 46]]
    assert geometry.second_per_grid_ts == (1.0,)
    assert geometry.vision_patches == 3 * 34 * 46


def _frame_list(num_frames: int, height: int, width: int) -> VideoInfo:
    return VideoInfo(num_frames=num_frames, fps=QWEN25.fps, width=width, height=height, codec="jpeg", container=FRAME_LIST)


@pytest.mark.parametrize("spec", [QWEN25, QWEN3], ids=["qwen2.5-vl", "qwen3-vl"])
def test_a_frame_list_keeps_every_frame_and_the_rate_rule(spec) -> None:
    # 5 frames: all kept, padded by the processor to 6 (t = 3); a 5-frame file at 2 fps keeps 4.
    geometry = media_geometry([], [_frame_list(5, 336, 336)], spec)
    assert geometry.timings[0].frame_indices == (0, 1, 2, 3, 4) and geometry.video_grid_thw[0, 0] == 3
    assert geometry.second_per_grid_ts == (2 / spec.fps,)
    as_file = media_geometry([], [_video(5, spec.fps, 336, 336)], spec)
    assert as_file.timings[0].frame_indices == (0, 1, 3, 4) and as_file.video_grid_thw[0, 0] == 2


def test_shrink_tries_the_even_count_below_an_odd_frame_list() -> None:
    video = _frame_list(9, 336, 336)  # 24x24 patches a step; all 9 frames: 5 steps
    per_step = 24 * 24
    assert media_geometry([], [video], QWEN25).vision_patches == 5 * per_step
    limits = shrink_limits([], [video], QWEN25, fits=lambda g: g.vision_patches <= 4 * per_step)
    assert limits == MediaLimits(image_max_pixels=QWEN25.image_max_pixels, max_frames=8)
    shrunk = media_geometry([], [video], limits.apply(QWEN25))
    assert shrunk.timings[0].frame_indices == (0, 1, 2, 3, 5, 6, 7, 8) and shrunk.second_per_grid_ts == (9 / 8,)


def test_shrink_limits_docstring_example() -> None:
    image = _image(4000, 3000)
    assert image_token_count(image_grid(4000, 3000, QWEN25), 2) == 1230

    def fits(geometry: MediaGeometry) -> bool:
        return geometry.vision_patches // 4 <= 400

    limits = shrink_limits([image], [], QWEN25, fits=fits)
    assert limits == MediaLimits(image_max_pixels=338687, max_frames=768)
    assert media_geometry([image], [], limits.apply(QWEN25)).image_grid_thw.tolist() == [[1, 46, 34]]
    assert smart_resize(4000, 3000, factor=28, min_pixels=3136, max_pixels=338688) == (672, 504)


def test_shrink_keeps_frames_while_images_can_give_way() -> None:
    # A big image and a 10 s video: lowering the image alone is enough, so frames stay.
    image, video = _image(2000, 2000), _video(300, 30.0, 360, 640)
    full = media_geometry([image], [video], QWEN25)
    video_patches = int(np.prod(full.video_grid_thw, axis=-1).sum())
    limits = shrink_limits([image], [video], QWEN25, fits=lambda g: g.vision_patches <= video_patches + 2000)
    assert limits is not None and limits.max_frames == QWEN25.max_frames
    assert QWEN25.image_min_pixels < limits.image_max_pixels < QWEN25.image_max_pixels


def test_shrink_lowers_frames_when_images_at_minimum_are_not_enough() -> None:
    image, video = _image(2000, 2000), _video(300, 30.0, 360, 640)  # 20 frames sampled
    per_step = 26 * 46  # patches per temporal step of a 360x640 frame (resized to 364x644)
    budget = 4 * per_step + 200  # room for 8 frames and a small image
    limits = shrink_limits([image], [video], QWEN25, fits=lambda g: g.vision_patches <= budget)
    assert limits is not None and limits.max_frames == 8
    shrunk = media_geometry([image], [video], limits.apply(QWEN25))
    assert shrunk.video_grid_thw.tolist() == [[4, 26, 46]] and shrunk.vision_patches <= budget
    # Images then get the largest budget that still fits with 8 frames.
    assert limits.image_max_pixels > QWEN25.image_min_pixels


def test_shrink_gives_up_below_the_processor_minimum() -> None:
    video = _video(300, 30.0, 360, 640)
    # Even 4 frames (the minimum) carry 2 steps of 26x46 patches.
    assert shrink_limits([], [video], QWEN25, fits=lambda g: g.vision_patches < 2 * 26 * 46) is None
    assert shrink_limits([], [video], QWEN25, fits=lambda g: g.vision_patches <= 2 * 26 * 46) == MediaLimits(
        image_max_pixels=QWEN25.image_max_pixels, max_frames=4
    )


# --------------------------------------------------------------------------- properties


@settings(max_examples=300, deadline=None)
@given(
    height=st.integers(28, 5000),
    width=st.integers(28, 5000),
    budgets=st.lists(st.integers(3136, 4_000_000), min_size=2, max_size=2),
)
def test_image_patches_never_drop_when_the_pixel_budget_grows(height: int, width: int, budgets: list[int]) -> None:
    if max(height, width) / min(height, width) > 200:
        return
    low, high = sorted(budgets)
    sizes = [smart_resize(height, width, factor=28, min_pixels=3136, max_pixels=b) for b in (low, high)]
    assert sizes[0][0] * sizes[0][1] <= sizes[1][0] * sizes[1][1]


media = st.fixed_dictionaries(
    {
        "images": st.lists(st.tuples(st.integers(28, 3000), st.integers(28, 3000)), max_size=3),
        "videos": st.lists(
            st.tuples(st.integers(4, 600), st.sampled_from([10.0, 24.0, 29.97, 60.0]), st.integers(32, 720),
                      st.integers(32, 1280)),
            max_size=2,
        ),
        "spec": st.sampled_from([QWEN25, QWEN3]),
        "share": st.floats(0.02, 1.0),
    }
)


@settings(max_examples=150, deadline=None)
@given(case=media)
def test_shrunk_limits_fit_and_are_the_largest(case: dict) -> None:
    images = [_image(h, w) for h, w in case["images"]]
    videos = [_video(*v) for v in case["videos"]]
    spec: VisionSpec = case["spec"]
    budget = int(media_geometry(images, videos, spec).vision_patches * case["share"])

    def fits(geometry: MediaGeometry) -> bool:
        return geometry.vision_patches <= budget

    def fits_with(image_max_pixels: int, max_frames: int) -> bool:
        limits = MediaLimits(image_max_pixels=image_max_pixels, max_frames=max_frames)
        return fits(media_geometry(images, videos, limits.apply(spec)))

    limits = shrink_limits(images, videos, spec, fits=fits)
    lowest_frames = max(2, -(-spec.min_frames // 2) * 2)
    if limits is None:
        assert not fits_with(spec.image_min_pixels, lowest_frames)
        return
    assert fits_with(limits.image_max_pixels, limits.max_frames)
    assert spec.image_min_pixels <= limits.image_max_pixels <= spec.image_max_pixels
    if limits.image_max_pixels < spec.image_max_pixels:
        assert not fits_with(limits.image_max_pixels + 1, limits.max_frames)
    if limits.max_frames < spec.max_frames:
        assert limits.max_frames % 2 == 0 and limits.max_frames >= lowest_frames
        assert not fits_with(spec.image_min_pixels, limits.max_frames + 2)


# --------------------------------------------------------------------------- token arithmetic


def test_placeholder_token_count_docstring_example(processor) -> None:
    from energon_pack.qwen.template import VideoTiming

    image = np.array([[1, 4, 6]])
    assert placeholder_token_count(processor, MediaExpansion(image_grid_thw=image)) == 6
    video = VideoTiming(total_frames=10, fps=10.0, frame_indices=(0, 3, 6, 9))
    count = placeholder_token_count(
        processor, MediaExpansion(image_grid_thw=image, video_grid_thw=np.array([[2, 4, 4]]), videos=[video])
    )
    assert count == 14


def _assert_counts_match_tokenization(processor, samples, spec: VisionSpec) -> int:
    """placeholder_token_count == tokens of the expanded rendering - tokens of the unexpanded
    one + one pad token per placeholder, for every sample with media; returns how many were checked."""
    from energon_pack.qwen.media import probe_image, probe_video

    tokenizer = processor.tokenizer
    checked = 0
    for sample in samples:
        if not (sample.images or sample.videos):
            continue
        geometry = media_geometry(
            [probe_image(data) for data in sample.images], [probe_video(data) for data in sample.videos], spec
        )
        grids = {"image_grid_thw": geometry.image_grid_thw, "video_grid_thw": geometry.video_grid_thw}
        text = render_conversation(processor, sample.messages)
        expanded = expand_media_placeholders(processor, text, MediaExpansion(**grids, videos=geometry.timings))
        placeholders = len(sample.images) + len(sample.videos)
        expected = len(tokenizer(expanded)["input_ids"]) - len(tokenizer(text)["input_ids"]) + placeholders
        assert placeholder_token_count(processor, MediaExpansion(**grids, videos=geometry.timings)) == expected
        checked += 1
    return checked


def _small_samples(family: str) -> list[GoldenSample]:
    """Three chats with small images and short videos (1-3 s at 10-30 fps), cheap to build."""
    rng = np.random.default_rng(11)
    factor = FAMILY_FACTORS[family]
    images = [make_image(rng, factor, size=size) for size in ((60, 90), (200, 130), (28, 300))]
    videos = [make_video(rng, num_frames=n, rate=Fraction(r), size=(48, 64)) for n, r in ((10, 10), (90, 30), (25, 24))]

    def chat(num_images: int, num_videos: int) -> list[Message]:
        parts = [{"type": "image"}] * num_images + [{"type": "video"}] * num_videos + [{"type": "text", "text": "Hi?"}]
        return [{"role": "user", "content": parts}, {"role": "assistant", "content": [{"type": "text", "text": "Yes."}]}]

    return [
        GoldenSample(chat(2, 0), images[:2], []),
        GoldenSample(chat(0, 2), [], videos[:2]),
        GoldenSample(chat(1, 1), images[2:], videos[2:]),
    ]


FAMILIES_AND_LIMITS = pytest.mark.parametrize(
    ("family", "limits"),
    [(f, lim) for f in ("qwen2.5-vl", "qwen3-vl") for lim in (None, MediaLimits(image_max_pixels=70000, max_frames=6))],
)


def _spec(processor, limits: MediaLimits | None) -> VisionSpec:
    spec = VisionSpec.from_processor(processor)
    return spec if limits is None else limits.apply(spec)


@FAMILIES_AND_LIMITS
def test_placeholder_token_count_equals_tokenizing_the_expansion(request, family, limits) -> None:
    processor = request.getfixturevalue("processor_qwen3" if family == "qwen3-vl" else "processor")
    assert _assert_counts_match_tokenization(processor, _small_samples(family), _spec(processor, limits)) == 3


@pytest.fixture(scope="module", params=["qwen2.5-vl", "qwen3-vl"])
def golden_family(request) -> tuple[str, list[GoldenSample]]:
    family = request.param
    return family, [golden_sample(np.random.default_rng([7, index]), family=family) for index in range(2, 32)]


@pytest.mark.slow
@pytest.mark.parametrize("limits", [None, MediaLimits(image_max_pixels=70000, max_frames=6)])
def test_placeholder_token_count_on_the_golden_mix(request, golden_family, limits) -> None:
    family, samples = golden_family
    processor = request.getfixturevalue("processor_qwen3" if family == "qwen3-vl" else "processor")
    assert _assert_counts_match_tokenization(processor, samples, _spec(processor, limits)) >= 20
