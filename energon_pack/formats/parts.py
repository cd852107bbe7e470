"""The members of a foreign WebDataset sample as its sample loader, field map or cooker sees them.

Energon's default decoder would decode images to tensors and videos to decoders (and unpickle
``.pyd`` members); we never decode media before packing, and never unpickle. So: JSON members are
parsed, text members are strings, class members are integers, and everything else (images,
videos, audio, pickles, arrays) stays the bytes stored in the shard.

Example: ``decode_parts({"__key__": "a", "jpg": b"\\xff\\xd8...", "txt": b"A cat.", "json": b'{"n": 1}',
"cls": b"3"})`` -> ``{"__key__": "a", "jpg": b"\\xff\\xd8...", "txt": "A cat.", "json": {"n": 1}, "cls": 3}``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from energon_pack.errors import BadSampleError

#: Member extensions read as UTF-8 text.
TEXT_EXTENSIONS = ("txt", "text", "transcript")
#: Member extensions read as JSON.
JSON_EXTENSIONS = ("json", "jsn")
#: Member extensions read as an integer (WebDataset class labels).
INT_EXTENSIONS = ("cls", "cls2", "index", "inx", "id")


def decode_part(name: str, data: Any) -> Any:
    """One member by its name's last extension (see the module docstring); raises ``BadSampleError``
    ``non_utf8_text`` or ``malformed_sample`` for a text, JSON or class member that does not parse.

    Example: ``decode_part("0.txt", b"hi")`` -> ``"hi"``; ``decode_part("0.png", b"\\x89PNG")`` -> ``b"\\x89PNG"``.
    """
    extension = name.rpartition(".")[2].lower()
    if not isinstance(data, (bytes, bytearray)) or extension not in TEXT_EXTENSIONS + JSON_EXTENSIONS + INT_EXTENSIONS:
        return data
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as err:
        raise BadSampleError("non_utf8_text", f"member {name!r} is not UTF-8 ({err.reason} at byte {err.start})") from None
    try:
        if extension in JSON_EXTENSIONS:
            return json.loads(text)
        if extension in INT_EXTENSIONS:
            return int(text)
    except ValueError as err:
        raise BadSampleError("malformed_sample", f"member {name!r} does not parse ({err})") from None
    return text


def decode_parts(parts: Mapping[str, Any]) -> dict[str, Any]:
    """Every member of one sample through ``decode_part``; Energon's ``__key__``-style entries as they are."""
    return {name: value if name.startswith("__") else decode_part(name, value) for name, value in parts.items()}
