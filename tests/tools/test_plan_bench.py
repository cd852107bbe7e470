"""``energon-pack bench --stage plan``: synthetic facts, then plan, save, open and read."""

from __future__ import annotations

import numpy as np

from energon_pack.config import PackingConfig
from energon_pack.packing.simulate import reference_mix
from energon_pack.tools.bench_plan import PlanBenchOptions, bench_plan, synthetic_measurement


def test_synthetic_facts_are_the_reference_mix_with_overlong_samples_skipped():
    config = PackingConfig(seq_length=4096)
    measurement = synthetic_measurement(3000, config)
    mix = reference_mix(3000)
    fits = np.array([-(-s.tokens // config.pad_multiple) * config.pad_multiple <= 4096 for s in mix])
    assert measurement.skipped["overlong"] == int((~fits).sum()) > 0
    assert measurement.tokens[fits].tolist() == [s.tokens for s, ok in zip(mix, fits) if ok]
    assert measurement.vision[fits].tolist() == [s.vision_patches for s, ok in zip(mix, fits) if ok]
    assert measurement.media[fits].tolist() == [s.media for s, ok in zip(mix, fits) if ok]
    assert measurement.samples_in == 3000


def test_bench_plan_reports_plan_memory_and_open_figures(tmp_path):
    [(title, rows, columns)] = bench_plan(5000, tmp_path, PlanBenchOptions(seq_length=8192))
    figures = {row["metric"]: row["value"] for row in rows}
    assert "5000 reference-mix samples" in title and columns == ["metric", "value"]
    assert {"plan (s)", "peak RSS (MiB)", "open + first row (s)", "plan file (MiB)"} <= set(figures)
    assert figures["samples planned"] + 0 <= 5000 and float(figures["fill"]) > 0.99
    assert list(tmp_path.iterdir()) == [], "the bench plan file is removed"
