"""Chat conversations: the three accepted input forms, normalised to typed messages.

A typed message is ``{"role": "system"|"user"|"assistant"|"tool", "content": [part, ...]}`` with
parts ``{"type": "text", "text": str}``, ``{"type": "image"}``, ``{"type": "video"}`` or
``{"type": "audio"}`` (Qwen-Omni, docs/omni.md). Media parts refer to the sample's images /
videos / audios lists in order of appearance. An assistant message may
also carry ``"reasoning_content": str`` (its thinking); templates with a thinking block (Qwen3.5 /
Qwen3.6; Qwen3-Omni for the answers after the last text query) render it inside
``<think>...</think>``, the others ignore it (docs/qwen35.md, docs/omni.md).

Tool use, as Hugging Face chat templates take it (docs/on_disk_format.md, "Tool use and template
options"): an assistant message may carry ``"tool_calls": [{"type": "function", "function":
{"name": str, "arguments": dict or JSON object string}}, ...]`` (content may then be empty);
a ``"tool"`` message holds a call's result (``name`` / ``tool_call_id`` kept when given). A
record may carry ``tools`` (JSON-schema function definitions) and ``chat_template_kwargs``
(options passed to the template); `ChatRecord` holds them and `stored_conversation` writes them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from energon_pack.errors import BadSampleError

Message = dict[str, Any]

ROLES = ("system", "user", "assistant", "tool")
# ShareGPT / LLaVA speaker names -> chat roles.
ROLE_ALIASES = {
    "human": "user", "gpt": "assistant", "user": "user", "assistant": "assistant", "system": "system", "tool": "tool",
}
MEDIA_KINDS = ("image", "video")
#: Every media part kind: the vision kinds and audio (heard by Qwen-Omni models only).
ALL_MEDIA_KINDS = (*MEDIA_KINDS, "audio")
#: Message field holding an assistant turn's reasoning (the thinking before its answer).
REASONING_FIELD = "reasoning_content"
#: Assistant message field holding its function calls.
TOOL_CALLS_FIELD = "tool_calls"
#: Tool message fields kept when given (strings): the function's name and the call it answers.
TOOL_MESSAGE_FIELDS = ("name", "tool_call_id")
#: ``apply_chat_template`` arguments that are not template options (``chat_template_kwargs`` may not set them).
RESERVED_TEMPLATE_OPTIONS = frozenset({
    "messages", "conversation", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "return_dict", "return_tensors", "return_assistant_tokens_mask",
    "processor_kwargs", "sanitize_control_tokens", "load_audio_from_video",
})
_PLACEHOLDER = re.compile(r"<(image|video|audio)>")


def split_placeholders(text: str) -> list[dict[str, str]]:
    """Split a string at ``<image>`` / ``<video>`` / ``<audio>`` placeholders into typed parts.

    Text between placeholders is kept verbatim (newlines included); empty text parts are dropped.

    Example: ``"<image>\\nWhat?"`` -> ``[{"type": "image"}, {"type": "text", "text": "\\nWhat?"}]``.
    """
    parts: list[dict[str, str]] = []
    position = 0
    for match in _PLACEHOLDER.finditer(text):
        if match.start() > position:
            parts.append({"type": "text", "text": text[position : match.start()]})
        parts.append({"type": match.group(1)})
        position = match.end()
    if position < len(text):
        parts.append({"type": "text", "text": text[position:]})
    return parts


def _typed_part(part: Any) -> dict[str, str]:
    if isinstance(part, str):
        return {"type": "text", "text": part}
    if not isinstance(part, Mapping) or part.get("type") not in ("text", *ALL_MEDIA_KINDS):
        raise BadSampleError(
            "malformed_conversation",
            f"content part {part!r} is not a typed part; use {{'type': 'text', 'text': ...}}, "
            "{'type': 'image'}, {'type': 'video'} or {'type': 'audio'}",
        )
    if part["type"] == "text":
        text = part.get("text")
        if not isinstance(text, str):
            raise BadSampleError("malformed_conversation", f"text part {part!r} has no string 'text'")
        return {"type": "text", "text": text}
    return {"type": part["type"]}


def _typed_content(content: Any) -> list[dict[str, str]]:
    if isinstance(content, str):
        return split_placeholders(content)
    if isinstance(content, Sequence):
        return [p for p in map(_typed_part, content) if p["type"] != "text" or p["text"]]
    raise BadSampleError(
        "malformed_conversation", f"message content {content!r} is neither a string nor a list of typed parts"
    )


def _typed_message(message: Any) -> Message:
    if not isinstance(message, Mapping):
        raise BadSampleError("malformed_conversation", f"message {message!r} is not a mapping")
    if "role" in message:
        speaker, content = message["role"], message.get("content")
    elif "from" in message:
        speaker, content = message["from"], message.get("value")
    else:
        raise BadSampleError(
            "malformed_conversation", f"message {message!r} has neither 'role'/'content' nor 'from'/'value'"
        )
    role = ROLE_ALIASES.get(speaker) if isinstance(speaker, str) else None
    if role is None:
        raise BadSampleError(
            "malformed_conversation", f"role {speaker!r} is not one of {', '.join(ROLE_ALIASES)}"
        )
    # An assistant turn that only calls tools (or a tool result) may have null or no content.
    empty = content is None and role in ("assistant", "tool")
    typed: Message = {"role": role, "content": [] if empty else _typed_content(content)}
    calls = message.get(TOOL_CALLS_FIELD)
    if calls is not None:
        if role != "assistant":
            raise BadSampleError(
                "malformed_conversation",
                f"{TOOL_CALLS_FIELD} on a {role} message: only an assistant message calls tools; fix: move the "
                "calls to the assistant turn that makes them",
            )
        if isinstance(calls, (str, bytes, Mapping)) or not isinstance(calls, Sequence):
            raise BadSampleError("malformed_conversation", f"{TOOL_CALLS_FIELD} {calls!r} must be a list of calls")
        if calls:
            typed[TOOL_CALLS_FIELD] = [typed_tool_call(call) for call in calls]
    if role == "tool":
        typed.update({name: message[name] for name in TOOL_MESSAGE_FIELDS if isinstance(message.get(name), str)})
    reasoning = message.get(REASONING_FIELD)
    if reasoning is not None:
        if role != "assistant" or not isinstance(reasoning, str):
            raise BadSampleError(
                "malformed_conversation",
                f"{REASONING_FIELD}={reasoning!r} on a {role} message: only an assistant message carries "
                f"reasoning, as a string; fix: move it to the assistant turn it belongs to, or drop it",
            )
        typed[REASONING_FIELD] = reasoning
    return typed


def typed_tool_call(call: Any) -> dict[str, Any]:
    """One function call in the Hugging Face form ``{"type": "function", "function": {"name", "arguments"}}``
    (a flat ``{"name", "arguments"}`` is accepted; ``id`` is kept when it is a string).

    ``arguments`` stay as given: a dict, or a string that must parse as a JSON object (templates
    render it verbatim, or iterate it: docs/on_disk_format.md). Raises ``BadSampleError`` with
    ``tool_call_without_name`` or ``bad_tool_arguments``.
    Example: ``{"function": {"name": "f", "arguments": "{\\"x\\": 1}"}}`` ->
    ``{"type": "function", "function": {"name": "f", "arguments": "{\\"x\\": 1}"}}``;
    ``{"name": "f", "arguments": "[1]"}`` -> BadSampleError("bad_tool_arguments").
    """
    if not isinstance(call, Mapping):
        raise BadSampleError(
            "malformed_conversation",
            f"tool call {call!r} is not an object; use {{'type': 'function', 'function': {{'name': ..., 'arguments': {{...}}}}}}",
        )
    function = call.get("function", call)
    if not isinstance(function, Mapping):
        raise BadSampleError(
            "malformed_conversation", f"tool call {call!r}: 'function' must be an object with 'name' and 'arguments'"
        )
    name, arguments = function.get("name"), function.get("arguments")
    if not isinstance(name, str) or not name:
        raise BadSampleError(
            "tool_call_without_name",
            f"tool call {call!r} has no function name; fix: give each call {{'function': {{'name': '<function>', ...}}}}",
        )
    if not isinstance(arguments, Mapping) and not (isinstance(arguments, str) and _is_json_object(arguments)):
        raise BadSampleError(
            "bad_tool_arguments",
            f"tool call {name!r}: arguments {arguments!r} are neither an object nor a string holding a JSON object; "
            "fix: write them as {\"param\": value, ...} (a dict, or that JSON text)",
        )
    typed: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if isinstance(call.get("id"), str):
        typed["id"] = call["id"]
    return typed


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except json.JSONDecodeError:
        return False


def check_tool_order(messages: Sequence[Message]) -> None:
    """Raise ``BadSampleError("tool_result_before_call")`` when a tool message comes before any
    assistant message that calls a tool (a result must answer a call).

    Example: ``[user "Hi", tool "42", assistant "ok"]`` -> BadSampleError naming message 2.
    """
    called = False
    for number, message in enumerate(messages, start=1):
        called = called or bool(message.get(TOOL_CALLS_FIELD))
        if message["role"] == "tool" and not called:
            raise BadSampleError(
                "tool_result_before_call",
                f"message {number} (tool) comes before any assistant tool call; fix: put the assistant message "
                "with its tool_calls before the tool results that answer them",
            )


def count_media_parts(messages: Sequence[Message]) -> dict[str, int]:
    """Number of image, video and audio parts in typed messages.

    Example: one user message ``[image, text, image]`` -> ``{"image": 2, "video": 0, "audio": 0}``.
    """
    counts = dict.fromkeys(ALL_MEDIA_KINDS, 0)
    for message in messages:
        for part in message["content"]:
            if part["type"] in counts:
                counts[part["type"]] += 1
    return counts


def normalize_conversation(messages: Any, *, num_images: int, num_videos: int, num_audios: int = 0) -> list[Message]:
    """Validate a conversation in any accepted form and return typed messages.

    Raises ``BadSampleError`` with reason ``empty_conversation``, ``malformed_conversation``,
    ``no_assistant_turn``, ``placeholder_mismatch`` (media parts != media given), or a tool-use
    reason (``tool_result_before_call``, ``tool_call_without_name``, ``bad_tool_arguments``).

    Example: ``[{"from": "human", "value": "<image>Hi"}, {"from": "gpt", "value": "Yo"}]`` with one
    image -> ``[{"role": "user", "content": [image, text "Hi"]}, {"role": "assistant", "content": [text "Yo"]}]``.
    An assistant message's ``reasoning_content`` string is kept (None is dropped):
    ``{"role": "assistant", "content": "4", "reasoning_content": "2+2"}`` ->
    ``{"role": "assistant", "content": [text "4"], "reasoning_content": "2+2"}``.
    """
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise BadSampleError("malformed_conversation", f"conversation must be a list of messages, got {type(messages).__name__}")
    if not messages:
        raise BadSampleError("empty_conversation", "the conversation has no messages")
    typed = [_typed_message(m) for m in messages]
    if not any(m["role"] == "assistant" and (m["content"] or m.get(TOOL_CALLS_FIELD)) for m in typed):
        raise BadSampleError("no_assistant_turn", "no assistant message with content or tool calls: nothing to train on")
    check_tool_order(typed)
    counts = count_media_parts(typed)
    given = {"image": num_images, "video": num_videos, "audio": num_audios}
    for kind in ALL_MEDIA_KINDS:
        if counts[kind] != given[kind]:
            raise BadSampleError(
                "placeholder_mismatch",
                f"{counts[kind]} {kind} placeholder(s) but {given[kind]} {kind}(s) given; "
                f"put one <{kind}> (or {{'type': '{kind}'}}) per {kind}",
            )
    return typed


def check_no_assistant_media(messages: Sequence[Message]) -> None:
    """Raise ``BadSampleError("media_in_assistant_turn")`` when an assistant message holds media.

    Vision tokens never carry loss, so an image or video in an assistant turn cannot be learned
    as output; usually the record is wrong (the media belongs to the user turn).
    Example: ``[user "Draw.", assistant [image]]`` -> BadSampleError naming message 2.
    """
    for number, message in enumerate(messages, start=1):
        kinds = [part["type"] for part in message["content"] if part["type"] in ALL_MEDIA_KINDS]
        if message["role"] == "assistant" and kinds:
            raise BadSampleError(
                "media_in_assistant_turn",
                f"message {number} (assistant) holds {len(kinds)} media part(s) ({', '.join(kinds)}); vision "
                "tokens never carry loss, so the model cannot learn to produce them; fix: move the media into "
                "a user turn, or pass --allow-assistant-media to keep them as unsupervised context",
            )


def decode_conversation_json(data: bytes) -> Any:
    """Decode a stored ``<key>.json`` conversation; non-UTF-8 or invalid JSON is a bad sample."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BadSampleError("non_utf8_text", f"conversation is not valid UTF-8 ({err.reason} at byte {err.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise BadSampleError("malformed_conversation", f"conversation is not valid JSON: {err}") from None


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, Sequence) and all(isinstance(v, str) for v in value):
        return list(value)
    raise BadSampleError("malformed_conversation", f"media list {value!r} must be a path or a list of paths")


def template_options_problem(options: Any) -> str | None:
    """Why ``options`` cannot be ``chat_template_kwargs`` (None when it can): an object whose keys are
    template variable names, none of them an ``apply_chat_template`` argument (``RESERVED_TEMPLATE_OPTIONS``).

    Example: ``{"add_vision_id": True}`` -> None; ``{"tools": []}`` -> "... 'tools' is an argument ...".
    """
    if not isinstance(options, Mapping):
        return f"chat_template_kwargs {options!r} must be an object of template options, e.g. {{\"add_vision_id\": true}}"
    for key in options:
        if not isinstance(key, str) or not key.isidentifier():
            return f"chat_template_kwargs key {key!r} is not a template variable name"
        if key in RESERVED_TEMPLATE_OPTIONS:
            return (
                f"chat_template_kwargs key {key!r} is an argument of apply_chat_template, not a template option "
                "(training renders no generation prompt; tools go in the record's 'tools')"
            )
    return None


def check_tools(tools: Any) -> list[dict[str, Any]] | None:
    """A record's ``tools``: None, or a list of JSON-schema function definitions (objects), as given.

    Raises ``BadSampleError("malformed_tools")`` otherwise. Example: ``[{"type": "function",
    "function": {"name": "f", "parameters": {...}}}]`` -> the same list; ``{"name": "f"}`` -> error.
    """
    if tools is None:
        return None
    is_list = not isinstance(tools, (str, bytes, Mapping)) and isinstance(tools, Sequence)
    if not is_list or not all(isinstance(tool, Mapping) for tool in tools):
        raise BadSampleError(
            "malformed_tools",
            f"tools {tools!r} must be a list of function definitions (objects), e.g. [{{\"type\": \"function\", "
            "\"function\": {\"name\": ..., \"parameters\": {...}}}]",
        )
    return [dict(tool) for tool in tools] or None


def check_template_options(options: Any) -> dict[str, Any] | None:
    """A record's ``chat_template_kwargs``: None, or a dict of template options (`template_options_problem`).

    Raises ``BadSampleError("bad_template_options")`` otherwise. Example: ``{"preserve_thinking": True}`` -> same.
    """
    if options is None:
        return None
    problem = template_options_problem(options)
    if problem is not None:
        raise BadSampleError("bad_template_options", problem)
    return dict(options) or None


@dataclass(frozen=True)
class ChatRecord:
    """One input record of ``energon-pack prepare``: id, typed messages and media paths, and the
    record's ``tools`` and ``chat_template_kwargs`` (None when absent)."""

    id: str | None
    messages: list[Message]
    images: list[str] = field(default_factory=list)
    videos: list[str] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    #: Qwen-Omni: audio paths (one per audio part) and whether videos are heard with their sound.
    audios: list[str] = field(default_factory=list)
    use_audio_in_video: bool = False


#: Record field: hear each video with its sound track (Qwen-Omni; the name Qwen's own tools use).
USE_AUDIO_IN_VIDEO = "use_audio_in_video"


def check_use_audio_in_video(value: Any) -> bool:
    """A record's ``use_audio_in_video``: absent/None is False, else it must be a bool.

    Example: ``True`` -> True; ``"yes"`` -> BadSampleError("malformed_conversation").
    """
    if value is None or isinstance(value, bool):
        return bool(value)
    raise BadSampleError("malformed_conversation", f"{USE_AUDIO_IN_VIDEO}={value!r} must be true or false")


def stored_conversation(record: ChatRecord) -> bytes:
    """The ``<key>.json`` part of a record: its typed messages as a JSON list, or, when the record
    has ``tools``, ``chat_template_kwargs`` or ``use_audio_in_video``, an object ``{"messages": [...],
    "tools": [...], "chat_template_kwargs": {...}, "use_audio_in_video": true}`` holding those
    present (docs/on_disk_format.md).

    Example: a record without tools -> ``b'[{"role": "user", ...}, ...]'`` (as before tool use existed).
    """
    extra = {name: value for name in ("tools", "chat_template_kwargs", USE_AUDIO_IN_VIDEO) if (value := getattr(record, name))}
    document: Any = {"messages": record.messages, **extra} if extra else record.messages
    return json.dumps(document, ensure_ascii=False).encode("utf-8")


@dataclass(frozen=True)
class StoredConversation:
    """A decoded ``<key>.json`` part: typed messages, ``tools`` and ``chat_template_kwargs`` (None when absent)."""

    messages: list[Message]
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    use_audio_in_video: bool = False


def parse_stored_conversation(
    document: Any, *, num_images: int, num_videos: int, num_audios: int = 0
) -> StoredConversation:
    """Validate a decoded ``<key>.json`` part: a list of messages, or an object with ``messages``
    (or ``conversations``) and optional ``tools`` / ``chat_template_kwargs``.

    Example: ``{"messages": [...], "tools": [{...}]}`` -> ``StoredConversation(messages=[...], tools=[{...}])``.
    """
    tools = options = None
    hear_videos = False
    if isinstance(document, Mapping):
        tools = check_tools(document.get("tools"))
        options = check_template_options(document.get("chat_template_kwargs"))
        hear_videos = check_use_audio_in_video(document.get(USE_AUDIO_IN_VIDEO))
        document = document.get("messages", document.get("conversations"))
        if document is None:
            raise BadSampleError("malformed_conversation", "conversation object has neither 'messages' nor 'conversations'")
    messages = normalize_conversation(document, num_images=num_images, num_videos=num_videos, num_audios=num_audios)
    return StoredConversation(messages, tools, options, hear_videos)


def parse_record(record: Any) -> ChatRecord:
    """Parse an input record (messages/images/videos/audios, ShareGPT/LLaVA, or typed parts; Qwen-Omni
    records may set ``use_audio_in_video``).

    Example: ``{"id": "a", "messages": [{"role": "user", "content": "<image>What?"},
    {"role": "assistant", "content": "A cat."}], "images": ["a.jpg"]}`` -> ``ChatRecord(id="a", ...)``.
    A record's ``tools`` and ``chat_template_kwargs`` are checked (`check_tools`,
    `check_template_options`) and kept.
    """
    if not isinstance(record, Mapping):
        raise BadSampleError("malformed_conversation", f"record must be a JSON object, got {type(record).__name__}")
    raw_id = record.get("id")
    if raw_id is not None and not isinstance(raw_id, (str, int)):
        raise BadSampleError("malformed_conversation", f"record id {raw_id!r} must be a string")
    messages = record.get("messages", record.get("conversations"))
    if messages is None:
        raise BadSampleError("malformed_conversation", "record has neither 'messages' nor 'conversations'")
    images = _as_list(record.get("images", record.get("image")))
    videos = _as_list(record.get("videos", record.get("video")))
    audios = _as_list(record.get("audios", record.get("audio")))
    typed = normalize_conversation(messages, num_images=len(images), num_videos=len(videos), num_audios=len(audios))
    return ChatRecord(
        id=None if raw_id is None else str(raw_id), messages=typed, images=images, videos=videos,
        tools=check_tools(record.get("tools")), chat_template_kwargs=check_template_options(record.get("chat_template_kwargs")),
        audios=audios, use_audio_in_video=check_use_audio_in_video(record.get(USE_AUDIO_IN_VIDEO)),
    )
