"""Our record form, as a sample mapping or a cooker returns it, checked and turned into the fields
of ``QwenVLChatSample``.

A record is a mapping with ``conversation`` (or ``messages``): a list of messages in any form
``core.conversation`` accepts (``role``/``content`` or ``from``/``value``, ``<image>`` /
``<video>`` placeholders or typed parts), ``images`` and ``videos``: lists of compressed file
bytes in placeholder order (each optional, default empty). A ``QwenVLChatSample`` is a record too.

Example: ``chat_fields({"conversation": [{"role": "user", "content": "<image>What?"},
{"role": "assistant", "content": "A cat."}], "images": [b"\\xff\\xd8..."]})`` ->
``{"conversation": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]},
{"role": "assistant", "content": [{"type": "text", "text": "A cat."}]}], "images": [b"\\xff\\xd8..."],
"videos": [], "invalid_reason": None, "invalid_detail": None}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from energon_pack.core.conversation import normalize_conversation
from energon_pack.core.samples import QwenVLChatSample
from energon_pack.errors import BadSampleError
from energon_pack.formats.energon_types import media_bytes

#: Keys a record may hold (``messages`` is an alias of ``conversation``).
RECORD_KEYS = ("conversation", "messages", "images", "videos")


def _media_list(record: Mapping[str, Any], kind: str) -> list[bytes]:
    value = record.get(kind)
    if value is None:
        return []
    if isinstance(value, (bytes, bytearray, str)) or not isinstance(value, (list, tuple)):
        raise BadSampleError(
            "malformed_sample", f"record {kind!r} is a {type(value).__name__}; fix: a list of file bytes, one per <{kind[:-1]}>"
        )
    return [media_bytes(item, f"record {kind}[{index}]") for index, item in enumerate(value)]


def record_fields(record: Any) -> dict[str, Any]:
    """The ``conversation`` / ``images`` / ``videos`` of a record, checked; raises ``BadSampleError``.

    Reasons: ``malformed_sample`` (not a record, unknown keys, media not in lists),
    ``decoded_media`` (pixels instead of file bytes), and those of ``normalize_conversation``
    (``placeholder_mismatch``, ``no_assistant_turn``, ...).
    Example: ``record_fields({"messages": [{"from": "gpt", "value": "Hi"}]})`` ->
    ``{"conversation": [assistant [text "Hi"]], "images": [], "videos": []}``.
    """
    if isinstance(record, QwenVLChatSample):
        if record.invalid_reason is not None:
            raise BadSampleError(record.invalid_reason, record.invalid_detail or "")
        record = {"conversation": record.conversation, "images": record.images, "videos": record.videos}
    if not isinstance(record, Mapping):
        raise BadSampleError(
            "malformed_sample",
            f"a sample mapping returned a {type(record).__name__}; fix: return our record form, a dict with "
            "'conversation', 'images' and 'videos' (docs/foreign_datasets.md)",
        )
    unknown = sorted(str(key) for key in record if key not in RECORD_KEYS and not str(key).startswith("__"))
    if unknown:
        raise BadSampleError(
            "malformed_sample", f"record keys {unknown} are not part of our record form; fix: keep only {', '.join(RECORD_KEYS)}"
        )
    images, videos = _media_list(record, "images"), _media_list(record, "videos")
    messages = record.get("conversation", record.get("messages"))
    if messages is None:
        raise BadSampleError("malformed_sample", "record has neither 'conversation' nor 'messages'")
    conversation = normalize_conversation(messages, num_images=len(images), num_videos=len(videos))
    return {"conversation": conversation, "images": images, "videos": videos}


def chat_fields(record: Any) -> dict[str, Any]:
    """``QwenVLChatSample`` fields of a record (``record_fields``); a bad record gives an empty
    conversation and its ``invalid_reason`` / ``invalid_detail`` (a counted skip at preencode)."""
    try:
        return {**record_fields(record), "invalid_reason": None, "invalid_detail": None}
    except BadSampleError as err:
        return invalid_fields(err)


def invalid_fields(err: BadSampleError) -> dict[str, Any]:
    """``QwenVLChatSample`` fields of a sample skipped for ``err``.

    Example: ``invalid_fields(BadSampleError("malformed_sample", "x"))`` -> ``{"conversation": [],
    "images": [], "videos": [], "invalid_reason": "malformed_sample", "invalid_detail": "x"}``.
    """
    return dict(conversation=[], images=[], videos=[], invalid_reason=err.reason, invalid_detail=err.detail)
