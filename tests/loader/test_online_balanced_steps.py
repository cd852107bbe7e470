"""Balanced steps without a plan, on real online loaders (two worker processes per rank): four
ranks' steps from the rows' own ``row_cost["flops"]``, and exact resume at a step boundary."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from energon_pack.config import PackingConfig
from energon_pack.data.synthetic import SyntheticSpec, make_synthetic_dataset
from energon_pack.identity import ResumeMismatchError
from energon_pack.loader import get_packing_loader
from energon_pack.packing.online_balance import sliding_order
from energon_pack.tools.bench_balance import rank_row_flops, step_imbalance
from tests.support.loader_runs import EAGER, row_digest

# Slow: real Energon loaders with worker processes.
pytestmark = pytest.mark.slow

#: Qwen2.5-VL-3B: its vision tower is the 7B's, its text half as wide, so media weigh more in a row.
MODEL = "qwen2.5-vl-3b"
MICRO = 2


def make_config(balance: bool, **overrides: Any) -> PackingConfig:
    values = {"seq_length": 1024, "num_workers": 2, "repeat": True, "cost_model": MODEL, "balance_steps": balance,
              "micro_batches_per_step": MICRO, "balance_window_rows": 8, **overrides}
    return PackingConfig(**values)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    spec = SyntheticSpec(max_image_side=768, max_video_seconds=2.0, max_video_side=96)
    return make_synthetic_dataset(tmp_path_factory.mktemp("online_balance"), 160, seed=5, spec=spec,
                                  samples_per_shard=20).out_dir


def test_four_ranks_wait_less_with_balanced_steps(dataset, processor) -> None:
    """DP4 x 2 micro-batches, two workers per rank, windows of 8 rows: the slowest rank's excess
    over the mean rank drops by more than 30 % against today's order (windows this small leave
    most of the rest, see docs/balanced_steps.md), and each worker's rows are its rows of today in
    the sliding layout (``sliding_order``), worker processes and all."""
    today, today_stats = rank_row_flops(dataset, make_config(False), processor, dp=4, rows=48)
    balanced, stats = rank_row_flops(dataset, make_config(True), processor, dp=4, rows=32)
    before, after = step_imbalance(today[:, :32], MICRO).mean(), step_imbalance(balanced, MICRO).mean()
    assert after - 1 < (before - 1) * 0.7, (before, after)
    for rank in range(4):
        for worker in range(2):
            plain = today[rank, worker::2]  # 24 rows: the 16 emitted and the pool's 8 ahead of them
            order = sliding_order(plain.tolist(), window_rows=8, worker=worker, num_workers=2, micro_batches=MICRO,
                                  seed=make_config(True).loader.seed)
            assert balanced[rank, worker::2].tolist() == plain[order][:16].tolist(), (rank, worker)
    report = stats[0]["balanced_row_flops"]
    assert report["rows"] >= 16 and report["cv"] > 0.01
    assert report["mean"] == pytest.approx(balanced[0].mean(), rel=0.1)
    assert stats[0]["balanced_window_max_over_mean"] > 1.0
    assert "balanced_row_flops" not in today_stats[0]


def test_resume_at_a_step_boundary_is_exact_and_mid_step_is_refused(dataset, processor) -> None:
    """Two ranks x two workers: states saved after 3 steps restore to the same next 20 rows per
    rank (40 rows byte-identical); a save in the middle of a step is refused, another step size too
    (and continues under allow_inexact_resume)."""
    states, reference = [], []
    for rank in range(2):
        loader = get_packing_loader(dataset, make_config(True), processor, rank=rank, world_size=2, **EAGER)
        iterator = iter(loader)
        for _ in range(3 * MICRO):
            next(iterator)
        states.append(pickle.loads(pickle.dumps(loader.save_state_rank())))
        reference.append([row_digest(next(iterator)) for _ in range(20)])
        next(iterator)  # 27 rows: in the middle of step 14
        with pytest.raises(ValueError, match="in the middle of a step.*fix: save at a step boundary"):
            loader.save_state_rank()
        loader.close()
    for rank in range(2):
        resumed = get_packing_loader(dataset, make_config(True), processor, rank=rank, world_size=2, **EAGER)
        resumed.restore_state_rank(states[rank])
        iterator = iter(resumed)
        assert [row_digest(next(iterator)) for _ in range(20)] == reference[rank], f"rank {rank}"
        resumed.close()
    other = get_packing_loader(dataset, make_config(True, micro_batches_per_step=4), processor, rank=0, world_size=2)
    with pytest.raises(ResumeMismatchError, match="micro_batches_per_step"):
        other.restore_state_rank(states[0])
    other.close()
    inexact = make_config(True, micro_batches_per_step=4, allow_inexact_resume=True)
    with get_packing_loader(dataset, inexact, processor, rank=0, world_size=2) as loader:
        loader.restore_state_rank(states[0])  # continues: the saved pool, laid out for steps of 4
        iterator = iter(loader)
        assert len([next(iterator) for _ in range(8)]) == 8


def test_a_train_loader_balancing_steps_needs_the_step_size(dataset, processor) -> None:
    with pytest.raises(ValueError, match="needs micro_batches_per_step.*fix: set micro_batches_per_step"):
        get_packing_loader(dataset, make_config(True, micro_batches_per_step=None), processor)
