"""A flat file of named 1-D arrays, memory-mapped on open (pack plan format 2's container).

Layout (little-endian)::

    offset 0    magic  b"EPKPLAN\\x00"                       8 bytes
    offset 8    uint64 header length H                       8 bytes
    offset 16   header: UTF-8 JSON, H bytes, zero padding to a multiple of ALIGN (4096)
    arrays      each at the offset its header entry names, ALIGN-aligned, C order

The header holds the caller's ``meta`` (any JSON), ``chunk_bytes`` and ``arrays``:
``{name: {"dtype": "<i8", "shape": [n], "offset": o, "chunk_sha256": [hex, ...]}}`` (SHA-256 of
every ``chunk_bytes`` piece of the array's bytes), plus ``digest``: SHA-256 of the canonical JSON
of ``meta``, ``chunk_bytes`` and every array's dtype, shape and chunk hashes (not the offsets, so
the digest is known before the layout: :func:`columns_digest`). The digest thus commits to every
byte, yet opening reads only the header: O(1) in the array sizes.

Checks: opening verifies the magic, the header digest and the file size (a truncated file fails
at once); array bytes are verified chunk by chunk the first time they are read through
:meth:`ColumnsFile.read` (``verify="lazy"``), all at open (``"full"``) or never (``"none"``).

Example: ``write_columns(p, {"kind": "x"}, {"a": np.arange(3)})`` then
``ColumnsFile.open(p).read("a", 1, 3).tolist()`` -> ``[1, 2]``.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np

__all__ = [
    "ALIGN",
    "CHUNK_BYTES",
    "MAGIC",
    "ColumnsFile",
    "PlanFormatError",
    "Verify",
    "columns_digest",
    "is_columns_file",
    "write_columns",
]

MAGIC = b"EPKPLAN\x00"
ALIGN = 4096
CHUNK_BYTES = 1 << 22  # 4 MiB per verified chunk
Verify = Literal["lazy", "full", "none"]


class PlanFormatError(ValueError):
    """A file that is not a readable pack plan of this format (or whose digest does not match)."""


def _chunk_hashes(array: np.ndarray) -> list[str]:
    data = memoryview(np.ascontiguousarray(array)).cast("B")
    return [hashlib.sha256(data[i : i + CHUNK_BYTES]).hexdigest() for i in range(0, len(data), CHUNK_BYTES)]


def _entries(arrays: Mapping[str, np.ndarray]) -> dict[str, dict[str, Any]]:
    return {
        name: {"dtype": array.dtype.str, "shape": list(array.shape), "chunk_sha256": _chunk_hashes(array)}
        for name, array in arrays.items()
    }


def _digest_of_header(meta: Any, entries: Mapping[str, Mapping[str, Any]]) -> str:
    body = {
        "meta": meta,
        "chunk_bytes": CHUNK_BYTES,
        "arrays": {name: {k: v for k, v in entry.items() if k != "offset"} for name, entry in entries.items()},
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()


def columns_digest(meta: Any, arrays: Mapping[str, np.ndarray]) -> str:
    """The digest :func:`write_columns` stores for ``meta`` and ``arrays`` (hashes every byte).

    Example: equal meta and equal array bytes -> equal digests; one changed byte -> another digest.
    """
    return _digest_of_header(meta, _entries(arrays))


def write_columns(path: str | os.PathLike[str], meta: Any, arrays: Mapping[str, np.ndarray]) -> str:
    """Write ``arrays`` (1-D, any numeric dtype) and ``meta`` atomically (temporary file, then
    rename); returns the digest."""
    prepared = {name: np.ascontiguousarray(array).reshape(-1) for name, array in arrays.items()}
    entries = _entries(prepared)
    digest = _digest_of_header(meta, entries)
    relative, position = {}, 0
    for name, array in prepared.items():
        relative[name] = position
        position += -(-array.nbytes // ALIGN) * ALIGN
    draft = json.dumps({"meta": meta, "chunk_bytes": CHUNK_BYTES, "arrays": entries, "digest": digest}, sort_keys=True)
    start = -(-(16 + len(draft.encode("utf-8"))) // ALIGN) * ALIGN  # the offsets' digits may still add a page
    while True:  # offsets are absolute, so the data start depends on the header length
        for name in prepared:
            entries[name]["offset"] = start + relative[name]
        header = {"meta": meta, "chunk_bytes": CHUNK_BYTES, "arrays": entries, "digest": digest}
        text = json.dumps(header, sort_keys=True).encode("utf-8")
        if 16 + len(text) <= start:
            break
        start += ALIGN
    path = Path(path)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(partial, "wb") as out:
        out.write(MAGIC + len(text).to_bytes(8, "little") + text)
        for name, array in prepared.items():
            out.seek(entries[name]["offset"])
            out.write(memoryview(array).cast("B"))
        out.truncate(_expected_size(entries, start))
    os.replace(partial, path)
    return digest


def _expected_size(entries: Mapping[str, Mapping[str, Any]], data_start: int) -> int:
    ends = [e["offset"] + int(np.prod(e["shape"])) * np.dtype(e["dtype"]).itemsize for e in entries.values()]
    return max([data_start, *ends])


def is_columns_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` starts with this format's magic."""
    with open(path, "rb") as handle:
        return handle.read(len(MAGIC)) == MAGIC


class ColumnsFile:
    """An opened columns file: ``header``, ``meta``, ``digest`` and the arrays memory-mapped
    (``arrays[name]``, unchecked; :meth:`read` checks the chunks it touches when lazy)."""

    def __init__(self, path: Path, header: dict[str, Any], arrays: dict[str, np.ndarray], verify: Verify) -> None:
        self.path, self.header, self.arrays, self.verify = path, header, arrays, verify
        self._verified: dict[str, set[int]] = {name: set() for name in arrays}

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, verify: Verify = "lazy") -> ColumnsFile:
        """Open ``path``; a wrong magic, header digest or file size raises ``PlanFormatError``."""
        path = Path(path)
        fix = "fix: rebuild the plan with energon-pack plan"
        with open(path, "rb") as handle:
            head = handle.read(16)
            if len(head) < 16 or head[:8] != MAGIC:
                raise PlanFormatError(f"{path}: not a format-2 pack plan (magic {head[:8]!r}); {fix}")
            try:
                header = json.loads(handle.read(int.from_bytes(head[8:16], "little")).decode("utf-8"))
                entries, meta = header["arrays"], header["meta"]
                stored = header["digest"]
            except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as err:
                raise PlanFormatError(f"{path}: plan header unreadable ({err}); {fix}") from err
        if header.get("chunk_bytes") != CHUNK_BYTES or _digest_of_header(meta, entries) != stored:
            raise PlanFormatError(f"{path}: the plan header does not match its digest {str(stored)[:16]} (edited file); {fix}")
        actual = path.stat().st_size
        expected = _expected_size(entries, ALIGN)
        if actual != expected:
            raise PlanFormatError(f"{path}: {actual} bytes, its header says {expected} (truncated file); {fix}")
        with open(path, "rb") as handle:
            mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        arrays = {
            name: np.frombuffer(mapped, dtype=e["dtype"], count=int(np.prod(e["shape"])), offset=e["offset"])
            for name, e in entries.items()
        }
        opened = cls(path, header, arrays, verify)
        if verify == "full":
            for name, entry in entries.items():
                for chunk in range(len(entry["chunk_sha256"])):
                    opened._check_chunk(name, chunk)
        return opened

    @property
    def meta(self) -> Any:
        return self.header["meta"]

    @property
    def digest(self) -> str:
        return self.header["digest"]

    def _check_chunk(self, name: str, chunk: int) -> None:
        if chunk in self._verified[name]:
            return
        data = memoryview(self.arrays[name]).cast("B")[chunk * CHUNK_BYTES : (chunk + 1) * CHUNK_BYTES]
        if hashlib.sha256(data).hexdigest() != self.header["arrays"][name]["chunk_sha256"][chunk]:
            raise PlanFormatError(
                f"{self.path}: {name} bytes {chunk * CHUNK_BYTES}..{(chunk + 1) * CHUNK_BYTES} do not match their "
                "hash (edited or corrupt file); fix: rebuild the plan with energon-pack plan"
            )
        self._verified[name].add(chunk)

    def read(self, name: str, lo: int, hi: int) -> np.ndarray:
        """``arrays[name][lo:hi]``, its chunks checked first when ``verify="lazy"``."""
        array = self.arrays[name]
        if self.verify == "lazy" and hi > lo:
            size = array.itemsize
            for chunk in range(lo * size // CHUNK_BYTES, (hi * size - 1) // CHUNK_BYTES + 1):
                self._check_chunk(name, chunk)
        return array[lo:hi]
