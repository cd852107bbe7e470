"""Pixel path (postencode): decode media and run the processor's own image/video processors.

Only the samples of a bin being emitted come here. Outputs are exactly the Hugging Face
processor's ``pixel_values`` / ``pixel_values_videos`` and grids, because the processor's own
image and video processors do the resizing, rescaling, normalising and patchifying. With
``uint8=True`` the rescale/normalise step is left to the device (``energon_pack.core.visual``):
the payload is the resized, patchified uint8 pixels, 4x smaller than float32.

Memory: media are decoded and patchified one image / one video at a time (each decoded
image or frame stack is freed before the next is decoded), and the patches are written
straight into the row's preallocated payload (:func:`allocate_row_pixels`: one tensor per
row and media kind, in shared memory inside a loader worker so that handing the row to the
main process copies nothing), instead of one tensor per sample concatenated afterwards.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from energon_pack.errors import BadSampleError
from energon_pack.core.stage_times import timed
from energon_pack.qwen.template import VideoTiming


def decode_image(
    data: bytes, *, draft_size: tuple[int, int] | None = None, apply_exif_orientation: bool = True
) -> Any:
    """Open and fully decode one image (PIL, first frame, original mode), turned upright by its EXIF
    orientation as ``transformers.image_utils.load_image`` does (``ImageOps.exif_transpose``; TIFFs
    Pillow orients itself); corrupt or truncated data is a bad sample. The mode is kept, so the
    processor's ``convert_to_rgb`` composites transparency on white.

    With ``draft_size`` (upright width, height), a JPEG at least twice that size on each side is
    decoded at the largest of 1/2, 1/4, 1/8 scale that stays at least ``draft_size`` (DCT-domain
    downscale, PIL ``Image.draft``, in the stored orientation), then resized to exactly
    ``draft_size`` (bicubic). Other images decode as is.
    Example: a 4000x3000 JPEG with ``draft_size=(980, 728)`` decodes at 1000x750, then 980x728; a
    64x22 JPEG with EXIF orientation 6 decodes to a 22x64 image (64x22 with
    ``apply_exif_orientation=False``).
    """
    from PIL import Image, ImageOps

    from energon_pack.qwen.media import SWAPPING_ORIENTATIONS, header_orientation

    try:
        image = Image.open(io.BytesIO(data))
        drafted = False
        if draft_size is not None and image.format == "JPEG":
            stored = draft_size
            if apply_exif_orientation and header_orientation(image, data) in SWAPPING_ORIENTATIONS:
                stored = (draft_size[1], draft_size[0])
            drafted = 2 * stored[0] <= image.width and 2 * stored[1] <= image.height
            if drafted:
                image.draft(image.mode, stored)
        image.load()
        if apply_exif_orientation:
            ImageOps.exif_transpose(image, in_place=True)
        if drafted and image.size != draft_size:
            image = image.resize(draft_size, Image.BICUBIC)
    except Image.DecompressionBombError as err:
        raise BadSampleError("pixel_bomb", str(err)) from None
    except Exception as err:  # PIL raises OSError, SyntaxError, ValueError... on bad data
        raise BadSampleError("corrupt_image", f"cannot decode image: {err}") from None
    return image


def decode_video_frames(data: bytes, frame_indices: Sequence[int], total_frames: int) -> np.ndarray:
    """Decode the frames at ``frame_indices`` of the first video stream as RGB uint8 [n, H, W, 3].

    The stream must hold exactly ``total_frames`` frames (what preencode counted); otherwise the
    sample is a bad sample (``media_mismatch``, or ``corrupt_video`` when decoding fails).
    """
    import av

    wanted = {index: position for position, index in enumerate(frame_indices)}
    # Filled in place (allocated at the first wanted frame): no list of frames, then a stacked copy.
    frames: np.ndarray | None = None
    decoded = 0
    try:
        with av.open(io.BytesIO(data)) as container:
            stream = container.streams.video[0]
            for frame in container.decode(stream):
                if decoded in wanted:
                    rgb = frame.to_ndarray(format="rgb24")
                    if frames is None:
                        frames = np.empty((len(frame_indices), *rgb.shape), dtype=np.uint8)
                    frames[wanted[decoded]] = rgb
                decoded += 1
    except BadSampleError:
        raise
    except Exception as err:
        raise BadSampleError("corrupt_video", f"cannot decode video after {decoded} frames: {err}") from None
    if decoded != total_frames:
        raise BadSampleError(
            "media_mismatch", f"video decodes to {decoded} frames but its header gave {total_frames}"
        )
    assert frames is not None  # total_frames >= 1 frames decoded, frame_indices within them
    return frames


def _check_grid(kind: str, got: torch.Tensor, expected: np.ndarray) -> None:
    if got.shape != expected.shape or not np.array_equal(got.numpy(), expected):
        raise BadSampleError(
            "media_mismatch",
            f"decoded {kind} grids {got.tolist()} differ from the header-based grids {expected.tolist()}",
        )


def _payload_kwargs(uint8: bool) -> dict[str, Any]:
    return {"do_rescale": False, "do_normalize": False} if uint8 else {}


@dataclass(frozen=True)
class PixelSlots:
    """Where one sample's patches go: views [P_img, D] / [P_vid, D] into its row's payload
    (None when the sample has no image / no video)."""

    images: torch.Tensor | None = None
    videos: torch.Tensor | None = None


def patch_rows(grid_thw: torch.Tensor | np.ndarray | None) -> int:
    """Patches (rows of the pixel payload) of some grids: sum of t*h*w.

    Example: ``patch_rows(np.array([[1, 4, 6], [2, 2, 2]]))`` -> 32; ``patch_rows(None)`` -> 0.
    """
    if grid_thw is None or len(grid_thw) == 0:
        return 0
    return int(np.asarray(grid_thw, dtype=np.int64).prod(axis=1).sum())


def in_loader_worker() -> bool:
    """Whether this process is a torch DataLoader (Energon) worker."""
    return torch.utils.data.get_worker_info() is not None


def allocate_row_pixels(
    image_grids: Sequence[torch.Tensor | np.ndarray | None],
    video_grids: Sequence[torch.Tensor | np.ndarray | None],
    *,
    patch_dim: int,
    dtype: torch.dtype,
    shared: bool,
) -> list[PixelSlots]:
    """One payload tensor per media kind for a whole row, cut into consecutive per-sample slots.

    ``image_grids[i]`` / ``video_grids[i]`` are sample i's grids [n, 3] (None: no such media);
    ``patch_dim`` = C*T*p*p (1176 for Qwen2/2.5-VL). ``shared`` puts the payload in shared
    memory (inside a loader worker: the row then reaches the main process without a copy).
    ``VisualInputs.concat`` of the filled slots returns the payload itself.
    Example: image grids ``[[[1, 2, 2]], None, [[1, 2, 4]]]``, no videos -> one [12, D] tensor,
    slots of 4, 0 and 8 rows (images None for the second sample).
    """

    def slots(grids: Sequence[Any]) -> list[torch.Tensor | None]:
        rows = [patch_rows(grid) for grid in grids]
        if not sum(rows):
            return [None] * len(grids)
        payload = torch.empty((sum(rows), patch_dim), dtype=dtype)
        if shared:
            payload.share_memory_()
        starts = np.concatenate([[0], np.cumsum(rows)[:-1]])
        return [
            payload.narrow(0, int(start), count) if grid is not None and count else None
            for grid, start, count in zip(grids, starts, rows)
        ]

    return [PixelSlots(images=i, videos=v) for i, v in zip(slots(image_grids), slots(video_grids))]


def _fill(
    out: torch.Tensor | None,
    expected_grid_thw: np.ndarray,
    parts: Sequence[Callable[[], Any]],
    *,
    kind: str,
    grid_key: str,
    pixel_key: str,
) -> torch.Tensor:
    """Run each of ``parts`` (one processor call per image / video) and put its patches into
    ``out`` one after the other (or concatenate them when ``out`` is None); each part's output
    is freed before the next part runs. Checks every grid against ``expected_grid_thw``."""
    chunks: list[torch.Tensor] = []
    start = 0
    for position, part in enumerate(parts):
        processed = part()
        _check_grid(kind, processed[grid_key], expected_grid_thw[position : position + 1])
        pixels = processed[pixel_key]
        del processed
        if out is None:
            chunks.append(pixels)
        else:
            with timed("row assembly"):
                out.narrow(0, start, pixels.shape[0]).copy_(pixels)
        start += pixels.shape[0]
        del pixels
    if out is not None:
        if start != out.shape[0]:
            raise BadSampleError(
                "media_mismatch", f"{kind}s decode to {start} patches but the header-based grids give {out.shape[0]}"
            )
        return out
    return chunks[0] if len(chunks) == 1 else torch.cat(chunks)


def image_pixels(
    processor: Any,
    images: Sequence[bytes],
    expected_grid_thw: np.ndarray,
    *,
    uint8: bool = False,
    max_pixels: int | None = None,
    fast_jpeg: bool = False,
    apply_exif_orientation: bool = True,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``pixel_values`` [P, C*T*p*p] (float32, or uint8 with ``uint8=True``) of a sample's images;
    ``max_pixels`` overrides the processor's pixel limit per image for this call (a shrunk sample).

    Images are decoded and processed one at a time (each freed once patchified), which gives the
    same patches as one processor call on all of them. With ``out`` (a [P, C*T*p*p] slot of the
    row's payload, see :func:`allocate_row_pixels`) the patches are written there and ``out`` is
    returned. ``fast_jpeg`` decodes big JPEGs at reduced scale straight to the size the grid
    gives (:func:`decode_image` with ``draft_size``); ``apply_exif_orientation`` turns images
    upright as :func:`decode_image` says."""
    patch = int(processor.image_processor.patch_size)
    kwargs = _payload_kwargs(uint8)
    if max_pixels is not None:
        kwargs["size"] = {**dict(processor.image_processor.size), "longest_edge": max_pixels}

    def process(data: bytes, grid: np.ndarray) -> Callable[[], Any]:
        draft_size = (int(grid[2]) * patch, int(grid[1]) * patch) if fast_jpeg else None

        def run() -> Any:
            with timed("decode"):
                image = decode_image(data, draft_size=draft_size, apply_exif_orientation=apply_exif_orientation)
            with timed("resize/patchify"):
                return processor.image_processor(images=[image], return_tensors="pt", **kwargs)

        return run

    pixels = _fill(
        out, expected_grid_thw, [process(data, grid) for data, grid in zip(images, expected_grid_thw)],
        kind="image", grid_key="image_grid_thw", pixel_key="pixel_values",
    )
    return pixels.to(torch.uint8) if uint8 else pixels


def video_pixels(
    processor: Any,
    videos: Sequence[bytes],
    timings: Sequence[VideoTiming],
    expected_grid_thw: np.ndarray,
    *,
    uint8: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``pixel_values_videos`` [P, C*T*p*p] of a sample's videos, frames decoded with PyAV, one
    video at a time (its frames freed once patchified); ``out`` as in :func:`image_pixels`."""

    def process(data: bytes, timing: VideoTiming) -> Callable[[], Any]:
        def run() -> Any:
            with timed("decode"):
                frames = decode_video_frames(data, timing.frame_indices, timing.total_frames)
            with timed("resize/patchify"):
                return processor.video_processor(
                    videos=[frames],
                    video_metadata=[timing.metadata()],
                    do_sample_frames=False,
                    return_tensors="pt",
                    **_payload_kwargs(uint8),
                )

        return run

    pixels = _fill(
        out, expected_grid_thw, [process(data, timing) for data, timing in zip(videos, timings)],
        kind="video", grid_key="video_grid_thw", pixel_key="pixel_values_videos",
    )
    return pixels.to(torch.uint8) if uint8 else pixels
