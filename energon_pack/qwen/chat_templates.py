"""The chat templates energon_pack's offline processors carry.

- Qwen3-VL: the official Qwen3-VL Instruct template (``templates/qwen3_vl.jinja``).
- Qwen3.5 / Qwen3.6: the official Qwen3.6 template (``templates/qwen3_6.jinja``): tools,
  ``reasoning_content``, ``preserve_thinking`` and ``add_vision_id`` (docs/qwen35.md).
- Qwen2-VL / Qwen2.5-VL: ChatML with the default system prompt when the conversation has none,
  written for this project (``_chat_template(VL_MARKERS)``). It renders every conversation without template
  options exactly as the official Qwen2-VL / Qwen2.5-VL template (``templates/qwen2_5_vl.jinja``)
  does, and stays so that rows, saved states and plans keyed on its hash stay valid; the
  official one (``official_chat_template("qwen2.5-vl")``) adds ``add_vision_id``. Neither renders
  tools.
- Qwen2.5-Omni / Qwen3-Omni: the same ChatML with each family's media markers (an audio part is
  ``<|audio_bos|><|AUDIO|><|audio_eos|>`` / ``<|audio_start|><|audio_pad|><|audio_end|>``);
  Qwen2.5-Omni's adds the default system prompt, Qwen3-Omni's none (docs/omni.md).

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

__all__ = ["DEFAULT_SYSTEM_PROMPT", "OFFICIAL_TEMPLATE_FILES", "chat_template_for", "official_chat_template"]

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."

#: The official template file of each family (``templates/``; Qwen2-VL shares Qwen2.5-VL's).
OFFICIAL_TEMPLATE_FILES = {
    "qwen2-vl": "qwen2_5_vl.jinja",
    "qwen2.5-vl": "qwen2_5_vl.jinja",
    "qwen3-vl": "qwen3_vl.jinja",
    "qwen3.5": "qwen3_6.jinja",
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
QWEN3_OMNI_MARKERS = {**VL_MARKERS, "audio": "<|audio_start|><|audio_pad|><|audio_end|>"}
#: ChatML body and default system prompt of the families whose offline template is the project's.
_OWN_TEMPLATES = {
    "qwen2.5-omni": (QWEN25_OMNI_MARKERS, DEFAULT_SYSTEM_PROMPT),
    "qwen3-omni": (QWEN3_OMNI_MARKERS, ""),
}


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
def official_chat_template(family: str) -> str:
    """The official chat template text of ``family``'s released models (``templates/SOURCES.md``).

    Example: ``"tools" in official_chat_template("qwen3-vl")`` -> True;
    ``"preserve_thinking" in official_chat_template("qwen3.5")`` -> True (Qwen3.6's).
    """
    name = OFFICIAL_TEMPLATE_FILES[family]
    return resources.files("energon_pack.qwen").joinpath("templates", name).read_text(encoding="utf-8")


def chat_template_for(family: str) -> str:
    """The chat template the offline processor of ``family`` carries.

    Example: ``chat_template_for("qwen3.5") == official_chat_template("qwen3.5")`` -> True;
    ``"qwen2.5-vl"`` -> the project's ChatML adding ``You are a helpful assistant.`` when there
    is no system turn.
    """
    if family in ("qwen3-vl", "qwen3.5"):
        return official_chat_template(family)
    markers, default_system = _OWN_TEMPLATES.get(family, (VL_MARKERS, DEFAULT_SYSTEM_PROMPT))
    return "{%- set default_system = " + repr(default_system) + " -%}" + _chat_template(markers)
