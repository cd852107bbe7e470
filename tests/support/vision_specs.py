"""The published Qwen2.5-VL and Qwen3-VL vision settings as ``VisionSpec`` (patch, merge, pixel limits)."""

from __future__ import annotations

from energon_pack.qwen.geometry import VisionSpec

QWEN25 = VisionSpec(
    family="qwen2.5-vl", patch_size=14, merge_size=2, temporal_patch_size=2,
    image_min_pixels=3136, image_max_pixels=1003520, video_min_pixels=100352, video_max_pixels=602112,
)
QWEN3 = VisionSpec(
    family="qwen3-vl", patch_size=16, merge_size=2, temporal_patch_size=2,
    image_min_pixels=65536, image_max_pixels=16777216, video_min_pixels=131072, video_max_pixels=786432,
)
