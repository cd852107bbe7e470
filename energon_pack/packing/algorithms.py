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

Next to the width W, a row may have a vision budget (`RowBudget`): at most
``vision_patches`` ViT input patches and at most ``media`` images + videos, and (Qwen-Omni) an
audio budget: at most ``audio_frames`` log-mel feature frames.
With such a limit set, every bin and pending group stays within it and the
completion search maximises tokens within all limits
(:func:`_best_subset_budgeted`); with none set, the search, and so every
row, is exactly the token-only one.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["PackItem", "RoundResult", "RoundSize", "RowBudget", "first_fit_decreasing", "select_bins"]


@dataclass(frozen=True)
class PackItem:
    """One packable sample.

    ``index`` is the unique arrival index (stream order), ``length`` the
    aligned length in slots (``ceil(tokens / m) * m``), ``arrival_round`` the
    round in which the sample was first a candidate, ``vision`` its ViT input
    patches (sum of t*h*w over its image and video grids, before the 2x2
    merge), ``media`` its number of images + videos and ``audio`` its log-mel feature frames
    (Qwen-Omni: what the audio encoder reads).
    """

    index: int
    length: int
    arrival_round: int
    vision: int = 0
    media: int = 0
    audio: int = 0


@dataclass(frozen=True, kw_only=True)
class RowBudget:
    """What one row may hold: ``tokens`` slots (the width W), at most ``segments``
    samples, ``vision_patches`` ViT input patches, ``media`` images + videos and
    ``audio_frames`` log-mel feature frames (None = no limit).  Also used for the room left in a partly filled row.

    Example: ``RowBudget(tokens=10, vision_patches=8).fits([PackItem(0, 6, 0, vision=5),
    PackItem(1, 4, 0, vision=4)])`` -> False (9 patches > 8).
    """

    tokens: int
    segments: int | None = None
    vision_patches: int | None = None
    media: int | None = None
    audio_frames: int | None = None

    @property
    def tokens_only(self) -> bool:
        """True when no vision or audio limit is set (the token-only selection applies)."""
        return self.vision_patches is None and self.media is None and self.audio_frames is None

    def fits(self, items: Sequence[PackItem]) -> bool:
        """Whether ``items`` together stay within every limit."""
        return (
            _total(items) <= self.tokens
            and (self.segments is None or len(items) <= self.segments)
            and (self.vision_patches is None or sum(it.vision for it in items) <= self.vision_patches)
            and (self.media is None or sum(it.media for it in items) <= self.media)
            and (self.audio_frames is None or sum(it.audio for it in items) <= self.audio_frames)
        )

    def after(self, items: Sequence[PackItem]) -> RowBudget:
        """The room left once ``items`` are in the row.

        Example: ``RowBudget(tokens=10, media=2).after([PackItem(0, 6, 0, media=1)])``
        -> ``RowBudget(tokens=4, media=1)``.
        """

        def left(limit: int | None, used: int) -> int | None:
            return None if limit is None else limit - used

        return RowBudget(
            tokens=self.tokens - _total(items),
            segments=left(self.segments, len(items)),
            vision_patches=left(self.vision_patches, sum(it.vision for it in items)),
            media=left(self.media, sum(it.media for it in items)),
            audio_frames=left(self.audio_frames, sum(it.audio for it in items)),
        )


@dataclass(frozen=True, kw_only=True)
class RoundSize:
    """When a selection round runs: once ``samples`` new samples have arrived, or once the new
    samples hold at least ``tokens`` aligned slots (exactly one of the two is set).

    Example: ``RoundSize(tokens=16384).is_full(new_samples=3, new_tokens=17000)`` -> True;
    ``RoundSize(samples=16).is_full(new_samples=3, new_tokens=17000)`` -> False.
    """

    samples: int | None = None
    tokens: int | None = None

    def __post_init__(self) -> None:
        if (self.samples is None) == (self.tokens is None):
            raise ValueError(
                f"samples={self.samples}, tokens={self.tokens}: a round size is a number of samples "
                "(buffer_size) or of tokens (buffer_tokens); fix: set exactly one of them"
            )
        for name, value in (("buffer_size", self.samples), ("buffer_tokens", self.tokens)):
            if value is not None and value < 1:
                raise ValueError(f"{name}={value} must be >= 1; e.g. buffer_size=16 or buffer_tokens=2*W.")

    def is_full(self, new_samples: int, new_tokens: int) -> bool:
        """Whether ``new_samples`` arrivals holding ``new_tokens`` aligned slots fill a round."""
        if self.samples is not None:
            return new_samples >= self.samples
        return new_tokens >= self.tokens


@dataclass(frozen=True)
class RoundResult:
    """Outcome of one round: bins to emit now and groups carried to the next round.

    Every candidate is in exactly one emitted bin or one pending group; items
    in a bin are in arrival-index order.
    """

    emitted: list[list[PackItem]]
    pending: list[list[PackItem]]


def first_fit_decreasing(
    lengths: Sequence[int],
    budget: RowBudget,
    *,
    vision: Sequence[int] | None = None,
    media: Sequence[int] | None = None,
    audio: Sequence[int] | None = None,
) -> list[list[int]]:
    """First-fit-decreasing bin packing within ``budget``; returns bins of positions into ``lengths``.

    Items are taken longest first (equal lengths by position) and placed in
    the first bin with room for their tokens (and fewer than ``budget.segments`` items,
    and room for the item's ``vision`` patches, ``media`` count and ``audio`` frames when
    ``budget.vision_patches`` / ``budget.media`` / ``budget.audio_frames`` are set).  Bins are in creation
    order, positions within a bin in placement order.

    Example: ``first_fit_decreasing([3, 5, 2, 4], RowBudget(tokens=7))``
    -> ``[[1, 2], [3, 0]]`` (5+2, 4+3); with ``vision=[0, 4, 4, 0]`` and
    ``RowBudget(tokens=7, vision_patches=6)`` -> ``[[1], [3, 0], [2]]`` (5 and 2 would carry 8 patches).
    """
    _check_budget(budget)
    items = [
        PackItem(
            index=i,
            length=length,
            arrival_round=0,
            vision=0 if vision is None else vision[i],
            media=0 if media is None else media[i],
            audio=0 if audio is None else audio[i],
        )
        for i, length in enumerate(lengths)
    ]
    return _first_fit_decreasing(items, budget)


def _first_fit_decreasing(items: Sequence[PackItem], budget: RowBudget) -> list[list[int]]:
    """First-fit-decreasing of ``items`` within ``budget``; bins of positions into ``items``."""
    order = sorted(range(len(items)), key=lambda i: (-items[i].length, i))
    bins: list[list[int]] = []
    rooms: list[RowBudget] = []
    for i in order:
        item = items[i]
        _check_item(i, item, budget)
        for b, room in enumerate(rooms):
            if room.fits([item]):
                bins[b].append(i)
                rooms[b] = room.after([item])
                break
        else:
            bins.append([i])
            rooms.append(budget.after([item]))
    return bins


def select_bins(
    candidates: Sequence[PackItem],
    budget: RowBudget,
    *,
    round_index: int,
    min_fill: float,
    max_wait_rounds: int,
    flush: bool = False,
) -> RoundResult:
    """Choose the bins one round emits and the groups it carries forward.

    ``budget.tokens`` is the bin width W in slots; a bin's fill is the sum of its
    aligned lengths / W.  A candidate is forced when ``flush`` is set or
    ``round_index - arrival_round >= max_wait_rounds``; forced candidates are
    always emitted, so no sample waits more than ``max_wait_rounds`` rounds.
    The result depends only on the set of candidates, not on their order.
    ``budget.segments`` / ``budget.vision_patches`` / ``budget.media`` / ``budget.audio_frames``
    bound each bin's (and pending group's) count and sums of ``vision``, ``media`` and ``audio``;
    None sets no bound.

    Example (``RowBudget(tokens=10)``, min_fill=0.9, max_wait_rounds=2, round 0):
    lengths 6, 4, 3 (indices 0, 1, 2, all new)
    -> emitted ``[[#0 (6), #1 (4)]]`` (fill 1.0), pending ``[[#2 (3)]]``.
    Lengths 6, 4, 4 with vision 6, 5, 0 and ``max_vision_patches=8``: #0 and
    #1 cannot share a row -> emitted ``[[#0 (6), #2 (4)]]``, pending ``[[#1 (4)]]``.
    """
    capacity = budget.tokens
    _check_round_args(budget, min_fill, max_wait_rounds)
    _check_candidates(candidates, budget, round_index)
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
        chosen = [seed] + _best_subset_within(others, budget.after([seed]))
        if not forced(seed) and _total(chosen) < threshold:
            failed_seeds.add(seed.index)
            chosen = _best_subset_within(pool, budget)
            if _total(chosen) < threshold:
                break
        emitted.append(sorted(chosen, key=lambda it: it.index))
        taken = {it.index for it in chosen}
        pool = [it for it in pool if it.index not in taken]

    pending = [
        [pool[p] for p in sorted(group, key=lambda p: pool[p].index)]
        for group in _first_fit_decreasing(pool, budget)
    ]
    return RoundResult(emitted=emitted, pending=pending)


def _total(items: Sequence[PackItem]) -> int:
    return sum(it.length for it in items)


def _best_subset_within(items: Sequence[PackItem], room: RowBudget) -> list[PackItem]:
    """The completion of a row with ``room`` left: :func:`_best_subset` without a vision or audio
    limit (so rows stay those of the token-only selection), else :func:`_best_subset_budgeted`."""
    if room.tokens_only:
        return _best_subset(items, room.tokens, room.segments)
    return _best_subset_budgeted(items, room)


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


_UNREACHABLE = 1 << 62  # larger than any packed cost key of _best_subset_budgeted


def _best_subset_budgeted(items: Sequence[PackItem], room: RowBudget) -> list[PackItem]:
    """The subset of ``items`` with the largest token total within every limit of ``room``.

    Dynamic programme over token sums (numpy, one pass per item in the given
    order): ``best[s]`` holds the smallest cost key (vision patches, then audio
    frames, then media, then samples, each counted only when ``room`` limits it) of a
    subset of the items seen so far with total ``s`` that stays within the
    limits.  Exact (the largest reachable total) when one limit besides
    tokens is set; with several, the subset kept per total is the one with
    the smallest key, so every limit holds but a total reachable only through
    more vision patches may be missed.  Stops at the first item with which
    ``room.tokens`` is reached exactly; ties keep the earlier items.

    Example: lengths 5, 5, 4 with vision 6, 0, 3 and room (tokens 10,
    vision 5) -> the items of lengths 5 (vision 0) and 4 (total 9): 5+5 would
    carry 6 patches, and 5 (vision 6) alone breaks the limit.
    """
    if room.tokens <= 0 or room.segments == 0:
        return []
    fitting = [it for it in items if room.fits([it])]
    vision_limit, media_limit, count_limit = room.vision_patches, room.media, room.segments
    audio_limit = room.audio_frames
    # Cost key = ((vision * audio_base + audio) * media_base + media) * count_base + count; each
    # base exceeds twice its limit, so adding one item's key to a key within the limits never carries.
    audio_base = 1 if audio_limit is None else 2 * audio_limit + 1
    media_base = 1 if media_limit is None else 2 * media_limit + 1
    count_base = 1 if count_limit is None else 2 * count_limit + 1
    if 2 * ((vision_limit or 0) + 1) * audio_base * media_base * count_base >= _UNREACHABLE:
        raise ValueError(
            f"row budget {room} is too large for the packed cost key; lower max_row_vision_patches, "
            "max_row_audio_frames, max_row_media or max_segments."
        )

    def key(it: PackItem) -> int:
        vision = 0 if vision_limit is None else it.vision
        audio = 0 if audio_limit is None else it.audio
        media = 0 if media_limit is None else it.media
        return ((vision * audio_base + audio) * media_base + media) * count_base + (count_limit is not None)

    size = room.tokens + 1
    best = np.full(size, _UNREACHABLE, dtype=np.int64)
    best[0] = 0
    improved: list[np.ndarray] = []  # improved[i][s]: item i lowered best[s]
    for it in fitting:
        before = best[: size - it.length]
        cost = before + key(it)
        ok = (before < _UNREACHABLE) & (cost < best[it.length :])
        if vision_limit is not None:
            ok &= cost // (audio_base * media_base * count_base) <= vision_limit
        if audio_limit is not None:
            ok &= cost // (media_base * count_base) % audio_base <= audio_limit
        if media_limit is not None:
            ok &= cost // count_base % media_base <= media_limit
        if count_limit is not None:
            ok &= cost % count_base <= count_limit
        mask = np.zeros(size, dtype=bool)
        mask[it.length :] = ok
        best[it.length :] = np.where(ok, cost, best[it.length :])
        improved.append(mask)
        if best[room.tokens] < _UNREACHABLE:
            break
    total = int(np.flatnonzero(best < _UNREACHABLE)[-1])
    # best[total] was set by the last item that improved it, from the state of total - length
    # before that item, which the last earlier improver of that total set, and so on.
    chosen: list[PackItem] = []
    position = len(improved) - 1
    while total > 0:
        while not improved[position][total]:
            position -= 1
        chosen.append(fitting[position])
        total -= fitting[position].length
        position -= 1
    chosen.reverse()
    return chosen


def _check_capacity(capacity: int, max_segments: int | None) -> None:
    if capacity < 1:
        raise ValueError(f"capacity={capacity} must be >= 1 slot; pass the row width W (seq_length).")
    if max_segments is not None and max_segments < 1:
        raise ValueError(
            f"max_segments={max_segments} must be >= 1 or None; pass None for no segment limit."
        )


def _check_budget(budget: RowBudget) -> None:
    _check_capacity(budget.tokens, budget.segments)
    for name, value in (
        ("max_row_vision_patches", budget.vision_patches),
        ("max_row_media", budget.media),
        ("max_row_audio_frames", budget.audio_frames),
    ):
        if value is not None and value < 1:
            raise ValueError(f"{name}={value} must be >= 1 or None; pass None for no such limit per row.")


def _check_item(index: int, item: PackItem, budget: RowBudget) -> None:
    """Reject an item that could never be packed within ``budget`` (or has a negative count)."""
    _check_length(index, item.length, budget.tokens)
    for what, value, limit, name in (
        ("vision patches", item.vision, budget.vision_patches, "max_row_vision_patches"),
        ("media", item.media, budget.media, "max_row_media"),
        ("audio frames", item.audio, budget.audio_frames, "max_row_audio_frames"),
    ):
        if value < 0:
            raise ValueError(f"sample {index} has {value} {what}; counts must be >= 0.")
        if limit is not None and value > limit:
            raise ValueError(
                f"sample {index} has {value} {what} > {name} {limit}; filter such samples before "
                f"packing (on_overlong='skip' or 'shrink') or raise {name}."
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


def _check_round_args(budget: RowBudget, min_fill: float, max_wait_rounds: int) -> None:
    _check_budget(budget)
    if not 0.0 < min_fill <= 1.0:
        raise ValueError(f"min_fill={min_fill} must be in (0, 1]; e.g. 0.97.")
    if max_wait_rounds < 0:
        raise ValueError(
            f"max_wait_rounds={max_wait_rounds} must be >= 0; 0 emits every candidate every round."
        )


def _check_candidates(candidates: Sequence[PackItem], budget: RowBudget, round_index: int) -> None:
    seen: set[int] = set()
    for it in candidates:
        _check_item(it.index, it, budget)
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
