"""Header-only probing of images (PIL) and videos (PyAV) on media generated in memory."""

from __future__ import annotations

import io
import struct
import wave
import zlib
from fractions import Fraction

import av
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image, ImageFile

from energon_pack.qwen.media import (
    BadMediaError,
    ImageInfo,
    VideoInfo,
    probe_image,
    probe_video,
)


def encode_image(mode: str, size: tuple[int, int], fmt: str) -> bytes:
    """Noise image of ``size`` (w, h) in ``mode`` (RGBA with non-opaque alpha), saved as ``fmt``."""
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 4), dtype=np.uint8), "RGBA")
    if mode != "RGBA":
        image = image.convert("RGB").convert(mode)
    buffer = io.BytesIO()
    image.save(buffer, fmt)
    return buffer.getvalue()


def png_header(width: int, height: int) -> bytes:
    """A PNG that declares width x height but carries no pixel data (only IHDR, an empty IDAT, IEND)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", b"") + chunk(b"IEND", b"")


def encode_video(
    num_frames: int, fps: int | Fraction, size: tuple[int, int], *, container: str = "mp4", codec: str = "libx264"
) -> bytes:
    """``num_frames`` frames of ``size`` (w, h) at ``fps``, encoded in memory with PyAV."""
    width, height = size
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=container) as output:
        stream = output.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for index in range(num_frames):
            pixels = np.full((height, width, 3), (index * 37) % 256, dtype=np.uint8)
            output.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
        output.mux(stream.encode())
    return buffer.getvalue()


def header_frame_count(data: bytes) -> int:
    with av.open(io.BytesIO(data)) as container:
        return container.streams.video[0].frames


# ---------------------------------------------------------------- images


@pytest.mark.parametrize(
    ("fmt", "mode", "expected_mode"),
    [
        ("JPEG", "RGB", "RGB"),
        ("JPEG", "L", "L"),
        ("JPEG", "CMYK", "CMYK"),
        ("PNG", "RGB", "RGB"),
        ("PNG", "RGBA", "RGBA"),
        ("PNG", "L", "L"),
        ("PNG", "P", "P"),
        ("WEBP", "RGB", "RGB"),
        ("WEBP", "RGBA", "RGBA"),
        ("WEBP", "L", "RGB"),  # WebP stores no grey/palette modes
        ("WEBP", "P", "RGB"),
    ],
)
@pytest.mark.parametrize("size", [(1, 1), (37, 23), (640, 17), (90, 700)])
def test_probe_image_formats_and_modes(fmt, mode, expected_mode, size):
    info = probe_image(encode_image(mode, size, fmt))
    assert info == ImageInfo(width=size[0], height=size[1], format=fmt, mode=expected_mode)


def test_probe_image_reads_only_the_header_of_truncated_files():
    jpeg = encode_image("RGB", (321, 123), "JPEG")
    scan_header_end = jpeg.index(b"\xff\xda") + 14  # SOS marker + its 12-byte header: no entropy-coded data
    assert probe_image(jpeg[:scan_header_end]) == ImageInfo(width=321, height=123, format="JPEG", mode="RGB")
    png = encode_image("RGBA", (321, 123), "PNG")
    idat_data = png.index(b"IDAT") + 4  # first IDAT chunk header only, no compressed pixels
    assert probe_image(png[:idat_data]) == ImageInfo(width=321, height=123, format="PNG", mode="RGBA")


def test_probe_image_never_loads_pixels(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("pixel data was decoded")

    encoded = [encode_image(mode, (64, 32), fmt) for fmt, mode in [("JPEG", "RGB"), ("PNG", "P"), ("WEBP", "RGBA")]]
    monkeypatch.setattr(ImageFile.ImageFile, "load", refuse)
    monkeypatch.setattr(Image.Image, "load", refuse)
    for data in encoded:
        assert probe_image(data).width == 64


def test_probe_image_pixel_bomb():
    over_pil_hard_limit = png_header(30_000, 30_000)  # 9e8 px > 2 * Image.MAX_IMAGE_PIXELS: PIL refuses to open
    between_limits = png_header(10_000, 10_000)  # 1e8 px: above MAX_IMAGE_PIXELS (PIL only warns), accepted
    small = encode_image("RGB", (640, 480), "PNG")
    with pytest.raises(BadMediaError) as caught:
        probe_image(over_pil_hard_limit)
    assert caught.value.reason == "pixel_bomb" and "PIL.Image.MAX_IMAGE_PIXELS" in caught.value.detail
    assert probe_image(between_limits) == ImageInfo(width=10_000, height=10_000, format="PNG", mode="RGB")
    with pytest.raises(BadMediaError) as caught:
        probe_image(between_limits, max_pixels=10**8 - 1)
    assert caught.value.reason == "pixel_bomb" and "max_image_pixels=99999999" in caught.value.detail
    with pytest.raises(BadMediaError) as caught:
        probe_image(small, max_pixels=640 * 480 - 1)
    assert caught.value.reason == "pixel_bomb"
    assert probe_image(small, max_pixels=640 * 480).width == 640
    with pytest.raises(BadMediaError) as caught:  # a larger max_pixels cannot beat Pillow's own refusal
        probe_image(over_pil_hard_limit, max_pixels=10**12)
    assert caught.value.reason == "pixel_bomb"


def test_probe_image_pixel_bomb_follows_pil_setting(monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # default limit: 2 * 1000
    with pytest.raises(BadMediaError) as caught:
        probe_image(encode_image("RGB", (50, 41), "PNG"))
    assert caught.value.reason == "pixel_bomb"
    assert probe_image(encode_image("RGB", (50, 40), "PNG")).height == 40


@pytest.mark.parametrize(
    "data",
    [b"", b"not an image at all", b"\x89PNG\r\n\x1a\n", encode_image("RGB", (50, 50), "PNG")[:20],
     encode_image("RGB", (50, 50), "JPEG")[:100], png_header(0, 10)],
    ids=["empty", "text", "png-signature-only", "png-cut-in-ihdr", "jpeg-cut-before-frame", "zero-width"],
)
def test_probe_image_corrupt(data):
    with pytest.raises(BadMediaError) as caught:
        probe_image(data)
    assert caught.value.reason == "corrupt_image"
    assert isinstance(caught.value, ValueError)


SAMPLE_IMAGES = [encode_image("RGB", (40, 30), "JPEG"), encode_image("P", (40, 30), "PNG"),
                 encode_image("RGBA", (40, 30), "WEBP")]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(which=st.sampled_from(range(len(SAMPLE_IMAGES))), edits=st.lists(st.tuples(st.integers(0, 400),
                                                                                   st.integers(0, 255)), max_size=6))
def test_probe_image_mutated_bytes_fail_only_as_bad_media(which, edits):
    data = bytearray(SAMPLE_IMAGES[which])
    for position, value in edits:
        data[position % len(data)] = value
    try:
        info = probe_image(bytes(data))
    except BadMediaError as error:
        assert error.reason in {"corrupt_image", "pixel_bomb"}
    else:
        assert info.width >= 1 and info.height >= 1


# ---------------------------------------------------------------- videos


@pytest.mark.parametrize(
    ("num_frames", "fps", "size", "container", "codec", "expected_codec"),
    [
        (17, 30, (64, 48), "mp4", "libx264", "h264"),
        (1, 24, (32, 32), "mp4", "libx264", "h264"),
        (60, Fraction(30000, 1001), (96, 54), "mp4", "libx264", "h264"),
        (9, Fraction(5, 2), (128, 72), "mp4", "mpeg4", "mpeg4"),
        (25, 25, (48, 96), "avi", "mpeg4", "mpeg4"),
        (23, 10, (64, 48), "matroska", "libx264", "h264"),  # no frame count in the header: packets are counted
        (13, 24, (80, 60), "webm", "libvpx", "vp8"),
    ],
)
def test_probe_video_known_values(num_frames, fps, size, container, codec, expected_codec):
    data = encode_video(num_frames, fps, size, container=container, codec=codec)
    demuxer = {"mp4": "mov,mp4,m4a,3gp,3g2,mj2", "avi": "avi", "matroska": "matroska,webm", "webm": "matroska,webm"}
    assert probe_video(data) == VideoInfo(
        num_frames=num_frames, fps=float(fps), width=size[0], height=size[1], codec=expected_codec,
        container=demuxer[container], has_audio=False,
    )


def test_probe_video_counts_packets_when_header_has_no_count():
    data = encode_video(23, 10, (64, 48), container="matroska")
    assert header_frame_count(data) == 0  # the fixture really exercises the demux path
    assert probe_video(data).num_frames == 23
    assert header_frame_count(encode_video(23, 10, (64, 48), container="mp4")) == 23


def wav_bytes() -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as audio:
        audio.setnchannels(1)
        audio.setsampwidth(2)
        audio.setframerate(8000)
        audio.writeframes(b"\x00\x00" * 800)
    return buffer.getvalue()


def test_probe_video_no_video_stream():
    with pytest.raises(BadMediaError) as caught:
        probe_video(wav_bytes())
    assert caught.value.reason == "no_video_stream"


def test_probe_video_unsupported_codec():
    avi = encode_video(5, 10, (32, 32), container="avi", codec="mpeg4")
    assert avi.count(b"FMP4") == 2  # fourcc in the stream header and the bitmap header
    with pytest.raises(BadMediaError) as caught:
        probe_video(avi.replace(b"FMP4", b"ZZZZ"))  # a fourcc no FFmpeg decoder knows
    assert caught.value.reason == "unsupported_codec"


@pytest.mark.parametrize(
    "data",
    [b"", b"definitely not a video" * 20, encode_video(17, 30, (64, 48))[:200],
     encode_video(17, 30, (64, 48))[:-300]],
    ids=["empty", "text", "mp4-cut-early", "mp4-without-trailing-moov"],
)
def test_probe_video_corrupt(data):
    with pytest.raises(BadMediaError) as caught:
        probe_video(data)
    assert caught.value.reason == "corrupt_video"
    assert isinstance(caught.value, ValueError)


SAMPLE_VIDEOS = [encode_video(8, 10, (32, 32)), encode_video(8, 10, (32, 32), container="matroska")]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(which=st.sampled_from(range(len(SAMPLE_VIDEOS))),
       edits=st.lists(st.tuples(st.integers(0, 4000), st.integers(0, 255)), min_size=1, max_size=6))
def test_probe_video_mutated_bytes_fail_only_as_bad_media(which, edits):
    data = bytearray(SAMPLE_VIDEOS[which])
    for position, value in edits:
        data[position % len(data)] = value
    try:
        info = probe_video(bytes(data))
    except BadMediaError as error:
        assert error.reason in {"corrupt_video", "unsupported_codec", "no_video_stream"}
    else:
        assert info.num_frames >= 1 and info.fps > 0 and info.width >= 1 and info.height >= 1
