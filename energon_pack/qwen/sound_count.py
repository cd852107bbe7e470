"""How many LLM tokens a Qwen-Omni sample's sounds become, from their lengths alone.

The one rule both the online path (``qwen.encode.OmniHearing``, after probing each sound) and a
plan from prepare's facts (``plan.accounting``, from the recorded sample counts) use: a sound of
n model-rate samples (uncapped) is over the cap when n > ``spec.max_samples`` (skipped as
``audio_too_long`` unless trimmed); its feature frames are ``AudioSpec.feature_frames`` under the
length the processor pads the sample's sounds to; its tokens are the family's rule
(`audio_token_count`); a sound without a token is skipped (``empty_audio``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from energon_pack.qwen.audio import AudioSpec
from energon_pack.qwen.media import BadMediaError
from energon_pack.qwen.template import SoundTokens

__all__ = ["OMNI_VIDEO_FPS", "SoundCount", "audio_token_count"]

#: Frames per second each Omni processor takes for a video's seconds per grid step
#: (``temporal_patch_size / fps``) when no ``fps`` is passed to it: ``Qwen2_5OmniProcessor``'s
#: hard-coded 2.0, ``Qwen3OmniMoeProcessor``'s 1.0 (whatever rate the frames were sampled at).
OMNI_VIDEO_FPS = {"qwen2.5-omni": 2.0, "qwen3-omni": 1.0}


def audio_token_count(feature_frames: int, n_window: int | None = None) -> int:
    """LLM tokens of an audio of ``feature_frames`` mel frames.

    ``n_window`` None (Qwen2.5-Omni): the audio tower's two stride-2 steps,
    ``((F - 1) // 2 + 1 - 2) // 2 + 1``. Else (Qwen3-Omni, 50): the frames are cut into chunks of
    ``2 * n_window`` and each goes through three stride-2 convolutions, ``c(n) = (n - 1) // 2 + 1``
    three times, so ``F // (2 * n_window) * c(2 * n_window) + c(F % (2 * n_window))``.

    Example: 100 frames (1 s) -> 25 (Qwen2.5-Omni), 13 (Qwen3-Omni); 3000 -> 750, 390;
    1 -> 0, 1; 150 -> 37, 20.
    """
    if n_window is None:
        return ((feature_frames - 1) // 2 + 1 - 2) // 2 + 1
    chunk = 2 * n_window
    return feature_frames // chunk * _three_strides(chunk) + _three_strides(feature_frames % chunk)


def _three_strides(frames: int) -> int:
    """Output length of three stride-2 convolutions (kernel 3, padding 1); 0 for 0. Example: 100 -> 13."""
    for _ in range(3):
        frames = (frames - 1) // 2 + 1 if frames > 0 else 0
    return frames


@dataclass(frozen=True, kw_only=True)
class SoundCount:
    """A Qwen-Omni processor's sound accounting: ``spec`` (its ``AudioSpec``, ``max_samples``
    lowered to ``max_audio_seconds``), ``trim`` (an overlong sound keeps its start, else the sample
    is skipped), ``n_window`` (Qwen3-Omni's audio token rule; None: Qwen2.5-Omni's) and
    ``video_second_per_grid`` (seconds per temporal grid step the processor gives every video).

    Example (Qwen2.5-Omni defaults): ``SoundCount.of(AudioSpec(), None, 1.0).tokens([16000])`` -> ``[25]``.
    """

    spec: AudioSpec
    trim: bool = True
    n_window: int | None = None
    video_second_per_grid: float = 1.0

    @classmethod
    def of(
        cls,
        spec: AudioSpec,
        n_window: int | None,
        video_second_per_grid: float,
        *,
        max_audio_seconds: float | None = None,
        trim: bool = True,
    ) -> SoundCount:
        """The accounting of a processor's ``spec`` capped at ``max_audio_seconds`` (None: the
        model's own cap); ValueError naming the value when the cap is outside (0, the model's]."""
        if max_audio_seconds is not None:
            cap = int(max_audio_seconds * spec.sampling_rate)
            if not 0 < cap <= spec.max_samples:
                raise ValueError(
                    f"max_audio_seconds={max_audio_seconds} must be in (0, {spec.max_seconds:g}]: the model reads at most "
                    f"{spec.max_seconds:g} s of an audio (its feature extractor's n_samples); fix: lower it"
                )
            spec = replace(spec, max_samples=cap)
        return cls(spec=spec, trim=trim, n_window=n_window, video_second_per_grid=video_second_per_grid)

    def check_length(self, samples: int) -> int:
        """``samples`` (model-rate samples of one sound, uncapped) when the sample may keep it;
        over the cap without ``trim``: ``BadMediaError("audio_too_long")``."""
        if samples > self.spec.max_samples and not self.trim:
            raise BadMediaError(
                "audio_too_long",
                f"audio of {samples / self.spec.sampling_rate:.1f} s is over max_audio_seconds={self.spec.max_seconds:g}; "
                "fix: cut the clip, raise max_audio_seconds, or set on_overlong_audio='trim' to keep its start",
            )
        return samples

    def tokens(self, samples: Sequence[int]) -> list[int]:
        """LLM tokens of each sound of one sample (``samples``: model-rate samples of each, uncapped;
        the frames of one depend on what the processor pads the sample's sounds to). A sound without
        a token is ``BadMediaError("empty_audio")``.

        Example (Qwen3-Omni): ``[100, 16000]`` -> ``[1, 13]``; ``[100]`` alone -> empty_audio.
        """
        padded = self.spec.padded_length(samples)
        tokens = [audio_token_count(self.spec.feature_frames(n, padded), self.n_window) for n in samples]
        for n, count in zip(samples, tokens):
            if count == 0:
                raise BadMediaError(
                    "empty_audio",
                    f"audio of {n} samples ({n / self.spec.sampling_rate * 1000:.0f} ms) gives the model no token "
                    f"(too few feature frames of {self.spec.hop_length} samples); fix: drop the clip",
                )
        return tokens

    def frames(self, samples: Sequence[int]) -> int:
        """Log-mel frames of one sample's sounds together (``samples``: model-rate samples of each,
        uncapped), the clips padded together as the processor pads them (``AudioSpec.padded_length``).
        Example: 16000 and 8000 samples at hop 160 -> 150."""
        padded = self.spec.padded_length(samples)
        return sum(self.spec.feature_frames(n, padded) for n in samples)

    def sound_tokens(self, audios: Sequence[int], videos: Sequence[int | None]) -> SoundTokens:
        """The ``SoundTokens`` of one sample from its sounds' lengths (model-rate samples, uncapped):
        ``audios`` per standalone audio, ``videos`` per video (its sound track when heard, else
        None); lengths checked first (`check_length`), then tokens counted (`tokens`), as the
        online path does. Example (Qwen2.5-Omni): ``([16000], [None])`` -> ``SoundTokens((25,), (None,), (1.0,))``."""
        heard = [n for n in videos if n is not None]
        for n in [*audios, *heard]:
            self.check_length(n)
        counted = iter(self.tokens([*audios, *heard]))
        audio_tokens = tuple(next(counted) for _ in audios)
        return SoundTokens(
            audios=audio_tokens,
            videos=tuple(None if n is None else next(counted) for n in videos),
            video_second_per_grid=(self.video_second_per_grid,) * len(videos),
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready values (``of_dict`` reads them back)."""
        return {"spec": vars(self.spec), "trim": self.trim, "n_window": self.n_window,
                "video_second_per_grid": self.video_second_per_grid}

    @classmethod
    def of_dict(cls, data: dict[str, Any]) -> SoundCount:
        """Inverse of `to_dict`."""
        return cls(spec=AudioSpec(**data["spec"]), trim=bool(data["trim"]),
                   n_window=None if data["n_window"] is None else int(data["n_window"]),
                   video_second_per_grid=float(data["video_second_per_grid"]))
