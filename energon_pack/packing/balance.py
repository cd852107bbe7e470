"""Balanced steps: rows of near-equal modelled cost, and steps dealt so that no DP rank waits.

A training step runs ``G = dp * micro_batches`` rows, ``micro_batches`` on each data-parallel
rank, and every rank waits for the slowest at the gradient all-reduce. Three pure parts (no
Energon, no torch; costs are modelled FLOPs, see :mod:`energon_pack.rows.flops`):

* **Cost-balanced packing** (:func:`balance_rows`): the plan's rows (:func:`plan_rows`) are
  improved by moving or exchanging samples between a heavy and a light row while both stay
  within the :class:`RowBudget`; the number of rows never changes, so neither does the fill.
* **Stream order** (:class:`BalancedStream`): the plain stream (position ``p`` holds
  ``epoch_row_order(R, seed, p // R)[p % R]``) is cut, from the stream base, into windows of
  ``window_steps`` steps; inside a window the rows are sorted by cost (heaviest first, ties by
  position), cut into steps of ``G`` and the steps shuffled (seeded by seed, stream, window), so
  each step holds rows of similar cost. ``window_steps=1`` keeps the plain order (dealing only).
* **Dealing** (:func:`deal_step`): a step's rows go to ranks by longest-processing-time with
  exactly ``micro_batches`` rows per rank; a rank reads its rows in position order.

See ``docs/balanced_steps.md`` (why steps wait, the resume rule, measured imbalance).
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from energon_pack.packing.algorithms import RowBudget
from energon_pack.packing.global_plan import epoch_row_order

__all__ = [
    "BalancedStream",
    "StepStats",
    "balance_rows",
    "check_balanced_resume",
    "deal_step",
    "step_imbalance",
    "synthetic_grids",
    "window_order",
]


def synthetic_grids(vision_patches: int, images: int, videos: int) -> list[tuple[int, int, int]]:
    """Plausible Qwen2.5-VL grids ``(t, h, w)`` for a sample known only by its ViT patches and
    media counts (the reference mix has no grids): images share the patches equally, each a
    near-square grid; a video is frames of 24 x 40 patches.

    Example: ``synthetic_grids(3200, 1, 0)`` -> ``[(1, 56, 58)]`` (800 merged tokens ~ 28 x 29).
    """
    if vision_patches == 0:
        return []
    merged = vision_patches // 4
    if videos:
        return [(max(1, round(merged / 240)), 24, 40)]
    per_image = max(1, merged // max(1, images))
    a = max(1, round(math.sqrt(per_image)))
    b = max(1, round(per_image / a))
    return [(1, 2 * a, 2 * b)] * max(1, images)


# ------------------------------------------------------------------------------ packing


def balance_rows(
    rows: Sequence[Sequence[int]],
    lengths: Sequence[int],
    costs: Sequence[float],
    budget: RowBudget,
    *,
    vision: Sequence[int] | None = None,
    media: Sequence[int] | None = None,
    chunk_rows: int = 256,
    passes: int = 3,
    partners: int = 4,
) -> list[list[int]]:
    """Rows (positions into ``lengths``) with the same count as ``rows`` and near-equal summed cost.

    Rows are balanced in chunks of ``chunk_rows`` (in the given order) toward the mean of all
    rows. Each pass takes the chunk's rows above the mean, heaviest first; for each, among its
    ``partners`` lightest rows it applies the move, 1-for-1 swap or 1-for-many swap (one sample
    for a bundle of the light row's cheapest) that brings the pair closest to equal cost, within
    every limit of ``budget``. A heavy row holding one sample is skipped (nothing to give).
    Deterministic in its arguments; rows returned sorted as ``plan_rows`` sorts them.

    Example: lengths [4, 4, 4, 4], costs [9, 9, 1, 1], ``RowBudget(tokens=8)``, rows
    [[0, 1], [2, 3]] -> [[0, 3], [1, 2]] (costs 10 and 10).
    """
    cost = np.asarray(costs, dtype=np.float64)
    length = np.asarray(lengths, dtype=np.int64)
    big = np.iinfo(np.int64).max // 4
    limits = np.array([budget.tokens, budget.segments or big, budget.vision_patches or big, budget.media or big])
    # per item: (slots, segments, vision patches, media)
    usage = np.column_stack([
        length,
        np.ones(len(length), np.int64),
        np.zeros(len(length), np.int64) if vision is None else np.asarray(vision, np.int64),
        np.zeros(len(length), np.int64) if media is None else np.asarray(media, np.int64),
    ])
    bins = [list(r) for r in rows]
    row_cost = np.array([cost[r].sum() for r in bins])
    mean = float(row_cost.mean()) if len(bins) else 0.0
    for start in range(0, len(bins), chunk_rows):
        _balance_chunk(bins, range(start, min(start + chunk_rows, len(bins))), row_cost, mean, cost, usage, limits,
                       passes=passes, partners=partners)
    return sorted((sorted(b) for b in bins), key=lambda b: b[0])


def _balance_chunk(bins, chunk, row_cost, mean, cost, usage, limits, *, passes, partners) -> None:
    """Balance the rows ``chunk`` of ``bins`` in place (``row_cost`` kept up to date)."""
    ids = np.asarray(chunk)
    row_use = {b: usage[bins[b]].sum(axis=0) for b in chunk}
    for _ in range(passes):
        improved = 0.0
        heavy = [int(a) for a in ids[np.argsort(-row_cost[ids], kind="stable")] if row_cost[a] > mean]
        for a in heavy:
            if len(bins[a]) < 2 and row_use[a][0] >= limits[0]:
                continue
            light = ids[np.argsort(row_cost[ids], kind="stable")[:partners]]
            best = None
            for b in (int(x) for x in light):
                diff = row_cost[a] - row_cost[b]
                if diff <= 0:
                    continue
                found = _best_exchange(bins[a], bins[b], diff, cost, usage,
                                       limits - row_use[a], limits - row_use[b])
                if found is not None and (best is None or found[2] > best[2][2]):
                    best = (b, diff, found)
            if best is None:
                continue
            b, diff, (out_a, out_b, gain) = best
            improved += gain
            for src, dst, item in [(a, b, i) for i in out_a] + [(b, a, j) for j in out_b]:
                bins[src].remove(item)
                bins[dst].append(item)
                row_cost[src] -= cost[item]
                row_cost[dst] += cost[item]
                row_use[src] = row_use[src] - usage[item]
                row_use[dst] = row_use[dst] + usage[item]
        if improved <= 1e-9 * mean * mean * len(ids):
            break


def _best_exchange(a, b, diff, cost, usage, room_a, room_b):
    """The exchange (items a -> b, items b -> a, gain) whose cost shift ``d`` (0 < d < diff) is
    closest to ``diff / 2`` (gain ``2 d (diff - d)``: the drop of the pair's squared deviation),
    keeping both rows within every limit (``room_*``: what each row has left); None if none.

    Tried for each item i of a: a move (i alone), a 1-for-1 swap with each item j of b, and a
    1-for-many swap with the longest prefix of b's items (cheapest per slot first) that fits
    into i's slots plus b's room: what lets a row of small text samples take an image.
    """
    ia, ib = np.asarray(a), np.asarray(b)
    order = np.argsort(cost[ib] / usage[ib, 0], kind="stable")
    cum_use = np.cumsum(usage[ib][order], axis=0)
    cum_cost = np.cumsum(cost[ib][order])
    n_bundle = np.searchsorted(cum_use[:, 0], usage[ia, 0] + room_b[0], side="right")
    pick = np.maximum(n_bundle - 1, 0)
    has_bundle = n_bundle > 1
    # candidates [len(a), 1 + len(b) + 1, 4 limits]: what goes from b to a
    back_use = np.concatenate([
        np.zeros((len(ia), 1, 4), np.int64),
        np.broadcast_to(usage[ib][None], (len(ia), len(ib), 4)),
        np.where(has_bundle[:, None], cum_use[pick], 0)[:, None, :],
    ], axis=1)
    back_cost = np.concatenate([
        np.zeros((len(ia), 1)), np.broadcast_to(cost[ib][None], (len(ia), len(ib))),
        np.where(has_bundle, cum_cost[pick], 0.0)[:, None],
    ], axis=1)
    net = usage[ia][:, None, :] - back_use  # what b gains, a loses
    shift = cost[ia][:, None] - back_cost
    ok = (net <= room_b).all(axis=2) & (-net <= room_a).all(axis=2) & (shift > 0) & (shift < diff)
    ok[:, -1] &= has_bundle
    if not ok.any():
        return None
    gap = np.where(ok, np.abs(shift - diff / 2), np.inf)
    r, c = np.unravel_index(int(np.argmin(gap)), gap.shape)
    d = float(shift[r, c])
    if c == 0:
        out_b: tuple[int, ...] = ()
    elif c <= len(ib):
        out_b = (int(ib[c - 1]),)
    else:
        out_b = tuple(int(j) for j in ib[order[: n_bundle[r]]])
    return (int(ia[r]),), out_b, 2 * d * (diff - d)


# ------------------------------------------------------------------------------ stream order


def window_order(costs: Sequence[float], *, step_rows: int, key: str) -> list[int]:
    """The offsets of one window's plain positions in balanced order: sorted by cost (heaviest
    first, ties by offset), cut into steps of ``step_rows``, the whole steps shuffled by
    ``random.Random(key)``; a short last step stays last.

    Example: costs [1, 5, 2, 4], step_rows 2 -> steps [1, 3] and [2, 0], in one of the orders
    [1, 3, 2, 0] / [2, 0, 1, 3].
    """
    ranked = sorted(range(len(costs)), key=lambda i: (-costs[i], i))
    steps = [ranked[s : s + step_rows] for s in range(0, len(ranked), step_rows)]
    tail = [steps.pop()] if steps and len(steps[-1]) < step_rows else []
    random.Random(key).shuffle(steps)
    return [i for step in steps + tail for i in step]


def deal_step(costs: Sequence[float], dp: int, micro_batches: int) -> list[int]:
    """Rank of each of a step's rows (at most ``dp * micro_batches``): longest-processing-time,
    heaviest row first to the least-loaded rank with a free micro-batch (ties: lower rank).

    Example: costs [5, 1, 4, 2], dp 2, micro_batches 2 -> [0, 0, 1, 1] (5+1 and 4+2).
    """
    if len(costs) > dp * micro_batches:
        raise ValueError(f"{len(costs)} rows do not fit one step of dp={dp} x micro_batches={micro_batches}")
    free = [(0.0, r, micro_batches) for r in range(dp)]  # (load, rank, free micro-batches), a heap
    ranks = [0] * len(costs)
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        load, rank, left = heapq.heappop(free)
        ranks[i] = rank
        if left > 1:
            heapq.heappush(free, (load + costs[i], rank, left - 1))
    return ranks


class BalancedStream:
    """Plan row and rank of every stream position in the balanced order (see the module docstring).

    ``row_costs``: modelled cost of each plan row; ``step_rows``: ``G = dp * micro_batches``;
    ``window_steps``: steps per cost window; ``repeat``: one endless stream from base 0 (else one
    epoch of ``R`` rows per stream, base ``epoch * R``). Windows are cached (one at a time).
    Example: R=4, G=2, window 1 step -> position p holds the plain row at p (dealing only).
    """

    def __init__(self, row_costs: Sequence[float], *, seed: int, step_rows: int, window_steps: int, repeat: bool) -> None:
        if step_rows < 1 or window_steps < 1:
            raise ValueError(f"step_rows={step_rows}, window_steps={window_steps}: both must be >= 1")
        self.row_costs = np.asarray(row_costs, dtype=np.float64)
        self.seed = seed
        self.step_rows = step_rows
        self.window_steps = window_steps
        self.repeat = repeat
        self._orders: dict[int, list[int]] = {}
        self._window: tuple[int, list[int]] | None = None  # (window start, plan row at each offset)

    @property
    def num_rows(self) -> int:
        return len(self.row_costs)

    def base(self, position: int) -> int:
        """Start of the stream holding ``position`` (0, or the start of its epoch)."""
        return 0 if self.repeat else position - position % self.num_rows

    def plain_row(self, position: int) -> int:
        """Plan row at ``position`` of the plain stream: ``epoch_row_order(R, seed, p // R)[p % R]``."""
        epoch, row = divmod(position, self.num_rows)
        if epoch not in self._orders:
            if len(self._orders) > 1:  # keep two epochs: a window may span an epoch boundary
                del self._orders[min(self._orders)]
            self._orders[epoch] = epoch_row_order(self.num_rows, seed=self.seed, epoch=epoch)
        return self._orders[epoch][row]

    def plan_row(self, position: int) -> int:
        """Plan row at ``position`` of the balanced stream (the plain one with ``window_steps=1``)."""
        if self.window_steps == 1:
            return self.plain_row(position)
        base = self.base(position)
        size = self.step_rows * self.window_steps
        start = base + (position - base) // size * size
        if self._window is None or self._window[0] != start:
            end = start + size if self.repeat else min(start + size, base + self.num_rows)
            plain = [self.plain_row(p) for p in range(start, end)]
            stream = 0 if self.repeat else base // self.num_rows
            offsets = window_order(self.row_costs[plain].tolist(), step_rows=self.step_rows,
                                   key=f"energon_pack.balance:{self.seed}:{stream}:{(start - base) // size}")
            self._window = (start, [plain[i] for i in offsets])
        return self._window[1][position - start]

    def rank_positions(self, cursor: int, end: int | None, *, rank: int, dp: int) -> Iterator[int]:
        """Positions ``rank`` reads from ``cursor`` (a step boundary) below ``end``: step by step,
        the positions :func:`deal_step` gives it, ascending (the short last step of an epoch is
        dealt as it is: some ranks get a row fewer).

        Example: costs [5, 1, 4, 2], G=4 (dp 2 x 2), window 1 step, rank 1 -> its two positions of step 0.
        """
        micro = self.step_rows // dp
        start = cursor
        while end is None or start < end:
            stop = start + self.step_rows if end is None else min(start + self.step_rows, end)
            costs = [self.row_costs[self.plan_row(p)] for p in range(start, stop)]
            ranks = deal_step(costs, dp, micro)
            yield from (start + i for i, r in enumerate(ranks) if r == rank)
            start = stop


def check_balanced_resume(*, cursor: int, base: int, saved_step_rows: int, step_rows: int) -> None:
    """Raise ValueError unless a balanced state saved at ``cursor`` (steps of ``saved_step_rows``
    from ``base``) continues exactly with steps of ``step_rows``: the same rows per step (any
    split of them into dp x micro-batches) at a step boundary.

    Example: cursor 40, saved 8, now 8 -> ok (DP4x2 -> DP2x4); saved 8, now 4 -> ValueError.
    """
    if step_rows == saved_step_rows and (cursor - base) % step_rows == 0:
        return
    raise ValueError(
        f"a balanced plan state saved at cursor {cursor} with steps of {saved_step_rows} rows "
        f"(dp x micro_batches_per_step) cannot continue exactly with steps of {step_rows} rows: the cost "
        f"windows and steps are cut by the step size; fix: keep dp * micro_batches_per_step = {saved_step_rows} "
        "(any DP size, e.g. the same global batch), or set allow_inexact_resume: true"
    )


# ------------------------------------------------------------------------------ measure


@dataclass(frozen=True, kw_only=True)
class StepStats:
    """Step imbalance (slowest rank / mean rank cost) over the whole steps of a stream."""

    steps: int
    mean: float
    p99: float
    max: float


def step_imbalance(stream_costs: Sequence[float], dp: int, micro_batches: int, *, balanced: bool) -> StepStats:
    """Imbalance of each whole step of ``stream_costs`` (row costs in stream order), dealt ``g % dp``
    (``balanced=False``: rank r reads positions r, r + dp, ...) or by :func:`deal_step`.

    Example: costs [3, 1, 2, 2], dp 2, micro 2: plain ranks 3+2, 1+2 -> 5/4 = 1.25; balanced -> 1.0.
    """
    g = dp * micro_batches
    values = []
    for start in range(0, len(stream_costs) - g + 1, g):
        step = np.asarray(stream_costs[start : start + g], dtype=np.float64)
        ranks = deal_step(step.tolist(), dp, micro_batches) if balanced else np.arange(g) % dp
        load = np.bincount(ranks, weights=step, minlength=dp)
        values.append(load.max() / load.mean())
    if not values:
        raise ValueError(f"{len(stream_costs)} rows hold no whole step of dp={dp} x micro_batches={micro_batches}")
    arr = np.array(values)
    return StepStats(steps=len(arr), mean=float(arr.mean()), p99=float(np.percentile(arr, 99)), max=float(arr.max()))
