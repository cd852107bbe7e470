"""Test helpers: audio files and videos with sound, generated with PyAV.

`encode_audio` writes a waveform in any of the containers/codecs Qwen-Omni users ship (`CODECS`);
`encode_video_with_sound` muxes random frames (H.264) with an AAC sound track into MP4.
"""

from __future__ import annotations

import io
from fractions import Fraction

import av
import numpy as np

#: name -> (container format, codec, sample format fed to the encoder, file extension).
CODECS: dict[str, tuple[str, str, str, str]] = {
    "wav_s16": ("wav", "pcm_s16le", "s16", "wav"),
    "wav_s24": ("wav", "pcm_s24le", "s32", "wav"),
    "wav_f32": ("wav", "pcm_f32le", "flt", "wav"),
    "flac": ("flac", "flac", "s16", "flac"),
    "mp3": ("mp3", "libmp3lame", "fltp", "mp3"),
    "m4a_aac": ("ipod", "aac", "fltp", "m4a"),
    "ogg_opus": ("ogg", "libopus", "s16", "ogg"),
    "ogg_vorbis": ("ogg", "vorbis", "fltp", "ogg"),
    "webm_opus": ("webm", "libopus", "s16", "webm"),
}


def tone(seconds: float, rate: int, channels: int = 1, seed: int = 0) -> np.ndarray:
    """A float32 [channels, n] test signal in [-0.5, 0.5]: a chirp plus a little noise."""
    n = int(round(seconds * rate))
    t = np.arange(n) / rate
    rng = np.random.default_rng(seed)
    base = 0.3 * np.sin(2 * np.pi * (220 + 400 * t) * t)
    return np.stack([base * (1 - 0.2 * c) + 0.05 * rng.standard_normal(n) for c in range(channels)]).astype(np.float32)


def _frames(signal: np.ndarray, rate: int, sample_format: str, frame_size: int) -> list[av.AudioFrame]:
    channels = signal.shape[0]
    layout = "mono" if channels == 1 else "stereo"
    planar = sample_format.endswith("p")
    frames, pts = [], 0
    for start in range(0, signal.shape[1], frame_size):
        block = signal[:, start : start + frame_size]
        if sample_format.startswith("s16"):
            block = np.clip(np.round(block * 32767), -32768, 32767).astype(np.int16)
        elif sample_format.startswith("s32"):
            block = np.round(block * 2147483647.0 * 0.99).astype(np.int32)
        data = block if planar else block.T.reshape(1, -1)
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(data), format=sample_format, layout=layout)
        frame.sample_rate, frame.pts, frame.time_base = rate, pts, Fraction(1, rate)
        pts += block.shape[1]
        frames.append(frame)
    return frames


def encode_audio(signal: np.ndarray, rate: int, codec: str) -> bytes:
    """The bytes of ``signal`` (float32 [channels, n]) at ``rate`` Hz encoded as ``CODECS[codec]``."""
    container_format, codec_name, sample_format, _ = CODECS[codec]
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=container_format) as container:
        stream = container.add_stream(codec_name, rate=rate, layout="mono" if signal.shape[0] == 1 else "stereo")
        if codec_name == "vorbis":
            stream.codec_context.options = {"strict": "-2"}
        frame_size = stream.codec_context.frame_size or 1024
        for frame in _frames(signal, rate, sample_format, frame_size):
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buffer.getvalue()


def encode_video_with_sound(frames: np.ndarray, fps: int, signal: np.ndarray | None, rate: int = 16000) -> bytes:
    """MP4: ``frames`` uint8 [T, H, W, 3] as H.264 at ``fps`` and, unless None, ``signal``
    float32 [channels, n] as AAC at ``rate`` Hz."""
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as container:
        video = container.add_stream("libx264", rate=fps)
        video.width, video.height, video.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        video.codec_context.options = {"threads": "1"}
        audio = None
        if signal is not None:
            audio = container.add_stream("aac", rate=rate, layout="mono" if signal.shape[0] == 1 else "stereo")
        for frame in frames:
            for packet in video.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in video.encode(None):
            container.mux(packet)
        if audio is not None:
            for frame in _frames(signal, rate, "fltp", audio.codec_context.frame_size or 1024):
                for packet in audio.encode(frame):
                    container.mux(packet)
            for packet in audio.encode(None):
                container.mux(packet)
    return buffer.getvalue()
