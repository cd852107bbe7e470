"""Qwen-VL geometry: hand-computed cases, invariants, and agreement with the Hugging Face processors.

Where supported transformers releases differ (the Qwen3-VL clip resize before 5.15, the per-frame
pixel cap from 5.16), both rules have golden cases and the installed release's is compared with HF.
Processors are configured with ``size=``: transformers 5.12 lets ``min_pixels=`` change the class
defaults of every later processor.
"""

from __future__ import annotations

import random
import types

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from transformers import (
    Qwen2_5_VLProcessor,
    Qwen2VLImageProcessor,
    Qwen2VLVideoProcessor,
    Qwen3VLProcessor,
    Qwen3VLVideoProcessor,
)
from transformers.models.qwen2_vl.image_processing_qwen2_vl import (
    smart_resize as hf_smart_resize,
)
from transformers.models.qwen3_vl.video_processing_qwen3_vl import (
    smart_resize as hf_smart_resize_clip,
)
from transformers.video_utils import VideoMetadata

from energon_pack.qwen.geometry import (
    VisionSpec,
    frame_list_indices,
    image_grid,
    image_token_count,
    resized_image_size,
    sample_frame_indices,
    second_per_grid_ts,
    smart_resize,
    smart_resize_clip,
    video_grid,
)
from energon_pack.qwen.hf_release import qwen3_clip_rule
from energon_pack.qwen.media import BadMediaError
from tests.support.vision_specs import QWEN3, QWEN25

# Published Qwen3-VL preprocessor_config.json image limits (the image processor is Qwen2VLImageProcessor, patch 16).
QWEN3_IMAGE_SIZE = {"shortest_edge": 65536, "longest_edge": 16777216}


#: The installed transformers has the qwen-vl-utils per-frame pixel cap option (5.16 on).
FRAME_CAP = hasattr(Qwen2VLVideoProcessor, "cap_pixels_per_frame")
VIDEO_PROCESSORS = ["qwen2.5", "qwen3"] + (["qwen2.5-cap", "qwen3-cap"] if FRAME_CAP else [])


def hf_video_processors() -> dict[str, object]:
    """HF video processors with default settings, uncapped and (where the release has it) with the cap."""
    if not FRAME_CAP:
        return {"qwen2.5": Qwen2VLVideoProcessor(), "qwen3": Qwen3VLVideoProcessor()}
    return {
        "qwen2.5": Qwen2VLVideoProcessor(cap_pixels_per_frame=False),
        # max_video_tokens=200 -> budget int(0.9*200*28*28)*2 // n px per frame: bites from a few frames on.
        "qwen2.5-cap": Qwen2VLVideoProcessor(cap_pixels_per_frame=True, max_video_tokens=200),
        "qwen3": Qwen3VLVideoProcessor(cap_pixels_per_frame=False),
        # max_video_tokens=160 -> at most 160*32*32 px per frame, below the 786432 px clip budget for short clips.
        "qwen3-cap": Qwen3VLVideoProcessor(cap_pixels_per_frame=True, max_video_tokens=160),
    }


def spec_for(video_processor: object, image_processor: object | None = None) -> VisionSpec:
    if image_processor is None:
        patch = video_processor.patch_size
        image_processor = Qwen2VLImageProcessor(patch_size=patch, **({"size": QWEN3_IMAGE_SIZE} if patch == 16 else {}))
    holder = types.SimpleNamespace(image_processor=image_processor, video_processor=video_processor)
    family = "qwen3-vl" if isinstance(video_processor, Qwen3VLVideoProcessor) else "qwen2.5-vl"
    return VisionSpec.from_processor(holder, family=family)


# ---------------------------------------------------------------- smart_resize


@pytest.mark.parametrize(
    ("height", "width", "factor", "min_pixels", "max_pixels", "expected"),
    [
        (480, 640, 28, 3136, 1003520, (476, 644)),  # rounding only: 480/28=17.1->17, 640/28=22.9->23
        # too big: beta = sqrt(12e6 / 1003520) = 3.458; floor(4000/beta/28) = 41, floor(3000/beta/28) = 30
        (4000, 3000, 28, 3136, 1003520, (1148, 840)),
        (10, 10, 28, 3136, 1003520, (56, 56)),  # too small: beta = 5.6, ceil(10*5.6/28) = 2 -> 56
        (28, 5600, 28, 3136, 1003520, (28, 5600)),  # ratio exactly 200 is allowed
        (480, 640, 32, 65536, 16777216, (480, 640)),  # Qwen3-VL image factor 32: already aligned
    ],
)
def test_smart_resize_golden(height, width, factor, min_pixels, max_pixels, expected):
    assert smart_resize(height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels) == expected


def test_smart_resize_rejects_extreme_aspect_ratio():
    with pytest.raises(BadMediaError) as caught:
        smart_resize(28, 5601, factor=28, min_pixels=3136, max_pixels=1003520)
    assert caught.value.reason == "extreme_aspect_ratio"
    assert isinstance(caught.value, ValueError)


def test_smart_resize_clip_golden():
    # 8 frames of 480x640 at factor 32: rounded 480x640 -> 8*480*640 = 2457600 > 786432,
    # beta = sqrt(8*480*640/786432) = 1.768 -> floor(271.5/32)=8 -> 256, floor(362/32)=11 -> 352.
    assert smart_resize_clip(8, 480, 640, factor=32, temporal_factor=2, min_pixels=131072, max_pixels=786432) == (
        256,
        352,
    )
    # Sides below the factor are scaled up first: 10x40 -> x3.2 -> 32x128; the clip 2*32*128 = 8192 px is
    # too small: beta = sqrt(131072/8192) = 4 -> 128x512.
    assert smart_resize_clip(2, 10, 40, factor=32, temporal_factor=2, min_pixels=131072, max_pixels=786432) == (
        128,
        512,
    )
    with pytest.raises(BadMediaError) as caught:
        smart_resize_clip(1, 480, 640, factor=32, temporal_factor=2, min_pixels=131072, max_pixels=786432)
    assert caught.value.reason == "too_few_frames"


def test_smart_resize_clip_golden_before_transformers_5_15():
    """The "ceil" rule: t_bar rounds up, a side below the factor is refused, one frame is a clip."""
    limits = dict(factor=32, temporal_factor=2, min_pixels=131072, max_pixels=786432, rule="ceil")
    assert smart_resize_clip(8, 480, 640, **limits) == (256, 352)  # an even count: as "round"
    # 5 frames of 384x480: "round" takes t_bar = 4 and 4*384*480 = 737280 fits the 786432 budget, so the
    # sides stay; "ceil" takes t_bar = 6 (1105920, too big): beta = sqrt(5*384*480/786432) = 1.0825 ->
    # floor(354.7/32)=11 -> 352, floor(443.4/32)=13 -> 416.
    assert smart_resize_clip(5, 384, 480, **limits) == (352, 416)
    assert smart_resize_clip(5, 384, 480, **{**limits, "rule": "round"}) == (384, 480)
    assert smart_resize_clip(1, 480, 640, **limits) == (480, 640)  # t_bar 2: 614400 px fits
    with pytest.raises(BadMediaError) as caught:
        smart_resize_clip(2, 10, 40, **limits)
    assert caught.value.reason == "frame_too_small"


sides = st.integers(min_value=1, max_value=6000)
pixel_limits = st.tuples(st.integers(1, 2_000_000), st.integers(1, 20_000_000)).map(sorted)


@settings(max_examples=300, deadline=None)
@given(height=sides, width=sides, factor=st.sampled_from([28, 32]), limits=pixel_limits)
def test_smart_resize_equals_hf(height, width, factor, limits):
    min_pixels, max_pixels = limits
    try:
        expected = hf_smart_resize(height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)
    except ValueError:
        with pytest.raises(BadMediaError):
            smart_resize(height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)
        return
    assert smart_resize(height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels) == expected


@settings(max_examples=300, deadline=None)
@given(frames=st.integers(1, 800), height=sides, width=sides, factor=st.sampled_from([28, 32]), limits=pixel_limits)
def test_smart_resize_clip_equals_hf(frames, height, width, factor, limits):
    min_pixels, max_pixels = limits
    kwargs = dict(factor=factor, temporal_factor=2, min_pixels=min_pixels, max_pixels=max_pixels)
    rule = qwen3_clip_rule()
    try:
        expected = hf_smart_resize_clip(frames, height, width, **kwargs)
    except ValueError:
        with pytest.raises(BadMediaError):
            smart_resize_clip(frames, height, width, **kwargs, rule=rule)
        return
    assert smart_resize_clip(frames, height, width, **kwargs, rule=rule) == expected


@settings(max_examples=300, deadline=None)
@given(height=sides, width=sides, factor=st.sampled_from([28, 32]), limits=pixel_limits)
def test_smart_resize_invariants(height, width, factor, limits):
    min_pixels, max_pixels = limits
    if max(height, width) / min(height, width) > 200:
        return
    out_h, out_w = smart_resize(height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)
    assert out_h > 0 and out_w > 0
    assert out_h % factor == 0 and out_w % factor == 0
    rounded_area = round(height / factor) * factor * round(width / factor) * factor
    if rounded_area > max_pixels:  # shrunk: within the maximum unless a side hit the one-factor floor
        assert out_h * out_w <= max_pixels or min(out_h, out_w) == factor
    elif rounded_area < min_pixels:  # grown: at least the minimum
        assert out_h * out_w >= min_pixels
    else:  # in range: plain rounding of each side
        assert min_pixels <= out_h * out_w <= max_pixels
        assert abs(out_h - height) <= factor / 2 and abs(out_w - width) <= factor / 2


# ---------------------------------------------------------------- grids vs the HF processors


def random_sizes(count: int, seed: int, max_side: tuple[int, int]) -> list[tuple[int, int]]:
    """Seeded (h, w) pairs from 28x28 up to max_side, plus fixed awkward aspect ratios."""
    rng = random.Random(seed)
    fixed = [(28, 28), (28, 5000), (3000, 15), (3000, 14), (2, 150), (33, 4000), (999, 1001)]
    return fixed + [(rng.randint(28, max_side[0]), rng.randint(28, max_side[1])) for _ in range(count - len(fixed))]


IMAGE_CASES = [
    ("qwen2.5-default", dict(), random_sizes(34, seed=0, max_side=(4000, 3000))),
    ("qwen2.5-small-limits", dict(size={"shortest_edge": 200704, "longest_edge": 401408}),
     random_sizes(12, seed=1, max_side=(3000, 4000))),
    ("qwen3-default", dict(patch_size=16, size=QWEN3_IMAGE_SIZE), random_sizes(12, seed=2, max_side=(1400, 1400))),
    ("qwen3-small-limits", dict(patch_size=16, size={"shortest_edge": 65536, "longest_edge": 1048576}),
     random_sizes(12, seed=3, max_side=(4000, 3000))),
]


@pytest.mark.parametrize(("name", "kwargs", "sizes"), IMAGE_CASES, ids=[case[0] for case in IMAGE_CASES])
def test_image_grid_equals_hf(name, kwargs, sizes):
    image_processor = Qwen2VLImageProcessor(**kwargs)
    spec = spec_for(Qwen3VLVideoProcessor() if kwargs.get("patch_size") == 16 else Qwen2VLVideoProcessor(),
                    image_processor)
    for height, width in sizes:
        image = Image.new("RGB", (width, height))
        try:
            expected = image_processor(images=image, return_tensors="pt")["image_grid_thw"][0].tolist()
        except ValueError:
            with pytest.raises(BadMediaError):
                image_grid(height, width, spec)
            continue
        grid = image_grid(height, width, spec)
        assert list(grid) == expected, (height, width)
        resized_h, resized_w = resized_image_size(height, width, spec)
        assert (resized_h // spec.patch_size, resized_w // spec.patch_size) == grid[1:]


VIDEO_CASES = [  # (total frames T, fps_in, height, width)
    (17, 30.0, 48, 64),  # 0.57 s -> min 4 frames
    (90, 30.0, 360, 640),  # 3 s -> 6 frames
    (301, 29.97, 240, 426),  # ~10 s -> 20 frames, odd width
    (3, 25.0, 1080, 1920),  # 3 frames -> floor_2(3) = 2
    (48, 8.0, 720, 90),  # tall
    (40, 2.0, 20, 30),  # tiny frames (Qwen3 scales sides up to the factor first, or refuses them before 5.15)
]


@pytest.mark.parametrize("processor_name", VIDEO_PROCESSORS)
def test_video_grid_equals_hf(processor_name):
    video_processor = hf_video_processors()[processor_name]
    spec = spec_for(video_processor)
    assert spec.cap_pixels_per_frame == processor_name.endswith("cap")
    for total, fps_in, height, width in VIDEO_CASES:
        indices = sample_frame_indices(total, fps_in, spec)
        frames = np.zeros((len(indices), height, width, 3), dtype=np.uint8)
        metadata = {"total_num_frames": total, "fps": fps_in, "frames_indices": indices}
        try:
            out = video_processor(videos=[frames], do_sample_frames=False, video_metadata=[metadata], return_tensors="pt")
        except ValueError:
            with pytest.raises(BadMediaError):
                video_grid(len(indices), height, width, spec)
            continue
        assert list(video_grid(len(indices), height, width, spec)) == out["video_grid_thw"][0].tolist(), (total, height)


@pytest.mark.parametrize("processor_name", VIDEO_PROCESSORS)
@pytest.mark.parametrize("num_frames", [2, 5, 64])
def test_video_grid_any_frame_count_equals_hf(processor_name, num_frames):
    """Odd counts pad the last temporal group; long clips make the caps / clip budget bite."""
    video_processor = hf_video_processors()[processor_name]
    spec = spec_for(video_processor)
    frames = np.zeros((num_frames, 120, 200, 3), dtype=np.uint8)
    metadata = {"total_num_frames": num_frames, "fps": 10.0, "frames_indices": list(range(num_frames))}
    out = video_processor(videos=[frames], do_sample_frames=False, video_metadata=[metadata], return_tensors="pt")
    assert list(video_grid(num_frames, 120, 200, spec)) == out["video_grid_thw"][0].tolist()


def test_qwen3_single_frame_clip_like_hf():
    """Refused from transformers 5.15 on; earlier releases pad the frame to a temporal patch."""
    frames = np.zeros((1, 64, 64, 3), dtype=np.uint8)
    video_processor = hf_video_processors()["qwen3"]
    if QWEN3.clip_rule == "round":
        with pytest.raises(ValueError):
            video_processor(videos=[frames], do_sample_frames=False)
        with pytest.raises(BadMediaError) as caught:
            video_grid(1, 64, 64, QWEN3)
        assert caught.value.reason == "too_few_frames"
    else:
        out = video_processor(videos=[frames], do_sample_frames=False, return_tensors="pt")
        assert list(video_grid(1, 64, 64, QWEN3)) == out["video_grid_thw"][0].tolist()


def test_clip_rule_follows_the_installed_transformers():
    assert QWEN3.clip_rule == qwen3_clip_rule() and QWEN25.clip_rule is None
    assert VisionSpec(**{**QWEN3.__dict__, "clip_rule": "ceil"}).clip_rule == "ceil"
    with pytest.raises(ValueError, match="no effect"):
        VisionSpec(**{**QWEN25.__dict__, "clip_rule": "ceil"})


def test_grid_goldens_and_token_counts():
    assert image_grid(480, 640, QWEN25) == (1, 34, 46)
    assert video_grid(8, 480, 640, QWEN25) == (4, 34, 46)
    assert video_grid(8, 480, 640, QWEN3) == (4, 16, 22)
    assert image_token_count((1, 34, 46), 2) == 34 * 46 // 4 == 391
    assert image_token_count((4, 16, 22), 2) == 352


# ---------------------------------------------------------------- frame sampling


@pytest.mark.parametrize(
    ("total", "fps_in", "spec_kwargs", "expected_count"),
    [
        (300, 30.0, {}, 20),  # 10 s at 2 fps
        (300, 29.97, {}, 20),  # 20.02 -> floor to even 20
        (45, 10.0, {}, 8),  # 9 -> floor to even 8
        (30, 30.0, {}, 4),  # 2 wanted -> min_frames 4
        (3, 30.0, {}, 2),  # min 4 but capped at floor_2(3) = 2
        (2, 30.0, {}, 2),
        (100, 1.0, {}, 100),  # 200 wanted -> at most T
        (101, 1.0, {}, 100),  # ... floored to even
        (10_000, 1.0, {}, 768),  # max_frames
        (10_000, 1.0, {"max_frames": 65}, 64),  # odd max_frames floored to even
        (300, 30.0, {"fps": 1.0}, 10),
        (300, 30.0, {"min_frames": 5}, 20),
        (30, 30.0, {"min_frames": 5}, 6),  # min_frames is ceiled to even
    ],
)
def test_sample_frame_count_golden(total, fps_in, spec_kwargs, expected_count):
    spec = VisionSpec(**{**QWEN25.__dict__, **spec_kwargs})
    indices = sample_frame_indices(total, fps_in, spec)
    assert len(indices) == expected_count
    assert indices == np.linspace(0, total - 1, expected_count).round().astype(int).tolist()


def test_sample_frame_indices_golden():
    assert sample_frame_indices(30, 10.0, QWEN25) == [0, 6, 12, 17, 23, 29]  # linspace 0, 5.8, 11.6, 17.4, 23.2, 29
    assert sample_frame_indices(3, 30.0, QWEN25) == [0, 2]
    assert sample_frame_indices(5, 30.0, QWEN25) == [0, 1, 3, 4]  # 0, 1.33, 2.67, 4


@pytest.mark.parametrize(("total", "fps_in", "reason"), [(1, 30.0, "too_few_frames"), (0, 30.0, "bad_video_metadata"),
                                                         (10, 0.0, "bad_video_metadata")])
def test_sample_frame_indices_rejects(total, fps_in, reason):
    with pytest.raises(BadMediaError) as caught:
        sample_frame_indices(total, fps_in, QWEN25)
    assert caught.value.reason == reason


@pytest.mark.parametrize(("total", "max_frames", "expected"), [
    (1, 768, [0]), (5, 768, [0, 1, 2, 3, 4]), (9, 9, list(range(9))),  # every frame, an odd count too
    (9, 4, [0, 3, 5, 8]), (10, 7, [0, 2, 4, 5, 7, 9]),  # beyond max_frames: as a 9 (10)-frame file at spec.fps
])
def test_frame_list_indices_keep_every_frame_up_to_max_frames(total, max_frames, expected):
    spec = VisionSpec(**{**QWEN25.__dict__, "max_frames": max_frames})
    assert frame_list_indices(total, spec) == expected
    if total > max_frames:
        assert expected == sample_frame_indices(total, spec.fps, spec)


def test_frame_list_indices_reject_an_empty_list():
    with pytest.raises(BadMediaError) as caught:
        frame_list_indices(0, QWEN25)
    assert caught.value.reason == "too_few_frames"


@settings(max_examples=300, deadline=None)
@given(
    total=st.integers(2, 20_000),
    fps_in=st.floats(0.1, 240.0),
    max_frames=st.integers(1, 1000),
    min_frames=st.integers(1, 16),
)
def test_sample_frame_indices_invariants(total, fps_in, max_frames, min_frames):
    spec = VisionSpec(**{**QWEN25.__dict__, "max_frames": max_frames, "min_frames": min_frames})
    try:
        indices = sample_frame_indices(total, fps_in, spec)
    except BadMediaError as error:
        assert error.reason == "too_few_frames" and max_frames < 2
        return
    count = len(indices)
    assert count % 2 == 0 and 2 <= count <= min(total, max_frames)
    assert indices[0] == 0 and indices[-1] == total - 1
    assert all(a < b for a, b in zip(indices, indices[1:]))
    # Same frames as round(linspace(0, T-1, n)) in float64 (torch's float32 default, as in
    # qwen-vl-utils, rounds differently near .5 once T reaches the thousands).
    assert indices == torch.linspace(0, total - 1, count, dtype=torch.float64).round().long().tolist()
    assert indices == np.linspace(0, total - 1, count).round().astype(int).tolist()
    wanted = total / fps_in * 2.0
    even_min, even_max = min_frames + min_frames % 2, min(total, max_frames) // 2 * 2
    if even_min <= wanted <= even_max:  # inside the clamps: the wanted count floored to even
        assert count == int(wanted) // 2 * 2


@pytest.mark.parametrize(("total", "fps_in"), [(300, 30.0), (17, 30.0), (301, 29.97), (1000, 24.0)])
def test_second_per_grid_ts_matches_hf_sampled_fps(total, fps_in):
    indices = sample_frame_indices(total, fps_in, QWEN25)
    metadata = VideoMetadata(total_num_frames=total, fps=fps_in, frames_indices=indices)
    expected = 2 / metadata.sampled_fps  # Qwen2_5_VLProcessor: temporal_patch_size / sampled_fps
    assert second_per_grid_ts(len(indices), total, fps_in, 2) == pytest.approx(expected, rel=1e-12)
    assert second_per_grid_ts(6, 30, 10.0, 2) == 1.0


# ---------------------------------------------------------------- from_processor


def test_from_processor_qwen25_defaults():
    holder = types.SimpleNamespace(image_processor=Qwen2VLImageProcessor(), video_processor=Qwen2VLVideoProcessor())
    assert VisionSpec.from_processor(holder, family="qwen2.5-vl") == VisionSpec(
        family="qwen2.5-vl", patch_size=14, merge_size=2, temporal_patch_size=2,
        image_min_pixels=56 * 56, image_max_pixels=28 * 28 * 1280,
        video_min_pixels=128 * 28 * 28, video_max_pixels=28 * 28 * 768,
        cap_pixels_per_frame=False, max_video_tokens=128000 if FRAME_CAP else None, fps=2.0, min_frames=4,
        max_frames=768,
    )


def test_from_processor_qwen3_defaults_detects_family():
    holder = types.SimpleNamespace(
        image_processor=Qwen2VLImageProcessor(patch_size=16, size=QWEN3_IMAGE_SIZE),
        video_processor=Qwen3VLVideoProcessor(),
    )
    assert VisionSpec.from_processor(holder) == VisionSpec(
        family="qwen3-vl", patch_size=16, merge_size=2, temporal_patch_size=2,
        image_min_pixels=65536, image_max_pixels=16777216,
        video_min_pixels=128 * 32 * 32, video_max_pixels=32 * 32 * 768,
        cap_pixels_per_frame=False, max_video_tokens=768 if FRAME_CAP else None, fps=2.0, min_frames=4,
        max_frames=768,
    )


def test_from_processor_reads_configured_limits():
    holder = types.SimpleNamespace(
        image_processor=Qwen2VLImageProcessor(size={"shortest_edge": 200704, "longest_edge": 401408}),
        video_processor=Qwen2VLVideoProcessor(
            size={"shortest_edge": 50176, "longest_edge": 200704}, max_frames=64, min_frames=2, fps=1.5,
            cap_pixels_per_frame=True,
        ),
    )
    spec = VisionSpec.from_processor(holder, family="qwen2-vl")
    assert (spec.image_min_pixels, spec.image_max_pixels) == (200704, 401408)
    assert (spec.video_min_pixels, spec.video_max_pixels) == (50176, 200704)
    # Before 5.16 the option is kept as an attribute but never applied: the spec ignores it too.
    assert (spec.max_frames, spec.min_frames, spec.fps, spec.cap_pixels_per_frame) == (64, 2, 1.5, FRAME_CAP)


@pytest.mark.parametrize(("processor_class", "family"), [(Qwen2_5_VLProcessor, "qwen2.5-vl"),
                                                         (Qwen3VLProcessor, "qwen3-vl")])
def test_from_processor_family_from_processor_class(processor_class, family):
    processor = object.__new__(processor_class)  # no tokenizer needed: only the two sub-processors are read
    processor.image_processor = Qwen2VLImageProcessor()
    processor.video_processor = Qwen2VLVideoProcessor()
    assert VisionSpec.from_processor(processor).family == family


def test_from_processor_errors():
    ambiguous = types.SimpleNamespace(image_processor=Qwen2VLImageProcessor(), video_processor=Qwen2VLVideoProcessor())
    with pytest.raises(ValueError, match="family"):
        VisionSpec.from_processor(ambiguous)
    mismatched = types.SimpleNamespace(image_processor=Qwen2VLImageProcessor(), video_processor=Qwen3VLVideoProcessor())
    with pytest.raises(ValueError, match="patch_size"):
        VisionSpec.from_processor(mismatched)
    no_resize = types.SimpleNamespace(
        image_processor=Qwen2VLImageProcessor(do_resize=False), video_processor=Qwen2VLVideoProcessor()
    )
    with pytest.raises(ValueError, match="do_resize"):
        VisionSpec.from_processor(no_resize, family="qwen2.5-vl")


@pytest.mark.parametrize(
    "override",
    [{"family": "qwen4"}, {"patch_size": 0}, {"image_min_pixels": 2_000_000}, {"fps": 0.0},
     {"cap_pixels_per_frame": True, "max_video_tokens": None}],
)
def test_vision_spec_validation(override):
    with pytest.raises(ValueError):
        VisionSpec(**{**QWEN25.__dict__, **override})
