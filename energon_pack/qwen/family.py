"""The Qwen-VL model families energon_pack supports, and how to tell a processor's family."""

from __future__ import annotations

from typing import Any, Literal, get_args

__all__ = ["FAMILIES", "Family", "processor_family"]

Family = Literal["qwen2-vl", "qwen2.5-vl", "qwen3-vl"]
FAMILIES: tuple[Family, ...] = get_args(Family)

# Class-name prefixes of the Hugging Face processors (matched along the MRO, so subclasses count).
_PROCESSOR_PREFIXES: tuple[tuple[str, Family], ...] = (
    ("Qwen3VL", "qwen3-vl"),
    ("Qwen2_5_VL", "qwen2.5-vl"),
    ("Qwen2VL", "qwen2-vl"),
)
# Qwen2-VL and Qwen2.5-VL share their sub-processors; only Qwen3-VL has its own video processor.
_QWEN3_VIDEO_PROCESSOR = "Qwen3VLVideoProcessor"


def processor_family(processor: Any) -> Family:
    """The Qwen-VL family of a processor object, from its class (or a parent class) name.

    A bare holder of ``image_processor`` / ``video_processor`` resolves only when its video
    processor is a Qwen3-VL one. Example: a ``Qwen2_5_VLProcessor`` -> ``"qwen2.5-vl"``.
    """
    for klass in type(processor).__mro__:
        for prefix, family in _PROCESSOR_PREFIXES:
            if klass.__name__.startswith(prefix):
                return family
    video_processor = getattr(processor, "video_processor", None)
    if any(klass.__name__ == _QWEN3_VIDEO_PROCESSOR for klass in type(video_processor).__mro__):
        return "qwen3-vl"
    raise ValueError(
        f"cannot tell the Qwen-VL family of {type(processor).__name__} (video processor "
        f"{type(video_processor).__name__}): it is not a Qwen2-VL, Qwen2.5-VL or Qwen3-VL processor; "
        f"fix: pass a Qwen-VL processor (load_processor() builds one offline) or family= one of {FAMILIES}"
    )
