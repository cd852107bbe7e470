"""Chat conversations: the three accepted input forms, normalised to typed messages.

A typed message is ``{"role": "system"|"user"|"assistant", "content": [part, ...]}`` with parts
``{"type": "text", "text": str}``, ``{"type": "image"}`` or ``{"type": "video"}``. Media parts
refer to the sample's images / videos lists in order of appearance. An assistant message may
also carry ``"reasoning_content": str`` (its thinking); templates with a thinking block (Qwen3.5 /
Qwen3.6) render it inside ``<think>...</think>``, the others ignore it (docs/qwen35.md).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from energon_pack.errors import BadSampleError

Message = dict[str, Any]

ROLES = ("system", "user", "assistant")
# ShareGPT / LLaVA speaker names -> chat roles.
ROLE_ALIASES = {"human": "user", "gpt": "assistant", "user": "user", "assistant": "assistant", "system": "system"}
MEDIA_KINDS = ("image", "video")
#: Message field holding an assistant turn's reasoning (the thinking before its answer).
REASONING_FIELD = "reasoning_content"
_PLACEHOLDER = re.compile(r"<(image|video)>")


def split_placeholders(text: str) -> list[dict[str, str]]:
    """Split a string at ``<image>`` / ``<video>`` placeholders into typed parts.

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
    if not isinstance(part, Mapping) or part.get("type") not in ("text", *MEDIA_KINDS):
        raise BadSampleError(
            "malformed_conversation",
            f"content part {part!r} is not a typed part; use {{'type': 'text', 'text': ...}}, "
            "{'type': 'image'} or {'type': 'video'}",
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
    typed: Message = {"role": role, "content": _typed_content(content)}
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


def count_media_parts(messages: Sequence[Message]) -> dict[str, int]:
    """Number of image and video parts in typed messages.

    Example: one user message ``[image, text, image]`` -> ``{"image": 2, "video": 0}``.
    """
    counts = dict.fromkeys(MEDIA_KINDS, 0)
    for message in messages:
        for part in message["content"]:
            if part["type"] in counts:
                counts[part["type"]] += 1
    return counts


def normalize_conversation(messages: Any, *, num_images: int, num_videos: int) -> list[Message]:
    """Validate a conversation in any accepted form and return typed messages.

    Raises ``BadSampleError`` with reason ``empty_conversation``, ``malformed_conversation``,
    ``no_assistant_turn`` or ``placeholder_mismatch`` (media parts != media given).

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
    if not any(m["role"] == "assistant" and m["content"] for m in typed):
        raise BadSampleError("no_assistant_turn", "no assistant message with content: nothing to train on")
    counts = count_media_parts(typed)
    given = {"image": num_images, "video": num_videos}
    for kind in MEDIA_KINDS:
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
        kinds = [part["type"] for part in message["content"] if part["type"] in MEDIA_KINDS]
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


@dataclass(frozen=True)
class ChatRecord:
    """One input record of ``energon-pack prepare``: id, typed messages and media paths."""

    id: str | None
    messages: list[Message]
    images: list[str] = field(default_factory=list)
    videos: list[str] = field(default_factory=list)


def parse_record(record: Any) -> ChatRecord:
    """Parse an input record (messages/images/videos, ShareGPT/LLaVA, or typed parts).

    Example: ``{"id": "a", "messages": [{"role": "user", "content": "<image>What?"},
    {"role": "assistant", "content": "A cat."}], "images": ["a.jpg"]}`` -> ``ChatRecord(id="a", ...)``.
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
    typed = normalize_conversation(messages, num_images=len(images), num_videos=len(videos))
    return ChatRecord(id=None if raw_id is None else str(raw_id), messages=typed, images=images, videos=videos)
