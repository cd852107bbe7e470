"""``energon-pack bench --stage plan``: synthetic facts, then plan, save, open and read."""

from __future__ import annotations

import numpy as np

from energon_pack.config import PackingConfig
from energon_pack.packing.simulate import reference_mix
from energon_pack.plan.blend import interleave_rows
from energon_pack.tools.bench_plan import PlanBenchOptions, bench_interleave, bench_plan, synthetic_compositions, synthetic_measurement


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
    [(title, rows, columns)] = bench_plan(5000, tmp_path, PlanBenchOptions(seq_length=8192, interleave_rows=0))
    figures = {row["metric"]: row["value"] for row in rows}
    assert "5000 reference-mix samples" in title and columns == ["metric", "value"]
    assert {"plan (s)", "peak RSS (MiB)", "open + first row (s)", "plan file (MiB)"} <= set(figures)
    assert figures["samples planned"] + 0 <= 5000 and float(figures["fill"]) > 0.99
    assert list(tmp_path.iterdir()) == [], "the bench plan file is removed"


def test_the_interleave_table_times_rows_of_two_sources_read_at_their_shares():
    compositions = synthetic_compositions(5000, seq_length=8192, seed=0)
    assert compositions.shape == (5000, 2) and bool((compositions.sum(axis=1) >= int(0.98 * 8192)).all())
    assert (compositions.max(axis=1) >= 9 * compositions.min(axis=1)).all()  # each row mostly one source's
    title, rows, columns = bench_interleave(5000)
    figures = {row["metric"]: row["value"] for row in rows}
    assert "5000 rows of 2 sources" in title and columns == ["metric", "value"] and figures["rows"] == 5000
    assert float(figures["interleave (s)"]) >= 0 and float(figures["worst 64-row window, off the share (points)"]) < 2
    order = interleave_rows(compositions, seed=0)
    assert sorted(order.tolist()) == list(range(5000))
