"""Online balanced steps (energon_pack.packing.online_balance): a sliding layout shared by every rank."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from energon_pack.packing.online_balance import (
    balanced_window_rows,
    level_of,
    pick_rank,
    pool_rows,
    pool_size,
    sliding_order,
    window_levels,
)
from energon_pack.packing.simulate import (OnlineRows, rank_floor, rank_step_imbalance, reference_mix,
                                          summed_step_imbalance)
from energon_pack.packing.algorithms import RowBudget
from energon_pack.rows.flops import CostModel


def test_docstring_examples() -> None:
    assert balanced_window_rows(64, num_workers=2, micro_batches=4) == 64
    assert balanced_window_rows(5, num_workers=2, micro_batches=4) == 6
    assert window_levels(4, window=0, worker=0, num_workers=1, micro_batches=2, seed=0) in ([0, 3, 1, 2], [1, 2, 0, 3])
    assert [pool_rows(64, emitted, ramp=32) for emitted in range(4)] == [1, 33, 64, 64]
    assert [level_of(k, window_rows=4, worker=0, num_workers=1, micro_batches=2, seed=0) for k in range(4)] in (
        [0, 3, 1, 2], [1, 2, 0, 3])
    assert (pick_rank(3, 0, 4), pick_rank(3, 3, 4), pick_rank(3, 2, 3)) == (0, 2, 2)
    assert sliding_order([1, 5, 3, 2], window_rows=4, worker=0, num_workers=1, micro_batches=2, seed=0,
                         ramp=4) == [0, 2, 1, 3]
    assert (pool_size([3, 3, 3], 3, max_samples=7), pool_size([9], 4, max_samples=7), pool_size([], 4)) == (2, 1, 0)
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
    # A full pool (as many rows as the window) picks the level itself.
    assert [pick_rank(rows, level, rows) for level in levels] == levels


@settings(max_examples=150, deadline=None)
@given(costs=st.lists(st.integers(0, 9), max_size=80), window_rows=st.integers(1, 12), ramp=st.integers(1, 40),
       worker=st.integers(0, 1), seed=st.integers(0, 3))
def test_the_sliding_order_emits_every_row_once_from_a_bounded_pool(costs, window_rows, ramp, worker, seed) -> None:
    window_rows = balanced_window_rows(window_rows, num_workers=2, micro_batches=2)
    kwargs = dict(window_rows=window_rows, worker=worker, num_workers=2, micro_batches=2, seed=seed, ramp=ramp)
    order = sliding_order(costs, **kwargs)
    assert sorted(order) == list(range(len(costs)))  # every planned row emitted once
    assert sliding_order(costs, **kwargs) == order  # no hidden state: every rank computes the same layout
    for emitted, row in enumerate(order):  # row k comes from the first pool_rows(k) rows not yet emitted
        assert row < emitted + pool_rows(window_rows, emitted, ramp=ramp)
    assert not order or order[0] == 0  # the first row waits for one planned row
    # A sample cap: with room for every row it changes nothing; with room for one, rows come in planning order.
    samples = [1 + cost % 4 for cost in costs]
    assert sliding_order(costs, **kwargs, samples=samples, max_samples=10**6) == order
    assert sliding_order(costs, **kwargs, samples=samples, max_samples=1) == list(range(len(costs)))
    capped = sliding_order(costs, **kwargs, samples=samples, max_samples=6)
    assert sorted(capped) == list(range(len(costs)))
    for emitted, row in enumerate(capped):  # the pool is the longest prefix of the rows left within 6 samples
        left = [i for i in range(len(costs)) if i not in capped[:emitted]]
        size = pool_size([samples[i] for i in left], pool_rows(window_rows, emitted, ramp=ramp), max_samples=6)
        assert row in left[:size]
    # With every row in the pool, row k is the pool's row at level k's quantile.
    if len(costs) >= window_rows:
        steady = sliding_order(costs[:window_rows], **{**kwargs, "ramp": window_rows})
        levels = window_levels(window_rows, window=0, worker=worker, num_workers=2, micro_batches=2, seed=seed)
        pool, ranked = list(range(window_rows)), []
        for emitted, row in enumerate(steady[1:], start=1):
            pool.remove(steady[emitted - 1])
            by_cost = sorted(pool, key=lambda i: (-costs[i], i))
            ranked.append(by_cost.index(row) == pick_rank(len(pool), levels[emitted], window_rows))
        assert all(ranked)


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
    with pytest.raises(ValueError, match=r"level=4 must be in \[0, window_rows=4\) and pool=3 >= 1"):
        pick_rank(3, 4, 4)
    with pytest.raises(ValueError, match="pool=0"):
        pick_rank(0, 0, 4)
    with pytest.raises(ValueError, match="ramp=0 must be >= 1"):
        pool_rows(4, 0, ramp=0)
    with pytest.raises(ValueError, match="worker=2 is not below num_workers=2"):
        window_levels(4, window=0, worker=2, num_workers=2, micro_batches=1, seed=0)
    with pytest.raises(ValueError, match="requested=0"):
        balanced_window_rows(0, num_workers=1, micro_batches=1)


def test_online_balanced_rows_wait_less_than_todays_on_the_same_rows() -> None:
    """Four ranks of two workers, two micro-batches: the same simulated rows read in planning order
    and in the sliding layout; the layout cuts the mean step imbalance by more than half."""
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
    # No order sums below the floor of the rows it emitted.
    assert 1.0 <= rank_floor(balanced_costs, 2, window_steps=32) <= summed_step_imbalance(balanced_costs, 2)
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
@given(window_rows=st.integers(1, 2000), ramp=st.integers(1, 64))
def test_the_pool_starts_at_one_row_and_fills_by_the_ramp(window_rows, ramp) -> None:
    sizes = [pool_rows(window_rows, emitted, ramp=ramp) for emitted in range(window_rows + 2)]
    assert sizes[0] == 1 and sizes[-1] == window_rows
    assert all(0 <= b - a <= ramp for a, b in zip(sizes, sizes[1:]))
