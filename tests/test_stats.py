"""Per-worker packing statistics: counting, saving/restoring, aggregation."""

from __future__ import annotations

import pickle

from energon_pack.stats import (
    FILL_BINS,
    PackingStats,
    aggregate_stats,
    fill,
    peak_rss_bytes,
    worker_telemetry,
)


def test_counting_rows_skips_and_histogram():
    stats = PackingStats(worker_id=1)
    stats.count_row(4096, 4096, 3)
    stats.count_row(2048, 4096, 1, flush=True)
    stats.count_skip("corrupt_image")
    stats.count_skip("corrupt_image")
    stats.count_skip("overlong")
    assert (stats.rows, stats.samples_packed, stats.real_tokens, stats.row_slots) == (2, 4, 6144, 8192)
    assert (stats.flush_rows, stats.flush_real_tokens) == (1, 2048)
    assert stats.skipped == {"corrupt_image": 2, "overlong": 1}
    assert stats.fill_histogram[FILL_BINS - 1] == 1 and stats.fill_histogram[FILL_BINS // 2] == 1
    assert sum(stats.fill_histogram) == stats.rows


def test_state_round_trip_is_exact_and_picklable():
    stats = PackingStats(worker_id=0)
    stats.count_row(100, 128, 2)
    stats.count_skip("overlong")
    state = pickle.loads(pickle.dumps(stats.save_state()))
    restored = PackingStats()
    restored.restore_state(state)
    assert restored == stats
    restored.count_skip("overlong")
    assert stats.skipped == {"overlong": 1}, "restored counters must not alias the saved ones"
    restored.restore_state(None)
    assert restored.rows == 0 and restored.skipped == {}


def test_aggregate_sums_workers_and_separates_the_flush():
    a, b = PackingStats(worker_id=0), PackingStats(worker_id=1)
    a.count_row(1000, 1000, 2)
    a.count_row(500, 1000, 1, flush=True)
    b.count_row(900, 1000, 3)
    b.count_skip("corrupt_video")
    a.samples_in, b.samples_in = 3, 4
    total = aggregate_stats([a.snapshot(), b.snapshot()])
    assert total["workers"] == 2 and total["rows"] == 3 and total["samples_in"] == 7
    assert total["skipped"] == {"corrupt_video": 1} and total["skipped_total"] == 1
    assert total["fill"] == fill(2400, 3000) == 0.8
    assert total["fill_before_flush"] == 1900 / 2000
    assert aggregate_stats([])["fill"] == 0.0


def test_telemetry_measures_rss_and_buffers():
    telemetry = worker_telemetry([100, 300], pending_samples=1)
    assert telemetry["buffered_samples"] == 2 and telemetry["buffered_bytes"] == 400
    assert telemetry["pending_samples"] == 1
    assert telemetry["peak_rss_bytes"] >= 10 * 2**20 and peak_rss_bytes() >= telemetry["peak_rss_bytes"]
