"""Test helpers: a small Qwen-Omni record set (JSONL + media folder) for ``prepare`` and loader tests:
speech-like clips in several codecs, an image + audio chat, a video heard with its sound, text."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from energon_pack.data.synthetic import encode_image
from tests.support.audio_media import encode_audio, encode_video_with_sound, tone


def write_omni_records(root: Path, *, clips: int = 6) -> Path:
    """``root/records.jsonl`` and ``root/media/``: ``clips`` audio chats (WAV, MP3, FLAC, WebM/Opus
    in turn, 0.5-2 s), one image + audio chat, one video heard with its sound, one text chat."""
    media = root / "media"
    media.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    codecs = [("wav_s16", "wav", 16000), ("mp3", "mp3", 22050), ("flac", "flac", 16000), ("webm_opus", "webm", 48000)]
    records = []
    for i in range(clips):
        codec, extension, rate = codecs[i % len(codecs)]
        name = f"clip{i}.{extension}"
        (media / name).write_bytes(encode_audio(tone(0.5 + 0.3 * i, rate, seed=i), rate, codec))
        records.append({"id": f"a{i}", "messages": [{"role": "user", "content": f"<audio>Clip {i}?"},
                                                    {"role": "assistant", "content": f"Tone {i}."}], "audios": [name]})
    (media / "pic.png").write_bytes(encode_image(rng.integers(0, 256, (56, 84, 3), dtype=np.uint8), "PNG", "RGB"))
    records.append({"id": "img", "messages": [{"role": "user", "content": "<image><audio>Same?"},
                                             {"role": "assistant", "content": "No."}],
                    "images": ["pic.png"], "audios": ["clip0.wav"]})
    (media / "talk.mp4").write_bytes(
        encode_video_with_sound(rng.integers(0, 256, (12, 56, 56, 3), dtype=np.uint8), 4, tone(3.0, 16000, seed=9))
    )
    records.append({"id": "vid", "messages": [{"role": "user", "content": "<video>Heard?"},
                                             {"role": "assistant", "content": "Yes."}],
                    "videos": ["talk.mp4"], "use_audio_in_video": True})
    records.append({"id": "txt", "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]})
    path = root / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path
