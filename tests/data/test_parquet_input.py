"""Parquet / ``datasets`` input of ``energon-pack prepare`` (``data.parquet_records``): the same
records as JSON + media files give the same shards byte for byte, for every layout and worker
count; bad rows and options are counted skips and one-line usage errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from energon_pack.cli import main as cli_main
from energon_pack.data.merge import merge_parts
from energon_pack.data.parquet_records import TableColumns, texts_to_messages
from energon_pack.data.prepare import prepare_dataset
from energon_pack.data.synthetic import (
    SyntheticSpec,
    encode_image,
    encode_video,
    make_jpeg_records,
    make_records,
    records_to_parquet,
)
from energon_pack.tools.bench_prepare import measure_prepare
from tests.support.paths import REPO

OPTIONS = dict(split_ratio="3,1,1", samples_per_shard=3, progress=False)
CHAT = [{"role": "user", "content": "<image>What?"}, {"role": "assistant", "content": "A cat."}]


def _jpeg(seed: int, side: int = 40) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, size=(side, side, 3), dtype=np.uint8)
    return encode_image(pixels, "JPEG", "RGB")


def _tree(path: Path) -> dict[str, bytes]:
    """Every shard and the facts of a dataset folder, by relative path (Energon's index.uuid aside)."""
    files = sorted(path.glob("shards/*.tar")) + [path / ".nv-meta" / "energon_pack.facts.npz"]
    return {file.relative_to(path).as_posix(): file.read_bytes() for file in files}


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    """20 synthetic records (images of every kind, videos) as JSON + files, and the same as Parquet."""
    folder = tmp_path_factory.mktemp("pq") / "raw"
    spec = SyntheticSpec(max_image_side=64, max_video_seconds=1.0, max_video_side=48, real_world_fraction=0.4)
    records = make_records(folder, 20, seed=3, spec=spec)
    records_to_parquet(records, folder, folder.parent / "records.parquet", row_group_rows=6)
    return records


@pytest.fixture(scope="module")
def from_json(raw) -> Path:
    out = raw.parent.parent / "from_json"
    prepare_dataset(raw, raw.parent, out, **OPTIONS)
    return out


def test_parquet_with_embedded_media_prepares_the_shards_json_plus_files_do(raw, from_json, tmp_path):
    (tmp_path / "media").mkdir()
    report = prepare_dataset(raw.parent.parent / "records.parquet", tmp_path / "media", tmp_path / "ds", **OPTIONS)
    assert report.written == 20 and not report.problems and report.images and report.videos
    assert _tree(tmp_path / "ds") == _tree(from_json)


def test_embedded_media_without_a_path_take_their_format_extension(tmp_path):
    images = [_jpeg(0), encode_image(np.zeros((8, 8, 3), np.uint8), "PNG", "RGB")]
    video = encode_video(np.zeros((4, 16, 16, 3), np.uint8), fps=4, codec="libvpx-vp9", container_format="webm",
                         options={"deadline": "realtime", "cpu-used": "8"})
    chat = [{"role": "user", "content": "<image><image><video>What?"}, {"role": "assistant", "content": "Both."}]
    table = pa.table({"messages": [json.dumps(chat)], "images": [[{"bytes": data, "path": None} for data in images]],
                      "video": pa.array([video], pa.binary())})
    pq.write_table(table, tmp_path / "t.parquet")
    prepare_dataset(tmp_path / "t.parquet", tmp_path, tmp_path / "ds", progress=False)
    import tarfile

    with tarfile.open(tmp_path / "ds" / "shards" / "train-000000.tar") as tar:
        members = {member.name: tar.extractfile(member).read() for member in tar.getmembers()}
    assert members["_line1.0.jpg"] == images[0] and members["_line1.1.png"] == images[1]
    assert members["_line1.0.webm"] == video


def test_llava_and_cauldron_layouts_and_paths_under_the_media_root(tmp_path):
    """LLaVA ``conversations`` + one ``image`` struct holding only a path; the_cauldron ``texts`` pairs."""
    (tmp_path / "a.jpg").write_bytes(_jpeg(1))
    llava = pa.table({"id": ["x"], "conversations": [[{"from": "human", "value": "<image>\nWhat?"}, {"from": "gpt", "value": "A."}]],
                      "image": [{"bytes": None, "path": "a.jpg"}]})
    pq.write_table(llava, tmp_path / "llava.parquet")
    report = prepare_dataset(tmp_path / "llava.parquet", tmp_path, tmp_path / "llava", progress=False)
    assert report.written == 1 and report.images == 1

    turns = [{"user": "What is it?", "assistant": "A cat.", "source": "s"}, {"user": "Sure?", "assistant": "Yes.", "source": "s"}]
    cauldron = pa.table({"images": [[{"bytes": _jpeg(2), "path": None}, {"bytes": _jpeg(3), "path": None}]], "texts": [turns]})
    pq.write_table(cauldron, tmp_path / "cauldron.parquet")
    report = prepare_dataset(tmp_path / "cauldron.parquet", tmp_path, tmp_path / "cauldron", progress=False)
    assert report.written == 1 and report.images == 2 and not report.problems


def test_texts_pairs_put_the_images_before_the_first_user_text():
    messages = texts_to_messages([{"user": "Q1", "assistant": "A1"}, {"user": "Q2", "assistant": "A2"}], 2)
    assert messages[0] == {"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "Q1"}]}
    assert messages[2] == {"role": "user", "content": [{"type": "text", "text": "Q2"}]}
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]


def test_a_folder_of_parquet_files_and_a_save_to_disk_folder_read_as_one_table(raw, from_json, tmp_path):
    """Rows numbered over files in order; the Arrow stream files of ``save_to_disk`` (``state.json``)."""
    table = pq.read_table(raw.parent.parent / "records.parquet")
    folder = tmp_path / "hub" / "data"
    folder.mkdir(parents=True)
    pq.write_table(table.slice(0, 7), folder / "train-00000-of-00002.parquet", row_group_size=4)
    pq.write_table(table.slice(7), folder / "train-00001-of-00002.parquet", row_group_size=4)
    prepare_dataset(tmp_path / "hub", tmp_path, tmp_path / "ds_folder", **OPTIONS)
    assert _tree(tmp_path / "ds_folder") == _tree(from_json)

    saved = tmp_path / "saved"
    saved.mkdir()
    for index, part in enumerate((table.slice(0, 11), table.slice(11))):
        with pa.OSFile(str(saved / f"data-0000{index}-of-00002.arrow"), "wb") as sink, pa.ipc.new_stream(sink, part.schema) as writer:
            writer.write_table(part, max_chunksize=5)
    files = [{"filename": f"data-0000{i}-of-00002.arrow"} for i in range(2)]
    (saved / "state.json").write_text(json.dumps({"_data_files": files}))
    (saved / "dataset_info.json").write_text("{}")
    prepare_dataset(saved, tmp_path, tmp_path / "ds_saved", **OPTIONS)
    assert _tree(tmp_path / "ds_saved") == _tree(from_json)


def test_a_datasets_save_to_disk_folder(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = {"messages": [CHAT, CHAT], "images": [[{"bytes": _jpeg(4), "path": None}], [{"bytes": _jpeg(5), "path": "b.jpg"}]]}
    features = datasets.Features({"messages": [{"role": datasets.Value("string"), "content": datasets.Value("string")}],
                                  "images": datasets.Sequence(datasets.Image())})
    datasets.Dataset.from_dict(rows, features=features).save_to_disk(str(tmp_path / "saved"))
    report = prepare_dataset(tmp_path / "saved", tmp_path, tmp_path / "ds", progress=False)
    assert report.written == 2 and report.images == 2


@pytest.mark.slow
def test_workers_and_parts_write_the_single_run_bytes(raw, tmp_path):
    source, media = raw.parent.parent / "records.parquet", tmp_path
    prepare_dataset(source, media, tmp_path / "one", **OPTIONS)
    prepare_dataset(source, media, tmp_path / "two", workers=2, **OPTIONS)
    for part in ("1/2", "0/2"):
        prepare_dataset(source, media, tmp_path / "parts", part=part, **OPTIONS)
    merge_parts(tmp_path / "parts")
    assert _tree(tmp_path / "one") == _tree(tmp_path / "two") == _tree(tmp_path / "parts")


def test_bad_rows_are_counted_skips(tmp_path):
    """A struct with neither bytes nor path, bytes that are no image, a bad JSON conversation; the
    other rows of their row groups are written."""
    good = [{"bytes": _jpeg(6), "path": None}]
    table = pa.table({
        "id": ["ok", "empty", "junk", "json"],
        "messages": [json.dumps(CHAT), json.dumps(CHAT), json.dumps(CHAT), "[{oops"],
        "images": [good, [{"bytes": None, "path": None}], [{"bytes": b"not an image", "path": None}], good],
    })
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=2)
    report = prepare_dataset(tmp_path / "t.parquet", tmp_path, tmp_path / "ds", progress=False)
    assert report.written == 1
    assert [(p.line, p.record_id, p.reason) for p in report.problems] == [
        (2, "empty", "empty_media_struct"), (3, "junk", "unreadable_media"), (4, None, "bad_json")]
    assert "neither bytes nor a path" in report.problems[0].detail


def test_a_row_group_that_does_not_read_is_counted_per_row(tmp_path, monkeypatch):
    """Rows of a group pyarrow cannot decode are ``unreadable_row`` skips; the other groups are written."""
    table = pa.table({"messages": [json.dumps(CHAT)] * 4, "images": [[{"bytes": _jpeg(i), "path": None}] for i in range(4)]})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=2)
    real = pq.ParquetFile.iter_batches

    def broken(self, *args, row_groups=None, **kwargs):
        if row_groups == [1]:
            raise OSError("Corrupt snappy compressed data.")
        return real(self, *args, row_groups=row_groups, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", broken)
    report = prepare_dataset(tmp_path / "t.parquet", tmp_path, tmp_path / "ds", progress=False)
    assert report.written == 2
    assert [(p.line, p.reason) for p in report.problems] == [(3, "unreadable_row"), (4, "unreadable_row")]
    assert "Corrupt snappy" in report.problems[0].detail


def test_media_that_do_not_read_when_written_are_counted_per_row(tmp_path, monkeypatch):
    """The records pass does not read the media bytes: a group whose media page is corrupt reads
    there, and its rows are ``unreadable_row`` skips when their media are streamed
    (``parquet_pages``; tests/data/test_parquet_pages.py corrupts a real page header)."""
    from energon_pack.data import parquet_records
    from energon_pack.data.parquet_pages import CorruptPage

    table = pa.table({"id": [f"r{i}" for i in range(4)], "messages": [json.dumps(CHAT)] * 4,
                      "images": [[{"bytes": _jpeg(i), "path": None}] for i in range(4)]})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=2)
    real = parquet_records.leaf_items

    def broken(path, group, leaf, *, parquet):
        if group == 0:
            raise CorruptPage("t.parquet, column 'images.list.element.bytes', row group 0 does not read")
        return real(path, group, leaf, parquet=parquet)

    monkeypatch.setattr(parquet_records, "leaf_items", broken)
    report = prepare_dataset(tmp_path / "t.parquet", tmp_path, tmp_path / "ds", progress=False)
    assert report.written == 2
    assert [(p.line, p.record_id, p.reason) for p in report.problems] == [(1, "r0", "unreadable_row"), (2, "r1", "unreadable_row")]


def _cli(capsys, *argv: str) -> tuple[int, str]:
    code = cli_main(["prepare", *argv])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("option, value, expected", [
    ("--image-column", "pictures", "--image-column 'pictures' is not a column of"),
    ("--conversation-column", "chat", "--conversation-column 'chat' is not a column of"),
    ("--video-column", "messages", "media column 'messages' holds struct"),
])
def test_column_options_name_existing_media_columns(tmp_path, capsys, option, value, expected):
    pq.write_table(pa.table({"messages": [CHAT], "images": [[{"bytes": _jpeg(7), "path": None}]]}), tmp_path / "t.parquet")
    code, err = _cli(capsys, str(tmp_path / "t.parquet"), "--media-root", str(tmp_path), "--out", str(tmp_path / "o"), option, value)
    assert code == 2 and expected in err and "fix:" in err and len(err.strip().splitlines()) == 1, err


def test_usage_errors_of_table_input(tmp_path, capsys):
    records = tmp_path / "r.jsonl"
    records.write_text(json.dumps({"messages": CHAT[1:]}) + "\n")
    code, err = _cli(capsys, str(records), "--media-root", str(tmp_path), "--out", str(tmp_path / "o"), "--image-column", "x")
    assert code == 2 and "is not Parquet input" in err and len(err.strip().splitlines()) == 1
    pq.write_table(pa.table({"text": ["hi"]}), tmp_path / "t.parquet")
    code, err = _cli(capsys, str(tmp_path / "t.parquet"), "--media-root", str(tmp_path), "--out", str(tmp_path / "o"))
    assert code == 2 and "none of the conversation columns" in err and "--conversation-column" in err
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not really")
    code, err = _cli(capsys, str(tmp_path / "bad.parquet"), "--media-root", str(tmp_path), "--out", str(tmp_path / "o"))
    assert code == 2 and "does not open as a table" in err and len(err.strip().splitlines()) == 1
    (tmp_path / "dd").mkdir()
    (tmp_path / "dd" / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    code, err = _cli(capsys, str(tmp_path / "dd"), "--media-root", str(tmp_path), "--out", str(tmp_path / "o"))
    assert code == 2 and "saved DatasetDict" in err and "dd/train" in err


def test_an_empty_media_column_name_means_none(tmp_path):
    table = pa.table({"messages": [[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]],
                      "images": [[{"bytes": _jpeg(8), "path": None}]]})
    pq.write_table(table, tmp_path / "t.parquet")
    report = prepare_dataset(tmp_path / "t.parquet", tmp_path, tmp_path / "ds", progress=False, columns=TableColumns(image=""))
    assert report.written == 1 and report.images == 0


@pytest.mark.slow
@pytest.mark.parametrize("compression", ["snappy", "none"])
def test_prepare_memory_is_bounded_by_a_row_group_not_the_file(tmp_path, compression):
    """A file of 16 row groups of 8 MB (JPEG bytes, one data page per group as pyarrow writes
    them), snappy (pyarrow's default) or uncompressed: prepare's peak RSS above the warmed-up
    process stays below 2 row groups (the media are streamed value by value, ``parquet_pages``;
    what remains is the records' text and the write path, docs/on_disk_format.md). ``bench --stage
    prepare`` measures the figure (docs/performance.md)."""
    jpeg = _jpeg(9, side=320)
    rows = max(1, (8 << 20) // len(jpeg))
    chat = json.dumps(CHAT)
    schema = pa.schema([("messages", pa.string()), ("images", pa.list_(pa.struct([("bytes", pa.binary()), ("path", pa.string())])))])
    with pq.ParquetWriter(tmp_path / "big.parquet", schema, use_dictionary=False, compression=compression) as writer:
        for _ in range(16):
            group = pa.table({"messages": [chat] * rows, "images": [[{"bytes": jpeg, "path": None}]] * rows}, schema=schema)
            writer.write_table(group, row_group_size=rows)
    pq.write_table(pa.table({"messages": [chat], "images": [[{"bytes": jpeg, "path": None}]]}, schema=schema), tmp_path / "small.parquet")
    group_bytes = pq.ParquetFile(tmp_path / "big.parquet").metadata.row_group(0).total_byte_size
    extra = measure_prepare(tmp_path / "big.parquet", tmp_path, tmp_path / "ds", tmp_path / "small.parquet")["extra"]
    assert extra < 2 * group_bytes, f"peak {extra / 2**20:.1f} MiB above start vs row group {group_bytes / 2**20:.1f} MiB"


@pytest.mark.slow
def test_ten_thousand_jpeg_rows_prepare_as_their_json_records(tmp_path):
    records = make_jpeg_records(tmp_path / "raw", 10_000, side=32)
    records_to_parquet(records, tmp_path / "raw", tmp_path / "rows.parquet", row_group_rows=1000)
    options = dict(samples_per_shard=500, progress=False)
    prepare_dataset(records, tmp_path / "raw", tmp_path / "json", **options)
    report = prepare_dataset(tmp_path / "rows.parquet", tmp_path, tmp_path / "parquet", **options)
    assert report.written == 10_000 and report.images == 10_000
    assert _tree(tmp_path / "parquet") == _tree(tmp_path / "json")


ITEMS = st.one_of(st.none(), st.lists(st.one_of(
    st.none(), st.fixed_dictionaries({"bytes": st.one_of(st.none(), st.binary(min_size=1, max_size=4)),
                                      "path": st.one_of(st.none(), st.sampled_from(["a.jpg", "b.png"]))})), max_size=3))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(ITEMS, min_size=1, max_size=12), group_rows=st.integers(1, 5), batch_rows=st.integers(1, 4),
       keep=st.lists(st.booleans(), min_size=12, max_size=12))
def test_rows_and_their_media_are_read_back_in_order(tmp_path_factory, monkeypatch, rows, group_rows, batch_rows, keep):
    """Any row groups, batches, null lists, null items and empty structs: the records pass names
    each row's items, and ``with_media`` attaches exactly the bytes of the rows asked for."""
    from energon_pack.data import parquet_records
    from energon_pack.data.parquet_records import EmbeddedMedia, TableInput
    from energon_pack.data.prepare import PlacedRecord

    monkeypatch.setattr(parquet_records, "BATCH_ROWS", batch_rows)
    path = tmp_path_factory.mktemp("prop") / "t.parquet"
    item = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table({"messages": pa.array([json.dumps(CHAT)] * len(rows)), "images": pa.array(rows, pa.list_(item))})
    pq.write_table(table, path, row_group_size=group_rows)
    source = TableInput(path)
    records = list(source.records())
    assert [line for line, _ in records] == list(range(1, len(rows) + 1))
    for (line, record), items in zip(records, rows):
        assert record["images"] == [(it or {}).get("path") or f"images[{i}]" for i, it in enumerate(items or [])]
    placed = [PlacedRecord(line, f"k{line}", None, "train", "s") for line in range(1, len(rows) + 1) if keep[line - 1]]
    attached = list(source.with_media(placed))
    assert [p.line for p in attached] == [p.line for p in placed]
    for record in attached:
        items = rows[record.line - 1] or []
        expected = {("image", i): EmbeddedMedia((it or {}).get("path"), (it or {}).get("bytes"))
                    for i, it in enumerate(items) if (it or {}).get("bytes") is not None or not (it or {}).get("path")}
        assert record.embedded == expected


@pytest.mark.slow
def test_bench_prepare_reports_parquet_beside_json(tmp_path, monkeypatch):
    import importlib

    from energon_pack.tools.bench_prepare import PrepareBenchOptions, bench_prepare

    monkeypatch.setattr(importlib.import_module("energon_pack.tools.bench_prepare"), "ROUNDS", 1)  # the package's name is the function

    options = PrepareBenchOptions(row_group_rows=3, image_side=32, baseline=REPO)  # this checkout as its own baseline
    [(title, rows, columns)] = bench_prepare(6, tmp_path, options)
    assert "2 row groups of 3 rows" in title and "best of 1" in title and f"baseline = {REPO}" in title
    assert columns == ["what", "parquet", "json", "ratio", "baseline parquet", "parquet / baseline"]
    assert [row["what"] for row in rows] == [
        "samples/s (higher is better)", "samples per CPU second", "peak MiB above start", "peak / one row group"]
    assert all(float(rows[i][side]) > 0 for i in (0, 1) for side in ("parquet", "json", "baseline parquet"))
    assert _tree(tmp_path / "prepare-6-3-32" / "out-parquet") == _tree(tmp_path / "prepare-6-3-32" / "out-json")
    assert _tree(tmp_path / "prepare-6-3-32" / "out-baseline") == _tree(tmp_path / "prepare-6-3-32" / "out-json")


def test_bench_prepare_refuses_a_baseline_without_the_package(tmp_path, capsys):
    assert cli_main(["bench", "--stage", "prepare", "--baseline", str(tmp_path), "--out", str(tmp_path / "b")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "holds no energon_pack package; fix: pass the root of a checkout" in line


def test_each_footer_is_parsed_once_a_pass_and_each_record_unpickled_once(tmp_path, monkeypatch):
    """Per file, whatever its row groups: one ``ParquetFile`` (its footer parsed) each for the
    layout, the text columns, the records pass and the media pass; each placed record unpickled once."""
    from energon_pack.data.prepare import PlacedRecord

    table = pa.table({"id": [f"r{i}" for i in range(8)], "messages": [json.dumps(CHAT)] * 8,
                      "images": [[{"bytes": _jpeg(i), "path": None}] for i in range(8)]})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=1)  # 8 row groups
    opened, unpickled = [], []
    real_init, real_record = pq.ParquetFile.__init__, PlacedRecord.record

    def counted_init(self, *args, **kwargs):
        opened.append(args[0])
        real_init(self, *args, **kwargs)

    def counted_record(self):
        unpickled.append(self.line)
        return real_record.fget(self)

    monkeypatch.setattr(pq.ParquetFile, "__init__", counted_init)
    monkeypatch.setattr(PlacedRecord, "record", property(counted_record))
    report = prepare_dataset(tmp_path / "t.parquet", tmp_path, tmp_path / "ds", progress=False)
    assert report.written == 8 and report.images == 8 and report.generated_ids == 0
    assert len(opened) == 4 and sorted(unpickled) == list(range(1, 9))
