"""``energon-pack bench --stage balance``: step costs and imbalance from rows' FLOPs, and its options."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from energon_pack.tools.bench_balance import (BalanceBenchOptions, balance_options, rank_floor, step_costs, step_imbalance,
                                              summed_imbalance)


def test_steps_sum_each_ranks_micro_batches_and_compare_the_slowest_to_the_mean() -> None:
    flops = np.array([[1, 2, 3, 4, 9], [3, 2, 1, 4, 9]], dtype=np.float64)  # the 5th row is no whole step
    assert step_costs(flops, 2).tolist() == [[3, 7], [5, 5]]
    assert step_imbalance(flops, 2) == pytest.approx([5 / 4, 7 / 6])
    assert step_imbalance(np.array([[1.0, 1.0], [3.0, 3.0]]), 1) == pytest.approx([1.5, 1.5])


def test_no_order_of_each_ranks_rows_sums_below_the_rank_floor() -> None:
    """The floor is the costliest rank's total over the mean rank's; the summed imbalance of every
    order of each rank's own rows is at least the floor, and an order that makes each rank's steps
    proportional to its total reaches it."""
    flops = np.array([[1, 3, 2, 2], [3, 1, 1, 1], [2, 2, 2, 6]], dtype=np.float64)
    assert rank_floor(flops, 1) == pytest.approx(12 / (26 / 3))  # totals 8, 6, 12
    assert summed_imbalance(flops, 1) == pytest.approx((3 + 3 + 2 + 6) / (26 / 3))
    rng = np.random.default_rng(0)
    for _ in range(200):
        shuffled = np.array([rng.permutation(rank) for rank in flops])
        for micro in (1, 2, 4):
            assert summed_imbalance(shuffled, micro) >= rank_floor(shuffled, micro) - 1e-12
    even = np.array([[1, 1, 1, 1], [2, 2, 2, 2]], dtype=np.float64)
    assert summed_imbalance(even, 2) == pytest.approx(rank_floor(even, 2)) == pytest.approx(4 / 3)


def test_options_come_from_the_command_line() -> None:
    args = argparse.Namespace(dataset=None, seq_length=None, balance_dp=8, balance_micro=4, workers=1, rows=64,
                              window_rows=32, cost_model="qwen2.5-vl-7b")
    assert balance_options(args) == BalanceBenchOptions(dp=8, micro=4, workers=1, rows=64, window_rows=32,
                                                        cost_model="qwen2.5-vl-7b")
