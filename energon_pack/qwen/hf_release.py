"""Where the supported transformers releases (>= 5.8, < 6) behave differently, and which one is installed.

Our processor and rope code follow the installed release, so rows agree with the Hugging Face
processor and model (and with Megatron-Bridge, which calls them) whatever the release.
Reading the version costs no ``import transformers``.
"""

from __future__ import annotations

from importlib.metadata import version

from packaging.version import Version

__all__ = ["INSTALLED_TRANSFORMERS", "QWEN25_FRACTIONAL_SECONDS_SINCE", "qwen25_rope_whole_seconds"]

#: The installed transformers release.
INSTALLED_TRANSFORMERS = Version(version("transformers"))

#: First release whose Qwen2.5-VL ``get_rope_index`` keeps fractional ``second_per_grid_ts``
#: (huggingface/transformers#48669); earlier ones compute ``tokens_per_second * int(seconds)``.
QWEN25_FRACTIONAL_SECONDS_SINCE = Version("5.18.0")


def qwen25_rope_whole_seconds(release: Version = INSTALLED_TRANSFORMERS) -> bool:
    """True when ``release`` truncates Qwen2.5-VL seconds per grid step to whole seconds.

    Example: ``Version("5.12.1") -> True``; ``Version("5.24.0") -> False``.
    """
    return release < QWEN25_FRACTIONAL_SECONDS_SINCE
