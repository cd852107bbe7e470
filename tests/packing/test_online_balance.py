"""Online balanced steps (energon_pack.packing.online_balance): window layout shared by every rank."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from energon_pack.packing.online_balance import balanced_window_rows, order_window, ramped_window_rows, window_levels
from energon_pack.packing.simulate import (OnlineRows, rank_floor, rank_step_imbalance, reference_mix,
                                          summed_step_imbalance)
from energon_pack.packing.algorithms import RowBudget
from energon_pack.rows.flops import CostModel


def test_docstring_examples() -> None:
    assert balanced_window_rows(64, num_workers=2, micro_batches=4) == 64
    assert balanced_window_rows(5, num_workers=2, micro_batches=4) == 6
    assert window_levels(4, window=0, worker=0, num_workers=1, micro_batches=2, seed=0) in ([0, 3, 1, 2], [1, 2, 0, 3])
    assert order_window([1, 5, 3], [2, 0, 1]) == [0, 1, 2]
    assert [ramped_window_rows(64, w, num_workers=2, micro_batches=2) for w in range(4)] == [8, 64, 64, 64]
    stats = rank_step_imbalance(np.array([[3.0, 1.0], [2.0, 2.0]]), 1)
    assert stats.steps == 2 and stats.mean == pytest.approx((1.2 + 4 / 3) / 2)
    assert summed_step_imbalance(np.array([[1.0, 3.0], [3.0, 1.0]]), 1) == pytest.approx(1.5)
    assert rank_floor(np.array([[1.0, 3.0], [3.0, 1.0]]), 1) == pytest.approx(1.0)
    assert rank_floor(np.array([[1.0, 3.0], [3.0, 1.0]]), 1, window_steps=1) == pytest.approx(1.5)


layouts = dict(
    rows=st.integers(1, 70), window=st.integers(0, 5), num_workers=st.integers(0, 4),
    micro_batches=st.integers(1, 6), seed=st.integers(0, 3),
)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), **layouts)
def test_levels_are_a_permutation_fixed_by_the_layout_alone(data, rows, window, num_workers, micro_batches, seed) -> None:
    worker = data.draw(st.integers(0, max(num_workers, 1) - 1))
    kwargs = dict(window=window, worker=worker, num_workers=num_workers, micro_batches=micro_batches, seed=seed)
    levels = window_levels(rows, **kwargs)
    assert sorted(levels) == list(range(rows))
    assert window_levels(rows, **kwargs) == levels  # no hidden state: every rank computes the same layout
    costs = data.draw(st.lists(st.integers(0, 5), min_size=rows, max_size=rows))
    order = order_window(costs, levels)
    assert sorted(order) == list(range(rows))  # every planned row emitted once
    ranked = sorted(range(rows), key=lambda i: (-costs[i], i))
    assert [ranked.index(i) for i in order] == levels


@settings(max_examples=60, deadline=None)
@given(steps=st.integers(1, 12), micro_batches=st.integers(2, 4), window=st.integers(0, 3))
def test_each_step_pairs_heavy_with_light(steps, micro_batches, window) -> None:
    """One worker, m >= 2: slot 0 of every step holds one of the window's heaviest 1/m rows, the
    last slot one of the lightest 1/m; the step's mean cost rank is the window's middle."""
    rows = steps * micro_batches
    levels = window_levels(rows, window=window, worker=0, num_workers=1, micro_batches=micro_batches, seed=7)
    for step in range(steps):
        mine = levels[step * micro_batches : (step + 1) * micro_batches]
        assert [level // steps for level in mine] == list(range(micro_batches))
    if micro_batches == 2:  # heaviest with lightest: each pair's ranks sum to rows - 1
        assert {levels[2 * s] + levels[2 * s + 1] for s in range(steps)} == {rows - 1}


def test_workers_of_a_rank_fill_the_strata_of_its_steps() -> None:
    """Two workers, two micro-batches: worker 0 fills slot 0 (heavy half), worker 1 slot 1 (light
    half, reversed), so step s holds worker 0's level l and worker 1's level rows - 1 - l."""
    w0 = window_levels(8, window=3, worker=0, num_workers=2, micro_batches=2, seed=1)
    w1 = window_levels(8, window=3, worker=1, num_workers=2, micro_batches=2, seed=1)
    assert [a + b for a, b in zip(w0, w1)] == [7] * 8


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="not a permutation"):
        order_window([1, 2], [0, 0])
    with pytest.raises(ValueError, match="worker=2 is not below num_workers=2"):
        window_levels(4, window=0, worker=2, num_workers=2, micro_batches=1, seed=0)
    with pytest.raises(ValueError, match="requested=0"):
        balanced_window_rows(0, num_workers=1, micro_batches=1)


def test_online_balanced_rows_wait_less_than_todays_on_the_same_rows() -> None:
    """Four ranks of two workers, two micro-batches: the same simulated rows read in planning order
    and laid out in windows; the windows cut the mean step imbalance by more than half."""
    model = CostModel.of("qwen2.5-vl-7b")
    samples = [s for s in reference_mix(3000, seed=1) if s.tokens <= 8192]
    costs = np.array([model.sample(s.tokens, []) + 1e9 * s.vision_patches for s in samples])
    rows = OnlineRows(samples, costs, constant=model.constant(8192), budget=RowBudget(tokens=8192, segments=64),
                      pad_multiple=64, min_fill=0.99, max_wait_rounds=4)
    common = dict(dp=4, workers=2, micro_batches=2, steps=64, seed=0)
    today_costs, balanced_costs = rows.rank_costs(window_rows=None, **common), rows.rank_costs(window_rows=32, **common)
    today, balanced = rank_step_imbalance(today_costs, 2), rank_step_imbalance(balanced_costs, 2)
    assert today.steps == balanced.steps == 64
    assert balanced.mean - 1 < (today.mean - 1) / 2, (today, balanced)
    # A window (32 rows x 2 workers = 32 steps) reorders the same rows: the floor per window is
    # today's, and the layout sums above it.
    floor = rank_floor(balanced_costs, 2, window_steps=32)
    assert floor == pytest.approx(rank_floor(today_costs, 2, window_steps=32), rel=1e-12)
    assert 1.0 <= floor <= summed_step_imbalance(balanced_costs, 2)
    assert 0.9 < rows.fill(8192) <= 1.0


@settings(max_examples=100, deadline=None)
@given(data=st.data(), dp=st.integers(1, 5), micro=st.integers(1, 3), window_steps=st.integers(1, 4),
       windows=st.integers(1, 3))
def test_no_order_within_windows_sums_below_the_rank_floor(data, dp, micro, window_steps, windows) -> None:
    """Any order of each rank's rows within each window keeps the summed imbalance at or above the
    floor (and the floor itself); steps proportional to each rank's window total reach it."""
    size = window_steps * micro
    costs = np.array(data.draw(st.lists(st.lists(st.integers(1, 50), min_size=size * windows, max_size=size * windows),
                                        min_size=dp, max_size=dp)), dtype=np.float64)
    floor = rank_floor(costs, micro, window_steps=window_steps)
    seed = data.draw(st.integers(0, 2**16))
    shuffled = costs.copy()
    for rank in range(dp):
        for window in range(windows):
            part = slice(window * size, (window + 1) * size)
            shuffled[rank, part] = np.random.default_rng(seed + rank).permutation(costs[rank, part])
    assert rank_floor(shuffled, micro, window_steps=window_steps) == pytest.approx(floor)
    assert summed_step_imbalance(shuffled, micro) >= floor - 1e-9
    even = np.repeat(costs.sum(axis=1, keepdims=True), size * windows, axis=1)  # every step alike per rank
    assert summed_step_imbalance(even, micro) == pytest.approx(rank_floor(even, micro, window_steps=window_steps))


@settings(max_examples=100, deadline=None)
@given(requested=st.integers(1, 2000), first=st.integers(1, 64), num_workers=st.integers(0, 8),
       micro_batches=st.integers(1, 8))
def test_the_first_window_is_short_and_every_later_one_full_in_whole_steps(
        requested, first, num_workers, micro_batches) -> None:
    sizes = [ramped_window_rows(requested, w, num_workers=num_workers, micro_batches=micro_batches, first=first)
             for w in range(14)]
    full = balanced_window_rows(requested, num_workers=num_workers, micro_batches=micro_batches)
    assert sizes[1:] == [full] * 13 and min(first, requested) <= sizes[0] <= full
    for size in sizes:  # each window holds whole steps of the rank
        assert size * max(num_workers, 1) % micro_batches == 0 and size <= full
