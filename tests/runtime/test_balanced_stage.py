"""The balanced packing stage (online balanced steps) on an in-memory source: the plain stage's
rows in the window layout, exact resume from every row boundary, its window state checked."""

from __future__ import annotations

import pytest
from megatron.energon.worker import WorkerConfig

from energon_pack.config import PackingConfig, PackingPolicy, RowLayout
from energon_pack.packing.online_balance import order_window, window_levels
from energon_pack.runtime.balanced_stage import (
    BalancedPackingDataset,
    OnlineBalance,
    balance_report,
    balanced_state_problems,
    online_balance,
)
from energon_pack.runtime.packing_stage import PendingGroupPackingDataset
from tests.support.stage_source import ListSource, row_builders, take

#: Token lengths (W = 32): several windows of 4 rows, pending groups, a flush and a short last window.
LENGTHS = [20, 9, 7, 30, 3, 12, 16, 5, 25, 8, 11, 2, 14, 6, 19, 4, 13, 10, 22, 1, 17, 15, 9, 18,
           27, 6, 3, 21, 11, 8, 24, 2, 16, 13, 5, 29, 7, 12, 18, 9]
ROW = RowLayout(seq_length=32)
POLICY = PackingPolicy(buffer_size=4, max_wait_rounds=2, min_fill=0.95)
MICRO = 2


def cost(samples) -> int:
    """A row's cost: the squares of its samples' lengths (attention-like; long samples are heavy)."""
    return sum(sample.num_tokens ** 2 for sample in samples)


def make_stage(cls=BalancedPackingDataset, *, undecodable: frozenset[str] = frozenset(), window_rows: int = 4):
    worker_config = WorkerConfig(rank=0, world_size=1, num_workers=0)
    source = ListSource(LENGTHS, worker_config=worker_config)
    extra = {} if cls is PendingGroupPackingDataset else {
        "balance": OnlineBalance(window_rows=window_rows, micro_batches=MICRO, seed=3, bin_cost=cost)}
    return cls(source, row=ROW, policy=POLICY, **row_builders(undecodable), worker_config=worker_config, **extra)


def test_rows_are_the_plain_stages_in_the_window_layout() -> None:
    plain, _ = take(make_stage(PendingGroupPackingDataset))
    balanced, state = take(make_stage())
    plain_rows = [keys for keys, _ in plain]
    assert sorted(map(tuple, plain_rows)) == sorted(tuple(keys) for keys, _ in balanced)  # the same rows
    length = dict(zip((f"s{i}" for i in range(len(LENGTHS))), LENGTHS))
    expected = []
    for window, start in enumerate(range(0, len(plain_rows), 4)):
        rows = plain_rows[start : start + 4]
        levels = window_levels(len(rows), window=window, worker=0, num_workers=0, micro_batches=MICRO, seed=3)
        costs = [sum(length[key] ** 2 for key in keys) for keys in rows]
        expected += [rows[i] for i in order_window(costs, levels)]
    assert [keys for keys, _ in balanced] == expected
    assert expected != plain_rows
    assert state["_window"]["windows"] == -(-len(plain_rows) // 4) and state["_window"]["left"] == 0
    report = balance_report([stats for _, stats in balanced[-1:]])
    assert report["balanced_row_flops"]["rows"] == len(plain_rows)
    assert report["balanced_row_flops"]["mean"] == pytest.approx(
        sum(sum(length[k] ** 2 for k in keys) for keys in plain_rows) / len(plain_rows))
    assert report["balanced_window_max_over_mean"] >= 1.0


@pytest.mark.parametrize("undecodable", [frozenset(), frozenset({"s2", "s9"})], ids=["clean", "decode-failures"])
def test_restore_from_every_row_boundary_continues_identically(undecodable) -> None:
    reference, _ = take(make_stage(undecodable=undecodable))
    for saved_after in range(len(reference) + 1):
        _, state = take(make_stage(undecodable=undecodable), saved_after)
        assert balanced_state_problems(state) == []
        resumed = make_stage(undecodable=undecodable)
        resumed.restore_state(state)
        continuation, _ = take(resumed)
        assert continuation == reference[saved_after:], f"saved after row {saved_after}"


def test_a_damaged_window_state_is_named() -> None:
    _, state = take(make_stage(), 3)
    assert state["_window"]["left"] > 0
    broken = {**state, "_window": {**state["_window"], "left": 99}}
    assert balanced_state_problems(broken) == [
        f"_window: left=99 rows of the current window, but only {len(state['_plan']['ready'])} ready bins are saved"]
    assert balanced_state_problems({**state, "_window": {"windows": -1}})[0].startswith("_window is not a saved")
    missing = {key: value for key, value in state.items() if key != "_window"}
    assert balanced_state_problems(missing) == ["fields ['_window'] are missing"]


def test_balance_steps_without_a_plan_needs_the_step_size() -> None:
    config = PackingConfig(seq_length=1024, balance_steps=True, cost_model="qwen2.5-vl-7b")
    with pytest.raises(ValueError, match="needs micro_batches_per_step.*fix: set micro_batches_per_step"):
        online_balance(config, cost)
    assert online_balance(PackingConfig(seq_length=1024, cost_model="qwen2.5-vl-7b"), cost) is None
    layout = online_balance(PackingConfig(seq_length=1024, balance_steps=True, cost_model="qwen2.5-vl-7b",
                                          micro_batches_per_step=4, balance_window_rows=32, seed=5), cost)
    assert (layout.window_rows, layout.micro_batches, layout.seed) == (32, 4, 5)
