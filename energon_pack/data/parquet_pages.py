"""A streaming reader of one Parquet leaf column: its values one at a time, never a whole page.

pyarrow reads a column chunk's page whole, and holds it compressed, decompressed and decoded at
once; a row group's media column is usually one page of megabytes. This reader takes only the
file metadata from pyarrow (where each column chunk lies, its codec, its levels) and reads the
pages itself: Thrift compact-protocol page headers, RLE / bit-packed definition and repetition
levels, PLAIN (or dictionary-encoded) ``BYTE_ARRAY`` values, decompressed as a stream of pieces of
``CHUNK_BYTES`` (UNCOMPRESSED, SNAPPY, GZIP). Memory holds one value, a piece of input and, for
snappy, a 64 KiB window of output; a page's levels (one int per value) are kept whole. A
dictionary page (pyarrow's default writes a group's media into one) is streamed too: its entries
are read as the data pages' indices reach them and kept until their last use.

``leaf_items(path, row_group, leaf)`` gives each row's items of a leaf. What it does not read (other codecs, encodings or
nesting) raises ``UnsupportedPage`` (the caller reads with pyarrow instead); bytes that do not
parse raise ``CorruptPage`` naming the file, the column and the row group.
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

#: Bytes read from the file, or decompressed, at a time.
CHUNK_BYTES = 256 << 10
#: How far back a snappy copy may reach: the compressor works in 64 KiB blocks and never refers
#: across one (snappy's ``kBlockSize``), so keeping the last 64 KiB of output is enough.
SNAPPY_WINDOW = 1 << 16
#: Parquet's PageType and Encoding numbers (parquet.thrift).
DATA_PAGE, DICTIONARY_PAGE, DATA_PAGE_V2 = 0, 2, 3
PLAIN, PLAIN_DICTIONARY, RLE, RLE_DICTIONARY = 0, 2, 3, 8
ENCODING_NAMES = {0: "PLAIN", 2: "PLAIN_DICTIONARY", 3: "RLE", 4: "BIT_PACKED", 5: "DELTA_BINARY_PACKED",
                  6: "DELTA_LENGTH_BYTE_ARRAY", 7: "DELTA_BYTE_ARRAY", 8: "RLE_DICTIONARY", 9: "BYTE_STREAM_SPLIT"}
CODECS = ("UNCOMPRESSED", "SNAPPY", "GZIP")


class UnsupportedPage(Exception):
    """A page this reader does not decode (codec, encoding, nesting): read the column with pyarrow."""


class CorruptPage(ValueError):
    """Bytes of a column chunk that do not parse as Parquet pages."""


class _Stream:
    """Bytes read from an iterator of pieces, a few at a time.

    Example: ``_Stream(iter([b"ab", b"cd"])).read(3)`` -> ``b"abc"``; reading past the end raises
    ``EOFError``.
    """

    def __init__(self, pieces: Iterator[bytes]) -> None:
        self._pieces = pieces
        self._buffer = b""
        self._position = 0
        self._taken = 0  # bytes taken from the pieces

    def _next_piece(self) -> bytes | None:
        piece = next(self._pieces, None)
        self._taken += len(piece or b"")
        return piece

    def tell(self) -> int:
        """Bytes read so far. Example: after ``read(3)`` of ``[b"ab", b"cd"]`` -> 3."""
        return self._taken - (len(self._buffer) - self._position)

    def _fill(self) -> bool:
        """Append the next non-empty piece to what is left; False at the end."""
        while (piece := self._next_piece()) is not None:
            if piece:
                self._buffer, self._position = self._buffer[self._position:] + piece, 0
                return True
        return False

    def byte(self) -> int:
        if self._position >= len(self._buffer) and not self._fill():
            raise EOFError("the data ends early")
        self._position += 1
        return self._buffer[self._position - 1]

    def read(self, size: int) -> bytes:
        """The next ``size`` bytes (joined from pieces when they span several)."""
        if size < 0:
            raise CorruptPage(f"a length of {size} bytes")
        end = self._position + size
        if end <= len(self._buffer):
            self._position = end
            return self._buffer[end - size:end]
        parts = [self._buffer[self._position:]]
        missing = size - len(parts[0])
        self._buffer, self._position = b"", 0
        while missing > 0:
            piece = self._next_piece()
            if piece is None:
                raise EOFError(f"the data ends {missing} bytes early")
            parts.append(piece[:missing])
            self._buffer, self._position = piece, min(missing, len(piece))
            missing -= len(piece)
        return b"".join(parts)

    def pieces(self, size: int) -> Iterator[bytes]:
        """The next ``size`` bytes as pieces of at most ``CHUNK_BYTES`` (a page body, streamed)."""
        while size > 0:
            if self._position >= len(self._buffer) and not self._fill():
                raise EOFError(f"the data ends {size} bytes early")
            piece = self.read(min(size, len(self._buffer) - self._position, CHUNK_BYTES))
            size -= len(piece)
            yield piece

    def drain(self) -> None:
        """Read the rest (a page's padding, a gzip trailer), so the file stands at the next page."""
        while self._next_piece() is not None:
            pass
        self._buffer, self._position = b"", 0

    def varint(self) -> int:
        """An unsigned LEB128 varint. Example: bytes ``ac 02`` -> 300."""
        result = shift = 0
        while True:
            byte = self.byte()
            result |= (byte & 0x7F) << shift
            if byte < 0x80:
                return result
            shift += 7


def _file_pieces(file: BinaryIO, size: int) -> Iterator[bytes]:
    """``size`` bytes of ``file`` from where it stands, in pieces of ``CHUNK_BYTES``."""
    while size > 0:
        piece = file.read(min(size, CHUNK_BYTES))
        if not piece:
            raise EOFError(f"the file ends {size} bytes early")
        size -= len(piece)
        yield piece


def _zigzag(value: int) -> int:
    """Example: 1 -> -1, 2 -> 1, 3 -> -2."""
    return (value >> 1) ^ -(value & 1)


#: Deepest nesting of Thrift structs, lists and maps read (a page header nests 3 deep): deeper
#: data is corrupt, not a page header, and would otherwise exhaust Python's recursion limit.
MAX_THRIFT_DEPTH = 16


def read_struct(stream: _Stream, depth: int = 0) -> dict[int, Any]:
    """A Thrift compact-protocol struct as ``{field id: value}`` (structs nested as dicts, lists
    as lists, binaries as bytes, booleans as bool); unknown fields are kept, the caller ignores them
    (and checks the type of those it reads: ``_struct_field``, ``_int_field``). ``CorruptPage`` for
    a type that is none, nesting deeper than ``MAX_THRIFT_DEPTH`` or a map key that is a container.

    Example: bytes ``15 04 00`` -> ``{1: 2}`` (field 1, i32, zigzag 4 = 2; then STOP).
    """
    if depth > MAX_THRIFT_DEPTH:
        raise CorruptPage(f"Thrift data nested deeper than {MAX_THRIFT_DEPTH} levels")
    fields: dict[int, Any] = {}
    last = 0
    while True:
        header = stream.byte()
        kind = header & 0x0F
        if kind == 0:
            return fields
        delta = header >> 4
        last = last + delta if delta else _zigzag(stream.varint())
        if kind in (1, 2):  # booleans carry their value in the type
            fields[last] = kind == 1
        else:
            fields[last] = _read_value(stream, kind, depth)


def parse_struct(data: bytes) -> dict[int, Any]:
    """``read_struct`` of the bytes ``data`` (a Parquet footer's ``FileMetaData``); ``EOFError``
    when they end inside the struct. Example: ``parse_struct(b"\\x15\\x04\\x00")`` -> ``{1: 2}``."""
    return read_struct(_Stream(iter([data])))


def _read_value(stream: _Stream, kind: int, depth: int) -> Any:
    if kind in (1, 2):  # a boolean list element: one byte
        return stream.byte() == 1
    if kind == 3:
        return int.from_bytes(stream.read(1), "little", signed=True)
    if kind in (4, 5, 6):
        return _zigzag(stream.varint())
    if kind == 7:
        return stream.read(8)
    if kind == 8:
        return stream.read(stream.varint())
    if kind in (9, 10, 11, 12) and depth >= MAX_THRIFT_DEPTH:
        raise CorruptPage(f"Thrift data nested deeper than {MAX_THRIFT_DEPTH} levels")
    if kind in (9, 10):
        header = stream.byte()
        size = header >> 4 if header >> 4 != 15 else stream.varint()
        return [_read_value(stream, header & 0x0F, depth + 1) for _ in range(size)]
    if kind == 11:
        size = stream.varint()
        types = stream.byte() if size else 0
        entries = {}
        for _ in range(size):
            key = _read_value(stream, types >> 4, depth + 1)
            if isinstance(key, (list, dict)):
                raise CorruptPage(f"a Thrift map key of type {type(key).__name__} (page headers have no such map)")
            entries[key] = _read_value(stream, types & 0x0F, depth + 1)
        return entries
    if kind == 12:
        return read_struct(stream, depth + 1)
    raise CorruptPage(f"Thrift type {kind} is not a compact-protocol type (1..12)")


def _struct_field(struct: dict[int, Any], field: int, what: str) -> dict[int, Any]:
    """Field ``field`` of a Thrift struct that is itself a struct (absent: ``{}``); ``CorruptPage`` otherwise.

    Example: ``_struct_field({5: {1: 3}}, 5, "the data page header")`` -> ``{1: 3}``; ``({5: 7}, 5, ...)`` raises.
    """
    value = struct.get(field, {})
    if not isinstance(value, dict):
        raise CorruptPage(f"{what} (Thrift field {field}) is a {type(value).__name__}, not a struct")
    return value


def _int_field(struct: dict[int, Any], field: int, what: str, default: int, *, limit: int | None = None) -> int:
    """Field ``field`` of a Thrift struct that is an integer (absent: ``default``), from 0 to ``limit``
    when one is given (a size or a count); ``CorruptPage`` otherwise.

    Example: ``_int_field({3: 100}, 3, "the page size", 0, limit=4096)`` -> 100; ``{3: -1}`` or
    ``{3: b"x"}`` raises.
    """
    value = struct.get(field, default)
    if type(value) is not int or (limit is not None and not 0 <= value <= limit):
        bound = "an integer" if limit is None else f"an integer from 0 to {limit}"
        raise CorruptPage(f"{what} (Thrift field {field}) is {value!r:.40}, not {bound}")
    return value


def hybrid_values(stream: _Stream, bit_width: int, count: int) -> Iterator[int]:
    """``count`` values of Parquet's RLE / bit-packed hybrid encoding, decoded as they are read.

    Each run starts with a varint h: h even, ``h >> 1`` copies of one value stored in
    ``ceil(bit_width / 8)`` little-endian bytes; h odd, ``h >> 1`` groups of 8 values packed
    ``bit_width`` bits each, least significant bit first.
    Example: width 1, bytes ``06 01`` -> 1, 1, 1 (an RLE run of 3 ones); bytes ``03 05`` ->
    1, 0, 1, 0, 0, 0, 0, 0 (one bit-packed group).
    """
    mask = (1 << bit_width) - 1
    value_bytes = (bit_width + 7) // 8
    while count > 0:
        header = stream.varint()
        if header & 1:
            for _ in range(min(header >> 1, (count + 7) // 8)):  # groups past the count are padding
                group = int.from_bytes(stream.read(bit_width), "little")
                for i in range(min(8, count)):
                    yield (group >> (i * bit_width)) & mask
                count -= min(8, count)
        else:
            run = min(header >> 1, count)
            value = int.from_bytes(stream.read(value_bytes), "little")
            for _ in range(run):
                yield value
            count -= run


def snappy_pieces(compressed: Iterator[bytes]) -> Iterator[bytes]:
    """Raw snappy decompression as a stream: the output in pieces of about ``CHUNK_BYTES``, holding
    one piece of input, and output back to ``SNAPPY_WINDOW`` for copies.

    The stream is a varint (the output's length) and elements: a literal (tag ``xxxxxx00``: length
    - 1 in the tag's 6 bits, or in the 1..4 bytes after it for 60..63) or a copy of earlier output
    (tag ``..01``: length 4..11, offset of 11 bits; ``..10`` / ``..11``: length 1..64, offset of 2 /
    4 bytes). Example: ``0a 0c 61 62 63 0a 03 00`` -> ``b"abcabcabca"`` (literal ``abc``, copy 7 from 3 back).
    """
    stream = _Stream(compressed)
    expected = stream.varint()
    window = bytearray()
    produced = sent = 0  # bytes output in all, and handed out; window ends at ``produced``
    while True:
        try:
            tag = stream.byte()
        except EOFError:
            break
        kind = tag & 3
        if kind == 0:
            length = tag >> 2
            if length >= 60:
                length = int.from_bytes(stream.read(length - 59), "little")
            window += stream.read(length + 1)
            produced += length + 1
        else:
            if kind == 1:
                length, offset = 4 + ((tag >> 2) & 7), ((tag >> 5) << 8) | stream.byte()
            else:
                length, offset = (tag >> 2) + 1, int.from_bytes(stream.read(2 if kind == 2 else 4), "little")
            if offset == 0 or offset > produced:
                raise CorruptPage(f"snappy copy from {offset} bytes back, with {produced} bytes output so far")
            if offset > len(window):
                raise UnsupportedPage(f"snappy copy from {offset} bytes back, beyond the {SNAPPY_WINDOW}-byte window "
                                      "this reader keeps (not written by the snappy library's 64 KiB blocks)")
            start = len(window) - offset
            pattern = window[start:start + length]
            window += pattern if offset >= length else (pattern * (length // offset + 1))[:length]
            produced += length
        if produced - sent >= CHUNK_BYTES:
            yield bytes(window[len(window) - (produced - sent):])
            sent = produced
            del window[:max(0, len(window) - SNAPPY_WINDOW)]
    if produced != expected:
        raise CorruptPage(f"snappy data gives {produced} bytes, its header says {expected}")
    if produced > sent:
        yield bytes(window[len(window) - (produced - sent):])


def gzip_pieces(compressed: Iterator[bytes]) -> Iterator[bytes]:
    """GZIP (or zlib) decompression as a stream, at most ``CHUNK_BYTES`` out at a time.

    Example: ``b"".join(gzip_pieces(iter([gzip.compress(b"abc")])))`` -> ``b"abc"``.
    """
    inflate = zlib.decompressobj(wbits=47)  # 32 + 15: a gzip or zlib header, found from the data
    for piece in compressed:
        while not inflate.eof:
            output = inflate.decompress(piece, CHUNK_BYTES)
            piece = inflate.unconsumed_tail
            if output:
                yield output
            elif not piece:
                break
    if not inflate.eof:
        raise CorruptPage("the gzip data ends early")


DECOMPRESSORS: dict[str, Callable[[Iterator[bytes]], Iterator[bytes]]] = {
    "UNCOMPRESSED": lambda pieces: pieces, "SNAPPY": snappy_pieces, "GZIP": gzip_pieces}


@dataclass(frozen=True)
class LeafColumn:
    """One leaf column chunk of one row group: where its pages lie (byte ``start`` and ``size`` in
    the file), its codec, levels and row count, and how its rows nest.

    Definition levels: below ``row_level`` the row's top-level value (list, struct or value) is
    null; from ``item_level`` on the row has an item there (a list's item, or the one value of
    another column); at ``max_def`` the item's value is present.
    Example: ``images: list<struct<bytes, path>>`` (all nullable), leaf ``images.list.element.bytes``:
    max_def 4, max_rep 1, row_level 1, item_level 2 (0 null list, 1 empty list, 2 null item,
    3 null bytes, 4 bytes); ``image: struct<bytes, path>``, leaf ``image.bytes``: max_def 2,
    row_level = item_level = 1 (0 null struct, 1 null bytes, 2 bytes).
    """

    path: Path
    row_group: int
    leaf: str
    start: int
    size: int
    codec: str
    max_def: int
    max_rep: int
    row_level: int
    item_level: int
    rows: int
    utf8: bool
    #: Values (levels) in the chunk, nulls included: no page of it holds more.
    values: int

    def where(self) -> str:
        """Example: ``"t.parquet, column 'images.list.element.bytes', row group 1"``."""
        return f"{self.path.name}, column {self.leaf!r}, row group {self.row_group}"


def leaf_column(path: Path, row_group: int, leaf: str, parquet: Any = None) -> LeafColumn:
    """The ``LeafColumn`` of ``leaf`` (a dotted ``path_in_schema``, e.g. ``images.list.element.bytes``)
    in ``row_group`` of the Parquet file ``path``, from its metadata (pyarrow: ``parquet``, the
    file's open ``ParquetFile`` when the caller has one, so that its footer is parsed once per file,
    else opened here); ``UnsupportedPage`` for a codec, type or nesting this reader does not read,
    ``CorruptPage`` for a footer that does not parse or places the chunk outside the file.

    Example: a ``video: binary`` column written by pyarrow (snappy) -> ``LeafColumn(leaf="video",
    codec="SNAPPY", max_def=1, max_rep=0, row_level=item_level=1, ...)``; the same with zstd ->
    ``UnsupportedPage``.
    """
    file_size = path.stat().st_size  # a missing or unreadable file is the OSError it is
    try:
        return _leaf_column(path, row_group, leaf, parquet, file_size)
    except (OSError, ValueError) as err:  # pyarrow's: "Couldn't deserialize thrift", ArrowInvalid, a bad name
        raise CorruptPage(f"{path.name}: its footer does not read ({str(err).strip()}); fix: rewrite the file "
                          "(e.g. pyarrow.parquet.write_table), or skip its rows") from None


def _leaf_column(path: Path, row_group: int, leaf: str, parquet: Any, file_size: int) -> LeafColumn:
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path) if parquet is None else parquet
    group = parquet.metadata.row_group(row_group)
    index = next((i for i in range(group.num_columns) if group.column(i).path_in_schema == leaf), None)
    if index is None:
        raise KeyError(f"{leaf!r} is not a leaf column of {str(path)!r}")
    chunk, schema = group.column(index), parquet.schema.column(index)
    try:
        top = parquet.schema_arrow.field(leaf.split(".")[0])
    except KeyError:
        raise CorruptPage(f"{path.name}: its footer's Arrow schema has no column {leaf.split('.')[0]!r}, its "
                          f"Parquet schema has the leaf {leaf!r}; fix: rewrite the file") from None
    is_list = pa.types.is_list(top.type) or pa.types.is_large_list(top.type)
    if chunk.compression not in CODECS:
        raise UnsupportedPage(f"codec {chunk.compression} (streamed: {', '.join(CODECS)})")
    if chunk.physical_type != "BYTE_ARRAY" or schema.max_repetition_level > 1 or (schema.max_repetition_level == 1) != is_list:
        raise UnsupportedPage(f"a {chunk.physical_type} leaf at repetition level {schema.max_repetition_level} of a {top.type} column")
    start = min(filter(None, (chunk.dictionary_page_offset, chunk.data_page_offset)), default=0)  # some writers put 0 for "none"
    if not 4 <= start <= start + chunk.total_compressed_size <= file_size or chunk.num_values < 0:
        raise CorruptPage(f"{path.name}, column {leaf!r}, row group {row_group}: the footer places its {chunk.num_values} values "
                          f"at bytes {start}..{start + chunk.total_compressed_size} of a file of {file_size}; fix: rewrite the file")
    return LeafColumn(path, row_group, leaf, start, chunk.total_compressed_size, chunk.compression,
                      schema.max_definition_level, schema.max_repetition_level, int(top.nullable),
                      int(top.nullable) + is_list, group.num_rows,
                      schema.logical_type.type == "STRING" or schema.converted_type == "UTF8", chunk.num_values)


class _Pages:
    """The levels and values of a column chunk's data pages, page by page (``levels`` and ``value``),
    from file offset ``start`` to the chunk's end (``opened`` opens the file at an offset).

    A dictionary page is not read whole: a first pass over the data pages counts each entry's
    uses into ``counting`` (dictionary indices only, PLAIN pages skipped unread), then the
    entries are streamed as the indices reach them, each kept until its last use (``_Dictionary``).
    Example: ``_Pages(column, opened, column.start)``, then ``for rep, level in pages.levels()``,
    calling ``pages.value()`` for each level at ``max_def``.
    """

    def __init__(self, column: LeafColumn, opened: Callable[[int], BinaryIO], start: int, *,
                 counting: _Uses | None = None) -> None:
        self.column = column
        self.opened = opened
        self.start = start
        self.raw = _Stream(_file_pieces(opened(start), column.start + column.size - start))
        self.counting = counting is not None
        self.dictionary: _Dictionary | _Uses | None = counting
        self._values: Iterator[Any] = iter(())

    def levels(self) -> Iterator[tuple[int, int]]:
        """``(repetition, definition)`` level of each value of the chunk; before advancing past one
        at ``max_def``, the caller reads it with ``value``."""
        column = self.column
        while True:
            try:
                header = read_struct(self.raw)
            except EOFError:
                return
            # Every field read is checked for its type and range (the bytes are untrusted): a page
            # size within the chunk, a value count within the chunk's (levels are held per page).
            kind = _int_field(header, 1, "the page type", -1)
            size = _int_field(header, 3, "the page size", 0, limit=column.size)
            if kind == DICTIONARY_PAGE and not self.counting:
                page = _struct_field(header, 7, "the dictionary page header")
                self._check_encoding(_int_field(page, 2, "the dictionary encoding", PLAIN), (PLAIN, PLAIN_DICTIONARY))
                self.dictionary = self._dictionary(_int_field(page, 1, "the dictionary's entries", 0), size)
            elif kind in (DATA_PAGE, DATA_PAGE_V2):
                v2 = kind == DATA_PAGE_V2  # v2: the header at field 8, its encoding at 4; v1: at 5 and 2
                page = _struct_field(header, 8 if v2 else 5, "the data page header")
                encoding = _int_field(page, 4 if v2 else 2, "the data page encoding", PLAIN)
                if self.counting and encoding == PLAIN:
                    self._skip(size)
                    continue
                count = _int_field(page, 1, "the page's value count", 0, limit=column.values)
                body, repetition, definition = (self._v2_levels if v2 else self._v1_levels)(page, size, count)
                yield from self._page(body, encoding, repetition, definition)
            else:  # an index page, one of a later format, or a dictionary page the counting pass skips
                self._skip(size)

    def _v1_levels(self, page: dict[int, Any], size: int, count: int) -> tuple[_Stream, list[int], list[int]]:
        """A v1 data page of ``size`` bytes: its body (decompressed), its repetition and definition
        levels read from the body's start (each prefixed with its byte length)."""
        body = _Stream(DECOMPRESSORS[self.column.codec](self.raw.pieces(size)))
        rep_encoding = _int_field(page, 4, "the repetition level encoding", RLE)
        def_encoding = _int_field(page, 3, "the definition level encoding", RLE)
        repetition = self._levels(body, self.column.max_rep, count, rep_encoding, prefixed=True)
        return body, repetition, self._levels(body, self.column.max_def, count, def_encoding, prefixed=True)

    def _v2_levels(self, page: dict[int, Any], size: int, count: int) -> tuple[_Stream, list[int], list[int]]:
        """A v2 data page of ``size`` bytes: its levels first, uncompressed (their sizes in the
        header), then its values, compressed unless the header says not."""
        repetition_size = _int_field(page, 6, "the repetition levels' size", 0, limit=size)
        definition_size = _int_field(page, 5, "the definition levels' size", 0, limit=size - repetition_size)
        compressed = page.get(7, True)
        if not isinstance(compressed, bool):
            raise CorruptPage(f"the data page v2 is_compressed (Thrift field 7) is {compressed!r:.40}, not a bool")
        repetition = self._levels(_Stream(iter([self.raw.read(repetition_size)])), self.column.max_rep, count, RLE)
        definition = self._levels(_Stream(iter([self.raw.read(definition_size)])), self.column.max_def, count, RLE)
        values = self.raw.pieces(size - repetition_size - definition_size)
        return _Stream(DECOMPRESSORS[self.column.codec](values) if compressed else values), repetition, definition

    def _skip(self, size: int) -> None:
        """Read past the next ``size`` bytes of the chunk (a page body this pass does not decode)."""
        for _ in self.raw.pieces(size):
            pass

    def _dictionary(self, entries: int, size: int) -> _Dictionary:
        """The dictionary page whose ``size`` bytes of body come next: its uses counted over the
        data pages after it, its body skipped here and streamed from its own file handle."""
        body_start = self.start + self.raw.tell()
        uses = _Uses()
        counting = _Pages(self.column, self.opened, body_start + size, counting=uses)
        for _, definition in counting.levels():
            if definition == self.column.max_def:
                counting.value()
        self._skip(size)
        stream = _Stream(DECOMPRESSORS[self.column.codec](_file_pieces(self.opened(body_start), size)))
        return _Dictionary(stream, entries, self.column.utf8, uses.uses)

    def value(self) -> Any:
        """The next present value of the page (bytes, or str for a UTF-8 leaf)."""
        return next(self._values)

    def _page(self, body: _Stream, encoding: int, repetition: list[int], definition: list[int]) -> Iterator[tuple[int, int]]:
        """A data page's levels, its values (from ``body``, after the levels) made ready for ``value``;
        the rest of ``body`` is read once the caller moves past the page."""
        present = sum(level == self.column.max_def for level in definition)
        # The value iterators refer to no ``self``: a cycle would keep a page's dictionary until gc runs.
        if encoding == PLAIN:
            utf8 = self.column.utf8
            self._values = (_plain(body, utf8) for _ in range(present))
        else:
            self._check_encoding(encoding, (PLAIN_DICTIONARY, RLE_DICTIONARY))
            if self.dictionary is None:
                raise CorruptPage("a dictionary-encoded data page without a dictionary page before it")
            entry = self.dictionary.entry
            bit_width = body.byte() if present else 0
            if bit_width > 32:
                raise CorruptPage(f"dictionary indices of {bit_width} bits (at most 32)")
            self._values = (entry(i) for i in hybrid_values(body, bit_width, present))
        yield from zip(repetition, definition)
        body.drain()

    def _levels(self, stream: _Stream, max_level: int, count: int, encoding: int, *, prefixed: bool = False) -> list[int]:
        """``count`` levels up to ``max_level`` (all 0 when it is 0); a v1 page prefixes them with their byte length."""
        if max_level == 0:
            return [0] * count
        self._check_encoding(encoding, (RLE,))
        if prefixed:
            stream = _Stream(iter([stream.read(int.from_bytes(stream.read(4), "little"))]))
        levels = list(hybrid_values(stream, max_level.bit_length(), count))
        if levels and max(levels) > max_level:
            raise CorruptPage(f"a level of {max(levels)} in a column whose levels go up to {max_level}")
        return levels

    def _check_encoding(self, encoding: int, supported: tuple[int, ...]) -> None:
        if encoding not in supported:
            raise UnsupportedPage(f"{ENCODING_NAMES.get(encoding, encoding)} encoding in {self.column.where()} "
                                  f"(streamed: {', '.join(ENCODING_NAMES[e] for e in supported)} there)")



class _Uses:
    """The counting pass's dictionary: how often each index is used (its entries are None).

    Example: ``entry(3)``, ``entry(3)``, ``entry(0)`` -> ``uses == {3: 2, 0: 1}``.
    """

    def __init__(self) -> None:
        self.uses: Counter[int] = Counter()

    def entry(self, index: int) -> None:
        self.uses[index] += 1


class _Dictionary:
    """A dictionary page's ``count`` entries, read from ``body`` as the indices reach them; an entry
    is kept from its reading to its last use (``uses``), one never used is not kept.

    Example: uses ``{0: 1, 1: 2}``: ``entry(1)`` reads entries 0 and 1 and keeps both; ``entry(0)``
    drops 0; ``entry(1)`` drops 1. Entries of a media column are used once each, in order
    (pyarrow numbers them as they first appear), so memory holds about one.
    """

    def __init__(self, body: _Stream, count: int, utf8: bool, uses: Counter[int]) -> None:
        self.body, self.count, self.utf8, self.uses = body, count, utf8, uses
        self.kept: dict[int, Any] = {}
        self.read = 0

    def entry(self, index: int) -> Any:
        while self.read <= index:
            if self.read >= self.count:
                raise CorruptPage(f"dictionary index {index} of a dictionary of {self.count} entries")
            value = _plain(self.body, self.utf8)
            if self.uses[self.read]:
                self.kept[self.read] = value
            self.read += 1
        self.uses[index] -= 1
        return self.kept[index] if self.uses[index] else self.kept.pop(index)


def _plain(body: _Stream, utf8: bool) -> Any:
    """One PLAIN ``BYTE_ARRAY`` value: a 4-byte little-endian length, then the bytes (str for a UTF-8 leaf).

    Example: bytes ``02 00 00 00 68 69`` -> ``b"hi"`` (``"hi"`` with ``utf8``).
    """
    value = body.read(int.from_bytes(body.read(4), "little"))
    return value.decode("utf-8") if utf8 else value


def leaf_items(path: Path, row_group: int, leaf: str, *, parquet: Any = None) -> Iterator[list[Any] | None]:
    """Each row's items of one leaf column: None when the row's top-level value (its list, or its
    struct or value) is null, else the list of its items, each the leaf's value or None (a null
    item, or a null field of a present struct). A row is yielded before the next row's first value
    is read, so memory holds one row. Levels beyond the leaf's (``max_rep`` > 1) are ``UnsupportedPage``.

    Example: ``images: list<struct<bytes, path>>`` with rows ``[{"bytes": b"a"}, None]``, ``None``,
    ``[]``; leaf ``images.list.element.bytes`` -> ``[b"a", None]``, ``None``, ``[]``. A top-level
    ``image: struct<bytes, path>`` with rows ``{"bytes": b"a"}``, ``None``, ``{"bytes": None}`` ->
    ``[b"a"]``, ``None``, ``[None]``. ``parquet``: the file's open ``ParquetFile``, as for `leaf_column`.
    """
    column = leaf_column(path, row_group, leaf, parquet)
    rows = 0
    try:
        with ExitStack() as files:
            def opened(offset: int) -> BinaryIO:
                file = files.enter_context(path.open("rb"))
                file.seek(offset)
                return file

            pages = _Pages(column, opened, column.start)
            row: list[Any] | None = None
            for repetition, definition in pages.levels():
                if repetition == 0:
                    if rows:
                        yield row
                    rows += 1
                    row = None if definition < column.row_level else []
                if definition >= column.item_level:
                    if row is None:
                        raise CorruptPage(f"a repeated value (repetition level {repetition}) before a row starts")
                    row.append(pages.value() if definition == column.max_def else None)
            if rows:
                yield row
    except (EOFError, StopIteration, IndexError, KeyError, UnicodeDecodeError, zlib.error, CorruptPage) as err:
        raise CorruptPage(f"{column.where()} does not read: {err}; fix: rewrite the file "
                          "(e.g. pyarrow.parquet.write_table), or skip its rows") from None
    if rows != column.rows:
        raise CorruptPage(f"{column.where()} holds {rows} rows, its metadata says {column.rows}; "
                          "fix: rewrite the file (e.g. pyarrow.parquet.write_table)")
