"""Blends by shares: which source a worker draws next so that what it has drawn tracks target shares.

Pure, deterministic and savable as plain data. A *unit* is what a share counts: 1 per sample
(``samples``), a sample's real tokens (``tokens``) or its supervised tokens (``supervised_tokens``).

The chooser is a deficit counter (smooth weighted round robin over units): every drawn unit adds
its target share ``p_i`` to each source's *due* and 1 to the drawing source's *drawn*; the next
draw goes to the source whose ``due - drawn`` is largest. Over any stretch the units drawn from
source i differ from ``p_i`` times all units drawn by less than about one sample's units, so a
blend of 200- and 2000-token samples at 1:1 meets 50 % of tokens within a few points over a
handful of rows, with no randomness and no communication: every worker meets the shares alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from energon_pack.config.blend import BlendPoint


def shares(weights: Sequence[float]) -> list[float]:
    """Weights normalised to sum 1. Example: ``shares([1, 3])`` -> ``[0.25, 0.75]``."""
    total = float(sum(weights))
    return [float(w) / total for w in weights]


def scheduled_weights(schedule: Sequence[BlendPoint], step: int, *, mode: str = "step") -> tuple[float, ...]:
    """The blend weights at global training ``step`` of a schedule (first point at step 0).

    ``mode="step"`` holds a point's weights until the next point; ``"linear"`` interpolates the
    shares between points (and holds the last point's after it). Weights of points are normalised
    to shares before interpolating.
    Example: points (0: [0.9, 0.1]), (100: [0.1, 0.9]): step 50 -> ``(0.9, 0.1)`` in mode ``step``,
    ``(0.5, 0.5)`` in mode ``linear``; step 150 -> ``(0.1, 0.9)`` either way.
    """
    index = max(i for i, point in enumerate(schedule) if point.step <= step)
    here = shares(schedule[index].weights)
    if mode == "step" or index + 1 == len(schedule):
        return tuple(here)
    start, end = schedule[index].step, schedule[index + 1].step
    frac = (step - start) / (end - start)
    there = shares(schedule[index + 1].weights)
    return tuple(a + (b - a) * frac for a, b in zip(here, there))


def rank_row_step(worker_row: int, *, worker: int, num_workers: int, micro_batches_per_step: int) -> int:
    """Global training step of a worker's ``worker_row``-th row (0-based) on its data-parallel rank.

    A rank's loader takes rows from its ``num_workers`` workers in turn (worker 0 first), and a step
    is ``micro_batches_per_step`` rows of each rank, so rank row r = worker_row * num_workers +
    worker belongs to step r // micro_batches_per_step (in-process loading: ``num_workers`` 1).
    Example: worker 1 of 2, its row 5, 4 micro-batches a step -> rank row 11 -> step 2.
    """
    return (worker_row * max(1, num_workers) + worker) // micro_batches_per_step


@dataclass
class ShareTracker:
    """Units drawn per source and units due per source (a deficit counter); plain-data state.

    Example: shares (0.5, 0.5), draws of 200 units from source 0 then 2000 from source 1: due
    (1100, 1100), drawn (200, 2000) -> the next draw goes to source 0 (deficit 900 against -900).
    """

    drawn: list[float] = field(default_factory=list)
    due: list[float] = field(default_factory=list)
    #: Samples drawn per source (any unit), for the epoch weights of ``blend_epochized``.
    samples: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, sources: int) -> ShareTracker:
        """A fresh tracker of ``sources`` sources."""
        return cls(drawn=[0.0] * sources, due=[0.0] * sources, samples=[0] * sources)

    def choose(self, weights: Sequence[float], available: Sequence[bool]) -> int:
        """The source to draw next: the largest deficit ``due - drawn`` among available sources of
        positive weight (ties: the larger weight, then the lower index).

        Example: ``ShareTracker.of(2).choose([1, 3], [True, True])`` -> 1 (equal deficits, larger weight).
        """
        candidates = [i for i, (w, ok) in enumerate(zip(weights, available)) if ok and w > 0]
        if not candidates:
            raise ValueError(
                f"no blend source can be drawn: weights {list(weights)}, available {list(available)}; every "
                "source with a positive weight is spent; fix: give a source that still has samples a weight "
                "above 0 at this step of blend_schedule"
            )
        return max(candidates, key=lambda i: (self.due[i] - self.drawn[i], weights[i], -i))

    def count(self, source: int, units: float, weights: Sequence[float]) -> None:
        """Book ``units`` drawn from ``source`` while the target weights were ``weights``."""
        for i, share in enumerate(shares(weights)):
            self.due[i] += share * units
        self.drawn[source] += units
        self.samples[source] += 1

    def uncount(self, source: int, units: float, weights: Sequence[float]) -> None:
        """Take back ``units`` booked for ``source`` (a sample the rows did not carry after all)."""
        for i, share in enumerate(shares(weights)):
            self.due[i] -= share * units
        self.drawn[source] -= units

    def state(self) -> dict[str, Any]:
        """Plain-data state (lists of numbers)."""
        return {"drawn": list(self.drawn), "due": list(self.due), "samples": list(self.samples)}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> ShareTracker:
        """The tracker of a saved :meth:`state`."""
        return cls(drawn=list(state["drawn"]), due=list(state["due"]), samples=list(state["samples"]))


def epoch_weights(repetitions_samples: Sequence[float], tracker: ShareTracker) -> list[float]:
    """Weights of a finite blend (``blend_epochized``) under a token unit: each source's units left
    to draw, estimated as its samples left (``repetitions_samples[i]``: samples this worker draws
    from it in the epoch, repetitions included) times its mean units per sample so far (the mean
    of all sources' samples before it has any), so that every source is spent at about the same time
    and any stretch of the epoch carries the epoch's token shares.

    Example: sources of 100 and 100 samples, 10 drawn of each at 200 and 2000 units a sample ->
    ``[18000.0, 180000.0]``.
    """
    total_drawn, total_samples = sum(tracker.drawn), sum(tracker.samples)
    overall = total_drawn / total_samples if total_samples else 1.0
    weights = []
    for i, planned in enumerate(repetitions_samples):
        mean = tracker.drawn[i] / tracker.samples[i] if tracker.samples[i] else overall
        weights.append(max(1.0, planned - tracker.samples[i]) * max(mean, 1e-9))
    return weights
