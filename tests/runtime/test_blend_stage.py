"""Where a sample came from in a blend, and the per-source counters workers keep and the loader sums."""

from __future__ import annotations

from energon_pack.loader import blend_share_warning, blend_sources
from energon_pack.runtime.blend_stage import blend_source, segment_source
from energon_pack.runtime.stats import PackingStats, aggregate_stats


def test_blend_source_reads_energons_and_our_blend_keys():
    assert blend_source(("MapDataset", 7, "BlendDataset", 1, "Webdataset", "shard-0.tar", 3)) == 1
    assert blend_source(("ShareBlendDataset", 2, "MapDataset", 0, "Webdataset", "s.tar", 9)) == 2
    assert blend_source(("Webdataset", "shard-0.tar", 3)) is None
    assert blend_source(()) is None


def test_segment_source_reads_blends_and_a_validation_concatenation_else_0():
    assert segment_source(("MapDataset", 7, "BlendDataset", 1, "Webdataset", "shard-0.tar", 3)) == 1
    assert segment_source(("MapDataset", 0, "ConcatDataset", 2, "Webdataset", "s.tar", 9)) == 2
    assert blend_source(("ConcatDataset", 2, "Webdataset", "s.tar", 9)) is None  # not a blend: no blend counters
    assert segment_source(("Webdataset", "shard-0.tar", 3)) == 0
    assert segment_source(None) == 0


def test_source_counters_are_saved_only_inside_a_blend_and_summed_over_workers():
    plain = PackingStats()
    plain.count_skip("corrupt_image")
    assert "sources" not in plain.save_state() and "sources" not in plain.snapshot()
    a, b = PackingStats(worker_id=0), PackingStats(worker_id=1)
    a.count_source_sample(0, real_tokens=200, supervised_tokens=120)
    b.count_source_sample(0, real_tokens=300, supervised_tokens=100)
    b.count_source_sample(1, real_tokens=2000, supervised_tokens=200)
    b.count_skip("corrupt_image", source=1)
    restored = PackingStats()
    restored.restore_state(b.save_state())
    assert restored.sources == b.sources
    total = aggregate_stats([a.snapshot(), b.snapshot()])["sources"]
    assert total == {0: {"samples": 2, "real_tokens": 500, "supervised_tokens": 220, "skipped": 0},
                     1: {"samples": 1, "real_tokens": 2000, "supervised_tokens": 200, "skipped": 1}}


ENTRIES = [{"index": 0, "path": "/d/short", "subflavors": {}, "weight": 0.5, "repetitions": None},
           {"index": 1, "path": "/d/long", "subflavors": {}, "weight": 0.5, "repetitions": None}]


def test_sources_report_shares_and_a_sample_blend_far_from_its_weights_is_named():
    counters = {0: {"samples": 10, "real_tokens": 2000, "supervised_tokens": 1200, "skipped": 0},
                1: {"samples": 10, "real_tokens": 20000, "supervised_tokens": 2000, "skipped": 1}}
    rows = blend_sources(ENTRIES, counters)
    assert rows[0]["samples_share"] == 0.5 and abs(rows[0]["real_tokens_share"] - 2000 / 22000) < 1e-12
    message = blend_share_warning(rows)
    assert "blend entry 0 (/d/short)" in message and "blend_unit: tokens" in message
    even = {0: {**counters[0], "real_tokens": 10000}, 1: counters[1]}
    assert blend_share_warning(blend_sources(ENTRIES, even)) is None
    assert blend_sources(ENTRIES, {})[0]["real_tokens_share"] is None


def test_a_supervised_blend_stops_on_a_source_without_supervised_tokens():
    import pytest

    from energon_pack.runtime.blend_stage import MAX_UNSUPERVISED_RUN, ShareBlendDataset, UnsupervisedSourceError

    class Sample:
        skip_reason = None

    blend = object.__new__(ShareBlendDataset)  # the check alone: no Energon sources needed
    blend.unit, blend.names, blend._unsupervised_run = "supervised_tokens", ["blend entry 1 (/d/captions)"], [0]
    for _ in range(MAX_UNSUPERVISED_RUN - 1):
        blend._check_supervised(0, Sample(), 0)
    blend._check_supervised(0, Sample(), 5)  # one supervised sample resets the run
    with pytest.raises(UnsupervisedSourceError, match=r"blend entry 1 \(/d/captions\).*fix: use blend_unit: tokens"):
        for _ in range(MAX_UNSUPERVISED_RUN):
            blend._check_supervised(0, Sample(), 0)
