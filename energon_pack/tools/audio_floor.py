"""The audio floor of ``bench --media audio``: what decoding, resampling and featurising a mix's
heard sounds costs with PyAV and torch alone, nothing else (no probe, no tokens, no rows).

`pyav_waveform` is the plain PyAV decode: every decoded frame through one ``av.AudioResampler`` to
16 kHz float, flushed. With ``layout=None`` it keeps the source's channels and averages them (the
package's definition of a sound, ``qwen.audio.decode_audio``, which must equal it: the eager side
of the bench decodes with it, and the tests compare against it); with ``layout="mono"`` FFmpeg
downmixes before resampling (the cheapest PyAV decode: the floor's). The floor's features are the
Whisper extractor's own torch STFT path (``_torch_extract_fbank_features``) on each clip alone.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from io import BytesIO
from typing import Any

import numpy as np

__all__ = ["AudioFloor", "pyav_waveform", "run_audio_floor"]


def pyav_waveform(data: bytes, rate: int = 16000, *, layout: str | None = None) -> np.ndarray:
    """float32 [n] at ``rate`` Hz of the first audio stream of ``data``, frame by frame through PyAV
    (``layout`` None: the source's channels, then their mean; "mono": FFmpeg's downmix).

    Example: a 1 s 44.1 kHz stereo WAV -> an array of 16000 samples.
    """
    import av

    planes = []
    with av.open(BytesIO(data)) as container:
        resampler = None
        for frame in container.decode(audio=0):
            if resampler is None:
                resampler = av.AudioResampler(format="fltp", layout=layout or frame.layout.name, rate=rate)
            planes += [out.to_ndarray() for out in resampler.resample(frame)]
        planes += [] if resampler is None else [out.to_ndarray() for out in resampler.resample(None)]
    joined = np.concatenate(planes, axis=1) if planes else np.zeros((1, 0), dtype=np.float32)
    return joined[0] if joined.shape[0] == 1 else joined.mean(axis=0, dtype=np.float32)


@dataclass(frozen=True, kw_only=True)
class AudioFloor:
    """One floor pass: ``sounds`` decoded, CPU seconds of this process (``cpu_s``) and wall seconds."""

    sounds: int
    cpu_s: float
    wall_s: float


def run_audio_floor(sounds: Sequence[bytes], extractor: Any) -> AudioFloor:
    """Decode (`pyav_waveform`, FFmpeg's mono), resample and featurise each of ``sounds`` (file bytes,
    read before timing), timed in this process with one torch thread."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        start_cpu, start_wall = time.process_time(), time.perf_counter()
        for data in sounds:
            waveform = pyav_waveform(data, int(extractor.sampling_rate), layout="mono")
            extractor._torch_extract_fbank_features(waveform[None], "cpu")
        cpu, wall = time.process_time() - start_cpu, time.perf_counter() - start_wall
    finally:
        torch.set_num_threads(threads)
    return AudioFloor(sounds=len(sounds), cpu_s=cpu, wall_s=wall)
