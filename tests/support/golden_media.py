"""Shared test helper: a deterministic mix of Qwen-VL chat samples.

``golden_samples(n, seed, family=...)`` returns ``GoldenSample`` tuples ``(messages, images, videos)``:
typed messages (see ``energon_pack.core.conversation``) with media parts in user turns, and the media
as compressed bytes. The mix covers text-only chats, 1-5 images per sample from 28x28 up to
4000x3000 (JPEG/PNG/WebP in RGB/RGBA/L/P, aspect ratios up to ~143, sides on and around
multiples of the family's resize factor), 1-20 s videos at 10-60 fps with small frames, system
prompts and several rounds. Big images are rare so that Hugging Face processing stays fast.

The Hugging Face reference they are compared with is ``tests.support.hf_reference.hf_reference``.
``chat_sample(golden, key)`` wraps a golden sample as the ``QwenVLChatSample`` preencode consumes.
``golden_count(n)`` is how many samples of an n-sample golden mix run (all, unless the
compatibility run asks for a prefix).
"""

from __future__ import annotations

import functools
import math
import os
from fractions import Fraction
from typing import NamedTuple

import numpy as np

from energon_pack.core.conversation import Message
from energon_pack.core.samples import QwenVLChatSample
from energon_pack.data.synthetic import IMAGE_KINDS, encode_image, encode_video

#: Share of each large golden mix that runs: 1 in the main suite; the compatibility run
#: (``make test-compat``, a second transformers release) checks a prefix of every mix.
GOLDEN_FRACTION = float(os.environ.get("ENERGON_PACK_GOLDEN_FRACTION", "1"))
#: Resize factor (patch * merge) per family; sizes near its multiples exercise the rounding.
FAMILY_FACTORS = {"qwen2-vl": 28, "qwen2.5-vl": 28, "qwen3-vl": 32, "qwen3.5": 32}
#: Source frame rates of the generated videos (frames/s); 30000/1001 is NTSC 29.97.
VIDEO_RATES: tuple[Fraction, ...] = tuple(map(Fraction, (10, 12, 24, 25, 30, 50, 60))) + (Fraction(30000, 1001),)
MIN_IMAGE_SIDE = 28
MAX_IMAGE_SIZE = (4000, 3000)  # long side, short side of the biggest images (pixels)
MAX_ASPECT = 4000 / 28  # ~143: HF rejects > 200

_WORDS = (
    "the a cat dog image video frame shows left right sky 7 42 3.14 café naïve 東京 猫 ok, yes! "
    "(maybe) `code` x=y+1 -- rows; \t tab new\nline end."
).split(" ")


class GoldenSample(NamedTuple):
    """One chat: typed ``messages``, compressed ``images`` and ``videos`` in placeholder order."""

    messages: list[Message]
    images: list[bytes]
    videos: list[bytes]


def _text(rng: np.random.Generator, min_words: int, max_words: int) -> str:
    words = rng.choice(_WORDS, size=int(rng.integers(min_words, max_words + 1)))
    return " ".join(words)


def _pixels(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """RGB uint8 [height, width, 3]: a random banded gradient (few colours, so cheap to encode and quantize)."""
    ys = (np.arange(height)[:, None, None] * rng.integers(1, 4, size=3)).astype(np.uint8)
    xs = (np.arange(width)[None, :, None] * rng.integers(1, 4, size=3) + rng.integers(0, 256, size=3)).astype(np.uint8)
    return (ys + xs) & np.uint8(0xE0)


def _image_size(rng: np.random.Generator, factor: int) -> tuple[int, int]:
    """(height, width) in pixels: mostly small and medium, ~3% up to 4000x3000, some extreme aspects."""
    draw = rng.random()
    if draw < 0.03:  # photo-sized: up to 4000x3000
        long_side = int(rng.integers(1600, MAX_IMAGE_SIZE[0] + 1))
        short_side = int(long_side * rng.uniform(0.5, MAX_IMAGE_SIZE[1] / MAX_IMAGE_SIZE[0]))
    elif draw < 0.10:  # extreme aspect ratio (thin strips), up to ~143
        short_side = int(rng.integers(MIN_IMAGE_SIDE, 60))
        long_side = min(int(short_side * rng.uniform(20, MAX_ASPECT)), MAX_IMAGE_SIZE[0])
    elif draw < 0.30:  # sides on, just off, or half way between multiples of the resize factor
        offsets = (-1, 0, 1, factor // 2)
        long_side = factor * int(rng.integers(2, 40)) + int(rng.choice(offsets))
        short_side = factor * int(rng.integers(1, 30)) + int(rng.choice(offsets))
        short_side = max(MIN_IMAGE_SIDE, min(short_side, long_side))
    else:  # everyday sizes, aspect within 1:4
        long_side = int(np.exp(rng.uniform(np.log(MIN_IMAGE_SIDE), np.log(1600))))
        short_side = max(MIN_IMAGE_SIDE, int(long_side / rng.uniform(1, 4)))
    return (long_side, short_side) if rng.random() < 0.5 else (short_side, long_side)


def make_image(
    rng: np.random.Generator, factor: int, *, size: tuple[int, int] | None = None, kind: tuple[str, str] | None = None
) -> bytes:
    """One encoded image; ``size`` (height, width) and ``kind`` (format, mode) are drawn when None."""
    height, width = size or _image_size(rng, factor)
    image_format, mode = kind or IMAGE_KINDS[int(rng.integers(len(IMAGE_KINDS)))]
    return encode_image(_pixels(rng, height, width), image_format, mode)


def make_video(
    rng: np.random.Generator, *, num_frames: int | None = None, rate: Fraction | None = None,
    size: tuple[int, int] | None = None,
) -> bytes:
    """One H.264 MP4 (frames/s ``rate``, ``size`` (height, width) even); 1-20 s at 10-60 fps, 32..96 px when drawn."""
    rate = rate or VIDEO_RATES[int(rng.integers(len(VIDEO_RATES)))]
    if num_frames is None:
        num_frames = max(2, round(float(np.exp(rng.uniform(0, np.log(20)))) * float(rate)))
    height, width = size or tuple(2 * int(rng.integers(16, 49)) for _ in range(2))
    first = _pixels(rng, height, width).astype(np.int16)
    steps = np.arange(num_frames, dtype=np.int16)[:, None, None, None] * 2
    frames = ((first[None] + steps) % 256).astype(np.uint8)
    return encode_video(frames, rate)  # type: ignore[arg-type]  # encode_video accepts any Fraction rate


def _user_content(rng: np.random.Generator, num_images: int, num_videos: int) -> list[dict[str, str]]:
    """Media parts in random order, with text before, between or after them (never empty)."""
    media = ["image"] * num_images + ["video"] * num_videos
    rng.shuffle(media)
    parts: list[dict[str, str]] = []
    for kind in media:
        if rng.random() < 0.4:
            parts.append({"type": "text", "text": _text(rng, 1, 6) + str(rng.choice(["\n", " ", ""]))})
        parts.append({"type": kind})
    if not parts or rng.random() < 0.9:
        parts.append({"type": "text", "text": str(rng.choice(["\n", " ", ""])) + _text(rng, 2, 30)})
    return parts


def _conversation(rng: np.random.Generator, num_images: int, num_videos: int) -> list[Message]:
    """1-4 user/assistant rounds (optional system prompt); media spread over the user turns."""
    rounds = int(rng.choice([1, 1, 2, 3, 4]))
    media_round = rng.integers(0, rounds, size=num_images + num_videos)
    kinds = ["image"] * num_images + ["video"] * num_videos
    messages: list[Message] = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": [{"type": "text", "text": _text(rng, 3, 20)}]})
    for index in range(rounds):
        here = [kind for kind, where in zip(kinds, media_round) if where == index]
        messages.append({"role": "user", "content": _user_content(rng, here.count("image"), here.count("video"))})
        # A leading newline merges with the header's newline into one token ("\n\n").
        lead = str(rng.choice(["", "", "", "", " ", "\n", "\n\n"]))
        messages.append({"role": "assistant", "content": [{"type": "text", "text": lead + _text(rng, 1, 60)}]})
    return messages


def _add_reasoning(rng: np.random.Generator, messages: list[Message]) -> None:
    """Give about half the assistant turns a ``reasoning_content`` (sometimes wrapped in newlines,
    which the Qwen3.5 template strips); the others keep none (non-thinking SFT data)."""
    for message in messages:
        if message["role"] == "assistant" and rng.random() < 0.5:
            wrap = str(rng.choice(["", "\n"]))
            message["reasoning_content"] = wrap + _text(rng, 1, 30) + wrap


def golden_sample(rng: np.random.Generator, *, family: str) -> GoldenSample:
    """One sample of the mix: 15% text only, 45% images, 25% videos, 15% images and videos.

    Qwen3.5 samples also carry assistant reasoning (``_add_reasoning``), drawn after everything
    else, so the other families' mixes do not change.
    """
    factor = FAMILY_FACTORS[family]
    kind = rng.choice(["text", "images", "videos", "both"], p=[0.15, 0.45, 0.25, 0.15])
    num_images = int(rng.choice([1, 1, 1, 2, 3, 4, 5])) if kind in ("images", "both") else 0
    num_videos = int(rng.choice([1, 1, 1, 2])) if kind in ("videos", "both") else 0
    images = [make_image(rng, factor) for _ in range(num_images)]
    videos = [make_video(rng) for _ in range(num_videos)]
    messages = _conversation(rng, num_images, num_videos)
    if family == "qwen3.5":
        _add_reasoning(rng, messages)
    return GoldenSample(messages, images, videos)


#: (height, width, format, mode) of the corner-case images every mix starts with.
CORNER_IMAGES: tuple[tuple[int, int, str, str], ...] = (
    (28, 28, "PNG", "P"),
    (3000, 4000, "JPEG", "RGB"),
    (4000, 3000, "WEBP", "RGBA"),
    (28, 4000, "PNG", "L"),
    (4000, 28, "JPEG", "L"),
)
#: (frames, frames/s, height, width) of the corner-case videos: 1 s at 10 fps, 20 s at 60 fps, 29.97 fps.
CORNER_VIDEOS: tuple[tuple[int, Fraction, int, int], ...] = (
    (10, Fraction(10), 32, 32),
    (1200, Fraction(60), 96, 64),
    (150, Fraction(30000, 1001), 48, 96),
)


@functools.lru_cache(maxsize=1)
def corner_media() -> tuple[tuple[bytes, ...], tuple[bytes, ...]]:
    """The encoded ``CORNER_IMAGES`` and ``CORNER_VIDEOS`` (made once per process: big images are slow to encode)."""
    rng = np.random.default_rng(0)
    images = tuple(make_image(rng, 28, size=(h, w), kind=(fmt, mode)) for h, w, fmt, mode in CORNER_IMAGES)
    videos = tuple(make_video(rng, num_frames=t, rate=r, size=(h, w)) for t, r, h, w in CORNER_VIDEOS)
    return images, videos


def corner_samples(seed: int) -> list[GoldenSample]:
    """Two samples with the extreme sizes and rates (``CORNER_IMAGES``; ``CORNER_VIDEOS``)."""
    rng = np.random.default_rng([seed, 0])  # indices 0 and 1 are never drawn at random
    images, videos = corner_media()
    return [
        GoldenSample(_conversation(rng, len(images), 0), list(images), []),
        GoldenSample(_conversation(rng, 0, len(videos)), [], list(videos)),
    ]


#: The seed of the golden mixes that the preencode (tokens) and postencode (pixels) golden tests
#: share, so that one Hugging Face processor run per sample serves both (``GoldenReferences``).
GOLDEN_MIX_SEED = 20251129


def golden_samples(n: int, seed: int, *, family: str) -> list[GoldenSample]:
    """``n`` deterministic samples: the two ``corner_samples``, then random ones (sample i depends
    only on (seed, i), so prefixes are stable).

    ``family`` ("qwen2-vl", "qwen2.5-vl", "qwen3-vl" or "qwen3.5") picks the resize factor whose
    multiples the boundary-case image sizes sit on.
    """
    if family not in FAMILY_FACTORS:
        raise ValueError(f"family={family!r} is unknown; use one of {tuple(FAMILY_FACTORS)}")
    corners = corner_samples(seed)[:n]
    rest = [golden_sample(np.random.default_rng([seed, index]), family=family) for index in range(len(corners), n)]
    return corners + rest


def golden_count(n: int) -> int:
    """``n`` scaled by GOLDEN_FRACTION, at least 1 (mixes are prefix-stable, so this is a prefix).

    Example: with GOLDEN_FRACTION 0.2, ``golden_count(500)`` -> 100.
    """
    return max(1, math.ceil(n * GOLDEN_FRACTION))


def chat_sample(golden: GoldenSample, key: str) -> QwenVLChatSample:
    """The ``QwenVLChatSample`` (no Energon dataset behind it) that preencode consumes."""
    return QwenVLChatSample(
        __key__=key,
        __restore_key__=(),
        __subflavors__=None,
        __sources__=None,
        conversation=golden.messages,
        images=list(golden.images),
        videos=list(golden.videos),
    )
