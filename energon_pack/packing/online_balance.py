"""Balanced steps for the online loader: cost windows laid out the same way on every rank.

No plan and no communication. Every rank's rows come from the same distribution, so when every
worker orders its own rows the same way, the row a rank reads at a given step costs about what
the other ranks' rows of that step cost. Pure (no Energon, no torch); costs are modelled FLOPs
(:mod:`energon_pack.rows.flops`).

A worker plans a *window* of ``N`` rows (groups chosen from headers, nothing decoded), ranks them
by cost (0 = heaviest, ties by planning order) and emits at its ``k``-th slot of the window the
row of cost rank ``window_levels(...)[k]``. A rank's micro-batches come from its DataLoader
workers in turn (Energon round-robins them), so a worker's slot ``k`` is position
``j = k * num_workers + worker`` of the rank's window: step ``j // m``, slot ``j % m`` of the
step (``m`` = micro-batches per step). The levels depend only on ``N``, the worker index, the
worker count, ``m``, the seed and the window index, never on the data, so slot ``k`` of worker
``w`` holds the same cost rank on every rank:

* the steps of a rank's window get a permutation of step levels (``random.Random(seed, window)``);
* slot ``u`` of a step is cost stratum ``u`` (slot 0 the heaviest rows of the window, ...), the
  odd strata read in reverse step level, so with ``m >= 2`` the heaviest row of the window shares
  its step with the lightest (heavy and light paired inside the rank's own step);
* a worker's positions sorted by (stratum, level) take its rows heaviest first.

See ``docs/balanced_steps.md`` (online section: figures, limits).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

__all__ = ["FIRST_WINDOW_ROWS", "balanced_window_rows", "order_window", "ramped_window_rows", "window_levels"]

#: Rows per worker of a worker's first window (every later one has the configured size), so the
#: first row waits for a few rows' headers, not for a whole window's.
FIRST_WINDOW_ROWS = 8


def balanced_window_rows(requested: int, *, num_workers: int, micro_batches: int) -> int:
    """Rows of a worker's window: ``requested`` rounded up so that the rank's window (``N *
    max(num_workers, 1)`` positions) holds whole steps of ``micro_batches``.

    Example: requested 64, 2 workers, 4 micro-batches -> 64; requested 5, 2 workers, 4 -> 6.
    """
    if requested < 1 or micro_batches < 1 or num_workers < 0:
        raise ValueError(f"requested={requested}, micro_batches={micro_batches} must be >= 1 and num_workers={num_workers} >= 0")
    workers = max(num_workers, 1)
    multiple = micro_batches // math.gcd(micro_batches, workers)
    return -(-requested // multiple) * multiple


def ramped_window_rows(
    requested: int, window: int, *, num_workers: int, micro_batches: int, first: int = FIRST_WINDOW_ROWS
) -> int:
    """Rows of a worker's window number ``window`` (0 first): ``first`` rows for the first window (so
    the first row waits for a few rows' headers, not for ``requested`` rows'), ``requested`` for every
    later one, rounded to whole steps (:func:`balanced_window_rows`). Depends on the window index
    only, so every rank's windows have the same sizes. One short window, not a doubling ramp: every
    row laid out in a short window is balanced less well (a ramp 8, 16, ..., 128 put a worker's first
    248 rows in short windows: DP4 x 2 real loaders read 1.0125 against a rank floor of 1.0021).

    Example: requested 64, 2 workers, 2 micro-batches -> windows 0, 1, 2 have 8, 64, 64 rows.
    """
    if window < 0 or first < 1:
        raise ValueError(f"window={window} must be >= 0 and first={first} >= 1")
    size = min(requested, first) if window == 0 else requested
    return balanced_window_rows(size, num_workers=num_workers, micro_batches=micro_batches)


def window_levels(
    rows: int, *, window: int, worker: int, num_workers: int, micro_batches: int, seed: int
) -> list[int]:
    """Cost rank (0 = heaviest) of the row a worker emits at each of its ``rows`` slots of window
    ``window`` (a permutation of ``range(rows)``; see the module docstring). ``rows`` need not
    hold whole steps (the last window of a finite epoch): the full window's levels are computed
    and the first ``rows`` ranked.

    Example: rows 4, 1 worker, 2 micro-batches -> steps (slots 0, 1) and (2, 3): each step holds
    one of the two heaviest and one of the two lightest, e.g. [0, 3, 1, 2] or [1, 2, 0, 3].
    """
    if not 0 <= worker < max(num_workers, 1):
        raise ValueError(f"worker={worker} is not below num_workers={num_workers}")
    workers = max(num_workers, 1)
    full = balanced_window_rows(max(rows, 1), num_workers=num_workers, micro_batches=micro_batches)
    steps = full * workers // micro_batches
    step_level = list(range(steps))
    random.Random(f"energon_pack.online_balance:{seed}:{window}").shuffle(step_level)
    keys = []
    for k in range(rows):
        step, slot = divmod(k * workers + worker, micro_batches)
        level = step_level[step]
        keys.append((slot, -level if slot % 2 else level, k))
    ranked = sorted(range(rows), key=lambda k: keys[k])
    levels = [0] * rows
    for cost_rank, k in enumerate(ranked):
        levels[k] = cost_rank
    return levels


def order_window(costs: Sequence[float], levels: Sequence[int]) -> list[int]:
    """Indices into ``costs`` (a window's rows in planning order) in emission order: slot ``k``
    emits the row of cost rank ``levels[k]`` (heaviest first, ties by planning order).

    Example: costs [1, 5, 3], levels [2, 0, 1] -> [0, 1, 2] (lightest, heaviest, middle).
    """
    if sorted(levels) != list(range(len(costs))):
        raise ValueError(f"levels {list(levels)} are not a permutation of the {len(costs)} rows' ranks")
    ranked = sorted(range(len(costs)), key=lambda i: (-costs[i], i))
    return [ranked[level] for level in levels]
