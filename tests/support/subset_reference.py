"""Test helper: the brute-force reference of the budgeted subset search (``packing.algorithms``)."""

from __future__ import annotations

import itertools

from energon_pack.packing.algorithms import PackItem, RowBudget


def brute_force_best(items: list[PackItem], room: RowBudget) -> int:
    """The largest token total of a subset of ``items`` within every limit of ``room`` (all subsets tried)."""
    return max(
        sum(it.length for it in subset)
        for k in range(len(items) + 1)
        for subset in itertools.combinations(items, k)
        if room.fits(subset)
    )
