"""The streaming Parquet leaf reader (``data.parquet_pages``): its rows are pyarrow's for every
page layout pyarrow writes (row groups, page sizes, dictionary, codecs, page versions, nulls),
its snappy stream is the snappy library's, it holds about one value at a time, and what it does
not read falls back to pyarrow (``TableInput.with_media``) or is a ``CorruptPage``."""

from __future__ import annotations

import json
import random
import tracemalloc
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from energon_pack.data import parquet_records
from energon_pack.data.parquet_pages import (
    MAX_THRIFT_DEPTH,
    CorruptPage,
    UnsupportedPage,
    _int_field,
    _Stream,
    _struct_field,
    hybrid_values,
    leaf_items,
    read_struct,
    snappy_pieces,
)
from energon_pack.data.parquet_records import EmbeddedMedia, TableInput
from energon_pack.data.prepare import PlacedRecord
from tests.support.parquet_leaves import leaf_rows

ITEM = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
CHAT = json.dumps([{"role": "user", "content": "<image>What?"}, {"role": "assistant", "content": "A cat."}])
#: Leaves of the table ``_table`` writes, and how pyarrow gives each one's rows.
LEAVES = {
    "images.list.element.bytes": lambda t: [None if r is None else [None if i is None else i["bytes"] for i in r]
                                            for r in t.column("images").to_pylist()],
    "images.list.element.path": lambda t: [None if r is None else [None if i is None else i["path"] for i in r]
                                           for r in t.column("images").to_pylist()],
    "image.bytes": lambda t: pc.struct_field(t.column("image").combine_chunks(), "bytes").to_pylist(),
    "image.path": lambda t: pc.struct_field(t.column("image").combine_chunks(), "path").to_pylist(),
    "video": lambda t: t.column("video").to_pylist(),
    "names.list.element": lambda t: t.column("names").to_pylist(),
}


def _value(size: int, seed: int) -> bytes:
    """``size`` bytes: random (odd seeds) or compressible (even seeds)."""
    if seed % 2:
        return random.Random(seed).randbytes(size)
    return (b"energon %d " % seed * (size // 9 + 1))[:size]


BINARY = st.one_of(st.none(), st.builds(_value, st.one_of(st.integers(0, 40), st.integers(0, 200_000)), st.integers(0, 9)))
STRUCT = st.one_of(st.none(), st.fixed_dictionaries({"bytes": BINARY, "path": st.one_of(st.none(), st.sampled_from(["", "a.jpg", "ü.png"]))}))
ROW = st.fixed_dictionaries({
    "images": st.one_of(st.none(), st.lists(STRUCT, max_size=3)),
    "image": STRUCT,
    "video": BINARY,
    "names": st.one_of(st.none(), st.lists(st.one_of(st.none(), st.text(max_size=5)), max_size=3)),
})


SCHEMA = pa.schema([("images", pa.list_(ITEM)), ("image", ITEM), ("video", pa.binary()), ("names", pa.list_(pa.string()))])


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                                                 HealthCheck.data_too_large])
@given(rows=st.lists(ROW, min_size=1, max_size=8), group_rows=st.integers(1, 5), page_size=st.sampled_from([1, None]),
       dictionary=st.booleans(), compression=st.sampled_from(["none", "snappy", "gzip"]), version=st.sampled_from(["1.0", "2.0"]))
def test_leaf_rows_are_pyarrows(tmp_path_factory, rows, group_rows, page_size, dictionary, compression, version):
    """Every leaf form (top-level binary, struct field, list of strings, list of struct fields)
    over any row groups, page sizes (``data_page_size=1``: a page per value, the first may hold
    none), dictionary or PLAIN, codec and page version: the rows ``to_pylist()`` gives."""
    path = tmp_path_factory.mktemp("pages") / "t.parquet"
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    pq.write_table(table, path, row_group_size=group_rows, data_page_size=page_size, use_dictionary=dictionary,
                   compression=compression, data_page_version=version)
    for group in range(pq.ParquetFile(path).num_row_groups):
        expected = table.slice(group * group_rows, group_rows)  # not read back: pyarrow misreads some page-per-value files
        for leaf, rows_of in LEAVES.items():
            assert list(leaf_rows(path, group, leaf)) == rows_of(expected), (leaf, group)


def test_leaf_items_tell_a_null_struct_from_a_struct_of_nulls(tmp_path):
    table = pa.table({"image": pa.array([{"bytes": b"a", "path": None}, None, {"bytes": None, "path": None}], ITEM)})
    pq.write_table(table, tmp_path / "t.parquet")
    assert list(leaf_items(tmp_path / "t.parquet", 0, "image.bytes")) == [[b"a"], None, [None]]
    assert list(leaf_rows(tmp_path / "t.parquet", 0, "image.bytes")) == [b"a", None, None]


@pytest.mark.parametrize("data", [b"energon pack " * 80_000, random.Random(1).randbytes(700_000), b"", b"x"])
@pytest.mark.parametrize("piece", [1000, 1 << 18])
def test_streaming_snappy_gives_the_snappy_librarys_data(data, piece):
    compressed = pa.compress(data, codec="snappy", asbytes=True)
    pieces = iter([compressed[i:i + piece] for i in range(0, len(compressed), piece)])
    assert b"".join(snappy_pieces(pieces)) == data


def test_a_snappy_copy_beyond_the_window_is_unsupported_and_beyond_the_start_corrupt():
    literal = b"\xf8" + (300_000 - 1).to_bytes(3, "little") + bytes(300_000)  # tag 62 << 2: a 3-byte length
    far = bytes([(4 - 1) << 2 | 3]) + (100_000).to_bytes(4, "little")  # copy 4 bytes from 100,000 back
    with pytest.raises(UnsupportedPage, match="beyond the 65536-byte window"):
        list(snappy_pieces(iter([b"\xe4\xa7\x12" + literal + far])))  # varint 300,004
    with pytest.raises(CorruptPage, match="copy from 7 bytes back, with 0 bytes output"):
        list(snappy_pieces(iter([b"\x04\x0e\x07\x00"])))


def test_hybrid_levels_and_thrift_golden():
    """The Parquet spec's bit-packed example (width 3: 0..7 as ``88 c6 fa``), then an RLE run of
    five 4s; a compact-protocol struct with a nested struct, a list and a skipped binary."""
    stream = _Stream(iter([bytes([0x03, 0x88, 0xC6, 0xFA, 0x0A, 0x04])]))
    assert list(hybrid_values(stream, 3, 13)) == [0, 1, 2, 3, 4, 5, 6, 7, 4, 4, 4, 4, 4]
    # field 1 i32 = 3; field 5 struct {1: i32 -2}; field 6 list<i32> [1, 2]; field 9 binary b"hi"; STOP
    data = bytes([0x15, 0x06, 0x4C, 0x15, 0x03, 0x00, 0x19, 0x25, 0x02, 0x04, 0x38, 0x02]) + b"hi" + b"\x00"
    assert read_struct(_Stream(iter([data]))) == {1: 3, 5: {1: -2}, 6: [1, 2], 9: b"hi"}


def test_thrift_that_is_no_page_header_is_corrupt_page():
    nested = bytes([0x1C] * (MAX_THRIFT_DEPTH + 2)) + b"\x00" * (MAX_THRIFT_DEPTH + 3)  # structs in structs
    with pytest.raises(CorruptPage, match="nested deeper than"):
        read_struct(_Stream(iter([nested])))
    list_key = bytes([0x1B, 0x01, 0x95, 0x11, 0x02, 0x02, 0x00])  # field 1: map of 1 entry, list<i32> [1] -> i32
    with pytest.raises(CorruptPage, match="map key of type list"):
        read_struct(_Stream(iter([list_key])))
    with pytest.raises(CorruptPage, match=r"the page size \(Thrift field 3\) is -1, not an integer from 0 to 100"):
        _int_field({3: -1}, 3, "the page size", 0, limit=100)
    with pytest.raises(CorruptPage, match=r"the data page header \(Thrift field 5\) is a int, not a struct"):
        _struct_field({5: 7}, 5, "the data page header")


def test_a_footer_that_does_not_parse_is_corrupt_page(tmp_path):
    pq.write_table(_media_table(2), tmp_path / "t.parquet")
    data = bytearray((tmp_path / "t.parquet").read_bytes())
    footer = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    data[footer:footer + 8] = b"\xff" * 8
    (tmp_path / "t.parquet").write_bytes(bytes(data))
    with pytest.raises(CorruptPage, match=r"^t\.parquet: its footer does not read \(.*\); fix: rewrite the file"):
        next(leaf_items(tmp_path / "t.parquet", 0, "images.list.element.bytes"))


def _attached(path: Path) -> list[dict]:
    """``with_media``'s embedded media of every row of ``path``."""
    placed = [PlacedRecord(line, f"k{line}", None, "train", "s") for line in range(1, pq.ParquetFile(path).metadata.num_rows + 1)]
    return [record.embedded for record in TableInput(path).with_media(placed)]


def _media_table(rows: int) -> pa.Table:
    return pa.table({"messages": [CHAT] * rows,
                     "images": pa.array([[{"bytes": _value(3000 + i, i), "path": f"{i}.jpg" if i % 3 else None}] for i in range(rows)],
                                        pa.list_(ITEM))})


@pytest.mark.parametrize("options", [dict(), dict(compression="gzip", use_dictionary=False, data_page_version="2.0")])
def test_with_media_streams_supported_files_without_pyarrow(tmp_path, monkeypatch, options):
    pq.write_table(_media_table(7), tmp_path / "t.parquet", row_group_size=3, **options)
    table = pq.read_table(tmp_path / "t.parquet")
    expected = [{("image", 0): EmbeddedMedia(item["path"], item["bytes"])} for [item] in table.column("images").to_pylist()]

    def refused(self, *args, **kwargs):
        raise AssertionError("the media pass read a Parquet file with pyarrow")

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", refused)
    assert _attached(tmp_path / "t.parquet") == expected


@pytest.mark.parametrize("options", [dict(compression="zstd"), dict(compression="lz4"),
                                     dict(use_dictionary=False, column_encoding={"images.list.element.bytes": "DELTA_BYTE_ARRAY"})])
def test_unsupported_codecs_and_encodings_fall_back_to_pyarrow(tmp_path, options):
    pq.write_table(_media_table(7), tmp_path / "plain.parquet", row_group_size=3)
    pq.write_table(_media_table(7), tmp_path / "other.parquet", row_group_size=3, **options)
    with pytest.raises(UnsupportedPage):
        list(leaf_items(tmp_path / "other.parquet", 0, "images.list.element.bytes"))
    assert _attached(tmp_path / "other.parquet") == _attached(tmp_path / "plain.parquet")


def test_the_fallback_starts_at_the_row_the_stream_stopped_at(tmp_path, monkeypatch):
    pq.write_table(_media_table(7), tmp_path / "t.parquet", row_group_size=5)
    expected = _attached(tmp_path / "t.parquet")
    streamed = parquet_records.leaf_items

    def stops_after_two_rows(path, group, leaf, *, parquet):
        items = streamed(path, group, leaf, parquet=parquet)
        yield next(items)
        yield next(items)
        raise UnsupportedPage("a page of another kind")

    monkeypatch.setattr(parquet_records, "leaf_items", stops_after_two_rows)
    assert _attached(tmp_path / "t.parquet") == expected


def test_a_corrupt_page_header_is_corrupt_page_and_unreadable_rows(tmp_path):
    pq.write_table(_media_table(4), tmp_path / "t.parquet", row_group_size=2, compression="none")
    offset = pq.ParquetFile(tmp_path / "t.parquet").metadata.row_group(1).column(1).data_page_offset  # images.list.element.bytes
    with (tmp_path / "t.parquet").open("r+b") as file:
        file.seek(offset)
        file.write(b"\xff\xff")
    with pytest.raises(CorruptPage, match=r"t.parquet, column 'images.list.element.bytes', row group 1 does not read"):
        list(leaf_items(tmp_path / "t.parquet", 1, "images.list.element.bytes"))
    placed = [PlacedRecord(line, f"k{line}", None, "train", "s") for line in range(1, 5)]
    records = list(TableInput(tmp_path / "t.parquet").with_media(placed))
    assert [record.media_error is None for record in records] == [True, True, False, False]
    assert records[2].media_error.reason == "unreadable_row" and "rows 3..4 do not read" in records[2].media_error.detail


@pytest.mark.parametrize("compression, dictionary", [("none", False), ("snappy", False), ("gzip", False), ("snappy", True)])
def test_a_page_of_large_values_is_read_about_one_value_at_a_time(tmp_path, compression, dictionary):
    """30 values of 1 MiB in one data page, or all in one dictionary page (pyarrow's default
    writes a group's media so): the reader's peak (tracemalloc) stays within 3 values."""
    size = 1 << 20
    values = [random.Random(i).randbytes(size) for i in range(30)]
    pq.write_table(pa.table({"video": pa.array(values, pa.binary())}), tmp_path / "t.parquet", compression=compression,
                   use_dictionary=dictionary, data_page_size=1 << 30)
    del values
    chunk = pq.ParquetFile(tmp_path / "t.parquet").metadata.row_group(0).column(0)
    assert (chunk.dictionary_page_offset is not None) == dictionary and chunk.total_compressed_size > 30 * size
    tracemalloc.start()
    try:
        sizes = list(map(len, leaf_rows(tmp_path / "t.parquet", 0, "video")))  # each value dropped once measured
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert sizes == [size] * 30
    assert peak < 3 * size, f"peak {peak / size:.2f} values"


#: How the fuzzed files are written: dictionary pages or not, each codec, v1 and v2 data pages, small pages.
FUZZ_WRITES = (
    dict(compression="snappy"), dict(compression="none", use_dictionary=False), dict(compression="gzip"),
    dict(compression="snappy", data_page_version="2.0", use_dictionary=False), dict(compression="none", data_page_version="2.0"),
)


@pytest.mark.timeout(60)  # a hang fails here, not the run
def test_mutated_pages_give_corrupt_page_or_rows_and_nothing_else(tmp_path):
    """300 seeded mutations (bytes set, bits flipped, 4-byte words replaced) of the column chunks of
    Parquet files (the bytes this reader parses itself; the footer is pyarrow's): every read of every
    leaf ends in rows, ``CorruptPage`` or ``UnsupportedPage`` (pyarrow reads instead), never another error."""
    rng = random.Random(44)
    rows = [{"images": None if i % 7 == 3 else [None if j == 1 else {"bytes": rng.randbytes(rng.randint(0, 60)), "path": f"p{i}.jpg"}
                                                for j in range(i % 3)],
             "image": {"bytes": rng.randbytes(20), "path": None}, "video": None if i % 5 == 0 else rng.randbytes(30),
             "names": ["a", None]} for i in range(12)]
    bases = []
    for n, options in enumerate(FUZZ_WRITES):
        pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), tmp_path / f"{n}.parquet", row_group_size=6, data_page_size=300, **options)
        bases.append((tmp_path / f"{n}.parquet").read_bytes())
    outcomes: Counter[str] = Counter()
    path = tmp_path / "mutated.parquet"
    for _ in range(300):
        data = bytearray(rng.choice(bases))
        footer = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
        for _ in range(rng.randint(1, 3)):
            at, how = rng.randrange(4, footer - 4), rng.random()  # the footer after it stays as written
            if how < 0.5:
                data[at] = rng.randrange(256)
            elif how < 0.8:
                data[at] ^= 1 << rng.randrange(8)
            else:
                data[at:at + 4] = rng.randbytes(4)
        path.write_bytes(bytes(data))
        group, parquet = rng.randrange(2), pq.ParquetFile(path)  # the footer is unchanged: parsed once
        for leaf in LEAVES:
            try:
                for _ in leaf_items(path, group, leaf, parquet=parquet):
                    pass
                outcomes["rows"] += 1
            except (CorruptPage, UnsupportedPage) as err:
                outcomes[type(err).__name__] += 1
    assert outcomes["CorruptPage"] >= 100 and outcomes["rows"] >= 100, outcomes  # the mutations do reach the parser
