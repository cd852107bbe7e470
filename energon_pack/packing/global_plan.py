"""Global pack plan: rows for a whole split, planned once before training (no Energon, no torch).

Two pure parts:

* **Planning** (:func:`plan_rows`): the aligned lengths of every sample of a split are packed
  into rows of ``budget.tokens`` slots by best-fit decreasing; the rows that stay under
  ``min_fill`` are then dissolved and packed again with the online selection's exact
  subset-sum (:func:`~energon_pack.packing.algorithms.select_bins` in a flush round), and
  the second packing is kept when it needs no more rows. Same budgets as online packing:
  one :class:`~energon_pack.packing.algorithms.RowBudget` (slots, segments, vision patches, media).
* **Reading order** (:func:`epoch_row_order`, :func:`rank_positions`): row ``g`` of epoch
  ``e`` is ``order_e[g]`` where ``order_e`` is a permutation drawn from ``(seed, e)``; a
  position in the stream goes to data-parallel rank ``(position - base) % world_size`` and,
  within a rank, its workers take the rank's rows round-robin. A loader's state is one
  global cursor (every position below it is consumed), valid for any world size and worker
  count.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Iterator, Sequence

from energon_pack.packing.algorithms import PackItem, RowBudget, _check_budget, _check_item, select_bins

__all__ = [
    "best_fit_decreasing",
    "epoch_row_order",
    "first_rank_position",
    "plan_rows",
    "rank_positions",
]


def best_fit_decreasing(
    lengths: Sequence[int], budget: RowBudget, *, vision: Sequence[int] | None = None, media: Sequence[int] | None = None
) -> list[list[int]]:
    """Best-fit-decreasing bin packing within ``budget``; returns bins of positions into ``lengths``.

    Items are taken longest first (equal lengths by position) and placed in the open bin
    with the least token room that still holds them within every limit (``budget.segments``,
    and ``budget.vision_patches`` / ``budget.media`` over the items' ``vision`` / ``media``;
    ties: the bin opened first); a bin closes when it has no token or segment room left. Bins
    are in creation order, positions within a bin ascending. O(n log n) without vision limits.

    Example: ``best_fit_decreasing([3, 5, 2, 4], RowBudget(tokens=7))`` -> ``[[1, 2], [0, 3]]``
    (5 opens bin 0, 4 opens bin 1, 3 fits bin 1 exactly, 2 fits bin 0 exactly).
    """
    _check_items_fit(lengths, budget, vision, media)
    vision = [0] * len(lengths) if vision is None else vision
    media = [0] * len(lengths) if media is None else media
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    vision_room: list[int] = []  # per bin; compared only when budget.vision_patches is set
    media_room: list[int] = []  # per bin; compared only when budget.media is set
    open_bins: list[tuple[int, int]] = []  # (token room, bin id), ascending

    def fits(i: int, b: int) -> bool:
        return (budget.vision_patches is None or vision[i] <= vision_room[b]) and (
            budget.media is None or media[i] <= media_room[b]
        )

    for i in order:
        slot = bisect.bisect_left(open_bins, (lengths[i], -1))
        while slot < len(open_bins) and not fits(i, open_bins[slot][1]):
            slot += 1
        if slot < len(open_bins):
            room, b = open_bins.pop(slot)
        else:
            room, b = budget.tokens, len(bins)
            bins.append([])
            vision_room.append(budget.vision_patches or 0)
            media_room.append(budget.media or 0)
        bins[b].append(i)
        room -= lengths[i]
        vision_room[b] -= vision[i]
        media_room[b] -= media[i]
        if room > 0 and (budget.segments is None or len(bins[b]) < budget.segments):
            bisect.insort(open_bins, (room, b))
    return [sorted(b) for b in bins]


def plan_rows(
    lengths: Sequence[int],
    budget: RowBudget,
    *,
    min_fill: float,
    vision: Sequence[int] | None = None,
    media: Sequence[int] | None = None,
) -> list[list[int]]:
    """Pack every item into rows within ``budget``; returns rows of positions into ``lengths``.

    Best-fit decreasing first; rows filled below ``min_fill`` are dissolved and packed again
    by exact subset-sum (each row seeded with the longest remaining item and completed as
    tightly as possible: :func:`select_bins` in a flush round). The refined packing replaces
    them when it needs no more rows. Rows are ordered by their smallest position, positions
    within a row ascending; the result depends only on the arguments.

    Example: ``plan_rows([4, 8, 6, 11, 6, 19, 2, 17, 5, 11, 1, 6], RowBudget(tokens=20), min_fill=0.9)``
    -> 5 rows ``[[0, 8, 9], [1, 3], [2, 4, 11], [5, 10], [6, 7]]``, where best-fit
    decreasing alone needs 6.
    """
    bins = best_fit_decreasing(lengths, budget, vision=vision, media=media)
    threshold = min_fill * budget.tokens
    loose = [b for b in bins if sum(lengths[i] for i in b) < threshold]
    if len(loose) > 1:
        pool = [
            PackItem(
                index=i,
                length=lengths[i],
                arrival_round=0,
                vision=0 if vision is None else vision[i],
                media=0 if media is None else media[i],
            )
            for b in loose
            for i in b
        ]
        refined = select_bins(pool, budget, round_index=0, min_fill=min_fill, max_wait_rounds=0, flush=True).emitted
        if len(refined) <= len(loose):
            kept = [b for b in bins if sum(lengths[i] for i in b) >= threshold]
            bins = kept + [[it.index for it in row] for row in refined]
    return sorted((sorted(b) for b in bins), key=lambda b: b[0])


def _check_items_fit(
    lengths: Sequence[int], budget: RowBudget, vision: Sequence[int] | None, media: Sequence[int] | None
) -> None:
    """Check the budget, and that every item could fit one row alone (ValueError naming it)."""
    _check_budget(budget)
    for i, length in enumerate(lengths):
        seen_vision = 0 if vision is None else vision[i]
        seen_media = 0 if media is None else media[i]
        if not (
            1 <= length <= budget.tokens
            and 0 <= seen_vision <= (budget.vision_patches if budget.vision_patches is not None else seen_vision)
            and 0 <= seen_media <= (budget.media if budget.media is not None else seen_media)
        ):
            _check_item(i, PackItem(index=i, length=length, arrival_round=0, vision=seen_vision, media=seen_media), budget)


def epoch_row_order(num_rows: int, *, seed: int, epoch: int) -> list[int]:
    """The permutation of ``range(num_rows)`` read in ``epoch``: ``order[g]`` is the plan row at
    global row ``g``. Deterministic in ``(seed, epoch)`` on every platform and Python 3 version
    (``random.Random`` seeded from a string, Fisher-Yates shuffle).

    Example: ``sorted(epoch_row_order(5, seed=1, epoch=0)) == [0, 1, 2, 3, 4]``.
    """
    order = list(range(num_rows))
    random.Random(f"energon_pack.plan:{seed}:{epoch}").shuffle(order)
    return order


def first_rank_position(cursor: int, *, base: int, rank: int, world_size: int) -> int:
    """The first stream position >= ``cursor`` that belongs to ``rank``.

    Position ``p`` belongs to rank ``(p - base) % world_size``.
    Example: cursor 12, base 0, rank 1 of 8 -> 17; rank 4 of 8 -> 12.
    """
    _check_rank(rank, world_size)
    return cursor + (rank - (cursor - base)) % world_size


def rank_positions(
    cursor: int,
    *,
    base: int,
    end: int | None,
    rank: int,
    world_size: int,
    worker: int = 0,
    num_workers: int = 1,
) -> Iterator[int]:
    """Stream positions (ascending, from ``cursor``, below ``end``; endless when None) read by
    ``worker`` of ``rank``: the rank's positions are dealt to its workers round-robin.

    Example: cursor 0, base 0, end 10, rank 1 of 2, worker 0 of 2 -> 1, 5, 9
    (rank 1 reads 1, 3, 5, 7, 9; worker 0 takes every other one of those, from the first).
    """
    if not 0 <= worker < num_workers:
        raise ValueError(f"worker={worker} must be in [0, num_workers={num_workers})")
    position = first_rank_position(cursor, base=base, rank=rank, world_size=world_size)
    position += worker * world_size
    step = world_size * num_workers
    while end is None or position < end:
        yield position
        position += step


def _check_rank(rank: int, world_size: int) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank}, world_size={world_size}: need world_size >= 1 and 0 <= rank < world_size")
