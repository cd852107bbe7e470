"""Test helpers: audio files and videos with sound, generated with PyAV.

`encode_audio` (from ``energon_pack.data.synthetic``) writes a waveform in any of the containers/codecs
Qwen-Omni users ship (`CODECS`); `encode_video_with_sound` (from there too) muxes frames (H.264) with an
AAC sound track into MP4.
"""

from __future__ import annotations

from energon_pack.data.synthetic import AUDIO_CODECS as CODECS
from energon_pack.data.synthetic import audio_tone as tone
from energon_pack.data.synthetic import encode_audio, encode_video_with_sound

__all__ = ["CODECS", "encode_audio", "encode_video_with_sound", "tone"]
