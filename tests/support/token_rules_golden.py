"""Golden token counts: what the token-counting rules (``energon_pack.core.token_rules``) give on a
fixed set of samples of every family, and their digest.

Each family's settings are its offline processor's (``load_processor(family=...)``:
``VisionSpec.from_processor`` and, Qwen-Omni, ``sound_count_of``), written out so that no
processor is loaded. Every sample is counted with the pure functions plans from facts use
(``qwen.fit.media_geometry``: grids and frame sampling, frame lists included; ``image_token_count``;
``SoundCount.sound_tokens`` and ``SoundCount.frames``: sound tokens and log-mel frames of the
sample's clips padded together); a sample the rules skip records its reason.

``tests/support/token_rules_golden.json`` holds ``{"token_rules": version, "digest": ...}``. When a
rule changes, bump ``TOKEN_RULES_VERSION`` (with a changelog line) and re-record with
``python -m tests.support.token_rules_golden > tests/support/token_rules_golden.json``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from energon_pack.core.token_rules import TOKEN_RULES_VERSION
from energon_pack.qwen.audio import AudioSpec
from energon_pack.qwen.fit import media_geometry
from energon_pack.qwen.geometry import VisionSpec, image_token_count
from energon_pack.qwen.media import FRAME_LIST, BadMediaError, ImageInfo, VideoInfo
from energon_pack.qwen.sound_count import SoundCount

from tests.support.paths import SUPPORT

GOLDEN = SUPPORT / "token_rules_golden.json"

_VL = dict(patch_size=14, merge_size=2, temporal_patch_size=2, image_min_pixels=3136, image_max_pixels=1003520,
           video_min_pixels=100352, video_max_pixels=602112, max_video_tokens=128000)
_QWEN3 = dict(patch_size=16, merge_size=2, temporal_patch_size=2, image_min_pixels=65536, image_max_pixels=16777216,
              video_min_pixels=131072, video_max_pixels=786432, max_video_tokens=768, clip_rule="round")
#: Each family's vision settings and, Qwen-Omni, its sound accounting (offline processors').
FAMILIES: dict[str, tuple[VisionSpec, SoundCount | None]] = {
    "qwen2-vl": (VisionSpec(family="qwen2-vl", **_VL), None),
    "qwen2.5-vl": (VisionSpec(family="qwen2.5-vl", **_VL), None),
    "qwen3-vl": (VisionSpec(family="qwen3-vl", **_QWEN3), None),
    "qwen3.5": (VisionSpec(family="qwen3.5", **_QWEN3), None),
    "qwen2.5-omni": (
        VisionSpec(family="qwen2.5-omni", **{**_VL, "image_max_pixels": 12845056}),
        SoundCount(spec=AudioSpec(), n_window=None, video_second_per_grid=1.0),
    ),
    "qwen3-omni": (
        VisionSpec(family="qwen3-omni", **{**_VL, "patch_size": 16, "image_max_pixels": 12845056,
                                           "video_min_pixels": 131072, "video_max_pixels": 786432}),
        SoundCount(spec=AudioSpec(padded_samples=None), n_window=50, video_second_per_grid=2.0),
    ),
}


def _image(width: int, height: int) -> ImageInfo:
    return ImageInfo(width=width, height=height, format="JPEG", mode="RGB")


def _video(frames: int, fps: float, width: int, height: int, *, frame_list: bool = False) -> VideoInfo:
    return VideoInfo(num_frames=frames, fps=fps, width=width, height=height, codec="h264",
                     container=FRAME_LIST if frame_list else "mov,mp4,m4a,3gp,3g2,mj2")


#: (images, videos, standalone audios' samples, per video its heard sound track's samples or None).
SAMPLES: list[tuple[list[ImageInfo], list[VideoInfo], list[int], list[int | None]]] = [
    ([], [], [], []),
    ([_image(640, 480)], [], [], []),
    ([_image(28, 28), _image(4000, 3000), _image(1200, 90)], [], [], []),
    ([], [_video(90, 30.0, 640, 360)], [], []),
    ([], [_video(3000, 29.97, 1920, 1080)], [], []),
    ([], [_video(1, 25.0, 320, 240)], [], []),
    ([], [_video(5, 1.0, 448, 448, frame_list=True)], [], []),
    ([], [_video(4, 1.0, 448, 448, frame_list=True), _video(1000, 1.0, 224, 224, frame_list=True)], [], []),
    ([_image(800, 600)], [_video(7, 1.0, 300, 200, frame_list=True)], [], []),
    ([], [], [16000], []),
    ([], [], [16001, 8000, 1234], []),
    ([], [], [100, 48000], []),
    ([], [], [5_000_000], []),
    ([], [], [80], []),
    ([_image(512, 512)], [_video(60, 30.0, 640, 480)], [24000], [32000]),
    ([], [_video(50, 25.0, 320, 240), _video(40, 20.0, 320, 240)], [], [None, 31999]),
]


def _count(vision: VisionSpec, sound: SoundCount | None, sample: tuple) -> Any:
    """One sample's counts: per medium its grid and tokens, per sound its tokens, the sample's
    log-mel frames; or the reason the rules skip it."""
    images, videos, audios, heard = sample
    try:
        geometry = media_geometry(images, videos, vision)
        grids = [grid for grids in (geometry.image_grid_thw, geometry.video_grid_thw) if grids is not None
                 for grid in grids.tolist()]
        counts: dict[str, Any] = {
            "grids": grids,
            "tokens": [image_token_count(tuple(grid), vision.merge_size) for grid in grids],
            "seconds": [round(s, 6) for s in geometry.second_per_grid_ts],
        }
        if sound is not None:
            tokens = sound.sound_tokens(audios, heard + [None] * (len(videos) - len(heard)))
            counts.update(audio_tokens=list(tokens.audios), heard_tokens=list(tokens.videos),
                          frames=sound.frames([*audios, *(n for n in heard if n is not None)]))
        return counts
    except BadMediaError as err:
        return err.reason


def golden_counts() -> dict[str, list[Any]]:
    """Every family's counts of every golden sample (sounds only for the families that hear)."""
    return {family: [_count(vision, sound, sample) for sample in SAMPLES] for family, (vision, sound) in FAMILIES.items()}


def counts_digest(counts: dict[str, list[Any]]) -> str:
    """SHA-256 (hex, 16 digits) of ``counts`` as sorted JSON."""
    return hashlib.sha256(json.dumps(counts, sort_keys=True).encode()).hexdigest()[:16]


def record() -> dict[str, Any]:
    """What ``token_rules_golden.json`` holds for this tree."""
    return {"token_rules": TOKEN_RULES_VERSION, "digest": counts_digest(golden_counts())}


if __name__ == "__main__":
    print(json.dumps(record(), indent=1))
