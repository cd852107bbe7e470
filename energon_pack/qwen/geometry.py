"""Qwen-VL vision geometry: resize targets, patch grids, token counts and frame sampling.

Pure arithmetic that reproduces the Hugging Face Qwen2/2.5/3-VL image and video
processors (transformers 5.x) without touching pixels, so exact token counts can
be computed from media headers alone. Sizes are in pixels, grids are
``(t, h, w)`` in vision patches, token counts are merged LLM tokens.

Data-dependent failures (extreme aspect ratio, too few frames) raise
`BadMediaError`, a `ValueError` whose ``reason`` is a skip-count key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from energon_pack.qwen.family import FAMILIES, Family, processor_family, vision_rules
from energon_pack.qwen.hf_release import qwen3_clip_rule
from energon_pack.qwen.media import BadMediaError

MAX_ASPECT_RATIO = 200
"""HF smart_resize rejects images/frames whose long/short side ratio exceeds this."""

DEFAULT_SAMPLING_FPS = 2.0
"""qwen-vl-utils ``FPS``: frames sampled per second of video."""

DEFAULT_MIN_FRAMES = 4
"""qwen-vl-utils ``FPS_MIN_FRAMES``."""

DEFAULT_MAX_FRAMES = 768
"""qwen-vl-utils ``FPS_MAX_FRAMES``."""

@dataclass(frozen=True, kw_only=True)
class VisionSpec:
    """Everything that decides a Qwen-VL image/video resize, grid and frame sampling.

    Pixel limits are total pixels (h*w), as the HF processors' ``size`` dict
    (``shortest_edge`` = min pixels, ``longest_edge`` = max pixels). Video limits
    are per frame for Qwen2/2.5-VL but per clip (``t_bar*h*w``, t_bar = frames
    rounded to the temporal patch) for Qwen3-VL.

    ``cap_pixels_per_frame`` / ``max_video_tokens`` mirror the HF video
    processors' optional qwen-vl-utils-style bound (off by default in HF):
    Qwen2/2.5-VL: per-frame max is ``min(video_max_pixels, int(0.9 *
    max_video_tokens * factor**2) * temporal_patch // n)``; Qwen3-VL: per-frame
    max is ``min(max_video_tokens * factor**2, video_max_pixels // n)``; both
    floored at ``int(1.05 * video_min_pixels)`` (factor = patch * merge).

    ``fps``, ``min_frames`` and ``max_frames`` drive `sample_frame_indices`.

    ``clip_rule`` (Qwen3-VL and Qwen3.5 only, None for other families): how the clip resize treats the
    frame count and small frames - ``"round"`` as transformers >= 5.15 (see
    `smart_resize_clip`), ``"ceil"`` as earlier releases; None (the default) becomes the
    installed release's rule.
    """

    family: Family
    patch_size: int
    merge_size: int
    temporal_patch_size: int
    image_min_pixels: int
    image_max_pixels: int
    video_min_pixels: int
    video_max_pixels: int
    cap_pixels_per_frame: bool = False
    max_video_tokens: int | None = None
    fps: float = DEFAULT_SAMPLING_FPS
    min_frames: int = DEFAULT_MIN_FRAMES
    max_frames: int = DEFAULT_MAX_FRAMES
    clip_rule: Literal["round", "ceil"] | None = None

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"VisionSpec.family={self.family!r} is unknown; use one of {FAMILIES}.")
        if vision_rules(self.family) != "qwen3-vl":
            if self.clip_rule is not None:
                raise ValueError(
                    f"VisionSpec.clip_rule={self.clip_rule!r} has no effect for family {self.family!r} "
                    "(only Qwen3-VL and Qwen3.5 resize whole clips); leave it None."
                )
        elif self.clip_rule is None:
            object.__setattr__(self, "clip_rule", qwen3_clip_rule())
        elif self.clip_rule not in ("round", "ceil"):
            raise ValueError(f"VisionSpec.clip_rule={self.clip_rule!r} must be 'round', 'ceil' or None.")
        for name in (
            "patch_size", "merge_size", "temporal_patch_size", "image_min_pixels", "image_max_pixels",
            "video_min_pixels", "video_max_pixels", "min_frames", "max_frames",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"VisionSpec.{name}={value!r} must be a positive int.")
        for kind in ("image", "video"):
            low, high = getattr(self, f"{kind}_min_pixels"), getattr(self, f"{kind}_max_pixels")
            if low > high:
                raise ValueError(
                    f"VisionSpec.{kind}_min_pixels={low} exceeds {kind}_max_pixels={high}; "
                    "the minimum must not exceed the maximum - lower min_pixels or raise max_pixels."
                )
        if not self.fps > 0:
            raise ValueError(f"VisionSpec.fps={self.fps!r} must be > 0 (sampled frames per second).")
        if self.cap_pixels_per_frame and (self.max_video_tokens is None or self.max_video_tokens < 1):
            raise ValueError(
                f"VisionSpec.cap_pixels_per_frame=True needs max_video_tokens >= 1, got {self.max_video_tokens!r}."
            )

    @property
    def factor(self) -> int:
        """Side multiple of every resized image/frame: patch_size * merge_size (28 for Qwen2.5-VL, 32 for Qwen3-VL)."""
        return self.patch_size * self.merge_size

    @classmethod
    def from_processor(cls, processor: Any, *, family: Family | None = None) -> VisionSpec:
        """Read every value from a HF Qwen-VL processor (``.image_processor`` and ``.video_processor``).

        ``family`` defaults to the processor class (Qwen2VLProcessor, Qwen2_5_VLProcessor,
        Qwen3VLProcessor); a bare holder of the two sub-processors resolves only when its
        video processor is a Qwen3VLVideoProcessor, otherwise pass ``family``.
        Sampling fps defaults to 2.0 when the video processor has no ``fps``.
        """
        image_proc, video_proc = processor.image_processor, processor.video_processor
        for name in ("patch_size", "merge_size", "temporal_patch_size"):
            if getattr(image_proc, name) != getattr(video_proc, name):
                raise ValueError(
                    f"image_processor.{name}={getattr(image_proc, name)} differs from "
                    f"video_processor.{name}={getattr(video_proc, name)}; one vision tower needs one value - "
                    "set both processors to the model's vision config."
                )
        for role, proc in (("image_processor", image_proc), ("video_processor", video_proc)):
            if not getattr(proc, "do_resize", True):
                raise ValueError(
                    f"{role}.do_resize=False is not supported: token counts assume the Qwen smart resize; "
                    "set do_resize=True."
                )
        image_min, image_max = _pixel_limits(image_proc, "image_processor")
        video_min, video_max = _pixel_limits(video_proc, "video_processor")
        # The per-frame cap exists from transformers 5.16 on; older video processors keep unknown
        # options as attributes but never apply them.
        frame_cap = hasattr(type(video_proc), "cap_pixels_per_frame")
        fps = getattr(video_proc, "fps", None)
        min_frames = getattr(video_proc, "min_frames", None)
        max_frames = getattr(video_proc, "max_frames", None)
        return cls(
            family=family or processor_family(processor),
            patch_size=image_proc.patch_size,
            merge_size=image_proc.merge_size,
            temporal_patch_size=image_proc.temporal_patch_size,
            image_min_pixels=image_min,
            image_max_pixels=image_max,
            video_min_pixels=video_min,
            video_max_pixels=video_max,
            cap_pixels_per_frame=frame_cap and bool(getattr(video_proc, "cap_pixels_per_frame", None)),
            max_video_tokens=getattr(video_proc, "max_video_tokens", None) if frame_cap else None,
            fps=float(fps) if fps is not None else DEFAULT_SAMPLING_FPS,
            min_frames=min_frames if min_frames is not None else DEFAULT_MIN_FRAMES,
            max_frames=max_frames if max_frames is not None else DEFAULT_MAX_FRAMES,
        )


def _pixel_limits(proc: Any, role: str) -> tuple[int, int]:
    """(min_pixels, max_pixels) from a HF processor's ``size`` = {shortest_edge, longest_edge}."""
    size = proc.size
    low, high = size["shortest_edge"], size["longest_edge"]
    if not low or not high:
        raise ValueError(
            f"{role}.size={size} lacks 'shortest_edge'/'longest_edge' (Qwen-VL min/max pixels); "
            "set size={'shortest_edge': MIN_PIXELS, 'longest_edge': MAX_PIXELS}."
        )
    return int(low), int(high)


def _check_aspect_ratio(height: int | float, width: int | float) -> None:
    ratio = max(height, width) / min(height, width)
    if ratio > MAX_ASPECT_RATIO:
        raise BadMediaError(
            "extreme_aspect_ratio",
            f"{height}x{width} (h x w) has aspect ratio {ratio:.1f} > {MAX_ASPECT_RATIO}, which Qwen-VL "
            "processors reject; crop or pad the media to a ratio <= 200.",
        )


def _fit_to_budget(
    height: int, width: int, *, factor: int, min_pixels: int, max_pixels: int, frames: int, rounded_frames: int
) -> tuple[int, int]:
    """Round sides to ``factor``, then rescale so rounded_frames*h*w lies in [min_pixels, max_pixels]."""
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if rounded_frames * h_bar * w_bar > max_pixels:
        beta = math.sqrt((frames * height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif rounded_frames * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def smart_resize(height: int, width: int, *, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """HF Qwen2-VL ``smart_resize``: (h, w) multiples of ``factor`` with h*w near [min_pixels, max_pixels].

    Sides are rounded to ``factor``; if the area is out of range the image is
    rescaled (aspect kept) and floored (too big) or ceiled (too small) to ``factor``.
    Raises `BadMediaError` (reason ``extreme_aspect_ratio``) when max/min side > 200.

    Example: smart_resize(480, 640, factor=28, min_pixels=3136, max_pixels=1003520) -> (476, 644);
    smart_resize(4000, 3000, factor=28, min_pixels=3136, max_pixels=1003520) -> (1148, 840).
    """
    _check_aspect_ratio(height, width)
    return _fit_to_budget(
        height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels, frames=1, rounded_frames=1
    )


def smart_resize_clip(
    num_frames: int,
    height: int,
    width: int,
    *,
    factor: int,
    temporal_factor: int,
    min_pixels: int,
    max_pixels: int,
    rule: Literal["round", "ceil"] = "round",
) -> tuple[int, int]:
    """HF Qwen3-VL video ``smart_resize``: like `smart_resize`, but the pixel range bounds the whole clip.

    The clip area is t_bar*h*w (the rescale itself uses num_frames). ``rule="round"``
    (transformers >= 5.15): t_bar = round(num_frames / temporal_factor) * temporal_factor, sides
    below ``factor`` are first scaled up (aspect kept, truncated to int), and num_frames <
    temporal_factor raises `BadMediaError` ``too_few_frames``. ``rule="ceil"`` (earlier
    releases): t_bar rounds up and a side below ``factor`` raises `BadMediaError`
    ``frame_too_small``. Both raise ``extreme_aspect_ratio`` as smart_resize.

    Example: smart_resize_clip(8, 480, 640, factor=32, temporal_factor=2,
    min_pixels=131072, max_pixels=786432) -> (256, 352), under either rule.
    """
    if rule == "round" and num_frames < temporal_factor:
        raise BadMediaError(
            "too_few_frames",
            f"a clip of {num_frames} frame(s) is shorter than the temporal patch {temporal_factor}; "
            f"Qwen3-VL needs at least {temporal_factor} frames - use a longer video.",
        )
    if height < factor or width < factor:
        if rule == "ceil":
            raise BadMediaError(
                "frame_too_small",
                f"video frames of {width}x{height} (w x h) have a side below {factor} px, which the Qwen3-VL "
                "video processor of this transformers release (< 5.15) refuses - use larger frames or "
                "transformers >= 5.15, which scales them up",
            )
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    _check_aspect_ratio(height, width)
    rounding = round if rule == "round" else math.ceil
    rounded_frames = rounding(num_frames / temporal_factor) * temporal_factor
    return _fit_to_budget(
        height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels,
        frames=num_frames, rounded_frames=rounded_frames,
    )


def resized_image_size(height: int, width: int, spec: VisionSpec) -> tuple[int, int]:
    """(h, w) in pixels that the HF image processor resizes a height x width image to.

    Example (Qwen2.5-VL defaults, factor 28): 480x640 -> (476, 644).
    """
    return smart_resize(
        height, width, factor=spec.factor, min_pixels=spec.image_min_pixels, max_pixels=spec.image_max_pixels
    )


def resized_video_size(num_frames: int, height: int, width: int, spec: VisionSpec) -> tuple[int, int]:
    """(h, w) in pixels that the HF video processor resizes every frame of an n-frame clip to.

    ``num_frames`` is the number of frames handed to the processor (already sampled).
    Example (Qwen2.5-VL video defaults 100352..602112 px/frame): 8 frames of 480x640 -> (476, 644);
    (Qwen3-VL video defaults 131072..786432 px/clip): 8 frames of 480x640 -> (256, 352).
    """
    factor = spec.factor
    min_pixels, max_pixels = spec.video_min_pixels, spec.video_max_pixels
    floor_pixels = int(min_pixels * 1.05)
    if vision_rules(spec.family) == "qwen3-vl":
        if spec.cap_pixels_per_frame:
            frame_cap = spec.max_video_tokens * factor * factor
            max_pixels = max(min(frame_cap, max_pixels // num_frames), floor_pixels) * num_frames
        return smart_resize_clip(
            num_frames, height, width, factor=factor, temporal_factor=spec.temporal_patch_size,
            min_pixels=min_pixels, max_pixels=max_pixels, rule=spec.clip_rule,
        )
    if spec.cap_pixels_per_frame:
        clip_budget = int(spec.max_video_tokens * factor * factor * 0.9)
        max_pixels = max(min(max_pixels, clip_budget * spec.temporal_patch_size // num_frames), floor_pixels)
    return smart_resize(height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)


def image_grid(height: int, width: int, spec: VisionSpec) -> tuple[int, int, int]:
    """``image_grid_thw`` row (1, gh, gw) in patches for a height x width image.

    Example (Qwen2.5-VL defaults, patch 14): 480x640 -> (1, 34, 46).
    """
    resized_h, resized_w = resized_image_size(height, width, spec)
    return 1, resized_h // spec.patch_size, resized_w // spec.patch_size


def video_grid(num_frames: int, height: int, width: int, spec: VisionSpec) -> tuple[int, int, int]:
    """``video_grid_thw`` row (t, gh, gw) for ``num_frames`` already-sampled frames of height x width.

    t = ceil(num_frames / temporal_patch_size): HF pads a short last group with the last frame.
    Example (Qwen2.5-VL defaults): 8 frames of 480x640 -> (4, 34, 46); Qwen3-VL defaults -> (4, 16, 22).
    """
    if num_frames < 1:
        raise BadMediaError("too_few_frames", f"num_frames={num_frames}: a video needs at least one frame.")
    resized_h, resized_w = resized_video_size(num_frames, height, width, spec)
    grid_t = -(-num_frames // spec.temporal_patch_size)
    return grid_t, resized_h // spec.patch_size, resized_w // spec.patch_size


def image_token_count(grid: tuple[int, int, int], merge_size: int) -> int:
    """Number of ``<|image_pad|>`` / ``<|video_pad|>`` tokens for one grid: t*h*w // merge_size**2.

    Example: image_token_count((1, 34, 46), 2) -> 391; image_token_count((4, 34, 46), 2) -> 1564.
    """
    grid_t, grid_h, grid_w = grid
    return grid_t * grid_h * grid_w // merge_size**2


def _floor_to(value: float, multiple: int) -> int:
    return math.floor(value / multiple) * multiple


def sample_frame_indices(total_frames: int, fps_in: float, spec: VisionSpec) -> list[int]:
    """Frame indices to decode, as qwen-vl-utils ``smart_nframes`` + ``round(linspace(0, T-1, n))``.

    n = T / fps_in * spec.fps, clamped to [ceil_k(min_frames), floor_k(min(max_frames, T))]
    and to T, then floored to k = temporal_patch_size. Ties round half to even (as numpy/torch).
    Raises `BadMediaError` (reason ``too_few_frames``) when n < k, e.g. a 1-frame video.

    Example: sample_frame_indices(30, 10.0, spec) -> [0, 6, 12, 17, 23, 29] (3 s at 2 fps -> 6 frames);
    sample_frame_indices(3, 30.0, spec) -> [0, 2] (clamped to floor_2(3) = 2 frames).
    """
    if total_frames < 1 or not fps_in > 0:
        raise BadMediaError(
            "bad_video_metadata",
            f"total_frames={total_frames}, fps_in={fps_in}: both must be positive to sample frames.",
        )
    step = spec.temporal_patch_size
    min_frames = math.ceil(spec.min_frames / step) * step
    max_frames = _floor_to(min(spec.max_frames, total_frames), step)
    wanted = total_frames / fps_in * spec.fps
    num = _floor_to(min(max(wanted, min_frames), max_frames, total_frames), step)
    if num < step:
        raise BadMediaError(
            "too_few_frames",
            f"a video of {total_frames} frame(s) yields {num} sampled frames, fewer than the temporal "
            f"patch {step}; use a video with at least {step} frames.",
        )
    return [_round_ratio(i * (total_frames - 1), num - 1) for i in range(num)]


def frame_list_indices(total_frames: int, spec: VisionSpec) -> list[int]:
    """Frame indices of a frame-list video (encoded frames, Megatron-Bridge's ``videos``) to decode:
    every frame, as the Hugging Face video processor (``do_sample_frames=False``) and
    qwen-vl-utils take a list of frames; they pad an odd count with the last frame, which
    `video_grid` counts (t = ceil(n / temporal patch)) and the pixel path repeats. A list longer
    than ``spec.max_frames`` (the processor's limit, or a shrunk sample's) is sampled as a video
    file of ``total_frames`` frames at ``spec.fps`` is (`sample_frame_indices`).

    Example (``max_frames=768``): frame_list_indices(5, spec) -> [0, 1, 2, 3, 4] (grid t = 3);
    with ``max_frames=4``: frame_list_indices(9, spec) -> [0, 3, 5, 8].
    """
    if total_frames < 1:
        raise BadMediaError("too_few_frames", f"total_frames={total_frames}: a frame list needs at least one frame.")
    if total_frames <= spec.max_frames:
        return list(range(total_frames))
    return sample_frame_indices(total_frames, spec.fps, spec)


def _round_ratio(numerator: int, denominator: int) -> int:
    """numerator / denominator rounded half to even, exactly (no float error)."""
    quotient, remainder = divmod(numerator, denominator)
    if 2 * remainder > denominator or (2 * remainder == denominator and quotient % 2 == 1):
        quotient += 1
    return quotient


def second_per_grid_ts(num_sampled: int, total_frames: int, fps_in: float, temporal_patch_size: int) -> float:
    """Seconds covered by one temporal grid step: temporal_patch / (n / T * fps_in).

    This is the Qwen2.5-VL ``second_per_grid_ts`` for n frames sampled from T frames at fps_in.
    Example: second_per_grid_ts(6, 30, 10.0, 2) -> 1.0.
    """
    return temporal_patch_size / (num_sampled / total_frames * fps_in)
