"""The Qwen-VL and Qwen-Omni model families energon_pack supports, and how to tell a processor's family.

Qwen2.5-Omni (``"qwen2.5-omni"``) and Qwen3-Omni (``"qwen3-omni"``, whose thinker is a MoE): the
thinker's inputs. Both size images and video frames as Qwen2.5-VL does (``Qwen2VLImageProcessor``,
``Qwen2VLVideoProcessor``; Qwen3-Omni at patch 16) and hear audio (docs/omni.md).

Qwen3-Omni's released Instruct and Thinking models share everything but their chat templates
(docs/omni.md, "Chat templates"): one family with two template variants (``TEMPLATE_VARIANTS``).

Qwen3.5 and Qwen3.6 (dense ``qwen3_5`` and MoE ``qwen3_5_moe`` in transformers) form one family,
``"qwen3.5"``: they share one tokenizer and one processor. That processor uses the very classes of
Qwen3-VL (``Qwen3VLProcessor``, ``Qwen2VLImageProcessor`` at patch 16, ``Qwen3VLVideoProcessor``)
and the same rope rule, so the class name cannot tell them apart. What does: the model config's
``model_type`` when one is known, else the vocabulary (``<|image_pad|>`` is 248056 in the 248k
Qwen3.5 vocabulary, 151655 in the Qwen2/2.5/3 one).
"""

from __future__ import annotations

from typing import Any, Literal, get_args

__all__ = [
    "FAMILIES",
    "FAMILY_BY_MODEL_TYPE",
    "Family",
    "OMNI_FAMILIES",
    "TEMPLATE_VARIANTS",
    "family_of_model_config",
    "processor_family",
    "vision_rules",
]

Family = Literal["qwen2-vl", "qwen2.5-vl", "qwen3-vl", "qwen3.5", "qwen2.5-omni", "qwen3-omni"]
FAMILIES: tuple[Family, ...] = get_args(Family)

#: ``model_type`` of each supported Hugging Face VL config (the full config, not its text_config).
FAMILY_BY_MODEL_TYPE: dict[str, Family] = {
    "qwen2_vl": "qwen2-vl",
    "qwen2_5_vl": "qwen2.5-vl",
    "qwen3_vl": "qwen3-vl",
    "qwen3_vl_moe": "qwen3-vl",
    "qwen3_5": "qwen3.5",
    "qwen3_5_moe": "qwen3.5",
    "qwen2_5_omni": "qwen2.5-omni",
    "qwen2_5_omni_thinker": "qwen2.5-omni",
    "qwen3_omni_moe": "qwen3-omni",
    "qwen3_omni_moe_thinker": "qwen3-omni",
}
#: Families whose models hear audio (docs/omni.md).
OMNI_FAMILIES: tuple[Family, ...] = ("qwen2.5-omni", "qwen3-omni")
#: Released variants of a family whose chat templates differ, the default first (``load_processor(variant=...)``).
TEMPLATE_VARIANTS: dict[Family, tuple[str, ...]] = {"qwen3-omni": ("instruct", "thinking")}
#: ``<|image_pad|>`` id of the Qwen3.5 / Qwen3.6 vocabulary.
QWEN35_IMAGE_PAD_ID = 248056

# Class-name prefixes of the Hugging Face processors (matched along the MRO, so subclasses count).
_PROCESSOR_PREFIXES: tuple[tuple[str, Family], ...] = (
    ("Qwen2_5Omni", "qwen2.5-omni"),
    ("Qwen3OmniMoe", "qwen3-omni"),
    ("Qwen3VL", "qwen3-vl"),
    ("Qwen2_5_VL", "qwen2.5-vl"),
    ("Qwen2VL", "qwen2-vl"),
)
# Qwen2-VL and Qwen2.5-VL share their sub-processors; only Qwen3-VL has its own video processor.
_QWEN3_VIDEO_PROCESSOR = "Qwen3VLVideoProcessor"


def vision_rules(family: Family) -> Family:
    """The family whose geometry, rope and template rules ``family`` follows.

    The one place where Qwen3.5 is mapped onto Qwen3-VL (and the Omni families' vision onto
    Qwen2.5-VL's: the same image and video processor classes, per-frame pixel limits):
    VisionSpec, RopeSpec and the chat template ask this, never ``family == "qwen3-vl"``.
    Example: ``"qwen3.5"`` -> ``"qwen3-vl"``; ``"qwen3-omni"`` -> ``"qwen2.5-vl"``.
    """
    return {"qwen3.5": "qwen3-vl", "qwen2.5-omni": "qwen2.5-vl", "qwen3-omni": "qwen2.5-vl"}.get(family, family)


def family_of_model_config(config: Any) -> Family:
    """The family of a Hugging Face VL model config, from its ``model_type``.

    Example: a ``Qwen3_5MoeConfig`` -> ``"qwen3.5"``. Raises ValueError naming the model_type.
    """
    model_type = getattr(config, "model_type", None)
    family = FAMILY_BY_MODEL_TYPE.get(model_type)
    if family is None:
        raise ValueError(
            f"model_type={model_type!r} is not a supported Qwen-VL model; expected one of "
            f"{sorted(FAMILY_BY_MODEL_TYPE)} (pass the full VL config, not its text_config)"
        )
    return family


def processor_family(processor: Any) -> Family:
    """The Qwen-VL family of a processor object.

    In order: the ``model_type`` of the model config ``load_processor(path)`` kept next to it
    (``processor.energon_pack_model_config``); else its class (or a parent class) name; and a
    Qwen3-VL-class processor whose ``<|image_pad|>`` is 248056 is Qwen3.5 / Qwen3.6. A bare
    holder of ``image_processor`` / ``video_processor`` resolves only when its video processor
    is a Qwen3-VL one. Example: a ``Qwen2_5_VLProcessor`` -> ``"qwen2.5-vl"``;
    ``load_processor(family="qwen3.5")`` -> ``"qwen3.5"``.
    """
    config = getattr(processor, "energon_pack_model_config", None)
    if getattr(config, "model_type", None) in FAMILY_BY_MODEL_TYPE:
        return family_of_model_config(config)
    family = _class_family(processor)
    if family == "qwen3-vl" and _image_pad_id(processor) == QWEN35_IMAGE_PAD_ID:
        return "qwen3.5"
    return family


def _class_family(processor: Any) -> Family:
    for klass in type(processor).__mro__:
        for prefix, family in _PROCESSOR_PREFIXES:
            if klass.__name__.startswith(prefix):
                return family
    video_processor = getattr(processor, "video_processor", None)
    if any(klass.__name__ == _QWEN3_VIDEO_PROCESSOR for klass in type(video_processor).__mro__):
        return "qwen3-vl"
    raise ValueError(
        f"cannot tell the Qwen-VL family of {type(processor).__name__} (video processor "
        f"{type(video_processor).__name__}): it is not a Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5 or Qwen-Omni processor; "
        f"fix: pass a Qwen-VL processor (load_processor() builds one offline) or family= one of {FAMILIES}"
    )


def _image_pad_id(processor: Any) -> int | None:
    """``<|image_pad|>`` id of a processor (its ``image_token_id``, else its tokenizer's), or None."""
    found = getattr(processor, "image_token_id", None)
    tokenizer = getattr(processor, "tokenizer", None)
    if found is None and tokenizer is not None:
        found = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    return None if found is None else int(found)
