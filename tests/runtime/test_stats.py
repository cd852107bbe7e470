"""Per-worker packing statistics: counting, saving/restoring, aggregation."""

from __future__ import annotations

import pickle
import time

import pytest

from energon_pack.runtime.stats import (
    FILL_BINS,
    PackingStats,
    aggregate_stats,
    fill,
    latest_snapshots,
    peak_rss_bytes,
    progress,
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


def _snapshot(samples_in: int, rows: int, skips: int) -> dict:
    return {**PackingStats(samples_in=samples_in, rows=rows, skipped={"x": skips} if skips else {}).snapshot()}


def test_latest_snapshot_per_worker_is_the_most_advanced():
    carried = {0: _snapshot(8, 2, 0), 1: _snapshot(3, 1, 0)}
    published = {0: _snapshot(6, 1, 0), 1: _snapshot(3, 1, 1), 2: _snapshot(1, 0, 1)}
    latest = latest_snapshots(carried, published)
    assert latest[0] is carried[0] and latest[1] is published[1] and latest[2] is published[2]
    assert progress(carried[0]) == (8, 2, 0)


@pytest.mark.slow
def test_workers_publish_statistics_at_most_every_few_seconds(synthetic_dataset, processor, monkeypatch):
    """With a clock that never advances, a worker writes its file only when its stream starts and
    ends, yet the loader's statistics count every sample."""
    from energon_pack.config import PackingConfig
    from energon_pack.loader import get_packing_loader
    from energon_pack.runtime import packing_stage as wrapper

    writes = []
    monkeypatch.setattr(wrapper.time, "monotonic", lambda: 1000.0)
    publish = wrapper.publish_snapshot

    def recording_publish(directory, snapshot):
        writes.append(dict(snapshot))
        publish(directory, snapshot)

    monkeypatch.setattr(wrapper, "publish_snapshot", recording_publish)
    config = PackingConfig(seq_length=4096, buffer_size=4, num_workers=0, repeat=False)
    loader = get_packing_loader(synthetic_dataset.out_dir, config, processor)
    rows = list(loader)
    assert len(rows) > 2 and len(writes) == 2
    assert writes[-1]["samples_in"] == synthetic_dataset.written == loader.stats()["samples_in"]
    assert loader.stats()["family"] == "qwen2.5-vl"  # the processor's family, as the fingerprint has it


def test_fill_before_flush_is_not_applicable_when_every_row_is_flushed():
    flushed = PackingStats(worker_id=0)
    flushed.count_row(500, 1000, 2, flush=True)
    flushed.count_row(300, 1000, 1, flush=True)
    total = aggregate_stats([flushed.snapshot()])
    assert total["fill"] == 0.4
    assert total["fill_before_flush"] is None, "no row was selected before the flush: not applicable, not 0.0"
    assert aggregate_stats([])["fill_before_flush"] is None


def test_fill_histogram_has_labelled_bucket_edges():
    stats = PackingStats(worker_id=0)
    for real_tokens in (1000, 999, 500, 549, 0):
        stats.count_row(real_tokens, 1000, 1)
    total = aggregate_stats([stats.snapshot()])
    edges, counts = total["fill_histogram_edges"], total["fill_histogram"]
    assert len(edges) == len(counts) + 1 and edges[0] == 0.0 and edges[-1] == 1.0
    assert edges == sorted(edges) and edges[10] == 0.5 and edges[11] == 0.55
    by_bucket = {(edges[i], edges[i + 1]): n for i, n in enumerate(counts) if n}
    assert by_bucket == {(0.0, 0.05): 1, (0.5, 0.55): 2, (0.95, 1.0): 2}


def test_stage_times_accumulate_per_stage_and_reach_the_telemetry():
    from energon_pack.core.stage_times import stage_seconds, timed

    before = stage_seconds().get("test stage", 0.0)
    for _ in range(2):
        with timed("test stage"):
            sum(range(1000))
    assert stage_seconds()["test stage"] > before
    assert worker_telemetry([], pending_samples=0)["stage_seconds"]["test stage"] == stage_seconds()["test stage"]


def test_stage_times_add_up_to_the_active_time_and_start_afresh():
    from energon_pack.core import stage_times

    stage_times.start_epoch()
    with stage_times.timed("decode"):
        time.sleep(0.02)
    with stage_times.suspended():  # the consumer's time: in no stage
        time.sleep(0.05)
    seconds, active = stage_times.stage_seconds(), stage_times.worker_seconds()
    assert seconds["decode"] >= 0.02 and active["wall"] < 0.05
    assert abs(sum(seconds.values()) - active["wall"]) < 1e-3
    stage_times.start_epoch()
    assert set(stage_times.stage_seconds()) == {"other"} and stage_times.stage_seconds()["other"] < 0.01


@pytest.mark.slow
def test_stage_seconds_of_an_in_process_epoch_add_up_to_its_wall_time_less_the_consumer(synthetic_dataset, processor):
    from energon_pack.config import PackingConfig
    from energon_pack.core.stage_times import stage_seconds
    from energon_pack.loader import get_packing_loader

    loader = get_packing_loader(synthetic_dataset.out_dir, PackingConfig(seq_length=4096, num_workers=0, repeat=False),
                                processor)
    consumer = 0.0
    start = time.perf_counter()
    for _ in loader:
        before = time.perf_counter()
        time.sleep(0.01)
        consumer += time.perf_counter() - before
    wall = time.perf_counter() - start - consumer
    total = sum(stage_seconds().values())
    assert 0.95 * wall <= total <= wall, (total, wall, consumer)
    loader.close()
