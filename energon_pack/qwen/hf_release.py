"""Where the supported transformers releases (>= 5.8, < 6) behave differently, and which one is installed.

Our processor and rope code follow the installed release, so rows agree with the Hugging Face
processor and model (and with Megatron-Bridge, which calls them) whatever the release.
Reading the version costs no ``import transformers``.
"""

from __future__ import annotations

from importlib.metadata import version

from packaging.version import Version

__all__ = [
    "INSTALLED_TRANSFORMERS",
    "QWEN25_FRACTIONAL_SECONDS_SINCE",
    "QWEN3_ROUNDED_CLIP_SINCE",
    "qwen25_rope_whole_seconds",
    "qwen3_clip_rule",
]

#: The installed transformers release.
INSTALLED_TRANSFORMERS = Version(version("transformers"))

#: First release whose Qwen2.5-VL ``get_rope_index`` keeps fractional ``second_per_grid_ts``
#: (huggingface/transformers#48669); earlier ones compute ``tokens_per_second * int(seconds)``.
QWEN25_FRACTIONAL_SECONDS_SINCE = Version("5.18.0")

#: First release whose Qwen3-VL video ``smart_resize`` rounds the frame count to the temporal
#: patch, scales up frames smaller than patch * merge and rejects clips shorter than the temporal
#: patch; earlier ones round the frame count up and reject the small frames instead.
QWEN3_ROUNDED_CLIP_SINCE = Version("5.15.0")


def qwen25_rope_whole_seconds(release: Version = INSTALLED_TRANSFORMERS) -> bool:
    """True when ``release`` truncates Qwen2.5-VL seconds per grid step to whole seconds.

    Example: ``Version("5.12.1") -> True``; ``Version("5.24.0") -> False``.
    """
    return release < QWEN25_FRACTIONAL_SECONDS_SINCE


def qwen3_clip_rule(release: Version = INSTALLED_TRANSFORMERS) -> str:
    """``"round"`` when ``release`` resizes Qwen3-VL clips the 5.15 way, else ``"ceil"``.

    Example: ``Version("5.12.1") -> "ceil"``; ``Version("5.24.0") -> "round"``.
    """
    return "round" if release >= QWEN3_ROUNDED_CLIP_SINCE else "ceil"
