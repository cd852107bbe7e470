"""Parquet footers checked before ``prepare`` opens them with pyarrow.

pyarrow parses a footer in C++; on some corrupted footers it ends the whole process (a C++
exception thrown where none may pass, e.g. "Definition level histogram size mismatch" when a
flipped bit turns a field's Thrift type, or a segmentation fault), never raising a Python
exception, which would end a long ``prepare`` with nothing counted. So ``footer_problems``
checks every file in two steps, and a file that fails either is the counted ``unreadable_file``
skip of ``prepare`` (docs/bad_input_policy.md):

1. ``check_footer`` reads the footer with the project's own Thrift reader
   (``parquet_pages.parse_struct``) and checks what pyarrow relies on: the magic bytes at both
   ends, a footer length that fits the file, a ``FileMetaData`` that parses, a schema tree whose
   group sizes add up, leaves of known physical types, row groups whose row counts add up to the
   file's and whose column chunks (one per leaf, of the leaf's type and path, a known codec, no
   external file) lie between the header magic and the footer. Most damage stops here, named.
2. The files that pass are opened by pyarrow in a child process (``_probe``: the footer, the
   Arrow and Parquet schemas, every row group's every column chunk, as ``prepare`` reads them),
   so what pyarrow does not survive ends the child, not the job: the child is started again for
   the files after it, and one that hangs is stopped after ``PROBE_TIMEOUT_S``. The child is
   kept for the next files of this process (``_Prober``).

``prepare`` opens only the files that passed both, and pyarrow parses a footer the same way each
time. Field numbers below are parquet.thrift's: ``FileMetaData`` 1 version, 2 schema, 3
num_rows, 4 row_groups; ``SchemaElement`` 1 type, 2 type_length, 3 repetition_type, 4 name, 5
num_children, 6 converted_type; ``RowGroup`` 1 columns, 3 num_rows; ``ColumnChunk`` 1 file_path,
3 meta_data; ``ColumnMetaData`` 1 type, 2 encodings, 3 path_in_schema, 4 codec, 5 num_values, 6
total_uncompressed_size, 7 total_compressed_size, 9 data_page_offset, 11 dictionary_page_offset.

Example: ``footer_problems([Path("good.parquet"), Path("cut.parquet")])`` -> ``{Path("cut.parquet"):
"the file does not end with the Parquet magic b'PAR1' (cut short, encrypted or not Parquet)"}``.
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from energon_pack.data.parquet_pages import CorruptPage, parse_struct

__all__ = ["PROBE_TIMEOUT_S", "CorruptFooter", "check_footer", "footer_problems"]

MAGIC = b"PAR1"
#: The most footer bytes read: a longer length field is damage, not metadata (a footer of 100k
#: column chunks is a few MiB).
MAX_FOOTER_BYTES = 256 << 20
#: Known values of parquet.thrift's enums: physical Type, FieldRepetitionType, ConvertedType,
#: CompressionCodec, Encoding.
PHYSICAL_TYPES = range(8)
REPETITIONS = range(3)
CONVERTED_TYPES = range(22)
CODECS = range(8)
ENCODINGS = range(10)
#: Seconds the child process may take to open one footer before it counts as hung.
PROBE_TIMEOUT_S = 60.0


class CorruptFooter(ValueError):
    """A Parquet footer that does not parse or does not describe its file."""


def footer_problems(paths: Sequence[Path], *, timeout_s: float = PROBE_TIMEOUT_S) -> dict[Path, str]:
    """Why each of the Parquet files ``paths`` whose footer is unsafe to open does not open (one
    phrase each; see the module docstring); the others are absent."""
    problems: dict[Path, str] = {}
    for path in paths:
        try:
            check_footer(path)
        except (CorruptFooter, OSError) as err:
            problems[path] = str(err)
    problems.update(_probe([path for path in paths if path not in problems], timeout_s))
    return problems


def check_footer(path: Path) -> None:
    """Raise ``CorruptFooter`` (naming what is wrong) unless ``path``'s footer is sound.

    Example: a file cut 10 bytes short -> ``CorruptFooter("the file does not end with the
    Parquet magic b'PAR1' (cut short, encrypted or not Parquet)")``.
    """
    with open(path, "rb") as file:
        size = file.seek(0, 2)
        if size < 12:
            raise CorruptFooter(f"the file holds {size} bytes, fewer than a Parquet file's 12 (magic, footer length, magic)")
        file.seek(0)
        head = file.read(4)
        file.seek(size - 8)
        tail = file.read(8)
        length = int.from_bytes(tail[:4], "little")
        if tail[4:] != MAGIC:
            raise CorruptFooter(f"the file does not end with the Parquet magic {MAGIC!r} (cut short, encrypted or not Parquet)")
        if head != MAGIC:
            raise CorruptFooter(f"the file does not start with the Parquet magic {MAGIC!r}")
        if not 0 < length <= min(size - 12, MAX_FOOTER_BYTES):
            raise CorruptFooter(f"footer length {length} is outside 1..{min(size - 12, MAX_FOOTER_BYTES)} (the file holds {size} bytes)")
        file.seek(size - 8 - length)
        footer = file.read(length)
    try:
        metadata = parse_struct(footer)
    except (CorruptPage, EOFError, RecursionError) as err:
        raise CorruptFooter(f"the footer's FileMetaData does not parse ({err})") from None
    check_metadata(metadata, data_end=size - 8 - length)


def check_metadata(metadata: dict[int, Any], *, data_end: int) -> None:
    """``CorruptFooter`` unless the parsed ``FileMetaData`` ``metadata`` is consistent, its column
    chunks within bytes ``[4, data_end)`` of the file (see the module docstring)."""
    if type(metadata.get(1)) is not int:
        raise CorruptFooter("the footer has no version")
    leaves = _schema_leaves(_list(metadata, 2, "schema"))
    total = _count(metadata, 3, "num_rows")
    rows = 0
    for index, group in enumerate(_list(metadata, 4, "row_groups")):
        where = f"row group {index}"
        if not isinstance(group, dict):
            raise CorruptFooter(f"{where} is not a struct")
        rows += _count(group, 3, f"{where} num_rows")
        chunks = _list(group, 1, f"{where} columns")
        if len(chunks) != len(leaves):
            raise CorruptFooter(f"{where} has {len(chunks)} column chunks for {len(leaves)} schema leaves")
        for (leaf_type, leaf_path), chunk in zip(leaves, chunks):
            _check_chunk(chunk, leaf_type, leaf_path, f"{where} column {'.'.join(leaf_path)}", data_end)
    if rows != total:
        raise CorruptFooter(f"the row groups hold {rows} rows, the footer's num_rows says {total}")


def _check_chunk(chunk: Any, leaf_type: int, leaf_path: list[str], where: str, data_end: int) -> None:
    if not isinstance(chunk, dict) or not isinstance(chunk.get(3), dict):
        raise CorruptFooter(f"{where} has no column metadata")
    if 1 in chunk:
        raise CorruptFooter(f"{where} lies in another file ({chunk[1]!r:.60})")
    meta = chunk[3]
    if meta.get(1) != leaf_type or meta.get(4) not in CODECS:
        raise CorruptFooter(f"{where} has type {meta.get(1)!r:.20} and codec {meta.get(4)!r:.20} (schema type {leaf_type})")
    encodings = _list(meta, 2, f"{where} encodings")
    if not all(type(e) is int and e in ENCODINGS for e in encodings):
        raise CorruptFooter(f"{where} has unknown encodings {encodings!r:.60}")
    if [_text(name, where) for name in _list(meta, 3, f"{where} path_in_schema")] != leaf_path:
        raise CorruptFooter(f"{where}: its path_in_schema is not its schema leaf's")
    _count(meta, 5, f"{where} num_values")
    _count(meta, 6, f"{where} total_uncompressed_size")
    size = _count(meta, 7, f"{where} total_compressed_size")
    start = _count(meta, 9, f"{where} data_page_offset")
    if meta.get(11):  # a dictionary page offset of 0 stands for none (some writers store it so)
        start = min(start, _count(meta, 11, f"{where} dictionary_page_offset"))
    if not 4 <= start or start + size > data_end:
        raise CorruptFooter(f"{where} spans bytes {start}..{start + size}, outside the data's 4..{data_end}")


def _schema_leaves(elements: list[Any]) -> list[tuple[int, list[str]]]:
    """``(physical type, path)`` of every leaf of a flattened schema tree (depth first, the root
    first); ``CorruptFooter`` when the group sizes do not add up to the elements given."""
    if not elements or not all(isinstance(element, dict) for element in elements):
        raise CorruptFooter("the schema is empty or holds a non-struct element")
    leaves: list[tuple[int, list[str]]] = []
    position = 1
    # (children still expected, path) of each open group, the root first.
    stack = [(_count(elements[0], 5, "the schema root's num_children"), [])]
    while stack:
        remaining, path = stack.pop()
        if remaining == 0:
            continue
        stack.append((remaining - 1, path))
        if position >= len(elements):
            raise CorruptFooter(f"the schema tree needs more than its {len(elements)} elements")
        element = elements[position]
        position += 1
        name = [*path, _text(element.get(4), "a schema element's name")]
        if element.get(3, 0) not in REPETITIONS or element.get(6, 0) not in CONVERTED_TYPES:
            raise CorruptFooter(f"schema element {'.'.join(name)} has an unknown repetition or converted type")
        children = element.get(5)
        if children is not None:
            stack.append((_count(element, 5, f"schema element {'.'.join(name)} num_children"), name))
        elif element.get(1) in PHYSICAL_TYPES and type(element.get(1)) is int:
            if type(element.get(2, 0)) is not int or element.get(2, 0) < 0:
                raise CorruptFooter(f"schema leaf {'.'.join(name)} has type_length {element.get(2)!r:.20}")
            leaves.append((element[1], name))
        else:
            raise CorruptFooter(f"schema leaf {'.'.join(name)} has no known physical type ({element.get(1)!r:.20})")
    if position != len(elements):
        raise CorruptFooter(f"the schema tree holds {position} of its {len(elements)} elements")
    return leaves


def _list(struct: dict[int, Any], field: int, what: str) -> list[Any]:
    value = struct.get(field)
    if not isinstance(value, list):
        raise CorruptFooter(f"{what} is {type(value).__name__}, not a list")
    return value


def _count(struct: dict[int, Any], field: int, what: str) -> int:
    value = struct.get(field)
    if type(value) is not int or value < 0:
        raise CorruptFooter(f"{what} is {value!r:.20}, not a count")
    return value


def _text(value: Any, what: str) -> str:
    if not isinstance(value, bytes):
        raise CorruptFooter(f"{what} is not a string")
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise CorruptFooter(f"{what} is not UTF-8") from None


#: The child of ``_probe``: reads JSON paths, one a line, opens each as ``prepare`` reads it
#: (``data.parquet_records``, ``data.parquet_pages.leaf_column``) and answers ``"ok"`` or the
#: error, one JSON line each. It imports pyarrow only.
_PROBE_CHILD = r"""
import json, sys
import pyarrow.parquet as pq
for line in sys.stdin:
    try:
        parquet = pq.ParquetFile(json.loads(line), buffer_size=0, pre_buffer=False)
        parquet.schema_arrow.names
        schema = parquet.schema
        for i in range(len(schema)):
            leaf = schema.column(i)
            leaf.path, leaf.max_definition_level, leaf.max_repetition_level, leaf.logical_type.type, leaf.converted_type
        for g in range(parquet.num_row_groups):
            group = parquet.metadata.row_group(g)
            for c in range(group.num_columns):
                chunk = group.column(c)
                chunk.path_in_schema, chunk.physical_type, chunk.compression, chunk.num_values
                chunk.data_page_offset, chunk.dictionary_page_offset, chunk.total_compressed_size
        answer = "ok"
    except Exception as err:
        answer = f"pyarrow: {type(err).__name__}: {str(err).strip()[:200]}"
    print(json.dumps(answer), flush=True)
"""


def _probe(paths: list[Path], timeout_s: float) -> dict[Path, str]:
    """Why each of ``paths`` does not open in pyarrow (``_PROBE_CHILD``); the child is started
    again after a file that ends it or hangs, for the files after that one."""
    problems: dict[Path, str] = {}
    while paths:
        answers, ended = _PROBER.answers(paths, timeout_s)
        problems.update({path: answer for path, answer in zip(paths, answers) if answer != "ok"})
        if len(answers) == len(paths):
            break
        problems[paths[len(answers)]] = ended
        paths = paths[len(answers) + 1:]
    return problems


class _Prober:
    """The child process running ``_PROBE_CHILD``: started on first use and kept for the next
    files (its start, mostly pyarrow's import, costs about 0.2 s; a footer about a millisecond),
    started again after one that ends it or hangs, closed when this process exits."""

    def __init__(self) -> None:
        self._child: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def answers(self, paths: list[Path], timeout_s: float) -> tuple[list[str], str]:
        """The child's answers for the first files of ``paths``, and why it stopped before the rest ("" if it did not)."""
        with self._lock:
            if self._child is None or self._child.poll() is not None:
                self._child = subprocess.Popen([sys.executable, "-c", _PROBE_CHILD], stdin=subprocess.PIPE,
                                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0)
            child = self._child
            lines = "".join(json.dumps(os.fspath(path)) + "\n" for path in paths).encode()
            threading.Thread(target=_feed, args=(child.stdin, lines), daemon=True).start()
            answers: list[str] = []
            pending = b""
            with selectors.DefaultSelector() as selector:
                selector.register(child.stdout, selectors.EVENT_READ)
                while len(answers) < len(paths):
                    if not selector.select(timeout_s):
                        child.kill()
                        self._end()
                        return answers, f"pyarrow did not finish opening its footer in {timeout_s:g} s (stopped)"
                    piece = os.read(child.stdout.fileno(), 1 << 16)
                    if not piece:
                        return answers, f"pyarrow ended the process opening its footer (exit status {self._end()})"
                    *done, pending = (pending + piece).split(b"\n")
                    answers += [json.loads(line) for line in done]
            return answers, ""

    def _end(self) -> int:
        """Close the child's pipes and wait for it; its exit status."""
        child, self._child = self._child, None
        for stream in (child.stdin, child.stdout):
            try:
                stream.close()
            except OSError:  # stdin of a child that ended: a broken pipe
                pass
        return child.wait()

    def close(self) -> None:
        """End the child (its input closed, it exits), if one runs."""
        with self._lock:
            if self._child is not None:
                self._end()


def _feed(stream: Any, data: bytes) -> None:
    """Write all of ``data`` to the child's stdin (a child that ended leaves a broken pipe)."""
    view = memoryview(data)
    try:
        while view:
            view = view[stream.write(view):]
    except (OSError, ValueError):  # a broken pipe, or a pipe closed after the child ended
        pass


_PROBER = _Prober()
atexit.register(_PROBER.close)
