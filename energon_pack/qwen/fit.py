"""The media geometry of one sample, and fit-to-budget: the largest per-sample limits that fit a row.

`media_geometry` turns a sample's media headers (image sizes, video frame counts, rates and
sizes) into the grids and frame samplings the Hugging Face processor would produce under one
`VisionSpec`. `shrink_limits` finds, for a sample too big for a row (tokens over W, or ViT
patches over the row's vision budget), the per-sample limits under which it fits: first its
images' pixel budget is lowered (the processor's ``max_pixels``, per sample), and only when
images at the processor's minimum are not enough, its videos' frame count (``max_frames``)
too. Everything is exact arithmetic on headers: the per-sample limits go through the same
`geometry` functions (sides multiples of patch * merge = 28 for Qwen2/2.5-VL, 32 for
Qwen3-VL; frame counts multiples of the temporal patch 2), so the processor called with the
same limits produces the same grids. A frame-list video keeps every frame (an odd count padded
by the processor with its last frame) up to ``max_frames``, and is sampled like a file beyond it
(`geometry.frame_list_indices`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from energon_pack.qwen.geometry import (
    VisionSpec,
    frame_list_indices,
    image_grid,
    sample_frame_indices,
    second_per_grid_ts,
    video_grid,
)
from energon_pack.qwen.media import ImageInfo, VideoInfo
from energon_pack.qwen.template import VideoTiming

__all__ = ["MediaGeometry", "MediaLimits", "media_geometry", "shrink_limits"]


@dataclass(frozen=True, kw_only=True)
class MediaLimits:
    """Per-sample limits: ``image_max_pixels`` (pixels per image, the processor's
    ``size["longest_edge"]``) and ``max_frames`` (most frames sampled per video)."""

    image_max_pixels: int
    max_frames: int

    def apply(self, spec: VisionSpec) -> VisionSpec:
        """``spec`` with these limits. Example: ``MediaLimits(image_max_pixels=200704,
        max_frames=8).apply(spec).image_max_pixels`` -> 200704."""
        return replace(spec, image_max_pixels=self.image_max_pixels, max_frames=self.max_frames)


@dataclass(frozen=True, kw_only=True)
class MediaGeometry:
    """Grids and frame sampling of one sample's media under one `VisionSpec`.

    ``image_grid_thw`` int64 [n_img, 3] and ``video_grid_thw`` int64 [n_vid, 3] in patches (None
    without such media); ``timings`` and ``second_per_grid_ts`` per video.
    """

    image_grid_thw: np.ndarray | None
    video_grid_thw: np.ndarray | None
    timings: tuple[VideoTiming, ...]
    second_per_grid_ts: tuple[float, ...]

    @property
    def vision_patches(self) -> int:
        """ViT input patches: sum of t*h*w over every grid (before the 2x2 merge)."""
        grids = [g for g in (self.image_grid_thw, self.video_grid_thw) if g is not None]
        return sum(int(np.prod(g, axis=-1).sum()) for g in grids)


def media_geometry(images: Sequence[ImageInfo], videos: Sequence[VideoInfo], spec: VisionSpec) -> MediaGeometry:
    """Grids and frame sampling of ``images`` and ``videos`` (header facts) under ``spec``.

    Raises `BadMediaError` for media the processor rejects (extreme aspect ratio, too few frames).
    Example (Qwen2.5-VL defaults): one 480x640 image -> ``image_grid_thw`` [[1, 34, 46]],
    1564 vision patches.
    """
    image_grids = [image_grid(info.height, info.width, spec) for info in images]
    timings, video_grids = [], []
    for info in videos:
        if info.is_frame_list:
            indices = frame_list_indices(info.num_frames, spec)
        else:
            indices = sample_frame_indices(info.num_frames, info.fps, spec)
        timings.append(VideoTiming(total_frames=info.num_frames, fps=info.fps, frame_indices=tuple(indices)))
        video_grids.append(video_grid(len(indices), info.height, info.width, spec))
    seconds = tuple(
        second_per_grid_ts(len(t.frame_indices), t.total_frames, t.fps, spec.temporal_patch_size) for t in timings
    )
    return MediaGeometry(
        image_grid_thw=np.array(image_grids, dtype=np.int64) if image_grids else None,
        video_grid_thw=np.array(video_grids, dtype=np.int64) if video_grids else None,
        timings=tuple(timings),
        second_per_grid_ts=seconds,
    )


def shrink_limits(
    images: Sequence[ImageInfo],
    videos: Sequence[VideoInfo],
    spec: VisionSpec,
    *,
    fits: Callable[[MediaGeometry], bool],
    lower_frames: bool = True,
) -> MediaLimits | None:
    """The largest per-sample limits under which the sample's media geometry ``fits``, or None.

    "Largest" is lexicographic in (``max_frames``, ``image_max_pixels``): videos keep as many
    frames as they can (``spec``'s own frame limit when that fits), and images get the largest
    pixel budget in [``spec.image_min_pixels``, ``spec.image_max_pixels``] that fits with those
    frames. Frame settings go down from the most frames any video samples, one temporal patch
    at a time, to ``min_frames`` rounded up to the temporal patch; None when nothing fits even
    with images at ``image_min_pixels`` and videos at that minimum. ``fits`` must be monotone
    in the image pixel budget (true for token and patch counts: a resized image's area never
    shrinks when its pixel budget grows), so that budget is found by bisection. With
    ``lower_frames=False`` the videos keep ``spec``'s frame limit and only images shrink (Qwen-Omni
    videos heard with their sound, whose positions are aligned to it).

    Example (Qwen2.5-VL defaults, factor 28): one 4000x3000 (h x w) image (1230 tokens at the
    default 1003520 px) and ``fits`` = "at most 400 image tokens" ->
    ``MediaLimits(image_max_pixels=338687, max_frames=768)``: the image resizes to 644x476 px,
    391 tokens; one pixel more resizes it to 672x504 px, 432 tokens.
    """
    step = spec.temporal_patch_size
    lowest = max(step, math.ceil(spec.min_frames / step) * step)
    original = media_geometry(images, videos, spec)
    most_frames = max((len(t.frame_indices) for t in original.timings), default=0)
    # Below the most frames any video keeps: the largest multiple of the temporal patch (a frame
    # list may keep an odd count), then one temporal patch less at a time.
    frame_settings = [spec.max_frames, *range((most_frames - 1) // step * step, lowest - 1, -step)]
    if not lower_frames:
        frame_settings = frame_settings[:1]
    for max_frames in frame_settings:

        def fits_with(image_max_pixels: int) -> bool:
            limits = MediaLimits(image_max_pixels=image_max_pixels, max_frames=max_frames)
            return fits(media_geometry(images, videos, limits.apply(spec)))

        low, high = spec.image_min_pixels, spec.image_max_pixels
        if fits_with(high):
            return MediaLimits(image_max_pixels=high, max_frames=max_frames)
        if not fits_with(low):
            continue
        # Invariant: fits_with(low); the answer lies in [low, high].
        while low < high:
            middle = (low + high + 1) // 2
            if fits_with(middle):
                low = middle
            else:
                high = middle - 1
        return MediaLimits(image_max_pixels=low, max_frames=max_frames)
    return None
