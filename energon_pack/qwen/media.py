"""Header-only media probing: image size and video frame count/rate without decoding pixels.

`probe_image` reads the image header through a lazy ``PIL.Image.open`` (never
``load()``); `probe_video` reads container metadata through PyAV and, when the
header has no frame count, counts demuxed packets (no decoding). Every failure
is a `BadMediaError` whose ``reason`` is a short snake_case skip-count key.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from io import BytesIO

import av
from PIL import Image

from energon_pack.errors import BadSampleError


class BadMediaError(BadSampleError):
    """A sample's media cannot be used; ``reason`` is the skip-count key (e.g. ``"corrupt_image"``).

    A `BadSampleError`, so preencode turns it into a skip marker instead of crashing the worker.
    """


@dataclass(frozen=True, kw_only=True)
class ImageInfo:
    """Image header facts: size in pixels, PIL format name (``"JPEG"``, ``"PNG"``, ...) and PIL mode."""

    width: int
    height: int
    format: str
    mode: str


@dataclass(frozen=True, kw_only=True)
class VideoInfo:
    """First video stream facts: frame count T, average rate in frames/s, frame size in pixels, codec name."""

    num_frames: int
    fps: float
    width: int
    height: int
    codec: str


def probe_image(data: bytes, *, max_pixels: int | None = None) -> ImageInfo:
    """Size, format and mode of an encoded image, from its header only.

    ``max_pixels`` (width*height) defaults to PIL's ``Image.MAX_IMAGE_PIXELS`` at call time
    (89,478,485 unless changed; None there disables the default guard); larger images raise
    ``BadMediaError("pixel_bomb")``. PIL itself refuses images over 2 * ``Image.MAX_IMAGE_PIXELS``
    whatever ``max_pixels`` says; that is reported as ``pixel_bomb`` too.
    Unreadable headers raise ``BadMediaError("corrupt_image")``.

    Example: probe_image(<PNG bytes of a 640x480 RGB image>) -> ImageInfo(width=640, height=480,
    format="PNG", mode="RGB").
    """
    limit = Image.MAX_IMAGE_PIXELS if max_pixels is None else max_pixels
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(BytesIO(data)) as image:
                width, height = image.size
                info = ImageInfo(width=width, height=height, format=image.format or "", mode=image.mode)
    except Image.DecompressionBombError as error:
        raise BadMediaError("pixel_bomb", f"{error}") from error
    except Exception as error:  # PIL plugins raise assorted types (OSError, SyntaxError, struct.error, ...)
        raise BadMediaError("corrupt_image", f"image header unreadable ({type(error).__name__}: {error})") from error
    if width < 1 or height < 1:
        raise BadMediaError("corrupt_image", f"image header gives an empty size {width}x{height} (w x h)")
    if limit is not None and width * height > limit:
        raise BadMediaError(
            "pixel_bomb",
            f"{width}x{height} (w x h) = {width * height} pixels exceeds the limit of {limit} pixels; "
            "shrink the image or raise max_pixels",
        )
    return info


def probe_video(data: bytes) -> VideoInfo:
    """Frame count, average frame rate, frame size and codec of the first video stream.

    T is the number of frames a decoder outputs, counted from the stream's demuxed packets
    (non-empty, not marked discard by an edit list) without decoding;
    fps is ``stream.average_rate``. Raises `BadMediaError` with reason
    ``corrupt_video`` (unreadable container, no frames, no rate or size),
    ``no_video_stream`` or ``unsupported_codec`` (no decoder in this FFmpeg build).

    Example: probe_video(<MP4 bytes, 17 h264 frames of 64x48 at 30 fps>) ->
    VideoInfo(num_frames=17, fps=30.0, width=64, height=48, codec="h264").
    """
    try:
        container = av.open(BytesIO(data), mode="r")
    except (av.FFmpegError, OSError, UnicodeDecodeError) as error:  # garbage metadata is not UTF-8
        raise BadMediaError("corrupt_video", f"container unreadable ({error})") from error
    with container:
        if not container.streams.video:
            raise BadMediaError("no_video_stream", f"container has streams {[s.type for s in container.streams]}")
        stream = container.streams.video[0]
        if stream.codec_context is None:
            raise BadMediaError(
                "unsupported_codec", f"this FFmpeg build has no decoder for video stream #{stream.index}"
            )
        codec = stream.codec_context.name
        width, height = stream.codec_context.width, stream.codec_context.height
        rate = stream.average_rate
        listed = stream.frames
        present, num_frames = _count_packets(container, stream)
    if 0 < present < listed:
        raise BadMediaError("corrupt_video", f"truncated: the header lists {listed} frames, the file holds {present}")
    if num_frames < 1:
        raise BadMediaError("corrupt_video", f"first video stream ({codec}) has no frames")
    if not rate or rate <= 0:
        raise BadMediaError("corrupt_video", f"first video stream ({codec}) has no average frame rate")
    if width < 1 or height < 1:
        raise BadMediaError("corrupt_video", f"first video stream ({codec}) has an empty size {width}x{height}")
    return VideoInfo(num_frames=num_frames, fps=float(rate), width=width, height=height, codec=codec)


def _count_packets(container: av.container.InputContainer, stream: av.video.stream.VideoStream) -> tuple[int, int]:
    """``(present, shown)``: non-empty packets of ``stream``, and those not marked discard.

    Demuxes, never decodes. ``shown`` is the number of frames a decoder outputs: the header's
    frame count also includes frames an MP4 edit list hides (stream-copy cuts, phone videos), and
    some containers have no count at all. ``present`` below the header's count means the file
    was cut short.
    """
    present = shown = 0
    try:
        for packet in container.demux(stream):
            if packet.size > 0:
                present += 1
                shown += not packet.is_discard
    except av.FFmpegError as error:
        raise BadMediaError("corrupt_video", f"demuxing failed ({error})") from error
    return present, shown
