"""Pixel path (postencode): decode media and run the processor's own image/video processors.

Only the samples of a bin being emitted come here. Outputs are exactly the Hugging Face
processor's ``pixel_values`` / ``pixel_values_videos`` and grids, because the processor's own
image and video processors do the resizing, rescaling, normalising and patchifying. With
``uint8=True`` the rescale/normalise step is left to the device (``energon_pack.visual``):
the payload is the resized, patchified uint8 pixels, 4x smaller than float32.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from energon_pack.errors import BadSampleError
from energon_pack.qwen.template import VideoTiming


def decode_image(data: bytes) -> Any:
    """Open and fully decode one image (PIL, original mode); corrupt or truncated data is a bad sample."""
    from PIL import Image

    try:
        image = Image.open(io.BytesIO(data))
        image.load()
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
    frames: list[np.ndarray | None] = [None] * len(frame_indices)
    decoded = 0
    try:
        with av.open(io.BytesIO(data)) as container:
            stream = container.streams.video[0]
            for frame in container.decode(stream):
                if decoded in wanted:
                    frames[wanted[decoded]] = frame.to_ndarray(format="rgb24")
                decoded += 1
    except BadSampleError:
        raise
    except Exception as err:
        raise BadSampleError("corrupt_video", f"cannot decode video after {decoded} frames: {err}") from None
    if decoded != total_frames:
        raise BadSampleError(
            "media_mismatch", f"video decodes to {decoded} frames but its header gave {total_frames}"
        )
    return np.stack(frames)  # type: ignore[arg-type]


def _check_grid(kind: str, got: torch.Tensor, expected: np.ndarray) -> None:
    if got.shape != expected.shape or not np.array_equal(got.numpy(), expected):
        raise BadSampleError(
            "media_mismatch",
            f"decoded {kind} grids {got.tolist()} differ from the header-based grids {expected.tolist()}",
        )


def _payload_kwargs(uint8: bool) -> dict[str, Any]:
    return {"do_rescale": False, "do_normalize": False} if uint8 else {}


def image_pixels(
    processor: Any,
    images: Sequence[bytes],
    expected_grid_thw: np.ndarray,
    *,
    uint8: bool = False,
    max_pixels: int | None = None,
) -> torch.Tensor:
    """``pixel_values`` [P, C*T*p*p] (float32, or uint8 with ``uint8=True``) of a sample's images;
    ``max_pixels`` overrides the processor's pixel limit per image for this call (a shrunk sample)."""
    decoded = [decode_image(data) for data in images]
    kwargs = _payload_kwargs(uint8)
    if max_pixels is not None:
        kwargs["size"] = {**dict(processor.image_processor.size), "longest_edge": max_pixels}
    out = processor.image_processor(images=decoded, return_tensors="pt", **kwargs)
    _check_grid("image", out["image_grid_thw"], expected_grid_thw)
    pixels = out["pixel_values"]
    return pixels.to(torch.uint8) if uint8 else pixels


def video_pixels(
    processor: Any,
    videos: Sequence[bytes],
    timings: Sequence[VideoTiming],
    expected_grid_thw: np.ndarray,
    *,
    uint8: bool = False,
) -> torch.Tensor:
    """``pixel_values_videos`` [P, C*T*p*p] of a sample's videos, frames decoded with PyAV."""
    frames = [
        decode_video_frames(data, timing.frame_indices, timing.total_frames) for data, timing in zip(videos, timings)
    ]
    out = processor.video_processor(
        videos=frames,
        video_metadata=[timing.metadata() for timing in timings],
        do_sample_frames=False,
        return_tensors="pt",
        **_payload_kwargs(uint8),
    )
    _check_grid("video", out["video_grid_thw"], expected_grid_thw)
    pixels = out["pixel_values_videos"]
    return pixels.to(torch.uint8) if uint8 else pixels
