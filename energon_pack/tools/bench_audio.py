"""``energon-pack bench --stage audio``: Qwen2.5-Omni audio features of speech-length clips, ours
(the clip's real frames, `qwen.audio.audio_features`) against the Hugging Face processor's
(every clip padded to 300 s), interleaved clip by clip; and what reaches the audio encoder
(real frames versus the padded batch).

Clips: ``num_samples`` synthetic MP3 clips of 1-30 s (uniform, seed 0) at 16 kHz, decoded once
with `qwen.audio.decode_audio` for both sides (decode is not timed).

Then each step on one 12-s speech-like clip per format of the audio mix (`audio_mix.AUDIO_MIX_FORMATS`),
CPU milliseconds per call (median of 5 after a warm-up, this process): ours' length count
(`probe_audio`) and decode (`decode_audio`) against PyAV alone (`audio_floor.pyav_waveform` with
FFmpeg's mono downmix: decode and resample, nothing else), and ours' features of that clip against
torch's STFT of it alone (in the "HF" column: the reference of each row).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from energon_pack.data.synthetic import audio_tone, encode_audio
from energon_pack.tools.common import BenchRows

__all__ = ["bench_audio"]


def bench_audio(num_samples: int, work_dir: Path) -> BenchRows:
    """Rows ``{"what", "ours", "HF", "ratio"}``: feature milliseconds per clip, encoder input frames
    and MiB of the clips, then each step per format (``work_dir`` unused: the clips stay in memory)."""
    from energon_pack.qwen.audio import AudioSpec, audio_features, decode_audio
    from energon_pack.qwen.processor import load_processor

    processor = load_processor(family="qwen2.5-omni")
    extractor, spec = processor.feature_extractor, AudioSpec.from_processor(processor)
    seconds = np.random.default_rng(0).uniform(1, 30, num_samples)
    ours = hf = 0.0
    real = padded = 0
    for index, length in enumerate(seconds):
        waveform = decode_audio(encode_audio(audio_tone(float(length), 16000, seed=index), 16000, "mp3"), spec)
        start = time.perf_counter()
        frames = audio_features(waveform, extractor, spec).shape[1]
        ours += time.perf_counter() - start
        start = time.perf_counter()
        reference = extractor(waveform, sampling_rate=spec.sampling_rate, padding="max_length", return_attention_mask=True,
                              return_tensors="np")
        hf += time.perf_counter() - start
        real += frames
        padded += reference["input_features"].shape[-1]
    mib = spec.n_mels * 4 / 2**20
    return [*_feature_rows(num_samples, ours, hf, real, padded, mib), *_step_rows(extractor, spec)]


def _feature_rows(num_samples: int, ours: float, hf: float, real: int, padded: int, mib: float) -> BenchRows:
    """Feature seconds of both sides (``ours``, ``hf``) per clip, real and padded frames, MiB a frame."""
    return [
        {"what": f"features per clip (ms), {num_samples} clips of 1-30 s", "ours": round(1000 * ours / num_samples, 1),
         "HF": round(1000 * hf / num_samples, 1), "ratio": round(ours / hf, 3)},
        {"what": "audio encoder input frames", "ours": real, "HF": padded, "ratio": round(real / padded, 3)},
        {"what": "audio encoder input (MiB, float32)", "ours": round(real * mib, 1), "HF": round(padded * mib, 1),
         "ratio": round(real / padded, 3)},
    ]


#: Seconds of the clip each step is timed on.
STEP_CLIP_SECONDS = 12.0


def _cpu_ms(step: Callable[[], Any], repeats: int = 5) -> float:
    """Median CPU milliseconds of ``step`` (this process) over ``repeats`` calls after one warm-up."""
    step()
    times = []
    for _ in range(repeats):
        start = time.process_time()
        step()
        times.append(time.process_time() - start)
    return 1000 * statistics.median(times)


def _step_rows(extractor: Any, spec: Any) -> BenchRows:
    """Per format: probe and decode ms against PyAV alone; features ms against torch.stft alone."""
    import torch

    from energon_pack.data.synthetic import speech_like
    from energon_pack.qwen.audio import audio_features, decode_audio, probe_audio
    from energon_pack.tools.audio_floor import pyav_waveform
    from energon_pack.tools.audio_mix import AUDIO_MIX_FORMATS

    rows: BenchRows = []
    window = torch.hann_window(int(extractor.n_fft))
    for name, (codec, rate, channels) in AUDIO_MIX_FORMATS.items():
        data = encode_audio(speech_like(STEP_CLIP_SECONDS, rate, channels, seed=1), rate, codec)
        waveform = torch.from_numpy(decode_audio(data, spec))
        alone = _cpu_ms(lambda: pyav_waveform(data, spec.sampling_rate, layout="mono"))
        stft = _cpu_ms(lambda: torch.stft(waveform, int(extractor.n_fft), spec.hop_length, window=window, return_complex=True))
        steps = {
            "probe": (_cpu_ms(lambda: probe_audio(data, spec, count_up_to=spec.max_samples)), alone, "PyAV alone"),
            "decode": (_cpu_ms(lambda: decode_audio(data, spec)), alone, "PyAV alone"),
            "features": (_cpu_ms(lambda: audio_features(waveform.numpy(), extractor, spec)), stft, "torch.stft alone"),
        }
        for step, (ours, reference, what) in steps.items():
            rows.append({"what": f"{step} ms, {name} {STEP_CLIP_SECONDS:g} s (HF: {what})", "ours": round(ours, 2),
                         "HF": round(reference, 2), "ratio": round(ours / reference, 3)})
    return rows
