"""Audio as a medium: probe, decode to 16 kHz mono with PyAV, and Whisper log-mel features.

Containers and codecs (tests/qwen/test_audio.py decodes each): WAV (PCM 16/24-bit, float), FLAC,
MP3, AAC / M4A, Ogg (Opus, Vorbis), WebM (Opus); any sample rate and channel count. The first
audio stream of a file is used, so a video's sound track decodes the same way.

- **Decode** (`decode_audio`): every sample of the first audio stream through one FFmpeg resampler
  to float planar at the model rate (``av.AudioResampler(format="fltp", layout=<the source's>,
  rate=16000)``, flushed at the end), then the mean of the channels (the downmix librosa and
  Qwen's ``qwen-omni-utils`` use; FFmpeg's own stereo-to-mono sums at -3 dB, 1.41 times louder):
  float32 [n]. Decoded frames are joined into blocks of ``_BLOCK_SAMPLES`` before the resampler
  (its output does not depend on how it is fed); a plain PCM WAV is read with NumPy
  (`qwen.wav.read_wav`, the floats FFmpeg's PCM decoder and converter give) instead of FFmpeg's
  slow WAV demuxer. A 16 kHz PCM file decodes to its samples exactly (``s16 / 32768``, channels
  averaged, no resampler); other rates are resampled by FFmpeg's ``swr`` (a 440 Hz tone at
  44.1 kHz within 1e-2 of an independent linear interpolation, tests/qwen/test_audio.py).
- **Length** (`probe_audio`): the number of 16 kHz samples that decode gives, never from a
  resample: the source-rate count, from the header for PCM WAV and FLAC at any rate and from
  the packets' durations less the pre-skip for Ogg Opus (``exact_from_header``: nothing decoded),
  else (MP3, AAC, Vorbis, WebM: encoder delay and padding are trimmed by the decoder) by decoding
  without resampling (``counted``); then `resampled_length` (the resampler's output count, periodic
  in the input count) gives the model-rate count. tests/qwen/test_audio.py checks probe = decode
  for every codec, rate and channel count it writes.
- **Cap**: the model reads at most ``max_samples`` (the feature extractor's ``n_samples``: 300 s
  for the released Qwen-Omni checkpoints); longer audio is what the Hugging Face processor
  truncates. `decode_audio` stops reading once it holds ``max_samples``, so a 30-minute file costs
  the memory of its first 300 s (docs/worker_memory.md).
- **Features** (`audio_features`): the feature extractor's log-mel spectrogram [n_mels, F] of the
  waveform, F its real frames (`AudioSpec.feature_frames`: ceil(n / hop_length), one less when
  the clip ends in the partial last hop of what the processor pads it to), equal to what the
  Hugging Face processor gives for the same waveform padded as it pads it (Qwen2.5-Omni: to
  ``n_samples``; Qwen3-Omni: to the longest clip of the sample), its ``feature_attention_mask`` frames.

Every failure is a `BadMediaError` with a skip reason: ``corrupt_audio`` (no audio stream, a
decoder error, a truncated file), ``empty_audio`` (no samples), ``undecodable_audio`` (a codec
this FFmpeg build cannot decode).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from io import BytesIO
from math import gcd
from typing import Any

import av
import numpy as np
import torch

from energon_pack.qwen.media import BadMediaError
from energon_pack.qwen.wav import WavPcm, as_float, read_wav

__all__ = [
    "AudioInfo",
    "AudioSpec",
    "audio_features",
    "decode_audio",
    "probe_audio",
    "resampled_length",
]

#: Codecs whose header sample count is the decoded count (no encoder delay, no padding).
_EXACT_HEADER_CODECS = ("flac",)
#: Zero samples appended before the STFT: every frame that overlaps the waveform then sees the
#: samples it sees in the Hugging Face processor's zero-padded input (window n_fft = 400).
_TAIL_FRAMES = 3
#: Source samples per channel handed to the resampler at once (decoded frames joined): PyAV's
#: per-call cost is paid per block, not per frame; the resampler's output does not depend on it.
_BLOCK_SAMPLES = 1 << 16
#: Input samples past which `resampled_length` counts by whole periods (beyond any filter's start).
_PERIOD_BASE = 4096


@dataclass(frozen=True, kw_only=True)
class AudioSpec:
    """What the model's processor reads of a sound: ``sampling_rate`` (Hz), ``hop_length`` (samples
    per feature frame), ``max_samples`` (samples read at most: the extractor's ``n_samples``, or a
    lower ``max_audio_seconds`` cap), ``n_mels``, and how the processor pads a sample's clips
    before the STFT: ``padded_samples`` (Qwen2.5-Omni: every clip to the extractor's ``n_samples``,
    300 s) or, with ``padded_samples=None``, each clip to the longest clip of its sample
    (Qwen3-Omni, ``padding=True``).

    Example: the released Qwen2.5-Omni processor -> ``AudioSpec(sampling_rate=16000,
    hop_length=160, max_samples=4800000, n_mels=128, padded_samples=4800000)``.
    """

    sampling_rate: int = 16000
    hop_length: int = 160
    max_samples: int = 4_800_000
    n_mels: int = 128
    padded_samples: int | None = 4_800_000

    @classmethod
    def from_processor(cls, processor: Any) -> AudioSpec:
        """The spec of a Hugging Face Omni processor: its ``WhisperFeatureExtractor`` and the
        ``padding`` its ``audio_kwargs`` call that extractor with (Whisper's default: ``"max_length"``)."""
        extractor = processor.feature_extractor
        padding = dict(getattr(processor, "audio_kwargs", None) or {}).get("padding", "max_length")
        return cls(
            sampling_rate=int(extractor.sampling_rate),
            hop_length=int(extractor.hop_length),
            max_samples=int(extractor.n_samples),
            n_mels=int(extractor.feature_size),
            padded_samples=None if padding in (True, "longest") else int(extractor.n_samples),
        )

    @property
    def max_seconds(self) -> float:
        """Seconds the model reads at most. Example: 4800000 samples at 16 kHz -> 300.0."""
        return self.max_samples / self.sampling_rate

    def padded_length(self, samples: Sequence[int]) -> int:
        """Samples every clip of one sample is padded to (``samples``: each clip's, uncapped).

        Example: (16000, 8000) -> 4800000 (Qwen2.5-Omni); 16000 (Qwen3-Omni: the longest, capped).
        """
        longest = max((min(n, self.max_samples) for n in samples), default=0)
        return longest if self.padded_samples is None else max(self.padded_samples, longest)

    def feature_frames(self, samples: int, padded: int | None = None) -> int:
        """Real feature frames of a clip of ``samples`` model-rate samples (capped at ``max_samples``)
        in a call padded to ``padded`` samples (default: ``padded_length([samples])``): the
        extractor's mask, ``ceil(n / hop_length)``, less the last frame when the clip reaches the
        padded length's partial last hop (the extractor drops the STFT's last frame).

        Example: 16000 -> 100; 16001 -> 101 (Qwen2.5-Omni; Qwen3-Omni alone: 100); 8000 padded to 16001 -> 50.
        """
        clip = min(samples, self.max_samples)
        padded = self.padded_length([samples]) if padded is None else padded
        frames = math.ceil(clip / self.hop_length)
        return frames - 1 if padded % self.hop_length and frames == math.ceil(padded / self.hop_length) else frames


@dataclass(frozen=True, kw_only=True)
class AudioInfo:
    """Facts of the first audio stream: ``samples`` at the model rate (uncapped), source
    ``sample_rate`` and ``channels``, decoder ``codec``, ``exact_from_header`` (True: the count
    came from the header, False: from a counted decode) and the FFmpeg demuxer (``container``,
    e.g. ``"ogg"``)."""

    samples: int
    sample_rate: int
    channels: int
    codec: str
    exact_from_header: bool
    container: str = ""

    def seconds(self, spec: AudioSpec) -> float:
        """Duration in seconds at the model rate."""
        return self.samples / spec.sampling_rate


def _open(data: bytes) -> Any:
    try:
        container = av.open(BytesIO(data), mode="r")
    except (av.error.FFmpegError, ValueError, UnicodeDecodeError) as err:
        raise BadMediaError("corrupt_audio", f"cannot open audio container: {err}") from None
    if not container.streams.audio:
        container.close()
        raise BadMediaError(
            "corrupt_audio", "the file holds no audio stream; fix: store the audio file itself (WAV, FLAC, MP3, ...)"
        )
    return container


def _stream_facts(stream: Any) -> tuple[int, int, str]:
    context = stream.codec_context
    if context is None or not context.name:
        raise BadMediaError(
            "undecodable_audio",
            f"no decoder for the audio codec {getattr(stream, 'codec_tag', '?')!r} in this FFmpeg build; "
            "fix: re-encode the audio as WAV, FLAC, MP3, AAC, Opus or Vorbis",
        )
    return int(context.sample_rate or 0), int(context.channels or 0), str(context.name)


def resampled_length(samples: int, rate: int, target: int = 16000) -> int:
    """Samples FFmpeg's resampler (``av.AudioResampler``, flushed) gives for ``samples`` samples
    at ``rate`` Hz resampled to ``target`` Hz, whatever the blocks it is fed in and the channels.

    The count is periodic: ``rate / g`` more input samples give ``target / g`` more output
    samples (g = gcd(rate, target)) once past the filter's start, so it is the count of one
    resample of zeros no longer than ``_PERIOD_BASE`` plus one period (cached) plus whole
    periods. Example: (16000, 16000) -> 16000; (44100, 44100) -> 16000; (3001, 48000) -> 1000.
    """
    if rate == target or samples <= 0:
        return max(samples, 0)
    step = gcd(rate, target)
    period_in, period_out = rate // step, target // step
    periods = max(0, (samples - _PERIOD_BASE) // period_in)
    return _resampled_zeros(samples - periods * period_in, rate, target) + periods * period_out


@lru_cache(maxsize=4096)
def _resampled_zeros(samples: int, rate: int, target: int) -> int:
    """Samples a flushed ``av.AudioResampler`` gives for ``samples`` zeros at ``rate`` Hz (mono)."""
    resampler = av.AudioResampler(format="fltp", layout="mono", rate=target)
    frame = _frame(np.zeros((1, samples), dtype=np.float32), "fltp", "mono", rate, 0)
    return sum(out.samples for out in resampler.resample(frame)) + sum(out.samples for out in resampler.resample(None))


def _frame(array: np.ndarray, sample_format: str, layout: str, rate: int, pts: int) -> Any:
    """An ``av.AudioFrame`` of ``array`` (PyAV's ``to_ndarray`` shape of ``sample_format``) at ``rate``."""
    frame = av.AudioFrame.from_ndarray(array, format=sample_format, layout=layout)
    frame.sample_rate, frame.pts, frame.time_base = rate, pts, Fraction(1, rate)
    return frame


@dataclass(frozen=True)
class _Block:
    """Consecutive source samples: ``array`` in PyAV's ``to_ndarray`` shape of ``sample_format``
    ([channels, n] planar, [1, n * channels] packed), its ``layout`` name, ``rate`` (Hz) and
    ``samples`` per channel."""

    array: np.ndarray
    sample_format: str
    layout: str
    rate: int
    samples: int


def _wav_blocks(wav: WavPcm) -> Iterator[_Block]:
    """A plain WAV's samples as float planes, ``_BLOCK_SAMPLES`` at a time."""
    for start in range(0, wav.frames, _BLOCK_SAMPLES):
        planes = wav.planes(start, start + _BLOCK_SAMPLES)
        yield _Block(planes, "fltp", wav.layout, wav.rate, planes.shape[1])


def _decoded_blocks(data: bytes) -> Iterator[_Block]:
    """The first audio stream's decoded frames, joined into blocks of at least ``_BLOCK_SAMPLES``
    samples of one format, layout and rate (so the resampler is called per block, not per frame)."""
    with _open(data) as container:
        stream = container.streams.audio[0]
        _stream_facts(stream)
        held: list[np.ndarray] = []
        kind = None
        samples = 0
        for frame in container.decode(stream):
            frame_kind = (frame.format.name, frame.layout.name, int(frame.sample_rate))
            if held and (frame_kind != kind or samples >= _BLOCK_SAMPLES):
                yield _Block(np.concatenate(held, axis=1), *kind, samples)
                held, samples = [], 0
            kind = frame_kind
            held.append(frame.to_ndarray())
            samples += frame.samples
        if held:
            yield _Block(np.concatenate(held, axis=1), *kind, samples)


def _resampled_blocks(data: bytes, spec: AudioSpec, limit: int | None) -> Iterator[np.ndarray]:
    """Mono float32 blocks at ``spec.sampling_rate`` in order, until ``limit`` samples (None: all).

    Samples already at the model rate are converted with NumPy (`qwen.wav.as_float`: the floats the
    resampler's converter gives), not through the resampler."""
    wav = read_wav(data)
    blocks = _wav_blocks(wav) if wav is not None else _decoded_blocks(data)
    resampler = None
    held = fed = 0
    try:
        for block in blocks:
            if block.rate == spec.sampling_rate and block.array.dtype.kind in "uif":  # no resampling: convert
                outputs = [_planes(block)]
            else:
                if resampler is None:  # channels kept: downmixed below as their mean
                    resampler = av.AudioResampler(format="fltp", layout=block.layout, rate=spec.sampling_rate)
                frame = _frame(block.array, block.sample_format, block.layout, block.rate, fed)
                outputs = [out.to_ndarray() for out in resampler.resample(frame)]
            fed += block.samples
            for planes in outputs:
                mono = _mono(planes)
                held += mono.size
                yield mono
            if limit is not None and held >= limit:
                return
        for out in [] if resampler is None else resampler.resample(None):
            yield _mono(out.to_ndarray())
    except (av.error.FFmpegError, ValueError) as err:
        raise BadMediaError("corrupt_audio", f"cannot decode audio after {held} samples: {err}") from None


def _planes(block: _Block) -> np.ndarray:
    """A block's samples as float32 planes [channels, n] (packed formats de-interleaved)."""
    samples = as_float(block.array)
    channels = samples.size // block.samples if block.samples else 1
    return samples if samples.shape[0] == channels else samples.reshape(-1, channels).T


def _mono(planes: np.ndarray) -> np.ndarray:
    """Planar float samples [channels, n] as the mean of their channels, float32 [n]."""
    return planes[0] if planes.shape[0] == 1 else planes.mean(axis=0, dtype=np.float32)


def probe_audio(data: bytes, spec: AudioSpec = AudioSpec(), *, count_up_to: int | None = None) -> AudioInfo:
    """Sample count at the model rate, source rate, channels and codec of an audio file.

    The source-rate count comes from the header (PCM WAV, FLAC), the packets' durations (Ogg
    Opus), or else a decode without resampling; `resampled_length` turns it into the model-rate
    count the decode gives. ``count_up_to``: a counted decode stops once the count exceeds this
    many model-rate samples (it is then only known to exceed it: what an overlong check needs),
    so a 30-minute MP3 costs the decode of its first ``count_up_to`` samples.

    Example: a 1.5 s 16 kHz stereo WAV -> ``AudioInfo(samples=24000, sample_rate=16000,
    channels=2, codec="pcm_s16le", exact_from_header=True)``; the same clip as MP3 ->
    ``exact_from_header=False`` (counted). Raises `BadMediaError` (see the module docstring).
    """
    try:
        return _probe(data, spec, count_up_to)
    except BadMediaError:
        raise
    except (av.error.FFmpegError, ValueError, OverflowError) as err:  # the resampler refused the source's rate
        raise BadMediaError("corrupt_audio", f"cannot count the audio's samples: {err}") from None


def _probe(data: bytes, spec: AudioSpec, count_up_to: int | None) -> AudioInfo:
    """`probe_audio` (its FFmpeg and rate errors raised as they come)."""
    target = spec.sampling_rate
    wav = read_wav(data)
    if wav is not None:
        facts = dict(sample_rate=wav.rate, channels=wav.channels, codec=wav.codec, container="wav")
        source, rate = wav.frames, wav.rate
    else:
        with _open(data) as container:
            stream = container.streams.audio[0]
            rate, channels, codec = _stream_facts(stream)
            facts = dict(sample_rate=rate, channels=channels, codec=codec, container=str(container.format.name))
            source = _header_samples(stream, rate, codec)
            if source is None and codec == "opus" and facts["container"] == "ogg":
                source = _ogg_opus_samples(container, stream, _source_limit(count_up_to, rate, target))
    from_header = source is not None and source > 0
    samples = resampled_length(source, rate, target) if from_header else _counted_samples(data, target, count_up_to)
    if samples == 0:
        raise BadMediaError("empty_audio", "the audio stream decodes to no samples; fix: drop the empty clip")
    return AudioInfo(samples=samples, exact_from_header=from_header, **facts)


def _source_limit(count_up_to: int | None, rate: int, target: int) -> int | None:
    """Source samples past which a count at ``rate`` surely exceeds ``count_up_to`` model-rate samples
    (one second of margin over the rate ratio). Example: (16000, 48000, 16000) -> 96004."""
    return None if count_up_to is None else (count_up_to + 1) * rate // target + rate + 1


def _header_samples(stream: Any, rate: int, codec: str) -> int | None:
    """The decoded sample count at ``rate`` from the header when it is exact (PCM, FLAC), else None."""
    exact_codec = codec.startswith("pcm_") or codec in _EXACT_HEADER_CODECS
    if not exact_codec or not rate or stream.duration is None or stream.time_base is None:
        return None
    samples = stream.duration * stream.time_base * rate
    return int(samples) if samples.denominator == 1 and samples > 0 else None


def _ogg_opus_samples(container: Any, stream: Any, limit: int | None) -> int | None:
    """An Ogg Opus stream's decoded samples (48 kHz): the packets' durations (the demuxer trims the
    last one to the final granule position) less the header's pre-skip; None without an OpusHead.
    Past ``limit`` source samples the count stops (only known to exceed it)."""
    head = bytes(stream.codec_context.extradata or b"")
    if head[:8] != b"OpusHead" or len(head) < 12:
        return None
    total = -struct.unpack_from("<H", head, 10)[0]
    try:
        for packet in container.demux(stream):
            total += int(packet.duration or 0) if packet.size else 0
            if limit is not None and total > limit:
                break
    except (av.error.FFmpegError, ValueError) as err:
        raise BadMediaError("corrupt_audio", f"cannot read the Ogg packets: {err}") from None
    return total


def _counted_samples(data: bytes, target: int, count_up_to: int | None) -> int:
    """Model-rate samples of the decoded frames (decoded at their own rate, never resampled), the
    count stopping once it surely exceeds ``count_up_to``."""
    source = rate = 0
    try:
        with _open(data) as container:
            for frame in container.decode(container.streams.audio[0]):
                source, rate = source + frame.samples, int(frame.sample_rate)
                if count_up_to is not None and source > _source_limit(count_up_to, rate, target):
                    break
    except (av.error.FFmpegError, ValueError) as err:
        raise BadMediaError("corrupt_audio", f"cannot decode audio after {source} samples: {err}") from None
    return resampled_length(source, rate, target)


def decode_audio(data: bytes, spec: AudioSpec = AudioSpec(), *, expected_samples: int | None = None) -> np.ndarray:
    """The first audio stream as mono float32 [n] at ``spec.sampling_rate``, n <= ``spec.max_samples``
    (reading stops there). ``expected_samples``: the count `probe_audio` gave; a decode that
    yields another (capped) count is ``corrupt_audio`` (a file changed or cut short since).

    Example: a 16 kHz mono s16 WAV of samples ``[0, 16384]`` -> ``array([0.0, 0.5], dtype=float32)``.
    """
    blocks = list(_resampled_blocks(data, spec, spec.max_samples))
    waveform = np.concatenate(blocks)[: spec.max_samples] if blocks else np.zeros(0, dtype=np.float32)
    if waveform.size == 0:
        raise BadMediaError("empty_audio", "the audio stream decodes to no samples; fix: drop the empty clip")
    if expected_samples is not None and waveform.size != min(expected_samples, spec.max_samples):
        raise BadMediaError(
            "corrupt_audio",
            f"audio decodes to {waveform.size} samples but its probe gave {min(expected_samples, spec.max_samples)}; "
            "fix: re-encode the file (it is truncated or its header is wrong)",
        )
    return waveform.astype(np.float32, copy=False)


def audio_features(waveform: np.ndarray, extractor: Any, spec: AudioSpec, *, padded: int | None = None) -> np.ndarray:
    """Log-mel features float32 [n_mels, F] of a mono waveform [n] (F = ``spec.feature_frames(n, padded)``),
    equal to the Hugging Face processor's features of the same waveform on its real frames.

    The processor pads every clip with zeros to ``padded`` samples (``spec.padded_length`` of the
    sample's clips) and normalises by the clip's loudest frame; the loudest frame is always one
    that overlaps the waveform (silence is the floor), so the waveform plus a few frames of zeros,
    up to ``padded`` (where the STFT's reflect padding starts), gives the same frames.
    Example: 1 s at 16 kHz -> [128, 100].
    """
    clip = np.asarray(waveform, dtype=np.float32)[: spec.max_samples]
    padded = spec.padded_length([clip.size]) if padded is None else padded
    frames = spec.feature_frames(clip.size, padded)
    tail = _TAIL_FRAMES * max(spec.hop_length, int(extractor.n_fft))
    length = min(padded, frames * spec.hop_length + tail)
    padded_clip = np.zeros(length, dtype=np.float32)
    padded_clip[: clip.size] = clip
    return np.ascontiguousarray(_log_mel(torch.from_numpy(padded_clip), extractor)[:, :frames].numpy())


def _log_mel(waveform: torch.Tensor, extractor: Any) -> torch.Tensor:
    """The Whisper extractor's log-mel spectrogram float32 [n_mels, frames] of a float32 waveform
    [n] (n // hop_length frames): its own steps (``WhisperFeatureExtractor._torch_extract_fbank_features``,
    no dither) without the batching and padding around them. A dithering extractor is refused."""
    if getattr(extractor, "dither", 0.0):
        raise ValueError(
            f"the feature extractor dithers (dither={extractor.dither}): its features are random; "
            "fix: load the processor with dither=0.0 (the released Qwen-Omni processors' value)"
        )
    window = torch.hann_window(int(extractor.n_fft))
    stft = torch.stft(waveform, int(extractor.n_fft), int(extractor.hop_length), window=window, return_complex=True)
    power = stft.abs().square_()[:, :-1]  # the extractor drops the last frame; contiguous before the slice
    log_spec = (torch.from_numpy(np.asarray(extractor.mel_filters, dtype=np.float32)).T @ power).clamp_(min=1e-10).log10_()
    return torch.maximum(log_spec, log_spec.max() - 8.0).add_(4.0).div_(4.0)
