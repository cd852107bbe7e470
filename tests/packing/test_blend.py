"""The pure blend chooser: deficits keep every source within about one sample of its share,
schedules, the step of a worker's row, and the epoch weights of a finite blend."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from energon_pack.config.blend import BlendPoint
from energon_pack.packing.blend import ShareTracker, epoch_weights, rank_row_step, scheduled_weights, shares


@settings(max_examples=60, deadline=None)
@given(
    weights=st.lists(st.floats(min_value=0.05, max_value=10), min_size=2, max_size=4),
    lengths=st.lists(st.lists(st.integers(1, 3000), min_size=1, max_size=5), min_size=4, max_size=4),
)
def test_every_prefix_keeps_each_source_within_one_sample_of_its_share(weights, lengths):
    tracker = ShareTracker.of(len(weights))
    drawn = [0] * len(weights)
    biggest = max(max(per_source) for per_source in lengths)
    for draw in range(400):
        source = tracker.choose(weights, [True] * len(weights))
        units = lengths[source][draw % len(lengths[source])]
        tracker.count(source, units, weights)
        drawn[source] += units
        total = sum(drawn)
        for i, share in enumerate(shares(weights)):
            assert abs(drawn[i] - share * total) <= 2 * biggest + 1e-6


def test_a_source_of_weight_zero_or_spent_is_never_drawn():
    tracker = ShareTracker.of(3)
    picks = {tracker.choose([1, 0, 1], [True, True, False]) for _ in range(3)}
    assert picks == {0}
    with pytest.raises(ValueError, match="no blend source can be drawn"):
        tracker.choose([0, 1], [True, False])


def test_taking_back_a_sample_restores_the_deficits():
    tracker = ShareTracker.of(2)
    tracker.count(0, 500, [1, 1])
    before = tracker.state()
    tracker.count(1, 300, [1, 1])
    tracker.uncount(1, 300, [1, 1])
    assert tracker.state()["drawn"] == before["drawn"] and tracker.state()["due"] == pytest.approx(before["due"])
    assert ShareTracker.from_state(tracker.state()) == tracker


SCHEDULE = (BlendPoint(step=0, weights=(9, 1)), BlendPoint(step=100, weights=(1, 9)))


@pytest.mark.parametrize("step, mode, expected", [
    (0, "step", (0.9, 0.1)), (99, "step", (0.9, 0.1)), (100, "step", (0.1, 0.9)), (5000, "step", (0.1, 0.9)),
    (50, "linear", (0.5, 0.5)), (25, "linear", (0.7, 0.3)), (150, "linear", (0.1, 0.9)),
])
def test_scheduled_weights(step, mode, expected):
    assert scheduled_weights(SCHEDULE, step, mode=mode) == pytest.approx(expected)


def test_a_rows_step_follows_energons_worker_order():
    # Two workers, two micro-batches a step: rank rows 0,1 (worker 0 row 0, worker 1 row 0) are step 0.
    assert [rank_row_step(r, worker=w, num_workers=2, micro_batches_per_step=2) for r in range(3) for w in range(2)] == [0, 0, 1, 1, 2, 2]
    assert rank_row_step(5, worker=0, num_workers=0, micro_batches_per_step=1) == 5  # in-process loading


def test_epoch_weights_spend_every_source_at_about_the_same_time():
    tracker = ShareTracker(drawn=[2000.0, 20000.0], due=[0.0, 0.0], samples=[10, 10])
    assert epoch_weights([100, 100], tracker) == pytest.approx([18000.0, 180000.0])
    fresh = ShareTracker.of(2)
    assert epoch_weights([30, 10], fresh) == pytest.approx([30.0, 10.0])  # no units yet: by samples left
    spent = ShareTracker(drawn=[100.0, 100.0], due=[0.0, 0.0], samples=[40, 1])
    assert epoch_weights([30, 10], spent)[0] > 0  # a source past its estimate keeps one sample's weight
