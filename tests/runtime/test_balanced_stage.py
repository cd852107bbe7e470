"""The balanced packing stage (online balanced steps) on an in-memory source: the plain stage's
rows in the sliding layout, exact resume from every row boundary, its window state checked."""

from __future__ import annotations

import copy
import pickle

import pytest
from megatron.energon.worker import WorkerConfig

from energon_pack.config import PackingConfig, PackingPolicy, RowLayout
from energon_pack.packing.online_balance import POOL_RAMP, POOL_SAMPLES, balanced_window_rows, sliding_order
from energon_pack.runtime.balanced_stage import (
    BalancedPackingDataset,
    OnlineBalance,
    balance_report,
    balanced_state_problems,
    online_balance,
)
from energon_pack.runtime.packing_stage import ParkedSample, PendingGroupPackingDataset
from tests.support.stage_source import ListSource, row_builders, take

#: Token lengths (W = 32): several windows of 4 rows, pending groups, a flush and a pool that drains.
LENGTHS = [20, 9, 7, 30, 3, 12, 16, 5, 25, 8, 11, 2, 14, 6, 19, 4, 13, 10, 22, 1, 17, 15, 9, 18,
           27, 6, 3, 21, 11, 8, 24, 2, 16, 13, 5, 29, 7, 12, 18, 9]
ROW = RowLayout(seq_length=32)
POLICY = PackingPolicy(buffer_size=4, max_wait_rounds=2, min_fill=0.95)
MICRO = 2


def cost(samples) -> int:
    """A row's cost: the squares of its samples' lengths (attention-like; long samples are heavy)."""
    return sum(sample.num_tokens ** 2 for sample in samples)


def make_stage(cls=BalancedPackingDataset, *, undecodable: frozenset[str] = frozenset(), window_rows: int = 4,
               ramp: int = POOL_RAMP, max_samples: int = POOL_SAMPLES):
    worker_config = WorkerConfig(rank=0, world_size=1, num_workers=0)
    source = ListSource(LENGTHS, worker_config=worker_config)
    extra = {} if cls is PendingGroupPackingDataset else {
        "balance": OnlineBalance(window_rows=window_rows, micro_batches=MICRO, seed=3, bin_cost=cost, ramp=ramp,
                                 max_samples=max_samples)}
    return cls(source, row=ROW, policy=POLICY, **row_builders(undecodable), worker_config=worker_config, **extra)


@pytest.mark.parametrize(("window_rows", "ramp", "max_samples"), [(4, POOL_RAMP, POOL_SAMPLES), (8, 2, POOL_SAMPLES),
                                                                  (5, 1, POOL_SAMPLES), (8, 4, 7)],
                         ids=["windows-of-4", "windows-of-8-ramp-2", "windows-of-6-ramp-1", "pool-of-7-samples"])
def test_rows_are_the_plain_stages_in_the_sliding_layout(window_rows, ramp, max_samples) -> None:
    plain, _ = take(make_stage(PendingGroupPackingDataset))
    balanced, state = take(make_stage(window_rows=window_rows, ramp=ramp, max_samples=max_samples))
    plain_rows = [keys for keys, _ in plain]
    length = dict(zip((f"s{i}" for i in range(len(LENGTHS))), LENGTHS))
    costs = [sum(length[key] ** 2 for key in keys) for keys in plain_rows]
    order = sliding_order(costs, window_rows=balanced_window_rows(window_rows, num_workers=0, micro_batches=MICRO),
                          worker=0, num_workers=0, micro_batches=MICRO, seed=3, ramp=ramp,
                          samples=[len(keys) for keys in plain_rows], max_samples=max_samples)
    assert [keys for keys, _ in balanced] == [plain_rows[i] for i in order]
    assert order != sorted(order)
    assert state["_stats"]["rows"] == len(plain_rows) and state["_window"]["costs"] == []
    report = balance_report([stats for _, stats in balanced[-1:]])
    assert report["balanced_row_flops"]["rows"] == len(plain_rows)
    assert report["balanced_row_flops"]["mean"] == pytest.approx(sum(costs) / len(plain_rows))
    assert report["balanced_window_max_over_mean"] >= 1.0


@pytest.mark.parametrize("max_samples", [POOL_SAMPLES, 7], ids=["pool-of-rows", "pool-of-7-samples"])
@pytest.mark.parametrize("undecodable", [frozenset(), frozenset({"s2", "s9"})], ids=["clean", "decode-failures"])
def test_restore_from_every_row_boundary_continues_identically(undecodable, max_samples) -> None:
    reference, _ = take(make_stage(undecodable=undecodable, window_rows=8, ramp=2, max_samples=max_samples))
    for saved_after in range(len(reference) + 1):
        _, state = take(make_stage(undecodable=undecodable, window_rows=8, ramp=2, max_samples=max_samples), saved_after)
        assert balanced_state_problems(state) == []
        resumed = make_stage(undecodable=undecodable, window_rows=8, ramp=2, max_samples=max_samples)
        resumed.restore_state(state)
        continuation, _ = take(resumed)
        assert continuation == reference[saved_after:], f"saved after row {saved_after}"


def held(stage) -> dict[int, bool]:
    """Per buffered arrival index: whether the stage holds the sample's data (False: parked)."""
    return {index: not isinstance(sample, ParkedSample) for index, sample in stage._samples._samples.items()}


def test_pool_rows_hold_restore_keys_only_and_are_read_when_their_row_comes() -> None:
    stage = make_stage(window_rows=8, ramp=2)
    rows, state = take(stage, 5)
    ready = {item[0] for group in state["_plan"]["ready"] for item in group}
    assert ready and held(stage) == {index: index not in ready for index in held(stage)}  # pending/new held
    # Every emitted sample was parked in the pool and read once more for its row; plain reads none again.
    assert stage._samples.reads == {"restore": 0, "parked": sum(len(keys) for keys, _ in rows)}
    plain = make_stage(PendingGroupPackingDataset)
    take(plain)
    assert plain._samples.reads == {"restore": 0, "parked": 0}


def last_release_window(state: dict, left: int, *, costed: bool) -> dict:
    """``state`` with its ``_window`` as the release before saved it (windows laid out whole): 2
    windows formed, ``left`` rows of the current one (the first ready bins, uncosted), the costs of
    the bins waiting for the next window (``costed``) or none (the release before that)."""
    window = {key: state["_window"][key] for key in ("rows", "flops_sum", "flops_sq_sum", "window_max_over_mean")}
    firsts = [group[0][0] for group in state["_plan"]["ready"]]
    costs = [pair for pair in state["_window"]["costs"] if pair[0] in firsts[left:]] if costed else []
    return {**state, "_window": {"windows": 2, "left": left, **window, **({"costs": costs} if costed else {})}}


@pytest.mark.parametrize("saved_after", [1, 2, 6])
def test_a_restore_reads_pending_samples_only_and_a_state_of_the_last_release_restores(saved_after) -> None:
    reference, _ = take(make_stage(window_rows=8, ramp=2))
    _, state = take(make_stage(window_rows=8, ramp=2), saved_after)
    # Every ready bin (the pool and the bins planned ahead of it) was costed when it became ready.
    assert sorted(index for index, _ in state["_window"]["costs"]) == sorted(
        group[0][0] for group in state["_plan"]["ready"])
    waiting = len(state["_plan"]["new"]) + len(state["_plan"]["pending"])
    assert not state["_plan"]["new"]  # saved between rounds
    resumed = make_stage(window_rows=8, ramp=2)
    resumed.restore_state(copy.deepcopy(state))  # a stage takes over the state's containers
    continuation, _ = take(resumed)
    assert continuation == reference[saved_after:]
    # Nothing read at the restore: the pool's samples when their rows come, the pending ones when
    # a round costs their bins (and again for their rows).
    assert resumed._samples.reads == {"restore": 0,
                                      "parked": sum(len(keys) for keys, _ in continuation) + waiting}
    # A state of the releases before: the same rows follow (every sample once), in this release's order.
    left = min(2, len(state["_plan"]["ready"]))
    for costed in (True, False):
        old = last_release_window(state, left, costed=costed)
        assert balanced_state_problems(old) == []
        resumed = make_stage(window_rows=8, ramp=2)
        resumed.restore_state(copy.deepcopy(old))
        continuation, _ = take(resumed)
        assert sorted(keys for keys, _ in continuation) == sorted(keys for keys, _ in reference[saved_after:])
        assert resumed._samples.reads["restore"] == 0
    _, plain_state = take(make_stage(PendingGroupPackingDataset), saved_after)
    buffered = len(plain_state["_samples"]["_restore_keys"])
    plain = make_stage(PendingGroupPackingDataset)
    plain.restore_state(plain_state)
    take(plain)
    assert plain._samples.reads == {"restore": buffered, "parked": 0}


def test_a_damaged_window_state_is_named() -> None:
    _, state = take(make_stage(), 3)
    assert state["_plan"]["ready"]
    rows = {**state, "_window": {**state["_window"], "rows": -1}}
    assert balanced_state_problems(rows) == ["_window: rows=-1 is not a non-negative integer"]
    old = last_release_window(state, 1, costed=True)
    broken = {**old, "_window": {**old["_window"], "left": 99}}
    assert balanced_state_problems(broken) == [
        f"_window: left=99 rows of the current window, but only {len(state['_plan']['ready'])} ready bins are saved"]
    assert balanced_state_problems({**state, "_window": {"windows": -1}})[0].startswith("_window is not a saved")
    costs = {**state, "_window": {**state["_window"], "costs": [[1, -2]]}}
    assert balanced_state_problems(costs) == [
        "_window: costs=[[1, -2]] is not a list of [first arrival index, cost] pairs of counts"]
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


@pytest.mark.parametrize("cls", [PendingGroupPackingDataset, BalancedPackingDataset])
def test_a_saved_state_is_energons_own_and_shares_nothing_mutable_with_the_stage(cls) -> None:
    from megatron.energon.wrappers.base import BaseWrapperDataset

    stage = make_stage(cls, window_rows=8, ramp=2)
    stage.worker_config.worker_activate(0)
    try:
        iterator = iter(stage)
        for _ in range(4):
            next(iterator)
        ours, energons = stage.save_state(), BaseWrapperDataset.save_state(stage)  # Energon: deep copies
        assert ours == energons and ours["_plan"]["ready"]
        frozen = pickle.dumps(ours)
        for _ in range(4):  # the stage goes on: the saved state must not change with it
            next(iterator)
        assert pickle.dumps(ours) == frozen
    finally:
        stage.worker_config.worker_deactivate()
