"""Test helpers: audio files and videos with sound, generated with PyAV.

`encode_audio` (from ``energon_pack.data.synthetic``) writes a waveform in any of the containers/codecs
Qwen-Omni users ship (`CODECS`);
`encode_video_with_sound` muxes random frames (H.264) with an AAC sound track into MP4.
"""

from __future__ import annotations

import io

import av
import numpy as np

from energon_pack.data.synthetic import AUDIO_CODECS as CODECS
from energon_pack.data.synthetic import audio_frames
from energon_pack.data.synthetic import audio_tone as tone
from energon_pack.data.synthetic import encode_audio

__all__ = ["CODECS", "encode_audio", "encode_video_with_sound", "tone"]


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
            for frame in audio_frames(signal, rate, "fltp", audio.codec_context.frame_size or 1024):
                for packet in audio.encode(frame):
                    container.mux(packet)
            for packet in audio.encode(None):
                container.mux(packet)
    return buffer.getvalue()
