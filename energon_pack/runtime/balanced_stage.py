"""The packing stage with balanced steps and no plan: rows emitted at cost quantiles every rank shares.

``balance_steps: true`` without a plan (with ``micro_batches_per_step`` and ``cost_model``): each
worker's round planner makes ready bins as the plain stage's does (groups chosen from headers,
nothing decoded), and each bin is costed (modelled FLOPs of the row it will be, from token counts
and media grids) when its round makes it ready. The worker's *pool* is the first
:func:`~energon_pack.packing.online_balance.pool_rows` of its ready bins, in planning order: one
bin for the first row, ``ramp`` more per row emitted, then ``N`` (``balance_window_rows``), at
most ``max_samples`` samples (:func:`~energon_pack.packing.online_balance.pool_size`). Its
``k``-th row is the pool's bin at the cost quantile of
:func:`~energon_pack.packing.online_balance.level_of` ``k``
(:func:`~energon_pack.packing.online_balance.pick_rank`); then it is decoded, packed and yielded
as the plain stage does, and the next round tops the pool up. Rows are the plain stage's rows in
:func:`~energon_pack.packing.online_balance.sliding_order`. No rank or worker talks to another: the
layout depends on the seed, the row index, the worker index, the worker count and the step size.

Windows of references: once a bin is costed its samples are *parked* (the buffer keeps their
restore keys only) and read again by key when the bin's row is next, so a worker holds the plain
stage's pending samples plus the row it emits, whatever ``N``. The first row waits for one bin,
not a window; while the pool fills, each row waits for ``ramp`` bins' headers.

State: the plain stage's fields (the pool's bins are the planner's ready bins and their samples
the buffered restore keys) plus ``_window``: the cost of every ready bin and the planned rows' cost
sums for ``loader.stats()``; the layout's row index is the rows the worker emitted, which the plain
stage's statistics count and save already. A restored worker reads no sample at the restore:
it parks every buffered one, read when a round costs its bin (pending ones) and when its row
comes. A ``_window`` of the release before (windows laid out whole: ``windows``, ``left``)
restores: its bins join the pool (those of its current window costed again from their headers),
the same rows in this release's order. See ``docs/balanced_steps.md``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from energon_pack.config import PackingConfig
from energon_pack.packing.algorithms import PackItem
from energon_pack.packing.online_balance import (
    POOL_RAMP,
    POOL_SAMPLES,
    balanced_window_rows,
    level_of,
    pick_rank,
    pool_rows,
    pool_size,
)
from energon_pack.packing.planner import is_count
from energon_pack.rows.encoded import PreparedSample
from energon_pack.runtime.packing_stage import PendingGroupPackingDataset, packing_state_problems

__all__ = ["BalancedPackingDataset", "OnlineBalance", "balance_report", "balanced_state_problems", "online_balance",
           "window_state_problems"]

_WINDOW_KEYS = ("rows", "flops_sum", "flops_sq_sum", "window_max_over_mean")
#: A ``_window`` saved by the release before, which laid windows out whole: windows formed, rows
#: of the current window not yet taken (the first ``left`` ready bins, uncosted).
_OLD_WINDOW_KEYS = ("windows", "left", "rows", "flops_sum", "flops_sq_sum", "window_max_over_mean")
#: ``[first arrival index, cost]`` of each ready bin (a state of the releases before lacks some or
#: all: those bins are read again to cost them).
_COSTS_KEY = "costs"


@dataclass(frozen=True, kw_only=True)
class OnlineBalance:
    """What a worker needs to lay out its rows: rows per window (``balance_window_rows``: the
    pool's size and the levels' window), the step size (``micro_batches_per_step``), the loader
    seed, the planned cost of a bin (``bin_cost(samples) -> FLOPs``, from headers) and the rows
    planned per row emitted while the pool fills (``ramp``)."""

    window_rows: int
    micro_batches: int
    seed: int
    bin_cost: Callable[[list[PreparedSample]], int]
    ramp: int = POOL_RAMP
    max_samples: int = POOL_SAMPLES


def window_state_problems(state: Any, *, ready: int) -> list[str]:
    """What is wrong with a saved ``_window`` (``ready``: the saved planner's ready bins); [] when sound.
    A ``_window`` of the release before (``windows``, ``left``) is checked as it was.

    Example: ``{"windows": 1, "left": 5, ...}`` with 3 ready bins ->
    ``["_window: left=5 rows of the current window, but only 3 ready bins are saved"]``.
    """
    if not isinstance(state, Mapping):
        return [f"_window is not a saved window state (keys {list(_WINDOW_KEYS)})"]
    keys = _OLD_WINDOW_KEYS if "windows" in state else _WINDOW_KEYS
    if any(key not in state for key in keys):
        return [f"_window is not a saved window state (keys {list(_WINDOW_KEYS)})"]
    bad = [key for key in keys if key != "window_max_over_mean" and not is_count(state[key])]
    if bad:
        return [f"_window: {key}={state[key]!r} is not a non-negative integer" for key in bad]
    if "left" in keys and state["left"] > ready:
        return [f"_window: left={state['left']} rows of the current window, but only {ready} ready bins are saved"]
    costs = state.get(_COSTS_KEY, [])
    if not isinstance(costs, list) or not all(
            isinstance(pair, (list, tuple)) and len(pair) == 2 and all(map(is_count, pair)) for pair in costs):
        return [f"_window: {_COSTS_KEY}={costs!r} is not a list of [first arrival index, cost] pairs of counts"]
    return []


def balanced_state_problems(state: Any) -> list[str]:
    """What is wrong with a saved balanced-stage state: the plain stage's checks, then ``_window``
    against the planner's ready bins ([] when consistent)."""
    problems = packing_state_problems(state)
    if problems:
        return problems
    if "_window" not in state:
        return ["fields ['_window'] are missing"]
    return window_state_problems(state["_window"], ready=len(state["_plan"]["ready"]))


def online_balance(config: PackingConfig, bin_cost: Callable[[list[PreparedSample]], int]) -> OnlineBalance | None:
    """The window layout of an online loader with ``balance_steps`` (None without it, or in mode
    in_batch); a ValueError with the fix when ``micro_batches_per_step`` is missing.

    Example: ``balance_steps=True, micro_batches_per_step=2`` -> ``OnlineBalance(window_rows=256, micro_batches=2, ...)``.
    """
    policy = config.policy
    if not policy.balance_steps or policy.mode != "online":
        return None
    micro = config.trainer.micro_batches_per_step
    if micro is None:
        raise ValueError(
            "balance_steps=True without a plan needs micro_batches_per_step: the online loader lays out each "
            "worker's rows in steps of dp x micro_batches_per_step; fix: set micro_batches_per_step (global batch / "
            "(micro-batch 1 x DP); Megatron-Bridge's PackingDatasetProvider sets it), or set balance_steps: false"
        )
    return OnlineBalance(window_rows=policy.balance_window_rows, micro_batches=micro, seed=config.loader.seed,
                         bin_cost=bin_cost)


def balance_report(snapshots: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """``loader.stats()`` figures of balanced rows over workers' snapshots: planned rows' cost
    mean and CV (``balanced_row_flops``) and the largest max/mean cost of a worker's pool at its
    latest row (``balanced_window_max_over_mean``); {} when no worker balances.

    Example: one worker, rows 2, flops_sum 6, flops_sq_sum 20, window 1.33 ->
    ``{"balanced_row_flops": {"rows": 2, "mean": 3.0, "cv": 0.333...}, "balanced_window_max_over_mean": 1.33}``.
    """
    states = [s["balance"] for s in snapshots if isinstance(s.get("balance"), Mapping)]
    if not states:
        return {}
    rows = sum(s["rows"] for s in states)
    total = sum(s["flops_sum"] for s in states)
    squares = sum(s["flops_sq_sum"] for s in states)
    mean = total / rows if rows else 0.0
    variance = max(0.0, squares / rows - mean * mean) if rows else 0.0
    return {
        "balanced_row_flops": {"rows": rows, "mean": mean, "cv": math.sqrt(variance) / mean if mean else 0.0},
        "balanced_window_max_over_mean": max(s["window_max_over_mean"] for s in states),
    }


class BalancedPackingDataset(PendingGroupPackingDataset):
    """:class:`PendingGroupPackingDataset` emitting its rows at shared cost quantiles (module docstring)."""

    _savable_fields = (*PendingGroupPackingDataset._savable_fields, "_window")
    _shallow_fields = (*PendingGroupPackingDataset._shallow_fields, "_window")

    def __init__(self, dataset: Any, *, balance: OnlineBalance, **kwargs: Any) -> None:
        #: Window size, step size, seed, bin cost and ramp of the layout.
        self.balance = balance
        super().__init__(dataset, **kwargs)

    def reset_state_own(self) -> None:
        super().reset_state_own()
        self._rows = self._flops_sum = self._flops_sq_sum = 0
        self._window_max_over_mean = 0.0
        self._costs: dict[int, int] = {}  # cost of each ready bin, by its first arrival index

    @property
    def _window(self) -> dict[str, Any]:
        """The layout state as plain data (a savable field)."""
        return {**self._figures(), _COSTS_KEY: [[index, cost] for index, cost in self._costs.items()]}

    def _figures(self) -> dict[str, Any]:
        """The planned rows' cost figures (``_window`` without the ready bins' costs)."""
        return {"rows": self._rows, "flops_sum": self._flops_sum,
                "flops_sq_sum": self._flops_sq_sum, "window_max_over_mean": self._window_max_over_mean}

    @_window.setter
    def _window(self, state: dict[str, Any]) -> None:
        # A state of the release before also holds ``windows`` and ``left``: the row index it needs
        # is the rows emitted (``_stats.rows``), so they are not needed.
        self._rows, self._flops_sum, self._flops_sq_sum = state["rows"], state["flops_sum"], state["flops_sq_sum"]
        self._window_max_over_mean = state["window_max_over_mean"]
        self._costs = {index: cost for index, cost in state.get(_COSTS_KEY, [])}

    def window_rows(self) -> int:
        """Rows of a window (``balance_window_rows``, in whole steps: :func:`balanced_window_rows`)."""
        return balanced_window_rows(self.balance.window_rows, num_workers=self.worker_config.num_workers,
                                    micro_batches=self.balance.micro_batches)

    def _run_round(self) -> None:
        """A round; each bin it makes ready is costed from its samples' headers and its samples
        parked (only restore keys held) until the bin's row is next."""
        ready = len(self._planner.ready)
        super()._run_round()
        for group in self._planner.ready[ready:]:
            self._cost_of(group)
            for item in group:
                self._samples.park(item.index)

    def _parked_at_restore(self) -> dict[int, int]:
        """A restored worker leaves every buffered sample parked: the planner needs only its items
        (lengths and budgets); a ready bin's samples are read when its row is next, a pending (or
        new) sample when the round that makes its bin ready costs it. (An uninterrupted worker
        holds its pending samples: ``buffered_bytes`` differs, the rows do not.)"""
        planner = self._planner
        items = [*planner.new, *planner.pending, *(item for group in planner.ready for item in group)]
        return {item.index: item.length for item in items}

    def _cost_of(self, group: list[PackItem]) -> int:
        """The planned cost of a ready bin: the one computed when it became ready, else (a bin of a
        state of the releases before) computed now from its samples' headers (parked ones read again)."""
        cost = self._costs.get(group[0].index)
        if cost is None:
            cost = self._costs[group[0].index] = self.balance.bin_cost([self._samples.peek(i.index) for i in group])
            self._rows += 1
            self._flops_sum += cost
            self._flops_sq_sum += cost * cost
        return cost

    def _next_bin(self) -> list[PackItem] | None:
        """The pool's bin at the next row's cost quantile; None, so that the stage reads one more
        round first, while the pool is short of :func:`pool_rows` and more bins can come."""
        planner = self._planner
        window_rows = self.window_rows()
        # The layout's row index: rows emitted (a bin that lost a sample at decode emits none, and
        # the next bin takes its level, so the worker stays aligned with the other ranks' workers).
        emitted = self._stats.rows
        rows = pool_rows(window_rows, emitted, ramp=self.balance.ramp)
        size = pool_size([len(group) for group in planner.ready[:rows]], rows, max_samples=self.balance.max_samples)
        if size == len(planner.ready) < rows and not (planner.exhausted and not planner.new and not planner.pending):
            return None  # the pool could hold more: plan a round
        if not size:
            return None
        pool = [self._cost_of(group) for group in planner.ready[:size]]
        level = level_of(emitted, window_rows=window_rows, worker=self.worker_config.rank_worker_id(),
                         num_workers=self.worker_config.num_workers, micro_batches=self.balance.micro_batches,
                         seed=self.balance.seed)
        index = sorted(range(size), key=lambda i: (-pool[i], i))[pick_rank(size, level, window_rows)]
        total = sum(pool)
        self._window_max_over_mean = max(pool) * size / total if total else 0.0
        group = planner.ready.pop(index)
        del self._costs[group[0].index]
        return group

    def _measure_telemetry(self) -> dict[str, Any]:
        # The layout's figures, not the ready bins' costs (state, not telemetry: a list as long as the pool).
        return {**super()._measure_telemetry(), "balance": self._figures()}
