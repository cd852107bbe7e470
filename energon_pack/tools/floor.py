"""The decode-and-resize floor of a loader epoch: what decoding and resizing the emitted samples'
media costs on its own, measured independently of the package's pixel path.

The floor decodes each image with PIL (``open`` + ``convert("RGB")``) and resizes it with PIL
bicubic to transformers' own ``smart_resize`` target (the processor's pixel limits). It decodes
each video with PyAV in order, up to the last frame that ``sample_frame_indices`` keeps, converts
the kept frames to RGB and resizes them (PIL bicubic) to the video processor's target. Media
bytes are read before timing. Only the samples a loader emitted count (a skipped sample is never
decoded by the loader either). ``energon-pack bench --stage loader`` divides it by the workers'
active seconds: the loader's efficiency.

Caveat: on CPUs with AVX2/AVX512, torch's uint8 antialiased bicubic resize (the loader's) is
several times faster than PIL's (the floor's), so the floor is not a strict lower bound.
"""

from __future__ import annotations

import io
import tarfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["FloorMedia", "FloorSeconds", "floor_media", "run_floor"]


@dataclass(frozen=True, kw_only=True)
class FloorMedia:
    """The floor's work, planned untimed: each image's bytes with its (width, height) target, each
    video's bytes with its last kept frame index, kept indices and (width, height) target."""

    images: list[tuple[bytes, tuple[int, int]]]
    videos: list[tuple[bytes, int, frozenset[int], tuple[int, int]]]


@dataclass(frozen=True, kw_only=True)
class FloorSeconds:
    """Wall and CPU (this process) seconds of one floor pass."""

    wall: float
    cpu: float


def _media_of_keys(dataset: Path, keys: set[str]) -> dict[str, tuple[list[bytes], list[bytes]]]:
    """(images, videos) bytes in part order of every sample in ``keys``, read from the dataset's shards."""
    from energon_pack.core.samples import IMAGE_EXTENSIONS, VIDEO_EXTENSIONS

    parts: dict[str, list[tuple[int, str, bytes]]] = {}
    for shard in sorted((Path(dataset) / "shards").glob("*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar:
                key, _, part = member.name.rpartition("/")[2].partition(".")
                index, _, extension = part.partition(".")
                if key in keys and index.isdigit() and extension.lower() in IMAGE_EXTENSIONS + VIDEO_EXTENSIONS:
                    parts.setdefault(key, []).append((int(index), extension.lower(), tar.extractfile(member).read()))
    media = {}
    for key, found in parts.items():
        found.sort()
        media[key] = (
            [data for _, extension, data in found if extension in IMAGE_EXTENSIONS],
            [data for _, extension, data in found if extension in VIDEO_EXTENSIONS],
        )
    return media


def floor_media(dataset: Path, keys: Iterable[str], processor: Any) -> FloorMedia:
    """The floor's plan for the samples ``keys`` of a prepared dataset, with ``processor``'s pixel limits.

    Example: one emitted sample with a 640x480 image -> ``images`` [(bytes, (644, 476))] (Qwen2.5-VL).
    """
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize as image_smart_resize
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import smart_resize as video_smart_resize

    from energon_pack.qwen.geometry import VisionSpec, sample_frame_indices
    from energon_pack.qwen.media import probe_video

    image_processor, video_processor = processor.image_processor, processor.video_processor
    factor = image_processor.patch_size * image_processor.merge_size
    spec = VisionSpec.from_processor(processor)
    images, videos = [], []
    for image_datas, video_datas in _media_of_keys(dataset, set(keys)).values():
        for data in image_datas:
            width, height = Image.open(io.BytesIO(data)).size
            size = image_processor.size
            h, w = image_smart_resize(
                height, width, factor=factor, min_pixels=size["shortest_edge"], max_pixels=size["longest_edge"]
            )
            images.append((data, (w, h)))
        for data in video_datas:
            info = probe_video(data)
            kept = sample_frame_indices(info.num_frames, info.fps, spec)
            size = video_processor.size
            max_pixels = size["longest_edge"]
            if getattr(video_processor, "cap_pixels_per_frame", False):
                total = int(video_processor.max_video_tokens * factor * factor * 0.9)
                max_pixels = max(
                    min(max_pixels, total * video_processor.temporal_patch_size // len(kept)),
                    int(size["shortest_edge"] * 1.05),
                )
            h, w = video_smart_resize(
                info.height, info.width, factor=factor, min_pixels=size["shortest_edge"], max_pixels=max_pixels
            )
            videos.append((data, max(kept), frozenset(kept), (w, h)))
    return FloorMedia(images=images, videos=videos)


def run_floor(media: FloorMedia) -> FloorSeconds:
    """Decode and resize every medium of ``media`` once; its wall and CPU seconds."""
    import av
    from PIL import Image

    wall, cpu = time.perf_counter(), time.process_time()
    for data, target in media.images:
        Image.open(io.BytesIO(data)).convert("RGB").resize(target, Image.BICUBIC)
    for data, last, kept, target in media.videos:
        with av.open(io.BytesIO(data)) as container:
            for index, frame in enumerate(container.decode(container.streams.video[0])):
                if index in kept:
                    Image.fromarray(frame.to_ndarray(format="rgb24")).resize(target, Image.BICUBIC)
                if index >= last:
                    break
    return FloorSeconds(wall=time.perf_counter() - wall, cpu=time.process_time() - cpu)
