"""Golden: Megatron-Bridge samples with sound (``ChatMLSample.audio``) read in place give the rows
our own record path gives for the same samples (``energon-pack prepare`` of their records): the
same keys, token ids, labels, positions and audio features, row by row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from energon_pack import PackingConfig, get_packing_loader
from energon_pack.data.prepare import prepare_dataset
from energon_pack.qwen.processor import load_processor
from tests.support.bridge_datasets import AUDIO_YAML, audio_samples, write_bridge_dataset
from tests.support.loader_runs import tensor_digest

# Slow: builds the offline Qwen2.5-Omni processor and decodes audio.
pytestmark = pytest.mark.slow


def _rows(path: Path, processor) -> tuple[list[tuple[list[str], str, int]], dict]:
    """(keys, tensor digest, audio frames) of every row, and the loader's stats."""
    config = PackingConfig(seq_length=256, buffer_size=4, num_workers=0, repeat=False, pixel_dtype="float32")
    with get_packing_loader(path, config, processor) as loader:
        rows = [(row["__keys__"], tensor_digest(row), row["row_cost"].get("audio_frames", 0)) for row in loader]
        return rows, loader.stats()


def test_bridge_audio_rows_equal_our_record_path(tmp_path):
    samples = audio_samples()
    bridge = write_bridge_dataset(tmp_path / "bridge", samples, AUDIO_YAML)
    media = tmp_path / "media"
    media.mkdir()
    for sample in samples:
        for name, data in sample["media"].items():
            (media / name).write_bytes(data)
    records = tmp_path / "records.jsonl"
    records.write_text("".join(json.dumps(sample["record"]) + "\n" for sample in samples))
    report = prepare_dataset(records, media, tmp_path / "ours", progress=False, samples_per_shard=4)
    assert report.written == len(samples) and not report.problems, report.problems

    processor = load_processor(family="qwen2.5-omni", min_pixels=56 * 56, max_pixels=112 * 112)
    ours, our_stats = _rows(tmp_path / "ours", processor)
    theirs, bridge_stats = _rows(bridge, processor)
    assert our_stats["skipped"] == bridge_stats["skipped"] == {}
    assert sorted(key for keys, _, _ in theirs for key in keys) == sorted(sample["__key__"] for sample in samples)
    assert sum(frames for _, _, frames in theirs) == 120 + 90 + 160  # 1.2 s, 0.9 s and 1.6 s at 100 frames a second
    assert theirs == ours
