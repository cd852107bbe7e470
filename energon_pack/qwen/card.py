"""A processor card: what token accounting from facts needs of a processor, readable without loading it.

Loading a processor costs seconds (importing torch and transformers, building the tokenizer);
``energon-pack plan`` from prepare's facts needs only a few of its values: its fingerprint (to
find the text-token file and to fingerprint the plan), its ``VisionSpec`` (grids), its rope
constants (the plan's encoder fingerprint) and how many tokens a media placeholder expands to.
A card holds exactly these, computed once from the loaded processor, and is filed in the user
cache (``cache_dir("processor_cards")/<key>.json``) under a key that is cheap to compute from
what the processor is built from:

* always: the token-rules version (``core.token_rules``);
* ``path`` None (the offline default): the BPE rank file, the ``energon_pack.qwen`` and
  ``identity`` sources (templates, special tokens, sub-processor settings) and the installed
  transformers / tokenizers releases;
* a processor folder (or a hub id in the local Hugging Face cache): the folder's path as
  ``resolve_processor_source`` gives it (the fingerprint names it), every file in it (content
  hash; files over 64 MiB, the weights, by name and size) and the same sources and releases.

Any change to those files, templates, image/video processor settings or releases gives another
key, so a stale card is never found (the processor is loaded and a new card filed).

Placeholder expansion (``qwen.template.placeholder_token_count``): a medium of grid (t, h, w)
expands to ``tokens(replacement of (t, merge, merge)) + t * (h*w/merge**2 - 1)``. Images always
have t = 1, so the card stores that count. Videos: for Qwen2/2.5-VL the replacement is t pad
tokens whatever the frame timing, so the card stores the count per step (checked on a few
lengths and timings); Qwen3-VL and Qwen3.5 write each step's timestamp, which only the
tokenizer can count, so their cards store None and videos need the processor.

Qwen-Omni processors (``qwen2.5-omni``, ``qwen3-omni``): the card also holds the processor's sound
accounting (``qwen.sound_count.SoundCount``: audio spec, token rule, videos' seconds per grid
step) and what the placeholders add beyond the sound's own tokens: per audio placeholder
(``audio_extra_tokens``, 0: an audio of n tokens expands to n pads) and per video heard with its
sound (``heard_video_extra_tokens``, 2: the audio span markers around the interleaved tokens),
both counted with the processor's own replacements when the card is made.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np

from energon_pack.core.cache import cache_dir
from energon_pack.core.token_rules import TOKEN_RULES_VERSION
from energon_pack.qwen.family import OMNI_FAMILIES, processor_family, vision_rules
from energon_pack.qwen.geometry import VisionSpec
from energon_pack.qwen.sound_count import SoundCount
from energon_pack.qwen.template import SoundTokens

__all__ = ["CARD_FORMAT", "ProcessorCard", "file_card", "file_processor_card", "processor_key"]

CARD_FORMAT = "energon_pack.processor_card/1"
#: Files above this size enter a processor folder's key by name and size only (weights).
_HASHED_FILE_LIMIT = 64 << 20
_PACKAGE = Path(__file__).resolve().parents[1]
#: (t, total frames, fps, sampled frame indices) of the video probes that confirm a per-step count.
_VIDEO_PROBES = ((1, 8, 2.0, (0, 4)), (3, 300, 29.97, (0, 50, 100, 150, 200, 250)), (7, 1000, 10.0, tuple(range(0, 980, 70))))


def _releases() -> list[str]:
    found = []
    for name in ("transformers", "tokenizers"):
        try:
            found.append(f"{name}=={version(name)}")
        except PackageNotFoundError:
            found.append(f"{name} absent")
    return found


def _hash_file(hasher: Any, path: Path) -> None:
    size = path.stat().st_size
    hasher.update(f"{path.name}\0{size}\0".encode())
    if size <= _HASHED_FILE_LIMIT:
        hasher.update(hashlib.sha256(path.read_bytes()).digest())


def processor_key(path: str | os.PathLike[str] | None) -> str | None:
    """The card key (32 hex digits) of the processor ``load_processor(path)`` builds, from its
    files and sources; None when it cannot be told cheaply (a hub id not in the local cache).

    Example: ``processor_key(None)`` -> ``"3f0c..."`` (the offline Qwen2.5-VL default);
    ``processor_key("/models/qwen")`` changes when any file in that folder changes.
    """
    from energon_pack.errors import UsageError
    from energon_pack.qwen.processor import _vocabulary, resolve_processor_source

    hasher = hashlib.sha256(f"{CARD_FORMAT}\0{' '.join(_releases())}\0token_rules {TOKEN_RULES_VERSION}\0".encode())
    for module in sorted([*(_PACKAGE / "qwen").glob("*.py"), _PACKAGE / "identity.py"]):
        _hash_file(hasher, module)
    if path is None:
        rank_file, pattern, *_ = _vocabulary("qwen2.5-vl")
        hasher.update(f"offline\0qwen2.5-vl\0{pattern}\0".encode())
        _hash_file(hasher, rank_file)
        return hasher.hexdigest()[:32]
    try:
        source = resolve_processor_source(path)
    except UsageError:
        return None
    folder = Path(source)
    if not folder.is_dir():
        return None
    # The tokenizer's name_or_path (in the fingerprint) is this string.
    hasher.update(f"folder\0{source}\0".encode())
    for file in sorted(folder.iterdir()):
        if file.is_file():
            _hash_file(hasher, file)
    return hasher.hexdigest()[:32]


def file_card(key: str) -> Path:
    """Where the card of ``key`` is filed."""
    return cache_dir("processor_cards") / f"{key}.json"


@dataclass(frozen=True, kw_only=True)
class ProcessorCard:
    """A processor's values for token accounting from facts (see the module docstring).

    ``fingerprint``: ``identity.processor_fingerprint``; ``vision``: its ``VisionSpec``;
    ``rope``: ``repr`` of its ``RopeSpec``; ``image_tokens``: tokens of an image grid
    (1, merge, merge); ``video_step_tokens``: tokens per temporal step of a video grid
    (t, merge, merge), None when the processor's video replacement depends on the timing.
    """

    key: str
    fingerprint: dict[str, Any]
    vision: VisionSpec
    rope: str
    image_tokens: int
    video_step_tokens: int | None
    sound: SoundCount | None = None
    audio_extra_tokens: int = 0
    heard_video_extra_tokens: int = 0

    @classmethod
    def of_processor(cls, processor: Any, key: str, *, rope: Any = None) -> ProcessorCard:
        """The card of a loaded processor (``rope``: its ``RopeSpec``; default from the processor)."""
        from energon_pack.identity import processor_fingerprint
        from energon_pack.qwen.rope import RopeSpec
        from energon_pack.qwen.template import MediaExpansion, VideoTiming, placeholder_token_count

        vision = VisionSpec.from_processor(processor)
        merge = vision.merge_size
        image_tokens = placeholder_token_count(processor, MediaExpansion(image_grid_thw=np.array([[1, merge, merge]])))
        step: int | None = None
        if vision_rules(vision.family) != "qwen3-vl":
            counts = {
                placeholder_token_count(processor, MediaExpansion(
                    video_grid_thw=np.array([[t, merge, merge]]),
                    videos=[VideoTiming(total_frames=total, fps=fps, frame_indices=indices)],
                )) / t
                for t, total, fps, indices in _VIDEO_PROBES
            }
            step = int(counts.pop()) if len(counts) == 1 and float(next(iter(counts), 0)).is_integer() else None
        return cls(
            key=key,
            fingerprint=processor_fingerprint(processor),
            vision=vision,
            rope=repr(rope or RopeSpec.from_processor(processor)),
            image_tokens=int(image_tokens),
            video_step_tokens=step,
            **_sound_fields(processor, vision),
        )

    def expansion(self, geometry: Any, sound: SoundTokens | None = None) -> int | None:
        """Tokens the placeholders of a ``qwen.fit.MediaGeometry`` (and, Qwen-Omni, of its
        ``sound``) expand to, as ``placeholder_token_count`` counts them; None when it has videos
        and the card no video count (or an image of more than one temporal step, which
        ``qwen.geometry.image_grid`` never gives)."""
        merged = self.vision.merge_size**2
        total = 0
        if sound is not None:
            heard = [tokens for tokens in sound.videos if tokens is not None]
            total += sum(sound.audios) + len(sound.audios) * self.audio_extra_tokens
            total += sum(heard) + len(heard) * self.heard_video_extra_tokens
        if geometry.image_grid_thw is not None:
            grids = np.asarray(geometry.image_grid_thw, dtype=np.int64)
            if (grids[:, 0] != 1).any():
                return None
            total += len(grids) * self.image_tokens + int((grids[:, 1] * grids[:, 2] // merged - 1).sum())
        if geometry.video_grid_thw is not None:
            if self.video_step_tokens is None:
                return None
            grids = np.asarray(geometry.video_grid_thw, dtype=np.int64)
            total += int((grids[:, 0] * (self.video_step_tokens + grids[:, 1] * grids[:, 2] // merged - 1)).sum())
        return total

    def to_json(self) -> str:
        return json.dumps(
            {"format": CARD_FORMAT, "key": self.key, "fingerprint": self.fingerprint, "vision": vars(self.vision),
             "rope": self.rope, "image_tokens": self.image_tokens, "video_step_tokens": self.video_step_tokens,
             **({} if self.sound is None else {
                 "sound": self.sound.to_dict(), "audio_extra_tokens": self.audio_extra_tokens,
                 "heard_video_extra_tokens": self.heard_video_extra_tokens})},
            sort_keys=True,
        )

    def save(self) -> Path:
        """File the card in the user cache (atomically); returns its path."""
        path = file_card(self.key)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(self.to_json(), encoding="utf-8")
        partial.replace(path)
        return path

    @classmethod
    def load(cls, key: str) -> ProcessorCard | None:
        """The filed card of ``key``; None when there is none, or it is unreadable or of another format or key."""
        try:
            data = json.loads(file_card(key).read_text(encoding="utf-8"))
            if data.get("format") != CARD_FORMAT or data.get("key") != key:
                return None
            return cls(
                key=key, fingerprint=dict(data["fingerprint"]), vision=VisionSpec(**data["vision"]), rope=str(data["rope"]),
                image_tokens=int(data["image_tokens"]),
                video_step_tokens=None if data["video_step_tokens"] is None else int(data["video_step_tokens"]),
                sound=None if data.get("sound") is None else SoundCount.of_dict(data["sound"]),
                audio_extra_tokens=int(data.get("audio_extra_tokens", 0)),
                heard_video_extra_tokens=int(data.get("heard_video_extra_tokens", 0)),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None


def _sound_fields(processor: Any, vision: VisionSpec) -> dict[str, Any]:
    """The card's sound fields of a Qwen-Omni processor ({} for others): its ``SoundCount`` and the
    tokens an audio placeholder and a heard video add beyond the sound's (and the video's) own,
    counted with ``placeholder_token_count`` on probes (a 7-token audio; a 3-step video heard with
    a 5-token sound)."""
    from energon_pack.qwen.encode import sound_count_of
    from energon_pack.qwen.template import MediaExpansion, VideoTiming, placeholder_token_count

    if processor_family(processor) not in OMNI_FAMILIES:
        return {}
    counting = sound_count_of(processor)
    merge = vision.merge_size
    seconds = (counting.video_second_per_grid,)
    audio = placeholder_token_count(processor, MediaExpansion(sound=SoundTokens(audios=(7,))))
    heard = placeholder_token_count(processor, MediaExpansion(
        video_grid_thw=np.array([[3, merge, merge]]),
        videos=[VideoTiming(total_frames=12, fps=2.0, frame_indices=tuple(range(0, 12, 2)))],
        sound=SoundTokens(videos=(5,), video_second_per_grid=seconds),
    ))
    return {"sound": counting, "audio_extra_tokens": audio - 7, "heard_video_extra_tokens": heard - 3 - 5}


def file_processor_card(path: str | os.PathLike[str] | None, processor: Any, *, rope: Any = None) -> Path | None:
    """File the card of ``processor``, the one ``load_processor(path)`` built (``rope``: the
    ``RopeSpec`` its encoder uses), unless the same card is filed already or the cache cannot
    be written; returns the path of a newly filed card, else None."""
    key = processor_key(path)
    if key is None:
        return None
    card = ProcessorCard.of_processor(processor, key, rope=rope)
    filed = ProcessorCard.load(key)
    if filed is not None and filed.to_json() == card.to_json():
        return None
    try:
        return card.save()
    except OSError:
        return None
