"""prepare's facts sidecar: a plan built from facts equals the measured one (rows, digest), and
stale or missing facts make plan measure and say so."""

from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import pytest

from energon_pack.config import PackingConfig
from energon_pack.data.prepare import prepare_dataset
from energon_pack.data.synthetic import SyntheticSpec, make_records
from energon_pack.identity import processor_fingerprint
from energon_pack.plan.build import measure_dataset, measure_split, plan_split
from energon_pack.plan.facts import Facts, fresh_facts
from energon_pack.runtime.task_encoder import QwenVLPackingTaskEncoder


@pytest.fixture(scope="module")
def facts_dataset(tmp_path_factory, processor):
    """40 synthetic samples (images, videos, a tenth corrupt) prepared with the offline processor's text tokens."""
    root = tmp_path_factory.mktemp("facts")
    spec = SyntheticSpec(max_image_side=640, max_video_seconds=3.0, max_video_side=128, corrupt_fraction=0.1)
    records = make_records(root / "raw", 40, seed=5, spec=spec)
    prepare_dataset(records, root / "raw", root / "ds", split_ratio="3,1,0", samples_per_shard=8, progress=False, processor=processor)
    return root / "ds"


@pytest.mark.parametrize(
    "overrides",
    [dict(seq_length=2048), dict(seq_length=1024, on_overlong="shrink"),
     dict(seq_length=2048, max_row_vision_patches=4000, max_row_media=3),
     dict(seq_length=2048, cost_model="qwen2.5-vl-7b", balance_steps=True)],
)
def test_plan_from_facts_is_the_measured_plan(facts_dataset, processor, overrides):
    config = PackingConfig(num_workers=0, **overrides)
    encoder = QwenVLPackingTaskEncoder(config, processor)
    for split in ("train", "val"):
        measured = measure_split(facts_dataset, encoder, split=split, num_workers=0, progress=False)
        from_facts, source = measure_dataset(facts_dataset, encoder, split=split, num_workers=0, progress=False)
        assert source.startswith("measured from facts"), source
        for name in ("tokens", "vision", "media", "flops"):
            assert np.array_equal(getattr(measured, name), getattr(from_facts, name)), name
        assert measured.skipped == from_facts.skipped
        planned = plan_split(measured, facts_dataset, split, encoder, config)
        assert planned.num_rows > 0
        assert planned.digest == plan_split(from_facts, facts_dataset, split, encoder, config).digest


def test_facts_record_media_and_skips(facts_dataset):
    facts = Facts.load(facts_dataset)
    columns = facts.columns
    assert len(columns["skip"]) == sum(row[1] for row in facts.meta["shards"]) == 40
    assert len(columns["media_offsets"]) == 41 and columns["media_offsets"][-1] == len(columns["kind"])
    assert set(columns["orientation"].tolist()) <= set(range(1, 9))
    assert (columns["frames"][columns["kind"] == 1] > 0).all()


def test_stale_or_other_processor_facts_measure(facts_dataset, processor, processor_qwen3, tmp_path):
    config = PackingConfig(num_workers=0, seq_length=2048)
    assert "no text tokens for this processor" in fresh_facts(facts_dataset, processor_fingerprint(processor_qwen3))
    copy = tmp_path / "ds"
    shutil.copytree(facts_dataset, copy)
    first = Facts.load(copy).meta["shards"][0][0]
    with open(copy / first, "ab") as shard:
        shard.write(b"\0" * 512)
    why = fresh_facts(copy, processor_fingerprint(processor))
    assert why.startswith("facts stale for 1 shard(s), first " + first), why
    encoder = QwenVLPackingTaskEncoder(config, processor)
    _, source = measure_dataset(copy, encoder, num_workers=0, progress=False)
    assert source.startswith("measured by preencoding every sample (facts stale"), source
    _, source = measure_dataset(facts_dataset, encoder, num_workers=0, progress=False, facts=False)
    assert source == "measured by preencoding every sample (--measure)"


@pytest.mark.slow
def test_cli_plan_says_facts_or_measure(facts_dataset, tmp_path):
    (tmp_path / "p.yaml").write_text("seq_length: 2048\nnum_workers: 0\n")
    lines = {}
    for extra in ([], ["--measure"]):
        done = subprocess.run(
            [sys.executable, "-m", "energon_pack.cli", "plan", str(facts_dataset), "--config", str(tmp_path / "p.yaml"),
             "--out", str(tmp_path / f"plan{len(extra)}"), *extra],
            capture_output=True, text=True, check=True,
        )
        lines[len(extra)] = done.stdout
    assert "measured from facts" in lines[0] and "measured by preencoding every sample (--measure)" in lines[1]
    assert lines[0].split("digest ")[1] == lines[1].split("digest ")[1]


def test_inspect_and_simulate_read_facts(facts_dataset, processor):
    from energon_pack.cli.simulate import dataset_mix
    from energon_pack.data.inspect_dataset import prepared_samples, summarize_with_source

    with_facts, source = summarize_with_source(facts_dataset, processor=processor)
    measured, measured_source = summarize_with_source(facts_dataset, processor=processor, facts=False)
    assert source.startswith("measured from facts")
    assert measured_source == "measured by preencoding every sample (--measure)"
    assert with_facts == measured
    assert float(dict((row["metric"], row["value"]) for row in with_facts)["compressed media (MiB)"]) > 0
    samples, source = dataset_mix(str(facts_dataset))
    assert source.startswith("measured from facts")
    reference = [s for s in prepared_samples(facts_dataset, facts=False)[0] if s.reason is None]
    assert [(s.tokens, s.vision_patches, s.images, s.videos) for s in samples] == [
        (s.tokens, s.geometry.vision_patches, s.images, s.videos) for s in reference
    ]
