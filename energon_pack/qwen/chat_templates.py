"""The chat templates energon_pack's offline processors carry (Jinja text written for this project).

Content is a string or a list of typed parts (``{"type": "text", "text": ...}``,
``{"type": "image"}``, ``{"type": "video"}``); a media part renders as
``<|vision_start|><|image_pad|><|vision_end|>`` (``<|video_pad|>`` for a video).

- Qwen2-VL / Qwen2.5-VL: ChatML with the default system prompt when the conversation has none,
  as the released Qwen2-VL templates do.
- Qwen3-VL: the same ChatML, no default system prompt.
- Qwen3.5 / Qwen3.6: ChatML with a thinking block (``QWEN35_CHAT_TEMPLATE``, docs/qwen35.md):

  - no default system prompt;
  - an assistant message's reasoning is its ``reasoning_content`` string field, else the text
    before a ``</think>`` inside its content (the content then keeps only the text after it);
  - assistant turns after the last user message render ``<think>\\n{reasoning}\\n</think>\\n\\n{answer}``;
    with no reasoning that is the empty block ``<think>\\n\\n</think>\\n\\n`` before the answer
    (non-thinking SFT data); earlier assistant turns render the answer only (history reasoning
    is dropped, as the released Qwen3 templates do);
  - the generation prompt is ``<|im_start|>assistant\\n<think>\\n`` (thinking, the default), or
    ``<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n`` with ``enable_thinking=False``;
  - loss rule: everything an assistant turn renders after its ``<|im_start|>assistant\\n``
    header, think block included, up to and including ``<|im_end|>``, sits inside
    ``{% generation %}``, so ``return_assistant_tokens_mask`` marks exactly what
    ``assistant_target_mask`` supervises: the think block (empty or not) is trained, as the
    model emits it after the header at inference.

Example (Qwen3.5): ``[user "Hi", assistant "Yo"]`` ->
``<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\nYo<|im_end|>\\n``.
"""

from __future__ import annotations

__all__ = ["DEFAULT_SYSTEM_PROMPT", "QWEN35_CHAT_TEMPLATE", "chat_template_for"]

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."

# A message's content as text: a string as is, typed parts one by one (media as vision markers).
_MESSAGE_TEXT = (
    "{%- if message['content'] is string -%}"
    "{{ message['content'] }}"
    "{%- else -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' -%}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif part['type'] == 'video' -%}{{ '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{%- elif part['type'] == 'text' -%}{{ part['text'] }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
)

# ChatML; ``default_system`` is bound by chat_template_for.
_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if loop.first and message['role'] != 'system' and default_system -%}"
    "{{ '<|im_start|>system\\n' + default_system + '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    + _MESSAGE_TEXT
    + "{{ '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)

QWEN35_CHAT_TEMPLATE = (
    "{%- macro text_of(message) -%}" + _MESSAGE_TEXT + "{%- endmacro -%}"
    # Index of the last user message: assistant turns after it keep their think block.
    "{%- set state = namespace(last_user=-1) -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}{%- set state.last_user = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- for message in messages -%}"
    "{%- set body = text_of(message) -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{%- set reasoning = '' -%}"
    "{%- if message['reasoning_content'] is string -%}"
    "{%- set reasoning = message['reasoning_content'] -%}"
    "{%- elif '</think>' in body -%}"
    "{%- set reasoning = body.split('</think>')[0].split('<think>')[-1] -%}"
    "{%- set body = body.split('</think>')[-1] -%}"
    "{%- endif -%}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{%- generation -%}"
    "{%- if loop.index0 > state.last_user -%}"
    "{{ '<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' + body.lstrip('\\n') }}"
    "{%- else -%}"
    "{{ body.lstrip('\\n') }}"
    "{%- endif -%}"
    "{{ '<|im_end|>' }}"
    "{%- endgeneration -%}"
    "{{ '\\n' }}"
    "{%- else -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + body + '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else -%}"
    "{{ '<think>\\n' }}"
    "{%- endif -%}"
    "{%- endif -%}"
)


def chat_template_for(family: str) -> str:
    """The project's chat template for ``family``, with its default system prompt bound.

    Example: ``chat_template_for("qwen3.5") is QWEN35_CHAT_TEMPLATE`` -> True;
    ``"qwen2.5-vl"`` -> ChatML adding ``You are a helpful assistant.`` when there is no system turn.
    """
    if family == "qwen3.5":
        return QWEN35_CHAT_TEMPLATE
    system = "" if family == "qwen3-vl" else DEFAULT_SYSTEM_PROMPT
    return "{%- set default_system = " + repr(system) + " -%}" + _CHAT_TEMPLATE
