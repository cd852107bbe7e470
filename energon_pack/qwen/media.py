"""Header-only media probing: upright image size and exact video frame count/rate, no pixels decoded.

`probe_image` reads the image header through a lazy ``PIL.Image.open`` (never ``load()``) and the
EXIF orientation ``PIL.ImageOps.exif_transpose`` will apply (``transformers.image_utils.load_image``
applies it), so the size it reports is the size the processor sees. `probe_video` reads the
container through PyAV and counts the frames a decoder outputs from the demuxed packets (no
decoding). Every failure is a `BadMediaError` whose ``reason`` is a short snake_case skip-count key.

Image format quirks (Pillow 13, docs/on_disk_format.md):

- TIFF: Pillow reports the oriented size at open and transposes on ``load()``, so its size is
  never swapped again (TIFFs are upright whatever ``apply_exif_orientation`` says).
- PNG: ``PngImageFile.getexif()`` decodes every pixel when no ``eXIf`` chunk precedes IDAT, because
  EXIF / XMP chunks may follow IDAT; those chunks are found here by walking the chunk lengths.
- JPEG/MPO, WebP: EXIF and XMP are read at open. GIF, BMP: no EXIF (orientation 1).
- An XMP ``tiff:Orientation`` counts when EXIF has none (as ``Image.getexif`` does).

Video frame counts (each rule checked against a full decode in tests/qwen/test_video_probe.py):

- Demuxed packets of the first video stream with ``size > 0`` (PyAV ends with an empty flush
  packet) and not ``is_discard`` (an MP4 edit list hides them).
- VP8 / VP9: a packet may hold a frame the decoder never shows (an alt-ref frame muxed on its
  own); its ``show_frame`` / ``show_existing_frame`` header bits are read (VP9: per frame of a
  superframe). H.264, HEVC, AV1, MPEG-4 Part 2: one shown frame per packet.
- The header's ``stream.frames`` is not T: Matroska/WebM have none, AVI counts zero-size "drop"
  chunks that decode to nothing. A file cut short is found against the container's index
  (non-empty ``stream.index_entries``, complete for MP4/MOV/AVI).
- Frames are used as stored: a display matrix (phone videos) is not applied, as
  ``transformers.video_utils.load_video`` does with its default pyav backend.
"""

from __future__ import annotations

import struct
import warnings
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from io import BytesIO

import av
from PIL import ExifTags, Image

from energon_pack.errors import BadSampleError

#: EXIF orientations whose transpose swaps width and height (transpose, rotate 270, transverse, rotate 90).
SWAPPING_ORIENTATIONS = frozenset((5, 6, 7, 8))
_ORIENTATION_TAG = ExifTags.Base.Orientation  # 0x0112
#: ``image.info`` keys Pillow reads EXIF / XMP orientation from.
_EXIF_INFO_KEYS = ("exif", "Raw profile type exif", "XML:com.adobe.xmp", "xmp")
#: PNG text-chunk keywords Pillow turns into EXIF / XMP.
_PNG_EXIF_KEYWORDS = (b"Raw profile type exif", b"XML:com.adobe.xmp")


class BadMediaError(BadSampleError):
    """A sample's media cannot be used; ``reason`` is the skip-count key (e.g. ``"corrupt_image"``).

    A `BadSampleError`, so preencode turns it into a skip marker instead of crashing the worker.
    """


@dataclass(frozen=True, kw_only=True)
class ImageInfo:
    """Image header facts: the size the processor sees in pixels (upright, after the EXIF
    orientation when it is applied), PIL format name (``"JPEG"``, ``"PNG"``, ...), PIL mode at open,
    and the EXIF ``orientation`` read from the header (1-8; 1 when absent or out of range).
    Animated GIF/WebP and MPO: the first frame (what PIL decodes)."""

    width: int
    height: int
    format: str
    mode: str
    orientation: int = 1


#: ``VideoInfo.container`` of a video given as a list of encoded frames (`probe_frame_list`).
FRAME_LIST = "frame list"


@dataclass(frozen=True, kw_only=True)
class VideoInfo:
    """First video stream facts: frame count T (frames a decoder outputs), average rate in
    frames/s (``stream.average_rate``), stored frame size in pixels, decoder name (``codec``),
    FFmpeg demuxer name (``container``, e.g. ``"matroska,webm"``) and whether an audio stream is there
    (ignored)."""

    num_frames: int
    fps: float
    width: int
    height: int
    codec: str
    container: str = ""
    has_audio: bool = False

    @property
    def is_frame_list(self) -> bool:
        """Whether the video is a list of encoded frames (`probe_frame_list`), not a file."""
        return self.container == FRAME_LIST


def default_max_image_pixels() -> int | None:
    """The largest image Pillow opens at all: ``2 * PIL.Image.MAX_IMAGE_PIXELS`` at call time
    (178,956,970 unless changed; None when that global is None). Example: -> 178956970."""
    return None if Image.MAX_IMAGE_PIXELS is None else 2 * Image.MAX_IMAGE_PIXELS


def upright_size(width: int, height: int, orientation: int, image_format: str) -> tuple[int, int]:
    """(width, height) after ``exif_transpose``: swapped for orientations 5-8, except TIFF, whose
    size Pillow reports already oriented.

    Example: ``upright_size(64, 22, 6, "JPEG")`` -> ``(22, 64)``; ``upright_size(22, 64, 6, "TIFF")``
    -> ``(22, 64)``; ``upright_size(64, 22, 3, "JPEG")`` -> ``(64, 22)``.
    """
    if orientation in SWAPPING_ORIENTATIONS and image_format != "TIFF":
        return height, width
    return width, height


def _png_chunks_after_idat(data: bytes) -> list[tuple[bytes, bytes]]:
    """``(type, payload)`` of the chunks after the first IDAT that can carry EXIF/XMP (``eXIf``,
    ``tEXt``, ``zTXt``, ``iTXt``); IDAT payloads are skipped by length, never inflated.

    Example: a PNG written with ``exif=`` by Pillow -> ``[]`` (Pillow writes eXIf before IDAT).
    """
    found: list[tuple[bytes, bytes]] = []
    position, seen_idat = 8, False
    while position + 8 <= len(data):
        length, kind = struct.unpack_from(">I4s", data, position)
        if kind == b"IDAT":
            seen_idat = True
        elif seen_idat and kind in (b"eXIf", b"tEXt", b"zTXt", b"iTXt"):
            found.append((kind, bytes(data[position + 8 : position + 8 + length])))
        elif kind == b"IEND":
            break
        position += 12 + length
    return found


def _png_text(kind: bytes, payload: bytes) -> tuple[str, str] | None:
    """(keyword, text) of a tEXt/zTXt/iTXt chunk Pillow maps to EXIF/XMP, else None (a broken
    chunk too: Pillow ignores it)."""
    keyword, _, rest = payload.partition(b"\0")
    if keyword not in _PNG_EXIF_KEYWORDS:
        return None
    try:
        if kind == b"tEXt":
            text = rest
        elif kind == b"zTXt":
            text = zlib.decompress(rest[1:])
        else:
            compressed, rest = rest[0], rest[2:]
            _language, _, rest = rest.partition(b"\0")
            _translated, _, text = rest.partition(b"\0")
            text = zlib.decompress(text) if compressed else text
    except (IndexError, zlib.error):
        return None
    return keyword.decode("latin-1"), text.decode("utf-8" if kind == b"iTXt" else "latin-1", "replace")


def _png_orientation(image: Image.Image, data: bytes) -> int:
    """EXIF orientation of a PNG as ``exif_transpose`` sees it after ``load()``, without decoding:
    chunks before IDAT are in ``image.info``, those after IDAT are read from ``data``."""
    trailing = _png_chunks_after_idat(data)
    if not trailing and not any(key in image.info for key in _EXIF_INFO_KEYS):
        return 1
    info = dict(image.info)
    for kind, payload in trailing:
        if kind == b"eXIf":
            info["exif"] = payload
        elif (text := _png_text(kind, payload)) is not None:
            info[text[0]] = text[1]
    probe = Image.new("1", (1, 1))
    probe.info = info
    return int(Image.Image.getexif(probe).get(_ORIENTATION_TAG, 1))


def header_orientation(image: Image.Image, data: bytes) -> int:
    """The EXIF orientation ``exif_transpose`` will read (1-8 as stored, 1 when absent), from the
    lazily opened ``image`` of ``data``; no pixel is decoded. Example: a JPEG saved with EXIF
    orientation 6 -> 6; a PNG without EXIF -> 1."""
    if image.format == "PNG":
        return _png_orientation(image, data)
    if image.format == "TIFF":
        return int(image.tag_v2.get(_ORIENTATION_TAG, 1))  # type: ignore[attr-defined]
    if not any(key in image.info for key in _EXIF_INFO_KEYS):
        return 1  # no EXIF or XMP at all: Image.getexif would find nothing
    return int(image.getexif().get(_ORIENTATION_TAG, 1))


def probe_image(data: bytes, *, max_pixels: int | None = None, apply_exif_orientation: bool = True) -> ImageInfo:
    """Upright size, format, mode and EXIF orientation of an encoded image, from its header only.

    ``max_pixels`` (stored width*height, ``RowLayout.max_image_pixels``) defaults to
    `default_max_image_pixels` (2 * ``PIL.Image.MAX_IMAGE_PIXELS``, the largest image Pillow opens);
    larger images raise ``BadMediaError("pixel_bomb")``, and so do images Pillow itself refuses.
    ``apply_exif_orientation`` (``RowLayout.apply_exif_orientation``): report the size after the EXIF
    orientation, as ``transformers.image_utils.load_image`` turns the image; False: the stored
    size (TIFFs excepted: Pillow orients those itself). Unreadable headers raise
    ``BadMediaError("corrupt_image")``.

    Example: probe_image(<64x22 JPEG with EXIF orientation 6>) -> ImageInfo(width=22, height=64,
    format="JPEG", mode="RGB", orientation=6).
    """
    limit = default_max_image_pixels() if max_pixels is None else max_pixels
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(BytesIO(data)) as image:
                (width, height), image_format, mode = image.size, image.format or "", image.mode
                orientation = header_orientation(image, data)
    except Image.DecompressionBombError as error:
        raise BadMediaError(
            "pixel_bomb", f"{error}; Pillow refuses images above 2 * PIL.Image.MAX_IMAGE_PIXELS; fix: shrink the "
            "image, or raise PIL.Image.MAX_IMAGE_PIXELS in the training script (and max_image_pixels)",
        ) from error
    except Exception as error:  # PIL plugins raise assorted types (OSError, SyntaxError, struct.error, ...)
        raise BadMediaError("corrupt_image", f"image header unreadable ({type(error).__name__}: {error})") from error
    if width < 1 or height < 1:
        raise BadMediaError("corrupt_image", f"image header gives an empty size {width}x{height} (w x h)")
    if limit is not None and width * height > limit:
        raise BadMediaError(
            "pixel_bomb",
            f"{width}x{height} (w x h) = {width * height} pixels exceeds max_image_pixels={limit}; fix: shrink "
            f"the image or raise max_image_pixels (at most 2 * PIL.Image.MAX_IMAGE_PIXELS = "
            f"{default_max_image_pixels()}, above which Pillow refuses to open it)",
        )
    orientation = orientation if orientation in range(1, 9) else 1  # exif_transpose ignores other values
    if apply_exif_orientation:
        width, height = upright_size(width, height, orientation, image_format)
    return ImageInfo(width=width, height=height, format=image_format, mode=mode, orientation=orientation)


def vp8_shown(frame: bytes | memoryview) -> int:
    """1 when a VP8 frame is shown, else 0: bit 4 of the frame tag's first byte (RFC 6386 9.1).

    Example: ``vp8_shown(b"\\x10\\x02\\x00")`` -> 1; ``vp8_shown(b"\\x00\\x02\\x00")`` -> 0.
    """
    return (frame[0] >> 4) & 1 if len(frame) else 0


def _vp9_frame_shown(frame: bytes | memoryview) -> int:
    """1 when one VP9 frame (not a superframe) is output: ``show_existing_frame`` or ``show_frame`` of
    its uncompressed header (VP9 spec 6.2). Bits from the MSB of byte 0: frame_marker (2),
    profile_low, profile_high, [reserved_zero when profile 3], show_existing_frame, frame_type, show_frame.
    Example: ``_vp9_frame_shown(bytes([0b10000010, 0]))`` -> 1."""
    if not len(frame):
        return 0
    bits = int.from_bytes(bytes(frame[:2]).ljust(2, b"\0"), "big")
    position = 13  # after the 2-bit frame marker
    profile = ((bits >> position) & 1) | (((bits >> (position - 1)) & 1) << 1)
    position -= 2 + (profile == 3)
    if (bits >> position) & 1:  # show_existing_frame
        return 1
    return (bits >> (position - 2)) & 1  # show_frame, after frame_type


def vp9_shown(packet: bytes | memoryview) -> int:
    """Frames a VP9 packet outputs: the shown frames of its superframe (index at the packet's end,
    VP9 spec Annex B), or of the packet as one frame.

    Example: a superframe of an alt-ref (hidden) frame and a shown frame -> 1.
    """
    if not len(packet):
        return 0
    marker = packet[-1]
    if marker & 0xE0 == 0xC0:
        frames, size_bytes = (marker & 0x7) + 1, ((marker >> 3) & 0x3) + 1
        index_size = 2 + size_bytes * frames
        if len(packet) >= index_size and packet[-index_size] == marker:
            shown, offset, index = 0, 0, packet[len(packet) - index_size + 1 : len(packet) - 1]
            for i in range(frames):
                size = int.from_bytes(bytes(index[i * size_bytes : (i + 1) * size_bytes]), "little")
                shown += _vp9_frame_shown(packet[offset : offset + size])
                offset += size
            return shown
    return _vp9_frame_shown(packet)


#: Frames a packet outputs, for codecs whose packets may hold a hidden frame (by decoder name).
SHOWN_FRAMES = {"vp8": vp8_shown, "libvpx": vp8_shown, "vp9": vp9_shown, "libvpx-vp9": vp9_shown}


def probe_video(data: bytes) -> VideoInfo:
    """Frame count, average frame rate, frame size, codec and container of the first video stream
    (audio ignored).

    T is the number of frames a decoder outputs, counted from the stream's demuxed packets without
    decoding (see the module notes); fps is ``stream.average_rate``. Raises `BadMediaError` with
    reason ``corrupt_video`` (unreadable container, cut short against its index, no frames, no rate
    or size), ``no_video_stream`` or ``unsupported_codec`` (no decoder in this FFmpeg build).

    Example: probe_video(<WebM bytes, 24 VP9 frames of 96x64 at 12 fps>) -> VideoInfo(num_frames=24,
    fps=12.0, width=96, height=64, codec="vp9", container="matroska,webm", has_audio=False).
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
                "unsupported_codec",
                f"this FFmpeg build has no decoder for the codec of video stream #{stream.index} in "
                f"{container.format.name!r} (FFmpeg gives no codec name then); fix: re-encode the video, e.g. "
                "H.264 in MP4",
            )
        codec = stream.codec_context.name
        width, height = stream.codec_context.width, stream.codec_context.height
        rate = stream.average_rate
        present, num_frames = _count_frames(container, stream)
        # Fewer packets than the header's count: cut short, unless the header counted zero-size
        # (AVI "drop") chunks; the index (read only then: it costs per entry) tells them apart.
        indexed = sum(1 for entry in stream.index_entries if entry.size > 0) if present < stream.frames else 0
        info = VideoInfo(
            num_frames=num_frames, fps=float(rate or 0), width=width, height=height, codec=codec,
            container=container.format.name, has_audio=bool(container.streams.audio),
        )
    if 0 < present < indexed:
        raise BadMediaError("corrupt_video", f"cut short: the index lists {indexed} packets, the file holds {present}")
    if num_frames < 1:
        raise BadMediaError("corrupt_video", f"first video stream ({codec}) has no frames")
    if not rate or rate <= 0:
        raise BadMediaError("corrupt_video", f"first video stream ({codec}) has no average frame rate")
    if width < 1 or height < 1:
        raise BadMediaError("corrupt_video", f"first video stream ({codec}) has an empty size {width}x{height}")
    return info


def probe_frame_list(frames: Sequence[bytes], *, fps: float, max_pixels: int | None = None) -> VideoInfo:
    """A video given as its encoded frames (JPEG, PNG, ...: Megatron-Bridge's frame lists): T is the
    number of frames, the size that of the first frame's header, and ``fps`` the rate the caller
    says the frames were taken at (the processor's sampling rate: docs/foreign_datasets.md). Every
    frame's header is read (no pixel decode) to check they share the first one's size.

    Raises `BadMediaError`: ``corrupt_video`` (no frames), ``mixed_frame_sizes``, or a frame's own
    image reason (``corrupt_image``, ``pixel_bomb``). EXIF orientation is not applied to frames.
    Example: probe_frame_list([<64x48 JPEG>] * 4, fps=2.0) -> VideoInfo(num_frames=4, fps=2.0,
    width=64, height=48, codec="jpeg", container="frame list").
    """
    if not frames:
        raise BadMediaError("corrupt_video", "the frame list is empty")
    first = probe_image(frames[0], max_pixels=max_pixels, apply_exif_orientation=False)
    for number, frame in enumerate(frames[1:], start=1):
        info = probe_image(frame, max_pixels=max_pixels, apply_exif_orientation=False)
        if (info.width, info.height) != (first.width, first.height):
            raise BadMediaError(
                "mixed_frame_sizes",
                f"frame {number} is {info.width}x{info.height}, frame 0 {first.width}x{first.height}; the frames of "
                "one video must share one size (fix: resize the frames when writing the dataset)",
            )
    return VideoInfo(
        num_frames=len(frames), fps=float(fps), width=first.width, height=first.height, codec=first.format.lower(),
        container=FRAME_LIST,
    )


def _count_frames(container: av.container.InputContainer, stream: av.video.stream.VideoStream) -> tuple[int, int]:
    """``(present, shown)``: non-empty packets of ``stream``, and the frames a decoder outputs for
    them (not marked discard; VP8/VP9: by their show bits). Demuxes, never decodes.

    Example: a 24-frame VP8 WebM whose 6th packet is a hidden frame -> ``(24, 23)``.
    """
    shown_of = SHOWN_FRAMES.get(stream.codec_context.name)
    present = shown = 0
    try:
        for packet in container.demux(stream):
            if packet.size <= 0:
                continue
            present += 1
            if not packet.is_discard:
                shown += 1 if shown_of is None else shown_of(memoryview(packet))
    except av.FFmpegError as error:
        raise BadMediaError("corrupt_video", f"demuxing failed after {present} packets ({error})") from error
    return present, shown
