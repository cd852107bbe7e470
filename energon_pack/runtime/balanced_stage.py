"""The packing stage with balanced steps and no plan: rows emitted in cost windows every rank shares.

``balance_steps: true`` without a plan (with ``micro_batches_per_step`` and ``cost_model``): each
worker lets the round planner make ``N`` ready bins (a *window*: groups chosen from headers,
nothing decoded), and reorders the window with
:func:`~energon_pack.packing.online_balance.window_levels` /
:func:`~energon_pack.packing.online_balance.order_window` by each bin's cost (modelled FLOPs of
the row it will be, from token counts and media grids); then it emits the window's bins one by
one as the plain stage does (decode, pack, yield). While it emits, it reads a round whenever
fewer than the next window's ``N`` bins are ready, so the next window fills as the current one
empties (no burst of planning between windows). Rounds select bins from pending and new samples
only, so the rows are the plain stage's rows, in another order. No rank or worker talks to
another: the layout depends on the seed, window index, worker index, worker count and step size only.

Windows of references: a bin is costed when its round makes it ready, then its samples are
*parked* (the buffer keeps their restore keys only) and read again by key when the bin's row is
next, so a worker holds the plain stage's pending samples plus the row it emits, whatever ``N``.
The first window has ``first_window_rows`` rows and every later one ``N``
(:func:`~energon_pack.packing.online_balance.ramped_window_rows`), so the first row waits for a
few rows' headers, not a whole window's.

State: the plain stage's fields (the window's bins are the planner's ready bins, already in
emission order, and their samples the buffered restore keys) plus ``_window``: windows formed,
rows of the current window not yet taken, the planned rows' cost sums for ``loader.stats()``,
and the costs of ready bins waiting for a window. A restored worker re-reads its pending and new
samples only; window rows are read when they come. See ``docs/balanced_steps.md``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from energon_pack.config import PackingConfig
from energon_pack.packing.algorithms import PackItem
from energon_pack.packing.online_balance import FIRST_WINDOW_ROWS, order_window, ramped_window_rows, window_levels
from energon_pack.packing.planner import is_count
from energon_pack.rows.encoded import PreparedSample
from energon_pack.runtime.packing_stage import PendingGroupPackingDataset, packing_state_problems

__all__ = ["BalancedPackingDataset", "OnlineBalance", "balance_report", "balanced_state_problems", "online_balance",
           "window_state_problems"]

_WINDOW_KEYS = ("windows", "left", "rows", "flops_sum", "flops_sq_sum", "window_max_over_mean")
#: Saved since windows hold no samples: ``[first arrival index, cost]`` of each ready bin that
#: waits for a window (a state of the release before lacks it: those bins are read again to cost them).
_COSTS_KEY = "costs"


@dataclass(frozen=True, kw_only=True)
class OnlineBalance:
    """What a worker needs to lay out its windows: rows per window (``balance_window_rows``), the
    step size (``micro_batches_per_step``), the loader seed, the planned cost of a bin
    (``bin_cost(samples) -> FLOPs``, from headers) and the rows of the first window (every later
    window has ``window_rows``)."""

    window_rows: int
    micro_batches: int
    seed: int
    bin_cost: Callable[[list[PreparedSample]], int]
    first_window_rows: int = FIRST_WINDOW_ROWS


def window_state_problems(state: Any, *, ready: int) -> list[str]:
    """What is wrong with a saved ``_window`` (``ready``: the saved planner's ready bins); [] when sound.

    Example: ``{"windows": 1, "left": 5, ...}`` with 3 ready bins ->
    ``["_window: left=5 rows of the current window, but only 3 ready bins are saved"]``.
    """
    if not isinstance(state, Mapping) or any(key not in state for key in _WINDOW_KEYS):
        return [f"_window is not a saved window state (keys {list(_WINDOW_KEYS)})"]
    bad = [key for key in _WINDOW_KEYS[:5] if not is_count(state[key])]
    if bad:
        return [f"_window: {key}={state[key]!r} is not a non-negative integer" for key in bad]
    if state["left"] > ready:
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
    """``loader.stats()`` figures of balanced windows over workers' snapshots: planned rows' cost
    mean and CV (``balanced_row_flops``) and the largest max/mean cost of a worker's latest window
    (``balanced_window_max_over_mean``); {} when no worker balances.

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
    """:class:`PendingGroupPackingDataset` emitting its rows in cost windows (module docstring)."""

    _savable_fields = (*PendingGroupPackingDataset._savable_fields, "_window")

    def __init__(self, dataset: Any, *, balance: OnlineBalance, **kwargs: Any) -> None:
        #: Window size, step size, seed and bin cost of the layout.
        self.balance = balance
        super().__init__(dataset, **kwargs)

    def reset_state_own(self) -> None:
        super().reset_state_own()
        self._windows = 0  # windows formed so far
        self._left = 0  # rows of the current window not yet taken
        self._rows = self._flops_sum = self._flops_sq_sum = 0
        self._window_max_over_mean = 0.0
        self._costs: dict[int, int] = {}  # cost of each ready bin not yet in a window, by its first arrival index

    @property
    def _window(self) -> dict[str, Any]:
        """The window state as plain data (a savable field)."""
        return {"windows": self._windows, "left": self._left, "rows": self._rows, "flops_sum": self._flops_sum,
                "flops_sq_sum": self._flops_sq_sum, "window_max_over_mean": self._window_max_over_mean,
                _COSTS_KEY: [[index, cost] for index, cost in self._costs.items()]}

    @_window.setter
    def _window(self, state: dict[str, Any]) -> None:
        self._windows, self._left = state["windows"], state["left"]
        self._rows, self._flops_sum, self._flops_sq_sum = state["rows"], state["flops_sum"], state["flops_sq_sum"]
        self._window_max_over_mean = state["window_max_over_mean"]
        self._costs = {index: cost for index, cost in state.get(_COSTS_KEY, [])}

    def window_rows(self, window: int) -> int:
        """Rows of this worker's window number ``window``: ``first_window_rows`` for the first,
        ``balance_window_rows`` for every later one, in whole steps (:func:`ramped_window_rows`)."""
        return ramped_window_rows(self.balance.window_rows, window, num_workers=self.worker_config.num_workers,
                                  micro_batches=self.balance.micro_batches, first=self.balance.first_window_rows)

    def _run_round(self) -> None:
        """A round; each bin it makes ready is costed from its samples' headers and its samples
        parked (only restore keys held) until the bin's row is next."""
        ready = len(self._planner.ready)
        super()._run_round()
        for group in self._planner.ready[ready:]:
            self._costs[group[0].index] = self._bin_cost(group)
            for item in group:
                self._samples.park(item.index)

    def _parked_at_restore(self) -> dict[int, int]:
        """A restored worker leaves its ready bins' samples parked: they are read when their row is next."""
        return {item.index: item.length for group in self._planner.ready for item in group}

    def _bin_cost(self, group: list[PackItem]) -> int:
        """The planned cost of a bin, from its samples' headers (parked ones are read again)."""
        return self.balance.bin_cost([self._samples.peek(item.index) for item in group])

    def _window_cost(self, group: list[PackItem]) -> int:
        """The cost of a ready bin entering a window: the one computed when it became ready (a state
        of the release before saved none: its samples are read again to cost it)."""
        cost = self._costs.pop(group[0].index, None)
        return self._bin_cost(group) if cost is None else cost

    def _next_bin(self) -> list[PackItem] | None:
        """The next bin of the current window (a new window when it is spent); None, so that the
        stage reads one more round first, while fewer than a window's bins are ready: the next
        window is planned a round at a time while this one is emitted, not in one burst."""
        planner = self._planner
        if not planner.exhausted and len(planner.ready) < self.window_rows(self._windows):
            return None
        if self._left == 0 and not self._form_window():
            return None
        self._left -= 1
        return self._planner.take_bin()

    def _form_window(self) -> bool:
        """Reorder the first ``N`` ready bins into their emission order (fewer at the end of a
        finite stream, once nothing is new or pending); False when no window can be formed yet."""
        planner = self._planner
        size = self.window_rows(self._windows)
        if len(planner.ready) < size:
            if not (planner.exhausted and not planner.new and not planner.pending and planner.ready):
                return False
            size = len(planner.ready)
        window = planner.ready[:size]
        costs = [self._window_cost(group) for group in window]
        levels = window_levels(size, window=self._windows, worker=self.worker_config.rank_worker_id(),
                               num_workers=self.worker_config.num_workers, micro_batches=self.balance.micro_batches,
                               seed=self.balance.seed)
        planner.ready[:size] = [window[i] for i in order_window(costs, levels)]
        self._windows += 1
        self._left = size
        self._rows += size
        self._flops_sum += sum(costs)
        self._flops_sq_sum += sum(cost * cost for cost in costs)
        self._window_max_over_mean = max(costs) * size / sum(costs) if sum(costs) else 0.0
        return True

    def _measure_telemetry(self) -> dict[str, Any]:
        # The window's figures, not the costs of the bins waiting for a window (state, not telemetry:
        # a list as long as a window, and absent while a state of the last release is re-costed).
        figures = {key: value for key, value in self._window.items() if key != _COSTS_KEY}
        return {**super()._measure_telemetry(), "balance": figures}
