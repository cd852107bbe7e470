"""Pure bin selection for fixed-width packing (no Energon, no torch).

A *round* receives candidate samples (new arrivals plus the samples of the
pending groups carried from earlier rounds), each with its aligned length in
physical slots, and splits them into bins of at most ``capacity`` slots:

* bins filled to at least ``min_fill`` are emitted;
* a bin holding a *forced* sample (one that has waited ``max_wait_rounds``
  rounds, or any sample in a flush round) is emitted whatever its fill;
* everything else stays pending for the next round.

Bins are built one at a time, each seeded with the most urgent remaining
sample (oldest arrival round, then longest, then lowest arrival index) and
completed by an exact subset-sum over the other candidates, taken in the
same urgency order, so that the gap is closed as tightly as possible and old
samples are used first.  If a seed cannot reach ``min_fill``, the best bin
without a seed constraint is tried instead.  Everything is deterministic:
ties are broken by arrival index, never by hash or dict order.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

__all__ = ["PackItem", "RoundResult", "aligned_length", "first_fit_decreasing", "select_bins"]


def aligned_length(length: int, multiple: int) -> int:
    """Physical slots a sample of ``length`` tokens occupies: ceil(length / multiple) * multiple.

    Example: aligned_length(5, 4) -> 8; aligned_length(8, 4) -> 8.
    """
    return -(-length // multiple) * multiple


@dataclass(frozen=True)
class PackItem:
    """One packable sample.

    ``index`` is the unique arrival index (stream order), ``length`` the
    aligned length in slots (``ceil(tokens / m) * m``), ``arrival_round`` the
    round in which the sample was first a candidate.
    """

    index: int
    length: int
    arrival_round: int


@dataclass(frozen=True)
class RoundResult:
    """Outcome of one round: bins to emit now and groups carried to the next round.

    Every candidate is in exactly one emitted bin or one pending group; items
    in a bin are in arrival-index order.
    """

    emitted: list[list[PackItem]]
    pending: list[list[PackItem]]


def first_fit_decreasing(
    lengths: Sequence[int], capacity: int, max_segments: int | None = None
) -> list[list[int]]:
    """First-fit-decreasing bin packing; returns bins of positions into ``lengths``.

    Items are taken longest first (equal lengths by position) and placed in
    the first bin with room (and fewer than ``max_segments`` items).  Bins
    are in creation order, positions within a bin in placement order.

    Example: ``first_fit_decreasing([3, 5, 2, 4], capacity=7)``
    -> ``[[1, 2], [3, 0]]`` (5+2, 4+3).
    """
    _check_capacity(capacity, max_segments)
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    free: list[int] = []
    for i in order:
        length = lengths[i]
        _check_length(i, length, capacity)
        for b, room in enumerate(free):
            if length <= room and (max_segments is None or len(bins[b]) < max_segments):
                bins[b].append(i)
                free[b] = room - length
                break
        else:
            bins.append([i])
            free.append(capacity - length)
    return bins


def select_bins(
    candidates: Sequence[PackItem],
    *,
    capacity: int,
    round_index: int,
    min_fill: float,
    max_wait_rounds: int,
    max_segments: int | None = None,
    flush: bool = False,
) -> RoundResult:
    """Choose the bins one round emits and the groups it carries forward.

    ``capacity`` is the bin width W in slots; a bin's fill is the sum of its
    aligned lengths / W.  A candidate is forced when ``flush`` is set or
    ``round_index - arrival_round >= max_wait_rounds``; forced candidates are
    always emitted, so no sample waits more than ``max_wait_rounds`` rounds.
    The result depends only on the set of candidates, not on their order.

    Example (W=10, min_fill=0.9, max_wait_rounds=2, round 0):
    lengths 6, 4, 3 (indices 0, 1, 2, all new)
    -> emitted ``[[#0 (6), #1 (4)]]`` (fill 1.0), pending ``[[#2 (3)]]``.
    """
    _check_round_args(capacity, min_fill, max_wait_rounds, max_segments)
    _check_candidates(candidates, capacity, round_index)
    pool = sorted(candidates, key=lambda it: (it.arrival_round, -it.length, it.index))
    threshold = min_fill * capacity

    def forced(item: PackItem) -> bool:
        return flush or round_index - item.arrival_round >= max_wait_rounds

    # Each pass emits one bin or marks one seed as failed; forced samples lead
    # the urgency order, so they are all seeded (and emitted) first.
    emitted: list[list[PackItem]] = []
    failed_seeds: set[int] = set()
    while pool:
        seed_pos = next((p for p, it in enumerate(pool) if it.index not in failed_seeds), None)
        if seed_pos is None:
            break
        seed = pool[seed_pos]
        others = pool[:seed_pos] + pool[seed_pos + 1 :]
        chosen = [seed] + _best_subset(
            others,
            capacity - seed.length,
            None if max_segments is None else max_segments - 1,
        )
        if not forced(seed) and _total(chosen) < threshold:
            failed_seeds.add(seed.index)
            chosen = _best_subset(pool, capacity, max_segments)
            if _total(chosen) < threshold:
                break
        emitted.append(sorted(chosen, key=lambda it: it.index))
        taken = {it.index for it in chosen}
        pool = [it for it in pool if it.index not in taken]

    pending = [
        [pool[p] for p in sorted(group, key=lambda p: pool[p].index)]
        for group in first_fit_decreasing([it.length for it in pool], capacity, max_segments)
    ]
    return RoundResult(emitted=emitted, pending=pending)


def _total(items: Sequence[PackItem]) -> int:
    return sum(it.length for it in items)


def _best_subset(
    items: Sequence[PackItem], room: int, max_count: int | None
) -> list[PackItem]:
    """The subset of ``items`` with the largest total <= ``room`` and at most
    ``max_count`` items; among equal totals, one that uses the earliest items.

    Exact without a count limit.  When the limit binds, only the longest
    ``max(64, 4 * max_count)`` items are searched, which bounds the cost.
    """
    if room <= 0 or max_count == 0:
        return []
    chosen = _best_subset_unbounded(_useful(items, room, max_count), room)
    if max_count is not None and len(chosen) > max_count:
        useful = list(_useful(items, room, max_count))
        longest = heapq.nlargest(
            max(64, 4 * max_count), range(len(useful)), key=lambda p: useful[p].length
        )
        window = [useful[p] for p in sorted(longest)]
        top = [useful[p] for p in sorted(longest[:max_count])]
        # If the max_count longest items fit together, no subset can beat them.
        chosen = top if _total(top) <= room else _best_subset_counted(window, room, max_count)
    return chosen


def _useful(items: Iterable[PackItem], room: int, max_count: int | None) -> Iterator[PackItem]:
    """``items`` without those that cannot fit and without copies of a length
    beyond what ``room`` (or ``max_count``) could hold; earliest copies kept.
    Dropping them never changes the best subset."""
    cap = room if max_count is None else max_count
    copies: dict[int, int] = {}
    for it in items:
        limit = room // it.length
        used = copies.get(it.length, 0)
        if used < limit and used < cap:
            copies[it.length] = used + 1
            yield it


def _best_subset_unbounded(items: Iterable[PackItem], room: int) -> list[PackItem]:
    """Exact subset-sum with Python integers as bitsets (bit s set = sum s reachable).

    Stops at the first item with which ``room`` is reached exactly; the
    backtrack then skips every item that is not needed, latest first.
    """
    mask = (1 << (room + 1)) - 1
    full = 1 << room
    reach = 1
    seen: list[PackItem] = []
    before: list[int] = []  # reach before seen[i]
    for it in items:
        seen.append(it)
        before.append(reach)
        reach = (reach | (reach << it.length)) & mask
        if reach & full:
            break
    total = reach.bit_length() - 1
    chosen: list[PackItem] = []
    for i in range(len(seen) - 1, -1, -1):
        if total == 0:
            break
        if not (before[i] >> total) & 1:  # total unreachable without seen[i]
            chosen.append(seen[i])
            total -= seen[i].length
    chosen.reverse()
    return chosen


def _best_subset_counted(items: Sequence[PackItem], room: int, max_count: int) -> list[PackItem]:
    """Like :func:`_best_subset_unbounded`, with one bitset per item count 0..max_count."""
    mask = (1 << (room + 1)) - 1
    full = 1 << room
    layers = [1] + [0] * max_count  # layers[k]: sums reachable with exactly k items
    before: list[list[int]] = []
    for it in items:
        before.append(layers.copy())
        for k in range(max_count, 0, -1):
            if layers[k - 1]:
                layers[k] |= (layers[k - 1] << it.length) & mask
        if any(layer & full for layer in layers):
            break
    # Largest total, then fewest items.
    total, count = max((layer.bit_length() - 1, -k) for k, layer in enumerate(layers))
    count = -count
    chosen: list[PackItem] = []
    for i in range(len(before) - 1, -1, -1):
        if count == 0:
            break
        if not (before[i][count] >> total) & 1:  # (count, total) unreachable without items[i]
            chosen.append(items[i])
            total -= items[i].length
            count -= 1
    chosen.reverse()
    return chosen


def _check_capacity(capacity: int, max_segments: int | None) -> None:
    if capacity < 1:
        raise ValueError(f"capacity={capacity} must be >= 1 slot; pass the row width W (seq_length).")
    if max_segments is not None and max_segments < 1:
        raise ValueError(
            f"max_segments={max_segments} must be >= 1 or None; pass None for no segment limit."
        )


def _check_length(index: int, length: int, capacity: int) -> None:
    if length < 1:
        raise ValueError(
            f"sample {index} has length {length}; aligned lengths must be >= 1 slot "
            "(drop empty samples before packing)."
        )
    if length > capacity:
        raise ValueError(
            f"sample {index} has aligned length {length} > capacity {capacity}; "
            "filter overlong samples before packing (on_overlong='skip') or raise seq_length."
        )


def _check_round_args(
    capacity: int, min_fill: float, max_wait_rounds: int, max_segments: int | None
) -> None:
    _check_capacity(capacity, max_segments)
    if not 0.0 < min_fill <= 1.0:
        raise ValueError(f"min_fill={min_fill} must be in (0, 1]; e.g. 0.97.")
    if max_wait_rounds < 0:
        raise ValueError(
            f"max_wait_rounds={max_wait_rounds} must be >= 0; 0 emits every candidate every round."
        )


def _check_candidates(candidates: Sequence[PackItem], capacity: int, round_index: int) -> None:
    seen: set[int] = set()
    for it in candidates:
        _check_length(it.index, it.length, capacity)
        if it.index in seen:
            raise ValueError(
                f"sample index {it.index} appears twice among the candidates; indices must be unique."
            )
        seen.add(it.index)
        if it.arrival_round > round_index:
            raise ValueError(
                f"sample {it.index} has arrival_round {it.arrival_round} > round_index {round_index}; "
                "a candidate cannot arrive after the round that packs it."
            )
