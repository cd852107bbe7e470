"""Global pack plan: rows for a whole split, planned once before training (no Energon, no torch).

Two pure parts:

* **Planning** (:func:`plan_rows`, :func:`plan_rows_flat`): the aligned lengths of every sample
  of a split are packed into rows of ``budget.tokens`` slots by best-fit decreasing; the rows
  that stay under ``min_fill`` are then dissolved and packed again with the online selection's
  exact subset-sum (:func:`~energon_pack.packing.algorithms.select_bins` in a flush round), and
  the second packing is kept when it needs no more rows. Same budgets as online packing:
  one :class:`~energon_pack.packing.algorithms.RowBudget` (slots, segments, vision patches, media).
* **Reading order** (:func:`epoch_row_order`, :func:`rank_positions`): row ``g`` of epoch
  ``e`` is ``order_e[g]`` where ``order_e`` is a permutation drawn from ``(seed, e)``; a
  position in the stream goes to data-parallel rank ``(position - base) % world_size`` and,
  within a rank, its workers take the rank's rows round-robin. A loader's state is one
  global cursor (every position below it is consumed), valid for any world size and worker
  count.

How planning scales to ten million samples (same algorithm and tie-breaking as the plain
list version, which ``tests/support/global_plan_reference.py`` keeps as the oracle; other data
structures):

* **Best-fit decreasing** (:func:`best_fit_decreasing_bins`): open bins live in buckets by
  token room (``room -> heap of bin ids``) and a Python-int bitset marks the non-empty rooms,
  so "the open bin with the least room >= L, ties: the bin opened first" is one shift and one
  heap pop. With a token-only budget the equal-length items of a run are placed in one step
  per bin touched: the best-fit bin stays the best fit until its room drops below L (every
  other bin with room >= L has more room), so it takes ``min(room // L, segments left, items
  left)`` of the run at once. With a vision or media limit each item scans the rooms upwards,
  skipping a room whose bound on its bins' vision / media room cannot hold the item, and, per
  room, the bins by id (exact, but one step per item and bin looked at: not fast).
* **Refinement** (token-only budget): the loose rows' items are kept per length, indices
  ascending; each row is seeded with the longest (lowest index) item and completed by the
  online selection's subset-sum fed lazily with just the items its ``_useful`` filter keeps,
  without the O(pool) list copies per row of ``select_bins``. With a vision or media limit
  ``select_bins`` runs as is: exact, but quadratic in the loose rows' items (not fast).
* **Output**: CSR ``(row_offsets int64 [R+1], members int64 [N])``, no list of lists.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import random
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import numpy as np

from energon_pack.packing.algorithms import (
    PackItem,
    RowBudget,
    _best_subset_counted,
    _check_budget,
    _check_item,
    _check_round_args,
    select_bins,
)

__all__ = [
    "best_fit_decreasing",
    "best_fit_decreasing_bins",
    "epoch_row_order",
    "first_rank_position",
    "plan_rows",
    "plan_rows_flat",
    "rank_positions",
    "rows_to_lists",
]



def best_fit_decreasing(
    lengths: Sequence[int], budget: RowBudget, *, vision: Sequence[int] | None = None, media: Sequence[int] | None = None
) -> list[list[int]]:
    """Best-fit-decreasing bin packing within ``budget``; returns bins of positions into ``lengths``.

    Items are taken longest first (equal lengths by position) and placed in the open bin
    with the least token room that still holds them within every limit (``budget.segments``,
    and ``budget.vision_patches`` / ``budget.media`` over the items' ``vision`` / ``media``;
    ties: the bin opened first); a bin closes when it has no token or segment room left. Bins
    are in creation order, positions within a bin ascending (:func:`best_fit_decreasing_bins`
    as lists).

    Example: ``best_fit_decreasing([3, 5, 2, 4], RowBudget(tokens=7))`` -> ``[[1, 2], [0, 3]]``
    (5 opens bin 0, 4 opens bin 1, 3 fits bin 1 exactly, 2 fits bin 0 exactly).
    """
    bin_of = best_fit_decreasing_bins(lengths, budget, vision=vision, media=media)
    if len(bin_of) == 0:
        return []
    return rows_to_lists(_offsets(np.bincount(bin_of)), np.argsort(bin_of, kind="stable"))


def best_fit_decreasing_bins(
    lengths: Sequence[int] | np.ndarray,
    budget: RowBudget,
    *,
    vision: Sequence[int] | np.ndarray | None = None,
    media: Sequence[int] | np.ndarray | None = None,
) -> np.ndarray:
    """Bin id (creation order) of every position: :func:`best_fit_decreasing` as an int64 array.

    Example: ``best_fit_decreasing_bins([3, 5, 2, 4], RowBudget(tokens=7))`` -> ``[1, 0, 0, 1]``
    (the bins ``[[1, 2], [0, 3]]``).
    """
    lengths, vision, media = _arrays(lengths, vision, media)
    _check_items_fit(lengths, budget, vision, media)
    n = len(lengths)
    order = np.argsort(-lengths, kind="stable")  # (-length, position)
    if budget.tokens_only:
        bin_sorted = _bfd_tokens(lengths[order], budget)
    else:
        zeros = np.zeros(n, dtype=np.int64)
        bin_sorted = _bfd_limited(
            lengths[order], (zeros if vision is None else vision)[order], (zeros if media is None else media)[order], budget
        )
    bin_of = np.empty(n, dtype=np.int64)
    bin_of[order] = bin_sorted
    return bin_of


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
    within a row ascending; the result depends only on the arguments (:func:`plan_rows_flat`
    as lists).

    Example: ``plan_rows([4, 8, 6, 11, 6, 19, 2, 17, 5, 11, 1, 6], RowBudget(tokens=20), min_fill=0.9)``
    -> 5 rows ``[[0, 8, 9], [1, 3], [2, 4, 11], [5, 10], [6, 7]]``, where best-fit
    decreasing alone needs 6.
    """
    return rows_to_lists(*plan_rows_flat(lengths, budget, min_fill=min_fill, vision=vision, media=media))


def plan_rows_flat(
    lengths: Sequence[int] | np.ndarray,
    budget: RowBudget,
    *,
    min_fill: float,
    vision: Sequence[int] | np.ndarray | None = None,
    media: Sequence[int] | np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`plan_rows` as CSR ``(row_offsets int64 [R+1], members int64 [N])``: row ``r`` is
    ``members[row_offsets[r]:row_offsets[r + 1]]``.

    Example: ``plan_rows_flat([4, 8, 6, 11, 6, 19, 2, 17, 5, 11, 1, 6], RowBudget(tokens=20),
    min_fill=0.9)`` -> offsets ``[0, 3, 5, 8, 10, 12]``, members ``[0, 8, 9, 1, 3, 2, 4, 11, 5, 10, 6, 7]``.
    """
    lengths, vision, media = _arrays(lengths, vision, media)
    bin_of = best_fit_decreasing_bins(lengths, budget, vision=vision, media=media)
    num_bins = int(bin_of.max()) + 1 if len(bin_of) else 0
    fill = np.bincount(bin_of, weights=lengths, minlength=num_bins)
    loose_bin = fill < min_fill * budget.tokens
    loose = int(loose_bin.sum())
    row_of = bin_of
    if loose > 1:
        loose_pos = np.flatnonzero(loose_bin[bin_of])
        if budget.tokens_only:
            _check_round_args(budget, min_fill, 0)
            refined = _refine_loose(loose_pos, lengths[loose_pos], budget)
        else:
            pool = [
                PackItem(
                    index=int(i),
                    length=int(lengths[i]),
                    arrival_round=0,
                    vision=0 if vision is None else int(vision[i]),
                    media=0 if media is None else int(media[i]),
                )
                for i in loose_pos
            ]
            emitted = select_bins(pool, budget, round_index=0, min_fill=min_fill, max_wait_rounds=0, flush=True).emitted
            refined = [np.array([it.index for it in row], dtype=np.int64) for row in emitted]
        if len(refined) <= loose:
            row_of = bin_of.copy()
            for k, row in enumerate(refined):
                row_of[row] = num_bins + k
    return _csr_by_smallest_member(row_of)


def rows_to_lists(row_offsets: np.ndarray, members: np.ndarray) -> list[list[int]]:
    """CSR rows as a list of lists. Example: ``rows_to_lists([0, 2, 3], [0, 2, 1])`` -> ``[[0, 2], [1]]``."""
    flat = np.asarray(members).tolist()
    bounds = np.asarray(row_offsets).tolist()
    return [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def _offsets(counts: np.ndarray) -> np.ndarray:
    """CSR offsets of rows with ``counts`` members. Example: ``[2, 1]`` -> ``[0, 2, 3]``."""
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


def _arrays(
    lengths: Sequence[int] | np.ndarray, vision: Sequence[int] | np.ndarray | None, media: Sequence[int] | np.ndarray | None
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """The planner's inputs as int64 arrays (None stays None)."""

    def as_array(values: Sequence[int] | np.ndarray | None) -> np.ndarray | None:
        return None if values is None else np.asarray(values, dtype=np.int64).reshape(-1)

    return as_array(lengths), as_array(vision), as_array(media)  # type: ignore[return-value]


def _check_items_fit(lengths: np.ndarray, budget: RowBudget, vision: np.ndarray | None, media: np.ndarray | None) -> None:
    """Check the budget, and that every item could fit one row alone: vectorised, then
    ``_check_item`` on the first offending item (ValueError naming its position and limit)."""
    _check_budget(budget)
    bad = (lengths < 1) | (lengths > budget.tokens)
    for values, limit in ((vision, budget.vision_patches), (media, budget.media)):
        if values is not None:
            bad |= values < 0
            if limit is not None:
                bad |= values > limit
    first = np.flatnonzero(bad)[:1]
    if len(first):
        i = int(first[0])
        item = PackItem(
            index=i,
            length=int(lengths[i]),
            arrival_round=0,
            vision=0 if vision is None else int(vision[i]),
            media=0 if media is None else int(media[i]),
        )
        _check_item(i, item, budget)


def _bfd_tokens(sorted_len: np.ndarray, budget: RowBudget) -> np.ndarray:
    """Token-only best-fit decreasing over lengths sorted non-increasing; one step per
    (bin, run of equal lengths). Returns the bin id of each sorted position."""
    n = len(sorted_len)
    out = np.empty(n, dtype=np.int64)
    if n == 0:
        return out
    capacity = budget.tokens
    cuts = np.flatnonzero(np.diff(sorted_len)) + 1
    starts = np.concatenate([[0], cuts]).tolist()
    ends = np.concatenate([cuts, [n]]).tolist()
    run_lengths = sorted_len[starts].tolist()
    seg = budget.segments if budget.segments is not None else n + 1
    buckets: dict[int, list[int]] = {}  # token room -> heap of open bin ids
    nonempty = 0  # bit r set: buckets[r] holds an open bin
    seg_left: list[int] = []  # per bin
    next_bin = 0
    for pos, end, length in zip(starts, ends, run_lengths):
        while pos < end:
            above = nonempty >> length
            if above:
                room = length + (above & -above).bit_length() - 1
                heap = buckets[room]
                b = heapq.heappop(heap)
                if not heap:
                    del buckets[room]
                    nonempty ^= 1 << room
                take = min(room // length, end - pos, seg_left[b])
                out[pos : pos + take] = b
                pos += take
                room -= take * length
                seg_left[b] -= take
                if room > 0 and seg_left[b] > 0:
                    if room in buckets:
                        heapq.heappush(buckets[room], b)
                    else:
                        buckets[room] = [b]
                        nonempty |= 1 << room
                continue
            # No open bin holds `length`: new bins, each filled with `per` items of the run.
            count = end - pos
            per = min(capacity // length, seg)
            full, last = divmod(count, per)
            out[pos:end] = next_bin + np.arange(count, dtype=np.int64) // per
            new_rooms = [(capacity - per * length, per, full)] if full else []
            if last:
                new_rooms.append((capacity - last * length, last, 1))
            for room, taken, bins in new_rooms:
                ids = range(next_bin, next_bin + bins)
                next_bin += bins
                seg_left.extend([seg - taken] * bins)
                if room > 0 and seg - taken > 0:
                    # the new ids exceed every id already in the heap: appending keeps it a heap
                    if room in buckets:
                        buckets[room].extend(ids)
                    else:
                        buckets[room] = list(ids)
                        nonempty |= 1 << room
            pos = end
    return out


def _bfd_limited(sorted_len: np.ndarray, sorted_vision: np.ndarray, sorted_media: np.ndarray, budget: RowBudget) -> np.ndarray:
    """Best-fit decreasing with a vision and/or media limit: per item, rooms upwards, bins by id
    within a room (the first bin that holds the item's patches and media).

    Pruned, still exact: each room's bucket keeps an upper bound of its bins' vision and media
    room (raised on insert, made exact by a scan that finds no fit), and a bucket whose bound
    cannot hold the item is skipped without looking at its bins.
    """
    n = len(sorted_len)
    out = np.empty(n, dtype=np.int64)
    check_vision, check_media = budget.vision_patches is not None, budget.media is not None
    buckets: dict[int, list[int]] = {}  # token room -> open bin ids, ascending
    bound: dict[int, list[int]] = {}  # token room -> [vision room, media room] >= those of its bins
    nonempty = 0
    vision_room: list[int] = []
    media_room: list[int] = []
    count: list[int] = []
    for p, (length, v, m) in enumerate(zip(sorted_len.tolist(), sorted_vision.tolist(), sorted_media.tolist())):
        found = -1
        above, base = nonempty >> length, length
        while above:
            low = (above & -above).bit_length() - 1
            room = base + low
            above >>= low + 1
            base = room + 1
            limit = bound[room]
            if (check_vision and v > limit[0]) or (check_media and m > limit[1]):
                continue
            ids = buckets[room]
            for k, b in enumerate(ids):
                if (not check_vision or v <= vision_room[b]) and (not check_media or m <= media_room[b]):
                    found = b
                    del ids[k]
                    if not ids:
                        del buckets[room], bound[room]
                        nonempty ^= 1 << room
                    break
            if found >= 0:
                break
            bound[room] = [max(vision_room[b] for b in ids), max(media_room[b] for b in ids)]
        if found < 0:
            found, room = len(count), budget.tokens
            vision_room.append(budget.vision_patches or 0)
            media_room.append(budget.media or 0)
            count.append(0)
        out[p] = found
        room -= length
        vision_room[found] -= v
        media_room[found] -= m
        count[found] += 1
        if room > 0 and (budget.segments is None or count[found] < budget.segments):
            if room in buckets:
                bisect.insort(buckets[room], found)
                limit = bound[room]
                limit[0], limit[1] = max(limit[0], vision_room[found]), max(limit[1], media_room[found])
            else:
                buckets[room] = [found]
                bound[room] = [vision_room[found], media_room[found]]
                nonempty |= 1 << room
    return out


class _Pair(NamedTuple):
    """A pool item for ``_best_subset_counted`` (which reads ``.length``)."""

    index: int
    length: int


class _Pool:
    """The refinement pool in ``select_bins`` urgency order (one arrival round: -length, index),
    kept per length: ``by_length[L]`` indices ascending, ``present`` the lengths ascending."""

    def __init__(self, indices: np.ndarray, lengths: np.ndarray) -> None:
        order = np.lexsort((indices, lengths))
        idx, lens = indices[order], lengths[order]
        cuts = np.flatnonzero(np.diff(lens)) + 1
        bounds = zip(np.concatenate([[0], cuts]).tolist(), np.concatenate([cuts, [len(lens)]]).tolist())
        self.by_length: dict[int, list[int]] = {int(lens[a]): idx[a:b].tolist() for a, b in bounds}
        self.present = sorted(self.by_length)

    def __bool__(self) -> bool:
        return bool(self.present)

    def seed(self) -> tuple[int, int]:
        """The most urgent item (longest, then lowest index): ``(index, length)``."""
        length = self.present[-1]
        return self.by_length[length][0], length

    def remove(self, index: int, length: int) -> None:
        ids = self.by_length[length]
        del ids[bisect.bisect_left(ids, index)]
        if not ids:
            del self.by_length[length]
            del self.present[bisect.bisect_left(self.present, length)]

    def pairs(self, room: int, max_count: int | None) -> Iterator[tuple[int, int]]:
        """What ``_useful(pool, room, max_count)`` yields, lazily, as ``(index, length)``: per
        length <= room (longest first), its first ``min(room // length, cap)`` indices."""
        cap = room if max_count is None else max_count
        for k in range(bisect.bisect_right(self.present, room) - 1, -1, -1):
            length = self.present[k]
            for index in self.by_length[length][: min(room // length, cap)]:
                yield index, length


def _complete(pool: _Pool, room: int, max_count: int | None) -> list[tuple[int, int]]:
    """``_best_subset(pool, room, max_count)`` of the online selection, over the lazy pool.

    The unbounded search is ``_best_subset_unbounded`` inlined over the pairs ``_useful`` keeps
    (same bitsets, same early stop, same latest-first backtrack); when its answer breaks
    ``max_count``, ``_best_subset_counted`` runs on the same window: the
    ``max(64, 4 * max_count)`` longest useful items, which (useful items run longest first and
    ``heapq.nlargest`` is stable) are simply the first ones.
    """
    if room <= 0 or max_count == 0:
        return []
    mask = (1 << (room + 1)) - 1
    full = 1 << room
    reach = 1
    seen: list[tuple[int, int]] = []
    before: list[int] = []
    for pair in pool.pairs(room, max_count):
        seen.append(pair)
        before.append(reach)
        reach = (reach | (reach << pair[1])) & mask
        if reach & full:
            break
    total = reach.bit_length() - 1
    chosen: list[tuple[int, int]] = []
    for i in range(len(seen) - 1, -1, -1):
        if total == 0:
            break
        if not (before[i] >> total) & 1:
            chosen.append(seen[i])
            total -= seen[i][1]
    chosen.reverse()
    if max_count is not None and len(chosen) > max_count:
        window = [_Pair(*pair) for pair in itertools.islice(pool.pairs(room, max_count), max(64, 4 * max_count))]
        top = window[:max_count]
        chosen = top if sum(p.length for p in top) <= room else _best_subset_counted(window, room, max_count)
    return chosen


def _refine_loose(indices: np.ndarray, lengths: np.ndarray, budget: RowBudget) -> list[np.ndarray]:
    """Rows of ``select_bins(pool, budget, round_index=0, max_wait_rounds=0, flush=True)`` for a
    token-only budget, each an ascending int64 array of ``indices``.

    Example: indices ``[0, 1, 2]``, lengths ``[6, 4, 3]``, ``RowBudget(tokens=10)`` -> ``[[0, 1], [2]]``.
    """
    pool = _Pool(indices, lengths)
    max_count = None if budget.segments is None else budget.segments - 1
    rows: list[np.ndarray] = []
    while pool:
        seed, seed_length = pool.seed()
        pool.remove(seed, seed_length)
        chosen = _complete(pool, budget.tokens - seed_length, max_count)
        for index, length in chosen:
            pool.remove(index, length)
        rows.append(np.sort(np.array([seed] + [index for index, _ in chosen], dtype=np.int64)))
    return rows


def _csr_by_smallest_member(row_of: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Group positions by ``row_of``; rows ordered by smallest member, members ascending.

    Example: ``row_of [1, 0, 1]`` -> offsets ``[0, 2, 3]``, members ``[0, 2, 1]``.
    """
    n = len(row_of)
    if n == 0:
        return np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64)
    _, dense = np.unique(row_of, return_inverse=True)
    dense = dense.reshape(-1)
    first = np.full(int(dense.max()) + 1, n, dtype=np.int64)
    np.minimum.at(first, dense, np.arange(n, dtype=np.int64))
    rank = np.empty_like(first)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    members = np.argsort(rank[dense], kind="stable")  # stable: positions ascending within a row
    return _offsets(np.bincount(rank[dense], minlength=len(first))), members.astype(np.int64)


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
