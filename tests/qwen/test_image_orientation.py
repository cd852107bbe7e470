"""Images upright like Hugging Face: the header-only size (``probe_image``) and the decoded pixels
(``decode_image``) against what ``transformers.image_utils.load_image`` gives, for all 8 EXIF
orientations in every way JPEG, MPO, WebP, TIFF and PNG store them; other formats and limits."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image, ImageFile, TiffImagePlugin, WebPImagePlugin
from transformers.image_transforms import convert_to_rgb
from transformers.image_utils import load_image

from energon_pack.errors import BadSampleError
from energon_pack.qwen.media import BadMediaError, probe_image, upright_size
from energon_pack.qwen.pixels import decode_image

ORIENTATIONS = range(1, 9)
SIZE = (64, 22)  # w, h: not square, so a missed swap shows


def _pixels(width: int = SIZE[0], height: int = SIZE[1]) -> Image.Image:
    """A picture whose 8 orientations all differ (a gradient plus a corner mark)."""
    array = np.zeros((height, width, 3), np.uint8)
    array[..., 0] = np.linspace(0, 255, width, dtype=np.uint8)[None, :]
    array[..., 1] = np.linspace(0, 255, height, dtype=np.uint8)[:, None]
    array[:4, :4, 2] = 255
    return Image.fromarray(array)


def _exif(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif.tobytes()


def _save(image: Image.Image, image_format: str, **kwargs) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=image_format, **kwargs)
    return buffer.getvalue()


def _png_chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload) & 0xFFFFFFFF)


def _png_with_trailing(chunk: bytes) -> bytes:
    """A PNG without EXIF before IDAT and ``chunk`` inserted just before IEND."""
    data = _save(_pixels(), "PNG")
    assert data[-12:-8] == b"\0\0\0\0" and data[-8:-4] == b"IEND"
    return data[:-12] + chunk + data[-12:]


def encoded(kind: str, orientation: int) -> bytes:
    """One image of ``kind`` whose orientation is stored the way that kind's writers store it."""
    image = _pixels()
    if kind == "jpeg":
        return _save(image, "JPEG", exif=_exif(orientation), quality=95)
    if kind == "mpo":
        return _save(image, "MPO", save_all=True, append_images=[image], exif=_exif(orientation))
    if kind == "webp":
        return _save(image, "WEBP", exif=_exif(orientation), lossless=True)
    if kind == "tiff":
        return _save(image, "TIFF", tiffinfo={274: orientation})
    if kind == "png_exif_before_idat":
        return _save(image, "PNG", exif=_exif(orientation))
    if kind == "png_exif_after_idat":
        return _png_with_trailing(_png_chunk(b"eXIf", _exif(orientation)))
    if kind == "png_ztxt_raw_profile_after_idat":
        raw = _exif(orientation)
        text = f"\nexif\n{len(raw):8}\n{raw.hex()}\n".encode()
        return _png_with_trailing(_png_chunk(b"zTXt", b"Raw profile type exif\0\0" + zlib.compress(text)))
    if kind == "png_xmp_after_idat":
        xmp = f'<x:xmpmeta><rdf:Description tiff:Orientation="{orientation}"/></x:xmpmeta>'.encode()
        return _png_with_trailing(_png_chunk(b"iTXt", b"XML:com.adobe.xmp\0\0\0\0\0" + xmp))
    raise ValueError(kind)


KINDS = (
    "jpeg", "mpo", "webp", "tiff", "png_exif_before_idat", "png_exif_after_idat",
    "png_ztxt_raw_profile_after_idat", "png_xmp_after_idat",
)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("orientation", ORIENTATIONS)
def test_header_size_is_load_image_size(kind: str, orientation: int, monkeypatch: pytest.MonkeyPatch) -> None:
    data = encoded(kind, orientation)
    hf = load_image(Image.open(io.BytesIO(data)))
    with monkeypatch.context() as patch:  # header only: any decode fails the test
        for cls in (ImageFile.ImageFile, WebPImagePlugin.WebPImageFile, TiffImagePlugin.TiffImageFile):
            patch.setattr(cls, "load", lambda self: pytest.fail(f"{kind}: image_header decoded pixels"))
        header = probe_image(data)
        stored = probe_image(data, apply_exif_orientation=False)
    assert header.orientation == stored.orientation == orientation
    assert (header.width, header.height) == hf.size
    assert hf.size == (SIZE if orientation < 5 else SIZE[::-1])
    assert (stored.width, stored.height) == (hf.size if kind == "tiff" else SIZE)  # Pillow orients TIFFs itself


@pytest.mark.parametrize("kind", ("png_exif_before_idat", "png_exif_after_idat", "webp", "tiff", "mpo"))
@pytest.mark.parametrize("orientation", ORIENTATIONS)
def test_decode_upright_pixels_equal_load_image(kind: str, orientation: int) -> None:
    """Lossless kinds (and MPO, same decoder): the upright pixels are load_image's, exactly."""
    data = encoded(kind, orientation)
    ours = decode_image(data)
    assert ours.size == (probe_image(data).width, probe_image(data).height)
    np.testing.assert_array_equal(np.asarray(ours.convert("RGB")), np.asarray(load_image(Image.open(io.BytesIO(data)))))
    if orientation != 1:  # really rotated: differs from the stored pixels
        assert not np.array_equal(np.asarray(ours.convert("RGB")), np.asarray(_pixels()))


def test_orientation_off_keeps_stored_size() -> None:
    data = encoded("jpeg", 6)
    assert decode_image(data, apply_exif_orientation=False).size == SIZE
    tiff = encoded("tiff", 6)  # Pillow orients TIFFs on load whatever we ask
    assert decode_image(tiff, apply_exif_orientation=False).size == SIZE[::-1]


def test_upright_size_examples() -> None:
    assert upright_size(64, 22, 6, "JPEG") == (22, 64)
    assert upright_size(22, 64, 6, "TIFF") == (22, 64)
    assert upright_size(64, 22, 3, "JPEG") == (64, 22)


@pytest.mark.parametrize(
    "image_format, kwargs, mode",
    [
        ("GIF", {"save_all": True, "append_images": [_pixels().rotate(180)]}, "P"),
        ("BMP", {}, "RGB"),
        ("TIFF", {"compression": "tiff_lzw"}, "RGB"),
        ("PNG", {}, "RGBA"),
    ],
)
def test_other_formats_first_frame(image_format: str, kwargs: dict, mode: str) -> None:
    image = _pixels().convert(mode) if mode != "P" else _pixels().quantize(64)
    data = _save(image, image_format, **kwargs)
    header = probe_image(data)
    assert (header.format, header.orientation, (header.width, header.height)) == (image_format, 1, SIZE)
    np.testing.assert_array_equal(
        convert_to_rgb(decode_image(data), return_numpy=True), convert_to_rgb(Image.open(io.BytesIO(data)), return_numpy=True)
    )


def test_alpha_keeps_processor_white_composite() -> None:
    """decode_upright keeps RGBA, so the processor composites on white (today's behaviour);
    load_image's convert("RGB") would show the stored colour under transparent pixels."""
    array = np.zeros((8, 8, 4), np.uint8)
    array[..., 0] = 200  # red, fully transparent
    data = _save(Image.fromarray(array, "RGBA"), "PNG")
    assert convert_to_rgb(decode_image(data), return_numpy=True)[0, 0].tolist() == [255, 255, 255]
    assert list(load_image(Image.open(io.BytesIO(data))).getpixel((0, 0))) == [200, 0, 0]


def test_pixel_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    ok = _save(Image.new("RGB", (40, 40)), "PNG")  # 1600 px: above the warning, below 2x
    assert probe_image(ok).width == 40
    with pytest.raises(BadMediaError, match="max_image_pixels=1500") as error:
        probe_image(ok, max_pixels=1500)
    assert error.value.reason == "pixel_bomb"
    bomb = _save(Image.new("RGB", (50, 41)), "PNG")  # 2050 px > 2 * 1000: Pillow refuses to open
    with pytest.raises(BadMediaError) as error:
        probe_image(bomb, max_pixels=10**9)
    assert error.value.reason == "pixel_bomb"


def test_corrupt_header() -> None:
    with pytest.raises(BadMediaError) as error:
        probe_image(b"not an image")
    assert error.value.reason == "corrupt_image"


@pytest.mark.parametrize("orientation", (1, 6, 8))
def test_fast_jpeg_draft_decodes_in_the_stored_orientation(orientation: int) -> None:
    """With a draft size (upright width, height), a turned JPEG is drafted in its stored
    orientation, then turned, then resized: the same size as the exact path, pixels close to it."""
    data = _save(_pixels(640, 220), "JPEG", exif=_exif(orientation), quality=95)
    exact = decode_image(data)
    target = (exact.width // 4, exact.height // 4)
    drafted = decode_image(data, draft_size=target)
    assert drafted.size == target
    reference = np.asarray(exact.resize(target, Image.BICUBIC), dtype=np.int16)
    assert np.abs(np.asarray(drafted, dtype=np.int16) - reference).mean() < 8


def test_truncated_image_decode_is_a_bad_sample() -> None:
    data = _save(_pixels(), "PNG")
    with pytest.raises(BadSampleError) as error:
        decode_image(data[: len(data) // 2])
    assert error.value.reason == "corrupt_image"
