"""The round planner: what the packing stage does between reading a sample and emitting a row.

Pure and savable (no Energon, no torch): it sees samples only as `PackItem`s (arrival index,
aligned length, arrival round, vision patches, media) and decides

1. when a round runs: once the new samples fill its :class:`RoundSize` (``buffer_size``
   samples, or ``buffer_tokens`` aligned slots), or, after the source ended, on what is left
   (a *flush* round, which emits everything);
2. what a round does (:func:`select_bins` over pending + new items): full or forced bins
   become *ready*, the rest stays *pending*;
3. which ready bin is emitted next, and whether the members of a bin that lost a sample at
   decode time may go back to pending (only while none would wait past ``max_wait_rounds``).

The packing stage (``runtime/packing_stage.py``) drives it with real samples and the simulator
(``packing/simulate.py``) with token lengths, with the same loop, so the fill the simulator
reports is the fill the loader gets. ``state()`` / ``restore()`` save and set it as plain lists and ints.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from energon_pack.packing.algorithms import PackItem, RoundResult, RoundSize, RowBudget, select_bins

__all__ = ["PlannedRound", "RoundPlanner", "is_count", "item_state", "plan_state_problems", "planned_indices"]

_PLAN_KEYS = ("new", "pending", "ready", "round_index", "next_index", "exhausted")
_ITEM_FIELDS = len(dataclasses.fields(PackItem))


def item_state(item: PackItem) -> tuple[int, ...]:
    """An item as the state holds it: its fields in order, ``audio`` left out when 0 (so the states
    of data without sound are those written before audio was counted, and those still restore).

    Example: ``PackItem(7, 512, 2, 64, 1)`` -> ``(7, 512, 2, 64, 1)``; with ``audio=300`` -> ``(7, 512, 2, 64, 1, 300)``.
    """
    # Fields by hand, not dataclasses.astuple (a recursive deep copy): a balanced worker saves
    # thousands of items at every per-row checkpoint.
    values = (item.index, item.length, item.arrival_round, item.vision, item.media)
    return (*values, item.audio) if item.audio else values


def is_count(value: Any) -> bool:
    """A non-negative int that is not a bool. Example: ``is_count(3)`` -> True; ``is_count(-1)`` -> False."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def planned_indices(state: Mapping[str, Any]) -> list[int]:
    """Arrival indices of every item in a planner state (new, pending, then ready bins).

    Example: ``{"new": [(3, 8, 1, 0, 0)], "pending": [(1, 4, 0, 0, 0)], "ready": [[(0, 9, 0, 0, 0)]], ...}``
    -> ``[3, 1, 0]``.
    """
    items = [*state["new"], *state["pending"], *(item for group in state["ready"] for item in group)]
    return [item[0] for item in items]


def plan_state_problems(state: Any) -> list[str]:
    """What is wrong with a saved planner state (``RoundPlanner.state()``); [] when consistent.

    Checks the keys, the counters, the item tuples (index below ``next_index``, arrival round
    at most ``round_index``, no index twice) and that no ready bin is empty.
    Example: ``pending`` holding ``(7, 10, 0, 0, 0)`` with ``next_index`` 3 ->
    ``["item 7 has an arrival index at or above next_index=3"]``.
    """
    if not isinstance(state, Mapping):
        return [f"the planner state is a {type(state).__name__}, not a mapping"]
    missing = [key for key in _PLAN_KEYS if key not in state]
    if missing:
        return [f"the planner state lacks {missing}"]
    problems = [f"{key}={state[key]!r} is not a non-negative integer" for key in ("round_index", "next_index")
                if not is_count(state[key])]
    if not isinstance(state["exhausted"], bool):
        problems.append(f"exhausted={state['exhausted']!r} is not a boolean")
    ready = state["ready"]
    if not all(isinstance(state[key], list) for key in ("new", "pending", "ready")) or not all(
        isinstance(group, list) and group for group in ready
    ):
        return problems + ["new and pending must be lists of items and ready a list of non-empty bins"]
    items = [*state["new"], *state["pending"], *(item for group in ready for item in group)]
    bad = [item for item in items if not (isinstance(item, (tuple, list))
                                          and len(item) in (_ITEM_FIELDS - 1, _ITEM_FIELDS)
                                          and all(is_count(value) for value in item))]
    if bad:
        return problems + [f"items {bad[:3]} are not ({', '.join(f.name for f in dataclasses.fields(PackItem))})"]
    if problems:
        return problems
    indices = [item[0] for item in items]
    if len(set(indices)) < len(indices):
        problems.append(f"arrival indices appear twice: {sorted(i for i in set(indices) if indices.count(i) > 1)}")
    problems += [f"item {item[0]} has an arrival index at or above next_index={state['next_index']}"
                 for item in items if item[0] >= state["next_index"]]
    problems += [f"item {item[0]} arrived in round {item[2]}, after round_index={state['round_index']}"
                 for item in items if item[2] > state["round_index"]]
    return problems


@dataclass(frozen=True, kw_only=True)
class PlannedRound:
    """One round: its index, its candidates (pending first, then new), flush flag and result."""

    index: int
    candidates: list[PackItem]
    flush: bool
    result: RoundResult


@dataclass(kw_only=True)
class RoundPlanner:
    """Read / round / emit decisions of one worker's packing stage (one instance per worker).

    budget: what one row may hold (width W in slots, segments, vision patches, media, audio frames).
    round_size: new samples (or new aligned slots) per round; min_fill, max_wait_rounds: see
    :func:`select_bins`.

    Example (W=10, ``RoundSize(samples=2)``, min_fill 0.9): admit lengths 6 and 4 ->
    ``wants_samples()`` is False; ``run_round()`` makes bin [#0, #1] ready; ``take_bin()``
    returns it.
    """

    budget: RowBudget
    round_size: RoundSize
    min_fill: float
    max_wait_rounds: int
    #: Items admitted since the last round (the reading buffer), in arrival order.
    new: list[PackItem] = field(default_factory=list)
    #: Items of under-filled groups carried to the next round.
    pending: list[PackItem] = field(default_factory=list)
    #: Bins selected but not yet emitted, in emission order.
    ready: list[list[PackItem]] = field(default_factory=list)
    round_index: int = 0
    next_index: int = 0
    #: The source ended (finite stream): no more admissions, the next round flushes.
    exhausted: bool = False

    # --- reading --------------------------------------------------------------------------

    def wants_samples(self) -> bool:
        """Whether the new samples do not fill a round yet (and the source has not ended)."""
        return not self.exhausted and not self.round_size.is_full(len(self.new), sum(item.length for item in self.new))

    def admit(self, length: int, *, vision: int = 0, media: int = 0, audio: int = 0) -> PackItem:
        """Register one arrival of ``length`` aligned slots (``vision`` patches, ``media`` count,
        ``audio`` feature frames); returns its item (next arrival index)."""
        item = PackItem(self.next_index, length, self.round_index, vision=vision, media=media, audio=audio)
        self.next_index += 1
        self.new.append(item)
        return item

    def end_of_source(self) -> None:
        """The source has no more samples: the next round is a flush round."""
        self.exhausted = True

    def is_empty(self) -> bool:
        """Nothing new, pending or ready."""
        return not (self.new or self.pending or self.ready)

    # --- rounds ---------------------------------------------------------------------------

    def run_round(self) -> PlannedRound:
        """Select bins over pending + new items (flushing everything once the source ended)."""
        candidates = self.pending + self.new
        result = select_bins(
            candidates,
            self.budget,
            round_index=self.round_index,
            min_fill=self.min_fill,
            max_wait_rounds=self.max_wait_rounds,
            flush=self.exhausted,
        )
        planned = PlannedRound(index=self.round_index, candidates=candidates, flush=self.exhausted, result=result)
        self.new = []
        self.pending = [item for group in result.pending for item in group]
        self.ready.extend(result.emitted)
        self.round_index += 1
        return planned

    # --- emitting -------------------------------------------------------------------------

    def take_bin(self) -> list[PackItem] | None:
        """The next ready bin (removed from the plan), or None when none is ready."""
        return self.ready.pop(0) if self.ready else None

    def repend(self, items: list[PackItem]) -> bool:
        """Put the members of a bin that lost a sample back to pending, when they may wait.

        They may while the source has not ended and none has waited more than
        ``max_wait_rounds`` by the next round (where it is forced). Returns whether they went back.
        Example: max_wait_rounds 2, round_index 3, arrival rounds (1, 2) -> True; (0, 2) -> False.
        """
        if self.exhausted or any(self.round_index - item.arrival_round > self.max_wait_rounds for item in items):
            return False
        self.pending.extend(items)
        return True

    # --- state ----------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Plain, picklable state (items as tuples)."""
        return {
            "new": [item_state(item) for item in self.new],
            "pending": [item_state(item) for item in self.pending],
            "ready": [[item_state(item) for item in group] for group in self.ready],
            "round_index": self.round_index,
            "next_index": self.next_index,
            "exhausted": self.exhausted,
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Set the state saved by :meth:`state`."""
        self.new = [PackItem(*item) for item in state["new"]]
        self.pending = [PackItem(*item) for item in state["pending"]]
        self.ready = [[PackItem(*item) for item in group] for group in state["ready"]]
        self.round_index = state["round_index"]
        self.next_index = state["next_index"]
        self.exhausted = state["exhausted"]
