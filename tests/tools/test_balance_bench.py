"""``energon-pack bench --stage balance``: step costs and imbalance from rows' FLOPs, and its options."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from energon_pack.tools.bench_balance import BalanceBenchOptions, balance_options, step_costs, step_imbalance
from energon_pack.tools.realistic_mix import RealisticMix, clip_durations


def test_steps_sum_each_ranks_micro_batches_and_compare_the_slowest_to_the_mean() -> None:
    flops = np.array([[1, 2, 3, 4, 9], [3, 2, 1, 4, 9]], dtype=np.float64)  # the 5th row is no whole step
    assert step_costs(flops, 2).tolist() == [[3, 7], [5, 5]]
    assert step_imbalance(flops, 2) == pytest.approx([5 / 4, 7 / 6])
    assert step_imbalance(np.array([[1.0, 1.0], [3.0, 3.0]]), 1) == pytest.approx([1.5, 1.5])


def test_options_come_from_the_command_line() -> None:
    args = argparse.Namespace(dataset=None, seq_length=None, balance_dp=8, balance_micro=4, workers=1, rows=64,
                              window_rows=32, cost_model="qwen2.5-vl-7b")
    assert balance_options(args) == BalanceBenchOptions(
        dataset=None, seq_length=1024, dp=8, micro=4, workers=1, rows=64, window_rows=32, cost_model="qwen2.5-vl-7b"
    )


def test_the_realistic_mix_reads_rows_of_32k_tokens_unless_told() -> None:
    args = argparse.Namespace(dataset=None, seq_length=None, balance_dp=4, balance_micro=2, workers=2, rows=64,
                              window_rows=256, cost_model="qwen2.5-vl-3b", media="realistic", photos=8, clips=2,
                              mix_scale=0.1)
    options = balance_options(args)
    assert options.seq_length == 32768
    assert options.realistic == RealisticMix(photos=8, clip_seconds=clip_durations(2)).scaled(0.1)
    assert balance_options(argparse.Namespace(**{**vars(args), "seq_length": 8192})).seq_length == 8192
