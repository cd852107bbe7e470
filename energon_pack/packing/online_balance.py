"""Balanced steps for the online loader: a sliding window of planned rows, laid out the same way on every rank.

No plan and no communication. Every rank's rows come from the same distribution, so when every
worker emits rows at the same cost quantiles in the same order, the row a rank reads at a given
step costs about what the other ranks' rows of that step cost. Pure (no Energon, no torch); costs
are modelled FLOPs (:mod:`energon_pack.rows.flops`).

A worker keeps a *pool* of planned rows (groups chosen from headers, nothing decoded), the first
``pool_rows(N, k)`` of its ready rows in planning order when it emits its ``k``-th row: one row at
first, ``ramp`` more per row emitted, then ``N`` (``balance_window_rows``, in whole steps), at
most ``POOL_SAMPLES`` samples (:func:`pool_size`). Row ``k`` is the pool's row at the quantile of
cost level ``level_of(k, ...)`` of a window of ``N`` (:func:`pick_rank`): the levels are
:func:`window_levels` of window ``k // N``, position ``k % N``. A rank's micro-batches come from its DataLoader workers in turn (Energon round-robins them), so a
worker's ``k``-th row of a window is position ``j = k * num_workers + worker`` of the rank's
window: step ``j // m``, slot ``j % m`` (``m`` = micro-batches per step). The levels depend only on
``N``, the worker index, the worker count, ``m``, the seed and the window index, never on the
data, so row ``k`` of worker ``w`` holds the same cost quantile on every rank:

* the steps of a rank's window get a permutation of step levels (``random.Random(seed, window)``);
* slot ``u`` of a step is cost stratum ``u`` (slot 0 the heaviest rows of the window, ...), the
  odd strata read in reverse step level, so with ``m >= 2`` the heaviest row of the window shares
  its step with the lightest (heavy and light paired inside the rank's own step);
* a worker's positions sorted by (stratum, level) take its rows heaviest first.

The pool slides: each row emitted is replaced by the next planned row, so a worker never waits
for a whole window to be planned (the ramp plans ``ramp`` rows per row emitted until the pool
holds ``N``), and a row's quantile is read from ``N`` rows' costs once the pool is full.
:func:`sliding_order` is the whole layout of a worker's rows in planning order. See
``docs/balanced_steps.md`` (online section: figures, limits).
"""

from __future__ import annotations

import bisect
import functools
import math
import random
from collections.abc import Sequence

__all__ = ["POOL_RAMP", "POOL_SAMPLES", "balanced_window_rows", "level_of", "pick_rank", "pool_rows", "pool_size",
           "sliding_order", "window_levels"]

#: Rows a worker plans per row it emits while its pool fills (then one per row): the first row
#: waits for one row's headers, the pool holds ``N`` rows after ``N / POOL_RAMP`` rows. Rows picked
#: from a small pool are laid out from few rows' costs: on DP4 x 2 real loaders' rows, 1024-row
#: windows, 512 rows a rank read 0.0038 over the rank floor at a ramp of 4, 0.0028 at 32, 0.0027
#: with the whole window planned before the first row (docs/balanced_steps.md).
POOL_RAMP = 32

#: Samples a worker's pool holds at most (as restore keys), whatever its rows: rows of many samples
#: vary less in cost (their samples average out), so fewer of them resolve the quantiles as well,
#: and a pool of ``N`` such rows would read ``N`` rows of headers while it fills and put them all
#: in every checkpoint (the realistic mix's rows hold about 24 samples: 24,000 at 1024 rows). The
#: cap may differ between ranks: it sets how finely a rank's pool resolves a quantile, not which
#: quantile a row is (the levels depend on ``N`` only).
POOL_SAMPLES = 4096


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


def pool_rows(window_rows: int, emitted: int, *, ramp: int = POOL_RAMP) -> int:
    """Rows of a worker's pool when it emits its row number ``emitted`` (0 first): one, ``ramp``
    more per row emitted, at most ``window_rows``.

    Example: window_rows 64, ramp 32 -> emitted 0, 1, 2, 3 pool 1, 33, 64, 64 rows.
    """
    if window_rows < 1 or emitted < 0 or ramp < 1:
        raise ValueError(f"window_rows={window_rows} and ramp={ramp} must be >= 1 and emitted={emitted} >= 0")
    return min(window_rows, 1 + ramp * emitted)


def pool_size(samples: Sequence[int], rows: int, *, max_samples: int = POOL_SAMPLES) -> int:
    """Bins of a worker's pool: the longest prefix of its ready bins (``samples``: each one's
    sample count, planning order) of at most ``rows`` bins and ``max_samples`` samples, at least
    one (0 when none is ready).

    Example: samples [3, 3, 3], rows 3, max_samples 7 -> 2; samples [9], rows 4, max_samples 7 -> 1.
    """
    size, total = 0, 0
    for count in samples[:rows]:
        if size and total + count > max_samples:
            break
        size, total = size + 1, total + count
    return size


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


def level_of(emitted: int, *, window_rows: int, worker: int, num_workers: int, micro_batches: int, seed: int) -> int:
    """Cost level (0 = heaviest of ``window_rows``) of a worker's row number ``emitted``:
    :func:`window_levels` of window ``emitted // window_rows`` at ``emitted % window_rows`` (the
    latest windows' levels are cached: a worker asks for every row of a window in turn).

    Example: window_rows 4, 1 worker, 2 micro-batches, emitted 0..3 -> e.g. 0, 3, 1, 2.
    """
    window, position = divmod(emitted, window_rows)
    return _cached_levels(window_rows, window, worker, num_workers, micro_batches, seed)[position]


@functools.lru_cache(maxsize=8)
def _cached_levels(rows: int, window: int, worker: int, num_workers: int, micro_batches: int,
                   seed: int) -> tuple[int, ...]:
    return tuple(window_levels(rows, window=window, worker=worker, num_workers=num_workers,
                               micro_batches=micro_batches, seed=seed))


def pick_rank(pool: int, level: int, window_rows: int) -> int:
    """Cost rank (0 = heaviest) in a pool of ``pool`` rows of the row at the quantile of cost level
    ``level`` of ``window_rows``: ``(2 level + 1) pool // (2 window_rows)``.

    Example: pool 3, window_rows 4 -> level 0: 0 (the heaviest); level 3: 2 (the lightest); a full
    pool (3 of 3) -> the level itself.
    """
    if pool < 1 or not 0 <= level < window_rows:
        raise ValueError(f"level={level} must be in [0, window_rows={window_rows}) and pool={pool} >= 1")
    return (2 * level + 1) * pool // (2 * window_rows)


def sliding_order(
    costs: Sequence[float], *, window_rows: int, worker: int, num_workers: int, micro_batches: int, seed: int,
    ramp: int = POOL_RAMP, samples: Sequence[int] | None = None, max_samples: int = POOL_SAMPLES,
) -> list[int]:
    """Emission order of a worker's rows (``costs`` in planning order; ``window_rows`` in whole
    steps, :func:`balanced_window_rows`): row ``k`` is the row of cost rank :func:`pick_rank` (ties
    by planning order) among the rows not yet emitted of :func:`pool_size` (at most
    :func:`pool_rows` rows and, with each row's ``samples``, ``max_samples`` samples), at
    :func:`level_of` ``k``. The whole layout of the balanced stage: its rows are its plain rows in
    this order.

    Example: costs [1, 5, 3, 2], window_rows 4, 1 worker, 2 micro-batches, seed 0, ramp 4 -> [0, 2, 1, 3]
    (row 0 from a pool of one; levels 2, 0, 3 then take the 3, the 5 and the 2).
    """
    pool: list[tuple[float, int]] = []  # (-cost, planning position), sorted: cost rank order
    held = 0  # samples of the pool's rows
    arrived = 0
    order = []
    for emitted in range(len(costs)):
        size = pool_rows(window_rows, emitted, ramp=ramp)
        while len(pool) < size and arrived < len(costs):
            count = 1 if samples is None else samples[arrived]
            if pool and held + count > max_samples:
                break
            bisect.insort(pool, (-costs[arrived], arrived))
            held += count
            arrived += 1
        level = level_of(emitted, window_rows=window_rows, worker=worker, num_workers=num_workers,
                         micro_batches=micro_batches, seed=seed)
        row = pool.pop(pick_rank(len(pool), level, window_rows))[1]
        held -= 1 if samples is None else samples[row]
        order.append(row)
    return order
