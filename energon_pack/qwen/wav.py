"""Plain PCM WAV files read without FFmpeg: the header's sample count and the samples as float.

FFmpeg's WAV demuxer is slow on in-memory files (opening a 12-s 44.1 kHz stereo WAV through
PyAV costs about 24 ms on the 2-core bench machine: it scans the data for S/PDIF), while the
RIFF header says everything: the rate, the channels, the sample format and the data chunk's
length. `read_wav` reads that header; `WavPcm.planes` converts the samples exactly as FFmpeg
does (its PCM decoder, then ``swresample``'s conversion to float, docs/omni.md): s16 / 32768,
24-bit as its 32-bit left-shifted value / 2**31, s32 rounded to float32 then / 2**31, u8 as
(x - 128) / 128, float32 as is, float64 rounded to float32.

Only the plain case is read here (format tag PCM or IEEE float, or WAVE_FORMAT_EXTENSIBLE with
one of those sub-formats; mono or stereo; 1-768 kHz; 8/16/24/32-bit integers or 32/64-bit floats; a ``data`` chunk that lies
whole inside the file and holds whole sample frames); anything else is None, and the caller
opens the file with FFmpeg as before.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

__all__ = ["WavPcm", "as_float", "read_wav"]

_PCM, _FLOAT, _EXTENSIBLE = 1, 3, 0xFFFE
#: The sub-format GUID of WAVE_FORMAT_EXTENSIBLE after its leading format tag (KSDATAFORMAT_SUBTYPE_*).
_GUID_TAIL = bytes.fromhex("000000001000800000aa00389b71")
#: Sample rates outside these (Hz) are left to FFmpeg (no real recording has them).
_MIN_RATE, _MAX_RATE = 1000, 768_000
#: Channel count -> FFmpeg's layout name (more channels: FFmpeg reads the file).
_LAYOUTS = {1: "mono", 2: "stereo"}
#: (format tag, bits per sample) -> the little-endian NumPy dtype the samples are stored as.
_DTYPES = {(_PCM, 8): "u1", (_PCM, 16): "<i2", (_PCM, 32): "<i4", (_FLOAT, 32): "<f4", (_FLOAT, 64): "<f8"}


@dataclass(frozen=True, kw_only=True)
class WavPcm:
    """A PCM WAV file's header facts: ``rate`` (Hz), ``channels``, ``frames`` (samples per
    channel in the data chunk), the ``codec`` FFmpeg names it by (e.g. ``"pcm_s16le"``) and where
    the samples lie in ``data`` (``offset``, ``tag``, ``bits``)."""

    data: bytes
    rate: int
    channels: int
    frames: int
    codec: str
    offset: int
    tag: int
    bits: int

    @property
    def layout(self) -> str:
        """FFmpeg's name of the channel layout. Example: 2 channels -> "stereo"."""
        return _LAYOUTS[self.channels]

    def planes(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Sample frames ``start`` to ``stop`` (None: the end) as float32 planes [channels, n],
        converted as FFmpeg converts them. Example: s16 frames ``[0, 16384]`` mono -> ``[[0.0, 0.5]]``."""
        stop = self.frames if stop is None else min(stop, self.frames)
        width = self.bits // 8 * self.channels
        raw = memoryview(self.data)[self.offset + start * width : self.offset + stop * width]
        if self.bits == 24:  # little-endian 3-byte integers, placed in the top of an int32 as FFmpeg does
            triples = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 3).astype(np.uint32)
            stored = ((triples[:, 0] << 8) | (triples[:, 1] << 16) | (triples[:, 2] << 24)).view(np.int32)
        else:
            stored = np.frombuffer(raw, dtype=_DTYPES[(self.tag, self.bits)])
        samples = as_float(stored)
        return np.ascontiguousarray(samples.reshape(-1, self.channels).T)


def as_float(stored: np.ndarray) -> np.ndarray:
    """Stored samples as float32, as FFmpeg's ``swresample`` converts them: uint8 (x - 128) / 128,
    int16 x / 2**15, int32 rounded to float32 then / 2**31, float32 as is, float64 rounded.
    Example: int16 ``[0, 16384, -32768]`` -> ``[0.0, 0.5, -1.0]``."""
    if stored.dtype == np.uint8:
        return (stored.astype(np.float32) - np.float32(128)) * np.float32(1 / 128)
    if stored.dtype.kind == "i":
        return stored.astype(np.float32) * np.float32(2.0 ** (1 - 8 * stored.dtype.itemsize))
    return stored.astype(np.float32, copy=False)


def _chunks(data: bytes, start: int) -> dict[bytes, tuple[int, int]]:
    """Chunk id -> (offset of its body, its length) for the chunks from ``start``, first of each id."""
    found: dict[bytes, tuple[int, int]] = {}
    position = start
    while position + 8 <= len(data):
        name, size = data[position : position + 4], struct.unpack_from("<I", data, position + 4)[0]
        found.setdefault(name, (position + 8, size))
        position += 8 + size + (size & 1)
    return found


def read_wav(data: bytes) -> WavPcm | None:
    """The header facts of a plain PCM WAV file, None for anything else (see the module docstring).

    Example: a 1 s 44.1 kHz stereo 16-bit WAV -> ``WavPcm(rate=44100, channels=2, frames=44100,
    codec="pcm_s16le", ...)``; an MP3 -> None.
    """
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return None
    chunks = _chunks(data, 12)
    if b"fmt " not in chunks or b"data" not in chunks:
        return None
    fmt_at, fmt_size = chunks[b"fmt "]
    if fmt_size < 16 or fmt_at + fmt_size > len(data):
        return None
    tag, channels, rate, _, block_align, bits = struct.unpack_from("<HHIIHH", data, fmt_at)
    if tag == _EXTENSIBLE:  # valid bits (all of them here), channel mask, then the sub-format GUID
        extension = data[fmt_at + 18 : fmt_at + 40]
        if fmt_size < 40 or struct.unpack_from("<H", extension)[0] != bits or extension[8:] != _GUID_TAIL:
            return None
        tag = struct.unpack_from("<H", data, fmt_at + 24)[0]
    data_at, data_size = chunks[b"data"]
    plain = (tag, bits) in _DTYPES or (tag == _PCM and bits == 24)
    if not plain or channels not in _LAYOUTS or not _MIN_RATE <= rate <= _MAX_RATE or block_align != channels * bits // 8:
        return None
    if data_size == 0 or data_at + data_size > len(data) or data_size % block_align:
        return None
    kind = "f" if tag == _FLOAT else ("u" if bits == 8 else "s")
    return WavPcm(
        data=data, rate=rate, channels=channels, frames=data_size // block_align,
        codec=f"pcm_{kind}{bits}{'' if bits == 8 else 'le'}", offset=data_at, tag=tag, bits=bits,
    )
