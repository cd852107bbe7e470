"""The reference global planner: best-fit decreasing plus subset-sum refinement in plain Python
lists, as energon_pack shipped it before the array planner (``energon_pack.packing.global_plan``).

Kept as the oracle of the property tests: the array planner must give exactly these rows.
Quadratic in the loose rows; for tests only.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from energon_pack.packing.algorithms import PackItem, RowBudget, _check_budget, _check_item, select_bins


def best_fit_decreasing(
    lengths: Sequence[int], budget: RowBudget, *, vision: Sequence[int] | None = None, media: Sequence[int] | None = None
) -> list[list[int]]:
    """The reference best-fit decreasing: one sorted ``(room, bin)`` list, scanned per item."""
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
    lengths: Sequence[int], budget: RowBudget, *, min_fill: float, vision: Sequence[int] | None = None, media: Sequence[int] | None = None
) -> list[list[int]]:
    """The reference plan: best-fit decreasing, then ``select_bins`` over the loose rows."""
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
