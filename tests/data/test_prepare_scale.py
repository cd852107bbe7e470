"""prepare at scale: ``--workers N`` and ``--part I/N`` + ``energon-pack merge`` write the dataset a
single run writes (every shard byte for byte, keys, splits, facts, text tokens, plan digest)."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

from energon_pack.cli import main as cli_main
from energon_pack.config import PackingConfig
from energon_pack.data.merge import merge_parts
from energon_pack.data.prepare import PrepareReport, prepare_dataset
from energon_pack.data.synthetic import SyntheticSpec, make_records
from energon_pack.identity import processor_fingerprint
from energon_pack.plan.build import measure_dataset, plan_split
from energon_pack.plan.facts import Facts, TextTokens
from energon_pack.runtime.task_encoder import QwenVLPackingTaskEncoder
from tests.support.prepared_reads import load_all, split_keys

OPTIONS = dict(split_ratio="3,1,1", samples_per_shard=4, progress=False)


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> Path:
    """30 synthetic records (images, videos, real-world kinds) after 4 bad ones (bad JSON, missing
    media, that record's id again: still taken, an unsupported file) and before a duplicate id."""
    raw = tmp_path_factory.mktemp("scale") / "raw"
    spec = SyntheticSpec(max_image_side=96, max_video_seconds=1.0, max_video_side=64, real_world_fraction=0.3)
    path = make_records(raw, 30, seed=7, spec=spec)
    (raw / "notes.txt").write_text("not an image")
    chat = [{"role": "user", "content": "<image>Hi"}, {"role": "assistant", "content": "Hello."}]
    bad = ['{"id": "broken", ', json.dumps({"id": "gone", "messages": chat, "images": ["nope.jpg"]}),
           json.dumps({"id": "gone", "messages": chat, "images": ["s00000_0.jpg"]}),
           json.dumps({"id": "txt", "messages": chat, "images": ["notes.txt"]})]
    path.write_text("\n".join(bad) + "\n" + path.read_text() + json.dumps({"id": "sample00003", "messages": chat[1:]}) + "\n")
    return path


def _prepare(records: Path, out: Path, processor, **options) -> PrepareReport:
    return prepare_dataset(records, records.parent, out, processor=processor, **OPTIONS, **options)


@pytest.fixture(scope="module")
def plain(records, processor) -> tuple[Path, PrepareReport]:
    out = records.parent.parent / "plain"
    return out, _prepare(records, out, processor)


@pytest.fixture(scope="module")
def merged(records, processor) -> tuple[Path, PrepareReport]:
    out = records.parent.parent / "parts"
    parts = [_prepare(records, out, processor, part=f"{part}/2") for part in (1, 0)]
    assert all(report.part is not None and report.written for report in parts)
    assert {p.name for p in (out / ".nv-meta").iterdir()} == {"energon_pack.part-0-of-2.json", "energon_pack.part-1-of-2.json"}
    return out, merge_parts(out)


def dataset_files(path: Path) -> dict[str, bytes]:
    """Every file of a dataset by relative path, but Energon's random ``index.uuid``."""
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file() and p.name != "index.uuid"}


def shard_keys(path: Path) -> dict[str, list[str]]:
    """Sample keys of every shard, in tar order."""
    keys = {}
    for shard in sorted((path / "shards").glob("*.tar")):
        with tarfile.open(shard) as tar:
            keys[shard.name] = list(dict.fromkeys(name.split(".")[0] for name in tar.getnames()))
    return keys


def same_report(a: PrepareReport, b: PrepareReport) -> None:
    for name in ("written", "images", "videos", "shards", "split_counts", "generated_ids", "media_kinds",
                 "oriented_images", "problems"):
        assert getattr(a, name) == getattr(b, name), name


def same_dataset(plain: Path, other: Path, processor) -> None:
    assert shard_keys(other) == shard_keys(plain)
    for name in ("split.yaml", "dataset.yaml", ".info.json"):
        assert (other / ".nv-meta" / name).read_text() == (plain / ".nv-meta" / name).read_text(), name
    facts, other_facts = Facts.load(plain), Facts.load(other)
    assert other_facts.meta == facts.meta and other_facts.digest == facts.digest
    fingerprint = processor_fingerprint(processor)
    tokens, other_tokens = TextTokens.load(plain, fingerprint), TextTokens.load(other, fingerprint)
    assert other_tokens.meta == tokens.meta
    for name, column in tokens.columns.items():
        assert np.array_equal(other_tokens.columns[name], column), name
    assert dataset_files(other) == dataset_files(plain), "every shard and metadata file the same bytes"


def test_a_plain_run_places_records_by_their_order(plain):
    path, report = plain
    keys = shard_keys(path)
    assert {p.line: p.reason for p in report.problems} == {
        1: "bad_json", 2: "missing_media", 3: "duplicate_id", 4: "unsupported_media", 35: "duplicate_id"}
    # 32 placed records split 19/7/6; records 2 and 4 (the first to train and to val) keep their
    # places: their shards hold a sample fewer
    assert {name: len(shard) for name, shard in keys.items()} == {
        "test-000000.tar": 4, "test-000001.tar": 2, "train-000000.tar": 3, "train-000001.tar": 4,
        "train-000002.tar": 4, "train-000003.tar": 4, "train-000004.tar": 3, "val-000000.tar": 3, "val-000001.tar": 3}
    assert split_keys(path, "val") == keys["val-000000.tar"] + keys["val-000001.tar"]


def test_parts_and_merge_write_the_single_run_dataset(plain, merged, processor):
    same_dataset(plain[0], merged[0], processor)
    same_report(plain[1], merged[1])
    assert merged[1].part is None


def test_parts_and_merge_load_and_plan_as_a_single_run(plain, merged, processor):
    loaded = [load_all(path, 0) for path, _ in (plain, merged)]
    assert sorted(loaded[0]) == sorted(loaded[1]) and len(loaded[0]) == plain[1].split_counts["train"] == 18
    for key, sample in loaded[0].items():
        other = loaded[1][key]
        assert (sample.conversation, sample.images, sample.videos) == (other.conversation, other.images, other.videos)
    config = PackingConfig(seq_length=2048, num_workers=0)
    encoder = QwenVLPackingTaskEncoder(config, processor)
    for split in ("train", "val"):
        digests = []
        for path, _ in (plain, merged):
            measurement, source = measure_dataset(path, encoder, split=split, num_workers=0, progress=False)
            assert source.startswith("measured from facts"), source
            digests.append(plan_split(measurement, path, split, encoder, config).digest)
        assert digests[0] == digests[1]


@pytest.mark.slow
def test_workers_write_the_single_run_dataset(records, plain, processor, tmp_path):
    report = _prepare(records, tmp_path / "w2", processor, workers=2)
    same_dataset(plain[0], tmp_path / "w2", processor)
    same_report(plain[1], report)


def test_more_parts_than_shards_a_rerun_part_and_a_shard_left_empty_via_the_cli(tmp_path, capsys):
    """10 records, 4 per shard, records 4-7 without their media: shard 1 is not written (the split
    lists shards 0 and 2); 5 parts for 2 shards: three parts write none; part 0 runs twice."""
    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
    records = tmp_path / "r.jsonl"
    records.write_text("".join(
        json.dumps({"id": f"r{i}", "messages": chat} if i not in range(4, 8) else
                   {"id": f"r{i}", "messages": [{"role": "user", "content": "<image>Hi"}, chat[1]], "images": ["no.jpg"]})
        + "\n" for i in range(10)))
    args = ["prepare", str(records), "--media-root", str(tmp_path), "--samples-per-shard", "4"]
    assert cli_main([*args, "--out", str(tmp_path / "plain")]) == 0
    assert sorted(p.name for p in (tmp_path / "plain" / "shards").glob("*.tar")) == ["train-000000.tar", "train-000002.tar"]
    for part in (0, 1, 2, 3, 4, 0):
        assert cli_main([*args, "--out", str(tmp_path / "parts"), "--part", f"{part}/5"]) == 0
    out = capsys.readouterr().out
    assert "part 3/5: wrote 2 samples" in out and f"energon-pack merge {tmp_path / 'parts'}" in out
    assert cli_main(["merge", str(tmp_path / "parts")]) == 0
    assert "wrote 6 samples (0 images, 0 videos) in 2 shard(s)" in capsys.readouterr().out
    assert dataset_files(tmp_path / "parts") == dataset_files(tmp_path / "plain")
    assert split_keys(tmp_path / "parts", "train") == ["r0", "r1", "r2", "r3", "r8", "r9"]
