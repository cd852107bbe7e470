"""The chat templates energon_pack's offline processors carry.

- Qwen3-VL: the official Qwen3-VL Instruct template (``templates/qwen3_vl.jinja``).
- Qwen3.5 / Qwen3.6: the official Qwen3.6 template (``templates/qwen3_6.jinja``): tools,
  ``reasoning_content``, ``preserve_thinking`` and ``add_vision_id`` (docs/qwen35.md).
- Qwen3-Omni: the released Instruct template (``templates/qwen3_omni_instruct.jinja``, the default)
  or Thinking template (``templates/qwen3_omni_thinking.jinja``, variant ``"thinking"``): tools,
  tool results and ``reasoning_content`` (docs/omni.md, "Chat templates").
- Qwen2-VL / Qwen2.5-VL: ChatML with the default system prompt when the conversation has none,
  written for this project (``_chat_template(VL_MARKERS)``). It renders every conversation without template
  options exactly as the official Qwen2-VL / Qwen2.5-VL template (``templates/qwen2_5_vl.jinja``)
  does, and stays so that rows, saved states and plans keyed on its hash stay valid; the
  official one (``official_chat_template("qwen2.5-vl")``) adds ``add_vision_id``. Neither renders
  tools.
- Qwen2.5-Omni: the same ChatML with its media markers (an audio part is
  ``<|audio_bos|><|AUDIO|><|audio_eos|>``) and the default system prompt (docs/omni.md).

The official texts and where they were taken from: ``templates/SOURCES.md``.

Content is a string or a list of typed parts (``{"type": "text", "text": ...}``,
``{"type": "image"}``, ``{"type": "video"}``); a media part renders as
``<|vision_start|><|image_pad|><|vision_end|>`` (``<|video_pad|>`` for a video).

Example (Qwen3.5): ``[user "Hi", assistant "Yo"]`` ->
``<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\nYo<|im_end|>\\n``.
"""

from __future__ import annotations

import functools
from importlib import resources

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "OFFICIAL_TEMPLATE_FILES",
    "OFFICIAL_VARIANT_FILES",
    "chat_template_for",
    "official_chat_template",
]

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."

#: The official template file of each family (``templates/``; Qwen2-VL shares Qwen2.5-VL's).
OFFICIAL_TEMPLATE_FILES = {
    "qwen2-vl": "qwen2_5_vl.jinja",
    "qwen2.5-vl": "qwen2_5_vl.jinja",
    "qwen3-vl": "qwen3_vl.jinja",
    "qwen3.5": "qwen3_6.jinja",
    "qwen3-omni": "qwen3_omni_instruct.jinja",
}
#: The official template file of each released variant of a family (``TEMPLATE_VARIANTS``).
OFFICIAL_VARIANT_FILES = {
    ("qwen3-omni", "instruct"): "qwen3_omni_instruct.jinja",
    ("qwen3-omni", "thinking"): "qwen3_omni_thinking.jinja",
}

# A message's content as text: a string as is, typed parts one by one (media as their markers).
def _message_text(markers: dict[str, str]) -> str:
    media = "".join(
        "{%- " + ("if" if index == 0 else "elif") + f" part['type'] == '{kind}' -%}}{{{{ '{marker}' }}}}"
        for index, (kind, marker) in enumerate(markers.items())
    )
    return (
        "{%- if message['content'] is string -%}"
        "{{ message['content'] }}"
        "{%- else -%}"
        "{%- for part in message['content'] -%}"
        + media
        + "{%- elif part['type'] == 'text' -%}{{ part['text'] }}"
        "{%- endif -%}"
        "{%- endfor -%}"
        "{%- endif -%}"
    )


#: Media markers of the Qwen-VL templates, and of Qwen2.5-Omni's (which has an audio part too).
VL_MARKERS = {
    "image": "<|vision_start|><|image_pad|><|vision_end|>",
    "video": "<|vision_start|><|video_pad|><|vision_end|>",
}
QWEN25_OMNI_MARKERS = {
    "image": "<|vision_bos|><|IMAGE|><|vision_eos|>",
    "video": "<|vision_bos|><|VIDEO|><|vision_eos|>",
    "audio": "<|audio_bos|><|AUDIO|><|audio_eos|>",
}
#: ChatML body and default system prompt of the families whose offline template is the project's.
_OWN_TEMPLATES = {"qwen2.5-omni": (QWEN25_OMNI_MARKERS, DEFAULT_SYSTEM_PROMPT)}


def _chat_template(markers: dict[str, str]) -> str:
    """ChatML with these media markers; ``default_system`` is bound by chat_template_for."""
    return (
        "{%- for message in messages -%}"
        "{%- if loop.first and message['role'] != 'system' and default_system -%}"
        "{{ '<|im_start|>system\\n' + default_system + '<|im_end|>\\n' }}"
        "{%- endif -%}"
        "{{ '<|im_start|>' + message['role'] + '\\n' }}"
        + _message_text(markers)
        + "{{ '<|im_end|>\\n' }}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
    )


@functools.lru_cache(maxsize=None)
def official_chat_template(family: str, variant: str | None = None) -> str:
    """The official chat template text of ``family``'s released models (``templates/SOURCES.md``);
    ``variant`` picks one of the family's ``TEMPLATE_VARIANTS`` (None: the family's default).

    Example: ``"tools" in official_chat_template("qwen3-vl")`` -> True;
    ``"preserve_thinking" in official_chat_template("qwen3.5")`` -> True (Qwen3.6's);
    ``official_chat_template("qwen3-omni", "thinking")`` -> the Qwen3-Omni Thinking model's.
    """
    name = OFFICIAL_TEMPLATE_FILES[family] if variant is None else OFFICIAL_VARIANT_FILES[(family, variant)]
    return resources.files("energon_pack.qwen").joinpath("templates", name).read_text(encoding="utf-8")


def chat_template_for(family: str, variant: str | None = None) -> str:
    """The chat template the offline processor of ``family`` (and ``variant``, for a family with
    ``TEMPLATE_VARIANTS``) carries.

    Example: ``chat_template_for("qwen3.5") == official_chat_template("qwen3.5")`` -> True;
    ``chat_template_for("qwen3-omni", "thinking")`` -> the released Thinking template;
    ``"qwen2.5-vl"`` -> the project's ChatML adding ``You are a helpful assistant.`` when there
    is no system turn.
    """
    if family in ("qwen3-vl", "qwen3.5", "qwen3-omni"):
        return official_chat_template(family, variant)
    markers, default_system = _OWN_TEMPLATES.get(family, (VL_MARKERS, DEFAULT_SYSTEM_PROMPT))
    return "{%- set default_system = " + repr(default_system) + " -%}" + _chat_template(markers)
