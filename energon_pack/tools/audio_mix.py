"""The audio mix of ``energon-pack bench --media audio``: what Qwen-Omni users bring.

Speech-like clips of 1-30 s (`data.synthetic.speech_like`: voiced syllables, fricatives, pauses) in
the containers and codecs users ship, at each codec's usual sample rate (`AUDIO_MIX_FORMATS`: WAV
16 kHz, FLAC 16 kHz, MP3 22.05 kHz, AAC/M4A 44.1 kHz stereo, Ogg/Opus 48 kHz by default; WAV
44.1 kHz stereo on request), a question and an answer each, some with a second audio or a
follow-up text turn; short videos with an AAC sound track heard with it
(``use_audio_in_video: true``); a few JPEG images (some of them asked about with a clip); text-only
chats of two turns. Generated with PyAV and prepared once per set of parameters, in a cache folder
named by them (like `realistic_mix`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["AUDIO_MIX_CODECS", "AUDIO_MIX_FORMATS", "AudioMix", "audio_mix_dataset", "heard_sounds"]

#: Version of the generator in the cache folder names (bumped when the generated media change).
AUDIO_MIX_VERSION = 1
#: The clips' formats: name -> (``data.synthetic.AUDIO_CODECS`` codec, sample rate Hz, channels).
AUDIO_MIX_FORMATS: dict[str, tuple[str, int, int]] = {
    "wav_s16": ("wav_s16", 16000, 1),
    "wav_s16_44k_stereo": ("wav_s16", 44100, 2),
    "flac": ("flac", 16000, 1),
    "mp3": ("mp3", 22050, 1),
    "m4a_aac": ("m4a_aac", 44100, 2),
    "ogg_opus": ("ogg_opus", 48000, 1),
}
#: The formats of the clips in turn, by default.
AUDIO_MIX_CODECS = ("wav_s16", "flac", "mp3", "m4a_aac", "ogg_opus")
#: Every this-many audio chats, one with a second clip; every other one a follow-up text turn.
TWO_CLIPS_EVERY = 5


@dataclass(frozen=True, kw_only=True)
class AudioMix:
    """What the audio mix holds: ``clips`` audio files (seconds uniform in ``clip_seconds``, the
    ``formats`` of `AUDIO_MIX_FORMATS` in turn), ``sound_videos`` videos with sound (seconds uniform
    in ``video_seconds``, ``video_size`` (width, height) at ``fps``), ``images`` JPEGs of
    ``image_size`` (the first ``images_heard`` asked about with a clip each), ``text_chats``
    text-only chats."""

    clips: int = 40
    clip_seconds: tuple[float, float] = (1.0, 30.0)
    formats: tuple[str, ...] = AUDIO_MIX_CODECS
    sound_videos: int = 6
    video_seconds: tuple[float, float] = (4.0, 12.0)
    video_size: tuple[int, int] = (320, 240)
    fps: int = 10
    images: int = 4
    image_size: tuple[int, int] = (640, 480)
    text_chats: int = 6
    images_heard: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        low, high = self.clip_seconds
        if not 0 < low <= high:
            raise ValueError(f"clip_seconds={self.clip_seconds} must be (shortest, longest) with 0 < shortest <= longest; fix: e.g. (1.0, 30.0)")
        if min(self.clips, self.sound_videos, self.images, self.text_chats, self.images_heard) < 0:
            raise ValueError(f"negative count in {self!r}; fix: give counts >= 0")
        unknown = [name for name in self.formats if name not in AUDIO_MIX_FORMATS]
        if unknown or not self.formats:
            raise ValueError(
                f"audio formats {', '.join(unknown) or 'none'}: not among {', '.join(AUDIO_MIX_FORMATS)}; fix: name some of those"
            )
        if self.clips + self.sound_videos + self.images + self.text_chats == 0:
            raise ValueError("the audio mix would hold no sample; fix: give at least one clip, video, image or text chat")

    @property
    def folder_name(self) -> str:
        """Cache folder of this mix: counts readable, every parameter in the digest.

        Example: ``AudioMix().folder_name`` -> "audiomix1-40clips-6videos-<10 hex digits>".
        """
        digest = hashlib.sha256(repr(self).encode()).hexdigest()[:10]
        return f"audiomix{AUDIO_MIX_VERSION}-{self.clips}clips-{self.sound_videos}videos-{digest}"

    def clip_codecs(self) -> list[str]:
        """Format of each clip (`AUDIO_MIX_FORMATS` names), in turn. Example: ``AudioMix(clips=6).clip_codecs()[5]`` -> "wav_s16"."""
        return [self.formats[index % len(self.formats)] for index in range(self.clips)]


def _turn(rng: np.random.Generator, question: str) -> list[dict[str, str]]:
    """A user message (``question`` plus a sentence) and an answer of one to three sentences."""
    from energon_pack.data.synthetic import _sentence

    answer = " ".join(_sentence(rng, 6, 24) for _ in range(int(rng.integers(1, 4))))
    return [{"role": "user", "content": f"{question}{_sentence(rng, 4, 12)}"}, {"role": "assistant", "content": answer}]


def _write_clip(rng: np.random.Generator, mix: AudioMix, index: int, audio_format: str, raw: Path) -> str:
    from energon_pack.data.synthetic import AUDIO_CODECS, encode_audio, speech_like

    codec, rate, channels = AUDIO_MIX_FORMATS[audio_format]
    seconds = float(rng.uniform(*mix.clip_seconds))
    name = f"clip{index:03d}.{AUDIO_CODECS[codec][3]}"
    (raw / name).write_bytes(encode_audio(speech_like(seconds, rate, channels, seed=mix.seed * 1000 + index), rate, codec))
    return name


def _write_video(rng: np.random.Generator, mix: AudioMix, index: int, raw: Path) -> str:
    from energon_pack.data.synthetic import _smooth_pixels, encode_video_with_sound, speech_like

    width, height = mix.video_size
    seconds = float(rng.uniform(*mix.video_seconds))
    picture = _smooth_pixels(rng, height, width)
    frames = np.stack([np.roll(picture, 4 * step, axis=1) for step in range(max(2, round(seconds * mix.fps)))])
    sound = speech_like(seconds, 16000, seed=mix.seed * 1000 + 500 + index)
    name = f"talk{index:03d}.mp4"
    (raw / name).write_bytes(encode_video_with_sound(frames, mix.fps, sound))
    return name


def _write_image(rng: np.random.Generator, mix: AudioMix, index: int, raw: Path) -> str:
    from energon_pack.data.synthetic import _smooth_pixels, encode_image

    width, height = mix.image_size
    name = f"photo{index:03d}.jpg"
    (raw / name).write_bytes(encode_image(_smooth_pixels(rng, height, width), "JPEG", "RGB"))
    return name


def _records(rng: np.random.Generator, mix: AudioMix, raw: Path) -> list[dict[str, Any]]:
    """Write every medium of ``mix`` into ``raw``; the chat records that use them (tqdm progress)."""
    from tqdm import tqdm

    records: list[dict[str, Any]] = []
    clips = [_write_clip(rng, mix, i, name, raw) for i, name in enumerate(tqdm(mix.clip_codecs(), desc="audio clips", unit="clip"))]
    pending = iter(clips)
    for index, name in enumerate(pending):
        audios = [name]
        if index % TWO_CLIPS_EVERY == TWO_CLIPS_EVERY - 1 and (second := next(pending, None)) is not None:
            audios.append(second)
        messages = _turn(rng, "<audio>" * len(audios) + "\n")
        if index % 2:
            messages += _turn(rng, "")
        records.append({"id": f"audio{index:03d}", "messages": messages, "audios": audios})
    for index in tqdm(range(mix.sound_videos), desc="videos with sound", unit="video"):
        record = {"id": f"video{index:03d}", "messages": _turn(rng, "<video>\n"), "videos": [_write_video(rng, mix, index, raw)]}
        records.append({**record, "use_audio_in_video": True})
    for index in range(mix.images):
        image = _write_image(rng, mix, index, raw)
        if index < mix.images_heard and clips:  # an image asked about with a clip
            heard = [clips[index % len(clips)]]
            records.append({"id": f"image{index:03d}", "messages": _turn(rng, "<image><audio>\n"), "images": [image], "audios": heard})
        else:
            records.append({"id": f"image{index:03d}", "messages": _turn(rng, "<image>\n"), "images": [image]})
    for index in range(mix.text_chats):
        records.append({"id": f"text{index:03d}", "messages": _turn(rng, "") + _turn(rng, "")})
    return records


def audio_mix_dataset(work_dir: Path, mix: AudioMix) -> Path:
    """The mix generated and prepared (once) under ``work_dir / mix.folder_name``; the dataset's path.

    One sample per record, in a shuffled order (fixed by ``mix.seed``).
    """
    from energon_pack.data.prepare import prepare_dataset

    root = Path(work_dir) / mix.folder_name
    raw, out = root / "raw", root / "dataset"
    if (out / ".nv-meta" / "dataset.yaml").exists() and (root / ".complete").exists():
        return out
    print(f"generating the audio mix in {root} (once)")
    raw.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(mix.seed)
    records = _records(rng, mix, raw)
    order = rng.permutation(len(records))
    (raw / "records.jsonl").write_text("".join(json.dumps(records[i]) + "\n" for i in order), encoding="utf-8")
    prepare_dataset(raw / "records.jsonl", raw, out, samples_per_shard=8, progress=True)
    (root / ".complete").touch()
    return out


def heard_sounds(dataset: Path) -> list[bytes]:
    """The file bytes of every sound the mix's chats hear (each audio of a record, each video of a
    record heard with its sound), from the raw folder next to ``dataset`` (``audio_mix_dataset``'s)."""
    raw = Path(dataset).parent / "raw"
    sounds = []
    for line in (raw / "records.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        heard = record.get("audios", []) + (record.get("videos", []) if record.get("use_audio_in_video") else [])
        sounds += [(raw / name).read_bytes() for name in heard]
    return sounds
