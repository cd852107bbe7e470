"""Audio as a medium (energon_pack.qwen.audio): probe, decode to 16 kHz mono, log-mel features, bad files."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from transformers import WhisperFeatureExtractor

from energon_pack.errors import BadSampleError
from energon_pack.qwen.audio import AudioSpec, audio_features, decode_audio, probe_audio
from tests.support.audio_media import CODECS, encode_audio, encode_video_with_sound, tone

#: A rate and channel count each codec's encoder takes (Opus: 48 kHz or 16 kHz; Vorbis: stereo).
RATES = {"ogg_opus": (48000, 2), "webm_opus": (16000, 1), "ogg_vorbis": (44100, 2)}


def _wav(tag: int, data: bytes, rate: int = 16000) -> bytes:
    """A WAV file with format tag ``tag`` (1: PCM) holding ``data`` as 16-bit mono."""
    fmt = struct.pack("<HHIIHH", tag, 1, rate, rate * 2, 2, 16)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


def test_spec_frames_and_cap():
    spec = AudioSpec()
    assert spec.max_seconds == 300.0
    assert [spec.feature_frames(n) for n in (1, 160, 161, 16000, 10**9)] == [1, 1, 2, 100, 30000]


def test_longest_padding_frames():
    """Qwen3-Omni pads a sample's clips to the longest: that clip loses its partial last hop's frame."""
    spec = AudioSpec(padded_samples=None)
    assert [spec.feature_frames(n) for n in (1, 160, 161, 16000, 16001)] == [0, 1, 1, 100, 100]
    assert spec.padded_length([8000, 16001]) == 16001
    assert [spec.feature_frames(n, 16001) for n in (8000, 15999, 16001)] == [50, 100, 100]


def test_16khz_pcm_decodes_exactly_from_the_header():
    samples = np.array([0, 16384, -32768, 32767, 5], dtype=np.int16)
    data = _wav(1, samples.tobytes())
    info = probe_audio(data)
    assert (info.samples, info.exact_from_header, info.codec) == (5, True, "pcm_s16le")
    assert np.array_equal(decode_audio(data), samples.astype(np.float32) / 32768)


def test_channels_are_averaged():
    """Stereo becomes the mean of its channels (librosa's downmix), not FFmpeg's -3 dB sum."""
    signal = tone(0.5, 16000, channels=2)
    assert np.abs(decode_audio(encode_audio(signal, 16000, "wav_f32")) - signal.mean(axis=0)).max() < 1e-7


def test_resampling_is_close_to_an_independent_resample():
    """44.1 kHz -> 16 kHz: FFmpeg's swr within 1e-2 of linear interpolation on a 440 Hz tone."""
    t = np.arange(44100) / 44100
    signal = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)[None]
    waveform = decode_audio(encode_audio(signal, 44100, "wav_f32"))
    assert abs(waveform.size - 16000) <= 1
    expected = np.interp(np.arange(waveform.size) / 16000, t, signal[0])
    assert np.abs(waveform - expected).max() < 1e-2


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_every_codec_probes_to_its_decoded_length(codec):
    """The probe's sample count (header or counted) is what the decode gives, for every codec."""
    rate, channels = RATES.get(codec, (22050, 2))
    data = encode_audio(tone(0.7, rate, channels), rate, codec)
    info = probe_audio(data)
    assert info.exact_from_header == (codec.startswith("wav") or codec in ("flac", "ogg_opus"))  # nothing decoded
    waveform = decode_audio(data, expected_samples=info.samples)
    assert waveform.dtype == np.float32 and waveform.size == info.samples
    assert abs(waveform.size - 0.7 * 16000) < 0.1 * 16000  # encoder delay and padding at most


def test_video_sound_track_decodes():
    video = encode_video_with_sound(np.zeros((4, 32, 32, 3), np.uint8), 4, tone(1.0, 16000))
    assert probe_audio(video).codec == "aac" and decode_audio(video).size > 15000


def test_cap_stops_reading():
    spec = AudioSpec(max_samples=8000)
    data = encode_audio(tone(2.0, 16000), 16000, "wav_s16")
    assert probe_audio(data, spec).samples == 32000  # the probe reports the whole clip
    assert decode_audio(data, spec).size == 8000


def test_counted_probe_stops_past_the_limit():
    """A counted probe with ``count_up_to`` decodes only until it holds more than that."""
    data = encode_audio(tone(3.0, 16000), 16000, "mp3")
    full = probe_audio(data).samples
    capped = probe_audio(data, count_up_to=16000).samples
    assert full > 47000 and 16000 < capped < full


def test_features_equal_the_hf_padded_features():
    """Our features of a waveform = the Whisper extractor's on the 300-s padded input, real frames."""
    extractor = WhisperFeatureExtractor(feature_size=128, chunk_length=300, dither=0.0, return_attention_mask=True)
    rng = np.random.default_rng(0)
    for n in (161, 12345):
        waveform = (0.1 * rng.standard_normal(n)).astype(np.float32)
        ref = extractor(waveform, sampling_rate=16000, padding="max_length", return_attention_mask=True, return_tensors="np")
        frames = int(ref["attention_mask"][0].sum())
        ours = audio_features(waveform, extractor, AudioSpec())
        assert ours.shape == (128, frames)
        np.testing.assert_allclose(ours, ref["input_features"][0][:, :frames], atol=1e-5, rtol=0)


def test_features_equal_the_hf_longest_padded_features():
    """Clips padded to the sample's longest (Qwen3-Omni's ``padding=True``): every clip's real frames,
    the longest's end seen through the STFT's reflect padding, as the extractor gives them."""
    extractor = WhisperFeatureExtractor(feature_size=128, chunk_length=300, dither=0.0, return_attention_mask=True)
    spec = AudioSpec(padded_samples=None)
    rng = np.random.default_rng(1)
    clips = [(0.1 * rng.standard_normal(n)).astype(np.float32) for n in (12345, 4000, 12300)]
    ref = extractor(clips, sampling_rate=16000, padding=True, return_attention_mask=True, return_tensors="np")
    padded = spec.padded_length([c.size for c in clips])
    for index, clip in enumerate(clips):
        frames = int(ref["attention_mask"][index].sum())
        assert spec.feature_frames(clip.size, padded) == frames
        ours = audio_features(clip, extractor, spec, padded=padded)
        np.testing.assert_allclose(ours, ref["input_features"][index][:, :frames], atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (_wav(0x1111, b"\0" * 3200), "undecodable_audio"),
        (_wav(1, b""), "empty_audio"),
        (b"\x00not audio" * 20, "corrupt_audio"),
        (encode_video_with_sound(np.zeros((4, 32, 32, 3), np.uint8), 4, None), "corrupt_audio"),
    ],
    ids=["unknown_codec", "empty", "garbage", "silent_video"],
)
def test_bad_audio_is_a_bad_sample(data, reason):
    with pytest.raises(BadSampleError) as err:
        decode_audio(data, expected_samples=probe_audio(data).samples)
    assert err.value.reason == reason


def test_truncated_file_is_found_at_decode():
    """A FLAC cut in half: its header still says the whole length, the decode finds the rest missing."""
    data = encode_audio(tone(2.0, 16000), 16000, "flac")
    info = probe_audio(data)
    assert info.exact_from_header and info.samples == 32000
    with pytest.raises(BadSampleError) as err:
        decode_audio(data[: len(data) // 2], expected_samples=info.samples)
    assert err.value.reason == "corrupt_audio"
