"""``energon-pack bench --stage audio``: Qwen2.5-Omni audio features of speech-length clips, ours
(the clip's real frames, `qwen.audio.audio_features`) against the Hugging Face processor's
(every clip padded to 300 s), interleaved clip by clip; and what reaches the audio encoder
(real frames versus the padded batch).

Clips: ``num_samples`` synthetic MP3 clips of 1-30 s (uniform, seed 0) at 16 kHz, decoded once
with `qwen.audio.decode_audio` for both sides (decode is not timed).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from energon_pack.data.synthetic import audio_tone, encode_audio
from energon_pack.tools.common import BenchRows

__all__ = ["bench_audio"]


def bench_audio(num_samples: int, work_dir: Path) -> BenchRows:
    """Rows ``{"what", "ours", "HF", "ratio"}``: feature milliseconds per clip, encoder input frames
    and MiB of the clips (``work_dir`` unused: the clips stay in memory)."""
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
    return [
        {"what": f"features per clip (ms), {num_samples} clips of 1-30 s", "ours": round(1000 * ours / num_samples, 1),
         "HF": round(1000 * hf / num_samples, 1), "ratio": round(ours / hf, 3)},
        {"what": "audio encoder input frames", "ours": real, "HF": padded, "ratio": round(real / padded, 3)},
        {"what": "audio encoder input (MiB, float32)", "ours": round(real * mib, 1), "HF": round(padded * mib, 1),
         "ratio": round(real / padded, 3)},
    ]
