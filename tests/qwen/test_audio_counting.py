"""Audio lengths without a resample, and the fast decode paths (energon_pack.qwen.audio, qwen.wav):
each against FFmpeg itself, frame by frame through PyAV (``tools.audio_floor.pyav_waveform``, the
plain decode: every frame through one resampler to 16 kHz in the source's layout, channels averaged)."""

from __future__ import annotations

import struct
from fractions import Fraction

import av
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from energon_pack.errors import BadSampleError
from energon_pack.qwen.audio import decode_audio, probe_audio, resampled_length
from energon_pack.qwen.wav import read_wav
from energon_pack.tools.audio_floor import pyav_waveform
from tests.support.audio_media import encode_audio, tone


def _resampled_count(samples: int, rate: int, chunk: int) -> int:
    """Samples a flushed resampler gives for ``samples`` random samples fed ``chunk`` at a time."""
    signal = np.random.default_rng(samples).standard_normal((1, samples)).astype(np.float32)
    resampler = av.AudioResampler(format="fltp", layout="mono", rate=16000)
    count = 0
    for start in range(0, samples, chunk):
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(signal[:, start : start + chunk]), format="fltp", layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = rate, start, Fraction(1, rate)
        count += sum(out.samples for out in resampler.resample(frame))
    return count + sum(out.samples for out in resampler.resample(None))


@settings(max_examples=30, deadline=None)
@given(
    samples=st.one_of(st.integers(1, 6000), st.integers(6000, 600_000)),
    rate=st.sampled_from([8000, 11025, 22050, 24000, 32000, 37800, 44056, 44100, 48000, 96000]),
    chunk=st.sampled_from([960, 1152, 4096]),
)
def test_resampled_length_is_the_resamplers_count(samples, rate, chunk):
    """The periodic rule equals FFmpeg's own output count, fed in any frame size (rates with a long
    period included: 44056 Hz repeats only every 5507 input samples)."""
    assert resampled_length(samples, rate) == _resampled_count(samples, rate, chunk)


@pytest.mark.parametrize(
    ("codec", "rate", "channels"),
    [("wav_s16", 16000, 1), ("wav_s16", 44100, 2), ("wav_s24", 22050, 2), ("wav_f32", 48000, 1), ("flac", 44100, 2), ("flac", 16000, 2),
     ("ogg_opus", 48000, 2), ("ogg_opus", 16000, 1), ("mp3", 22050, 1), ("mp3", 16000, 2), ("m4a_aac", 44100, 2)],
)
@pytest.mark.parametrize("seconds", [0.31, 2.047])
def test_probe_and_decode_equal_ffmpeg(codec, rate, channels, seconds):
    """The probe's count (header, Ogg packets or a decode without resampling) is the length of
    FFmpeg's decode, and our decode (NumPy WAV reader, frames resampled in blocks) is FFmpeg's, exactly."""
    data = encode_audio(tone(seconds, rate, channels), rate, codec)
    reference = pyav_waveform(data)
    info = probe_audio(data)
    assert info.samples == reference.size
    assert info.exact_from_header == (codec != "mp3" and codec != "m4a_aac")  # only those are decoded to count
    assert np.array_equal(decode_audio(data, expected_samples=info.samples), reference)


#: The KSDATAFORMAT_SUBTYPE GUID's bytes after its format tag.
GUID_TAIL = bytes.fromhex("000000001000800000aa00389b71")


def _wav(
    tag: int, bits: int, channels: int, payload: bytes, *, extensible_bits: int | None = None, guid_tail: bytes = GUID_TAIL,
    rate: int = 16000,
) -> bytes:
    """A WAV file: format ``tag`` (or WAVE_FORMAT_EXTENSIBLE of that sub-format, with
    ``extensible_bits`` valid bits), ``bits`` per sample, ``rate`` Hz, a LIST chunk before the data."""
    align = channels * bits // 8
    fmt = struct.pack("<HHIIHH", tag if extensible_bits is None else 0xFFFE, channels, rate, rate * align, align, bits)
    if extensible_bits is not None:
        fmt += struct.pack("<HHI", 22, extensible_bits, 3 if channels == 2 else 4) + struct.pack("<H", tag) + guid_tail
    chunks = b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"LIST" + struct.pack("<I", 4) + b"INFO"
    body = b"WAVE" + chunks + b"data" + struct.pack("<I", len(payload)) + payload
    return b"RIFF" + struct.pack("<I", len(body)) + body


@pytest.mark.parametrize(
    ("tag", "bits", "dtype"),
    [(1, 8, "u1"), (1, 16, "<i2"), (1, 24, None), (1, 32, "<i4"), (3, 32, "<f4"), (3, 64, "<f8")],
)
@pytest.mark.parametrize("extensible", [False, True])
def test_wav_reader_converts_as_ffmpeg(tag, bits, dtype, extensible):
    """Every sample format the reader takes gives FFmpeg's floats, extreme values included."""
    rng = np.random.default_rng(bits)
    if dtype is None:
        payload = rng.integers(0, 256, size=3 * 2 * 777, dtype=np.uint8).tobytes()
    elif dtype.startswith("<f"):
        payload = rng.uniform(-1.5, 1.5, size=2 * 777).astype(dtype).tobytes()
    else:
        info = np.iinfo(dtype)
        values = rng.integers(info.min, info.max, size=2 * 777, endpoint=True, dtype=np.int64)
        values[:4] = [info.min, info.max, 0, -1 if info.min < 0 else 1]
        payload = values.astype(dtype).tobytes()
    data = _wav(tag, bits, 2, payload, extensible_bits=bits if extensible else None)
    wav = read_wav(data)
    assert wav is not None and (wav.rate, wav.channels, wav.frames) == (16000, 2, 777)
    assert wav.codec == probe_audio(data).codec
    assert np.array_equal(decode_audio(data), pyav_waveform(data))


@pytest.mark.parametrize(
    "data",
    [
        _wav(1, 16, 2, bytes(4 * 10))[:-4],  # data chunk cut short
        _wav(1, 16, 2, bytes(4 * 10) + b"\0"),  # not whole sample frames
        _wav(1, 12, 1, bytes(30)),  # 12-bit samples
        _wav(1, 24, 2, bytes(60), extensible_bits=20),  # fewer valid bits than stored
        _wav(1, 16, 2, bytes(40), extensible_bits=16, guid_tail=bytes(14)),  # another sub-format GUID
        _wav(1, 16, 3, bytes(60)),  # three channels
        _wav(1, 16, 1, bytes(60), rate=800_000),  # no recording's rate
        b"RIFF\x04\0\0\0WAVE",  # no chunks
        b"ID3\x03" + bytes(40),
    ],
    ids=["cut", "partial_frame", "12bit", "20_valid_bits", "other_guid", "3ch", "800khz", "no_chunks", "not_riff"],
)
def test_wav_reader_leaves_other_files_to_ffmpeg(data):
    assert read_wav(data) is None


def test_ogg_opus_count_stops_past_the_limit():
    """An Ogg Opus count from its packets stops, like a counted decode, once past ``count_up_to``."""
    data = encode_audio(tone(3.0, 48000), 48000, "ogg_opus")
    full = probe_audio(data).samples
    capped = probe_audio(data, count_up_to=8000).samples
    assert full == 48000 and 8000 < capped < full


def test_a_clip_too_short_to_resample_to_a_sample_is_empty():
    """30 samples at 800 kHz (left to FFmpeg) resample to nothing at 16 kHz: ``empty_audio``."""
    with pytest.raises(BadSampleError) as err:
        probe_audio(_wav(1, 16, 1, bytes(60), rate=800_000))
    assert err.value.reason == "empty_audio"


def test_a_dithering_extractor_is_refused():
    """Dither adds noise to the features (the released Qwen-Omni processors use 0.0): refused, with the fix."""
    from transformers import WhisperFeatureExtractor

    from energon_pack.qwen.audio import AudioSpec, audio_features

    extractor = WhisperFeatureExtractor(feature_size=128, chunk_length=300, dither=0.5)
    with pytest.raises(ValueError, match=r"dither=0.5.*fix: load the processor with dither=0.0"):
        audio_features(np.zeros(1600, np.float32), extractor, AudioSpec())
