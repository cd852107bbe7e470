"""The realistic media mix of ``energon-pack bench --media realistic``: what users bring.

12 MP phone photos (JPEG, stored landscape with an EXIF orientation, as phones write them), 1080p
30 fps H.264 clips of 30 s to 5 min and one 4K clip, each with a fixed GOP of 1 s (a keyframe every
second, as phone cameras write them), encoded as web video is (x264 "veryfast", CRF 23: CABAC,
deblocking, B-frames; `tools.clips.ENCODINGS["h264-web"]`). Generation stays practical on 2 cores:
low-motion content (a slow camera pan over a smooth picture, made straight in yuv420p). The mix is
generated and prepared once per set of parameters, in a cache folder named by them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["RealisticMix", "clip_durations", "realistic_dataset"]

#: Version of the generator in the cache folder names (bumped when the generated media change).
REALISTIC_MIX_VERSION = 2  # 2: clips as web video (x264 veryfast, B-frames), not ultrafast
#: EXIF orientations of the photos, in turn: portrait (6), upright (1), upside down (3), portrait (8).
PHOTO_ORIENTATIONS = (6, 1, 3, 8)
#: Camera pan of the clips in luma pixels per frame (60 px/s at 30 fps).
PAN_PIXELS_PER_FRAME = 2


def clip_durations(count: int, shortest: float = 30.0, longest: float = 300.0) -> tuple[float, ...]:
    """``count`` clip lengths in seconds, geometrically spaced from ``shortest`` to ``longest``.

    Example: ``clip_durations(3)`` -> (30.0, 94.87, 300.0) (rounded here); ``clip_durations(1)`` -> (300.0,).
    """
    if count < 1:
        return ()
    if count == 1:
        return (float(longest),)
    ratio = longest / shortest
    return tuple(float(shortest * ratio ** (index / (count - 1))) for index in range(count))


@dataclass(frozen=True, kw_only=True)
class RealisticMix:
    """What the realistic mix holds: photos (count, stored (width, height)), 1080p clips (seconds
    each, (width, height)), one 4K clip (seconds, (width, height)), frame rate and keyframe interval."""

    photos: int = 24
    photo_size: tuple[int, int] = (4000, 3000)
    clip_seconds: tuple[float, ...] = clip_durations(6)
    clip_size: tuple[int, int] = (1920, 1080)
    uhd_seconds: float = 60.0
    uhd_size: tuple[int, int] = (3840, 2160)
    fps: int = 30
    gop_seconds: float = 1.0
    seed: int = 0

    def scaled(self, scale: float) -> RealisticMix:
        """The same mix with every clip ``scale`` times as long (at least 2 frames), sizes unchanged.

        Example: ``RealisticMix(clip_seconds=(30.0,), uhd_seconds=60.0).scaled(0.1)`` -> clips of 3 s, 4K clip of 6 s.
        """
        shortest = 2 / self.fps
        return dataclasses.replace(
            self,
            clip_seconds=tuple(max(shortest, seconds * scale) for seconds in self.clip_seconds),
            uhd_seconds=max(shortest, self.uhd_seconds * scale),
        )

    @property
    def folder_name(self) -> str:
        """Cache folder of this mix: counts readable, every parameter in the digest.

        Example: ``RealisticMix().folder_name`` -> "realistic2-24photos-6clips-<10 hex digits>".
        """
        digest = hashlib.sha256(repr(self).encode()).hexdigest()[:10]
        return f"realistic{REALISTIC_MIX_VERSION}-{self.photos}photos-{len(self.clip_seconds)}clips-{digest}"

    def clips(self) -> list[tuple[float, tuple[int, int]]]:
        """Every clip as (seconds, (width, height)): the 1080p clips, then the 4K one (none at 0 s)."""
        uhd = [(self.uhd_seconds, self.uhd_size)] if self.uhd_seconds > 0 else []
        return [(seconds, self.clip_size) for seconds in self.clip_seconds] + uhd


def _panning_frames(rng: np.random.Generator, size: tuple[int, int], num_frames: int) -> Iterator[np.ndarray]:
    """yuv420p frames [H * 3 / 2, W] of a slow pan over a smooth picture, made one at a time."""
    import av

    from energon_pack.data.synthetic import _smooth_pixels

    width, height = size
    # A quarter-size picture scaled up: smooth like a photo, cheap to make at 4K.
    small = _smooth_pixels(rng, height // 4, width // 4)
    picture = av.VideoFrame.from_ndarray(small, format="rgb24").reformat(width=width, height=height, format="yuv420p")
    planes = picture.to_ndarray()
    luma = planes[:height]
    chroma = [plane.reshape(height // 2, width // 2) for plane in np.split(planes[height:], 2)]
    for index in range(num_frames):
        shift = PAN_PIXELS_PER_FRAME * index
        parts = [np.roll(luma, shift, axis=1)]
        parts += [np.roll(plane, shift // 2, axis=1).reshape(height // 4, width) for plane in chroma]
        yield np.concatenate(parts)


def _write_clip(rng: np.random.Generator, mix: RealisticMix, seconds: float, size: tuple[int, int], path: Path) -> None:
    from energon_pack.data.synthetic import encode_video
    from energon_pack.tools.clips import ENCODINGS

    gop = max(1, round(mix.gop_seconds * mix.fps))
    num_frames = max(2, round(seconds * mix.fps))
    # Fixed GOP (keyint = min-keyint, no scene-cut keyframes), as phone cameras write.
    web = ENCODINGS["h264-web"]
    frames = _panning_frames(rng, size, num_frames)
    path.write_bytes(encode_video(frames, mix.fps, codec=web.codec, options=web.encoder_options(gop), input_format="yuv420p"))


def _write_photo(rng: np.random.Generator, mix: RealisticMix, index: int, path: Path) -> None:
    from energon_pack.data.synthetic import _smooth_pixels, encode_image

    width, height = mix.photo_size
    orientation = PHOTO_ORIENTATIONS[index % len(PHOTO_ORIENTATIONS)]
    path.write_bytes(encode_image(_smooth_pixels(rng, height, width), "JPEG", "RGB", orientation=orientation))


def _chat(rng: np.random.Generator, placeholder: str) -> list[dict[str, str]]:
    """A user question about one medium and an answer of one to three sentences."""
    from energon_pack.data.synthetic import _sentence

    answer = " ".join(_sentence(rng, 8, 30) for _ in range(int(rng.integers(1, 4))))
    return [{"role": "user", "content": f"{placeholder}\n{_sentence(rng, 4, 14)}"}, {"role": "assistant", "content": answer}]


def realistic_dataset(work_dir: Path, mix: RealisticMix) -> Path:
    """The mix generated and prepared (once) under ``work_dir / mix.folder_name``; the dataset's path.

    One sample per photo and per clip, in a shuffled order (fixed by ``mix.seed``).
    """
    from tqdm import tqdm

    from energon_pack.data.prepare import prepare_dataset

    root = Path(work_dir) / mix.folder_name
    raw, out = root / "raw", root / "dataset"
    if (out / ".nv-meta" / "dataset.yaml").exists() and (root / ".complete").exists():
        return out
    raw.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(mix.seed)
    media = [("image", index, None) for index in range(mix.photos)] + [("video", i, clip) for i, clip in enumerate(mix.clips())]
    records = []
    frames = sum(round(seconds * mix.fps) for seconds, _ in mix.clips())
    for kind, index, clip in tqdm(media, desc=f"generating the realistic mix ({frames} video frames) in {root}", unit="medium"):
        if kind == "image":
            name = f"photo{index:03d}.jpg"
            _write_photo(rng, mix, index, raw / name)
        else:
            name = f"clip{index:03d}.mp4"
            _write_clip(rng, mix, clip[0], clip[1], raw / name)
        record = {"id": f"{kind}{index:03d}", "messages": _chat(rng, f"<{kind}>")}
        record["images" if kind == "image" else "videos"] = [name]
        records.append(record)
    order = rng.permutation(len(records))
    (raw / "records.jsonl").write_text("".join(json.dumps(records[i]) + "\n" for i in order), encoding="utf-8")
    prepare_dataset(raw / "records.jsonl", raw, out, samples_per_shard=8, progress=True)
    (root / ".complete").touch()
    return out
