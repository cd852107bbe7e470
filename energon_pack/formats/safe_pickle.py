"""Reading pickled media lists from untrusted shards without running any code.

A pickle may name any importable callable and call it while loading (``__reduce__``); this
unpickler resolves no name but a few pure builtins, so a pickle naming anything else stops before
the call with ``BadSampleError("unsafe_pickle")`` and nothing is executed. Admitted: the opcodes of
``list``, ``tuple``, ``dict``, ``set``, ``frozenset``, ``bytes``, ``str``, ``int``, ``float``,
``bool``, ``None`` (any protocol), and the names ``builtins.{bytearray, set, frozenset, complex}``
and ``_codecs.encode`` that protocols 0-2 use to rebuild those values. numpy arrays are not admitted
(Bridge 0.6.2's reader refuses them as well); a pickle of them (decoded pixels, as Bridge's
``convert_to_qwenvl_wds.py`` example writes) is the counted skip ``pickled_pixel_arrays``.

Example: ``load_plain_pickle(pickle.dumps([b"\\xff\\xd8..."]), what="imgs")`` -> ``[b"\\xff\\xd8..."]``;
``load_plain_pickle(pickle.dumps(os.system), what="imgs")`` -> BadSampleError("unsafe_pickle", ...).
"""

from __future__ import annotations

import io
import pickle
from typing import Any

from energon_pack.errors import BadSampleError

#: The only names a media-list pickle may resolve: pure constructors of plain values.
SAFE_NAMES = frozenset(
    {("builtins", "bytearray"), ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "complex"),
     ("_codecs", "encode")}
)
#: The largest pickled member read (bytes): a cap on what one sample may make a worker hold.
MAX_PICKLE_BYTES = 256 * 1024 * 1024


class _PlainValueUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that resolves only :data:`SAFE_NAMES` (no ``persistent_load`` either)."""

    def find_class(self, module: str, name: str) -> Any:
        module = "builtins" if module == "__builtin__" else module  # protocols 0-2 write Python 2's name
        if (module, name) in SAFE_NAMES:
            return super().find_class(module, name)
        if module.split(".")[0] == "numpy":
            raise BadSampleError(
                "pickled_pixel_arrays",
                f"the pickle holds numpy arrays ({module}.{name}): decoded pixels, not encoded images; fix: store "
                "each image or frame as JPEG/PNG bytes (Bridge 0.6.2 cannot read these either)",
            )
        raise BadSampleError(
            "unsafe_pickle", f"the pickle names {module}.{name}, which may run code; it was not loaded (nothing ran)"
        )


def load_plain_pickle(data: bytes, *, what: str, max_bytes: int = MAX_PICKLE_BYTES) -> Any:
    """Unpickle ``data`` (a member named ``what``) admitting only plain values (see the module notes).

    Raises ``BadSampleError``: ``member_too_large`` (over ``max_bytes``), ``unsafe_pickle``,
    ``pickled_pixel_arrays`` or ``truncated_pickle`` (cut short or not a pickle).
    """
    if len(data) > max_bytes:
        raise BadSampleError(
            "member_too_large", f"member {what!r} is {len(data)} bytes, over the {max_bytes}-byte cap for a pickled member"
        )
    try:
        return _PlainValueUnpickler(io.BytesIO(data)).load()
    except BadSampleError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError,
            UnicodeDecodeError, OverflowError, MemoryError) as err:
        raise BadSampleError(
            "truncated_pickle", f"member {what!r} is not a whole pickle ({type(err).__name__}: {err})"
        ) from None
