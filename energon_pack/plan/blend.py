"""Pack plans over a metadataset's blend: which samples of each source a plan holds, and in which
order its rows are read (pure; ``plan.build`` measures the leaves and packs).

A *unit* is what a share counts (``energon_pack.config.blend``): 1 per sample (``samples``) or a
sample's real tokens (``tokens``). Selection works on the units of each source's good samples:

* ``blend`` weights (shares ``p_i``): the source that runs out first at its share defines the
  epoch, ``T = min_i U_i / p_i`` over the sources of positive weight (``U_i``: all units of source
  i); every other source contributes a seeded selection of its samples whose units are the closest
  prefix sum to ``T * p_i`` (so its share is exact to within one sample); a weight of 0 selects
  nothing.
* ``blend_epochized`` repetitions ``r_i``: each sample ``floor(r_i)`` times, plus a seeded subset
  of ``round(frac(r_i) * n_i)`` samples (units play no part: the shares are what the repetitions give).

Row order (:func:`interleave_rows`): rows packed best-fit-decreasing are homogeneous by length,
so a random permutation front-loads one source. Rows are instead taken one at a time, among the
next row of each source's bucket (rows grouped by the source holding most of their units, each
bucket in a seeded order), the one after which the units read so far are closest to the target
shares: every stretch of rows then carries the shares to within about one row's units.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from energon_pack.config import PackingConfig
from energon_pack.config.blend import weights_problem
from energon_pack.errors import UsageError

__all__ = [
    "blend_plan_problem",
    "blend_report",
    "blend_row_order",
    "blend_selection",
    "interleave_rows",
    "select_by_repetitions",
    "select_by_weights",
]

#: The blend units a plan can meet: supervised tokens are not measured by ``plan``.
PLAN_BLEND_UNITS = ("samples", "tokens")


def blend_plan_problem(config: PackingConfig) -> str | None:
    """Why ``config`` cannot plan a metadataset's blend (None: it can).

    Example: ``blend_unit="supervised_tokens"`` -> ``"blend_unit='supervised_tokens': a pack plan ..."``.
    """
    policy = config.policy
    if policy.blend_unit not in PLAN_BLEND_UNITS:
        return (
            f"blend_unit={policy.blend_unit!r}: a pack plan measures real tokens, not supervised tokens, so it "
            "meets shares of samples or tokens only; fix: set blend_unit: tokens (or samples) to plan this "
            "blend, or read it with the online loader (no plan)"
        )
    if policy.blend_schedule is not None:
        return (
            "blend_schedule: a pack plan holds one blend for its whole epoch, not weights that change over "
            "training steps; fix: remove blend_schedule to plan this blend, or read it with the online loader (no plan)"
        )
    if policy.balance_steps:
        return (
            "balance_steps: balanced steps reorder a plan's rows by cost, which would undo the order that keeps "
            "every stretch of rows at the blend's shares; fix: set balance_steps: false to plan a metadataset"
        )
    return None


def blend_selection(
    tokens: np.ndarray, blend: Mapping[str, Any], *, unit: str, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(kept, source_of)``: the global sample indices a plan packs (repeated ones listed again, in
    source order) and each global index's source (int [N]).

    ``tokens``: int [N], real tokens of every global sample index, negative for a sample not
    measured (skipped); ``blend``: a plan fingerprint's ``dataset.blend`` (mode and leaves with
    ``samples``, ``weight``, ``repetitions``). Example: two leaves of 2 samples, tokens
    ``[10, 10, 5, 5]``, weights 1:1 under ``tokens``: source 1 runs out first (10 tokens), source 0
    gives a seeded one of its samples -> kept ``[1, 2, 3]`` (or ``[0, 2, 3]``), source_of ``[0, 0, 1, 1]``.
    """
    leaves = blend["leaves"]
    sizes = [int(leaf["samples"]) for leaf in leaves]
    source_of = np.repeat(np.arange(len(sizes)), sizes)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    good = [lo + np.flatnonzero(tokens[lo:hi] >= 0) for lo, hi in zip(starts[:-1], starts[1:])]
    if blend["mode"] == "weights":
        problem = weights_problem("the metadataset's blend weights", [leaf["weight"] for leaf in leaves])
        if problem is not None:
            raise UsageError(problem)
    for leaf, samples in zip(leaves, good):
        if not len(samples) and (leaf["weight"] or 0) > 0:
            raise UsageError(
                f"blend leaf {leaf['path']!r} (split {leaf['split']!r}): none of its {leaf['samples']} samples can be "
                f"packed (all skipped), so its weight {leaf['weight']} can never be met; fix: see the plan's skip "
                "reasons (docs/bad_input_policy.md), or give that entry weight 0 or remove it from the metadataset"
            )
    if blend["mode"] == "repetitions":
        repetitions = [1.0 if leaf["repetitions"] is None else leaf["repetitions"] for leaf in blend["leaves"]]
        chosen = select_by_repetitions([len(g) for g in good], repetitions, seed=seed)
    else:
        units = [tokens[g] if unit == "tokens" else np.ones(len(g), dtype=np.int64) for g in good]
        chosen = select_by_weights(units, [leaf["weight"] for leaf in blend["leaves"]], seed=seed)
    kept = np.concatenate([g[c] for g, c in zip(good, chosen)]) if good else np.zeros(0, dtype=np.int64)
    return kept.astype(np.int64), source_of


def blend_row_order(
    source_of: np.ndarray, units: np.ndarray, *, seed: int
) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """The ``row_order`` of ``plan.build.plan_measurement`` for a blend: :func:`interleave_rows` over
    each row's units per source (``units``: int [N] per global sample index, ``source_of`` its source)."""

    def order(row_offsets: np.ndarray, members: np.ndarray) -> np.ndarray:
        rows = np.repeat(np.arange(len(row_offsets) - 1), np.diff(row_offsets))
        compositions = np.zeros((len(row_offsets) - 1, int(source_of.max(initial=0)) + 1))
        np.add.at(compositions, (rows, source_of[members]), units[members])
        return interleave_rows(compositions, seed=seed)

    return order


def _seeded_order(size: int, *, seed: int, source: int) -> np.ndarray:
    return np.random.default_rng([seed, source]).permutation(size)


def select_by_weights(units: Sequence[np.ndarray], weights: Sequence[float], *, seed: int) -> list[np.ndarray]:
    """Per source, the positions (into ``units[i]``) of the samples a ``blend`` plan holds.

    ``units[i]``: int [n_i], the units of source i's good samples. The source with the smallest
    ``U_i / p_i`` is taken whole; the others take a seeded prefix whose units are closest to
    ``T * p_i``. Example: units ``[[100] * 10, [10] * 100]``, weights ``[1, 1]`` -> all 10 samples
    of source 0 (1000 units) and 100 of source 1 (1000 units); weights ``[3, 1]`` -> 10 and 33
    (1000 against 330, the closest to 333).
    """
    total_weight = float(sum(weights))
    shares = [float(w) / total_weight for w in weights]
    totals = [float(np.sum(u)) for u in units]
    epoch = min(total / share for total, share in zip(totals, shares) if share > 0)
    selected = []
    for source, (u, share) in enumerate(zip(units, shares)):
        order = _seeded_order(len(u), seed=seed, source=source)
        sums = np.concatenate([[0], np.cumsum(np.asarray(u, dtype=np.float64)[order])])
        take = int(np.argmin(np.abs(sums - epoch * share)))
        selected.append(np.sort(order[:take]))
    return selected


def select_by_repetitions(sizes: Sequence[int], repetitions: Sequence[float], *, seed: int) -> list[np.ndarray]:
    """Per source, the positions of the samples a ``blend_epochized`` plan holds (repeated ones
    listed again). Example: sizes ``[4, 2]``, repetitions ``[1.5, 2]`` -> ``[[0, 1, 2, 3] + 2 of
    them, [0, 1, 0, 1]]``."""
    selected = []
    for source, (size, reps) in enumerate(zip(sizes, repetitions)):
        whole, frac = divmod(float(reps), 1.0)
        extra = np.sort(_seeded_order(size, seed=seed, source=source)[: int(round(frac * size))])
        selected.append(np.concatenate([np.tile(np.arange(size), int(whole)), extra]).astype(np.int64))
    return selected


def interleave_rows(compositions: np.ndarray, *, seed: int) -> np.ndarray:
    """The order to read rows in so that every stretch of rows carries the plan's shares.

    ``compositions``: float [R, K], units of each source in each row; the target shares are the
    plan's own (column sums over the total). Returns int [R], a permutation of the rows.
    Example: rows ``[[10, 0], [10, 0], [0, 10], [0, 10]]`` -> the sources alternate, e.g.
    ``[0, 2, 1, 3]`` (up to the seeded order inside each source's rows).
    """
    rows, sources = compositions.shape
    if rows == 0:
        return np.zeros(0, dtype=np.int64)
    totals = compositions.sum(axis=0)
    target = totals / max(totals.sum(), 1e-12)
    dominant = np.argmax(compositions, axis=1)
    buckets = []
    for source in range(sources):
        members = np.flatnonzero(dominant == source)
        buckets.append(members[_seeded_order(len(members), seed=seed, source=source)].tolist())
    units = compositions.tolist()  # plain floats: K is small, numpy per candidate would dominate
    shares = target.tolist()
    heads = [0] * sources
    drawn = [0.0] * sources
    order = np.empty(rows, dtype=np.int64)
    for position in range(rows):
        best, best_error = -1, float("inf")
        for source in range(sources):
            if heads[source] < len(buckets[source]):
                after = [d + u for d, u in zip(drawn, units[buckets[source][heads[source]]])]
                total = sum(after)
                error = sum((a - p * total) ** 2 for a, p in zip(after, shares))
                if error < best_error:
                    best, best_error = source, error
        row = buckets[best][heads[best]]
        heads[best] += 1
        drawn = [d + u for d, u in zip(drawn, units[row])]
        order[position] = row
    return order


def blend_report(plan: Any, unit: str) -> list[dict[str, Any]]:
    """Rows of the ``energon-pack plan`` report for a metadataset's plan: per leaf, its samples and
    real tokens in the plan and its share in ``unit`` against its weight's share (``blend``).

    Example: ``[{"metric": "source 0 (short): samples, tokens, share (tokens) / target", "value":
    "1200, 240100, 0.6009 / 0.6000"}, ...]``.
    """
    leaves = plan.fingerprint["dataset"]["blend"]["leaves"]
    leaf_of_shard = np.array([int(name.split(":", 1)[0]) for name, _, _ in plan.shards], dtype=np.int64)
    leaf = leaf_of_shard[plan.member_shard]
    samples = np.bincount(leaf, minlength=len(leaves))
    tokens = np.bincount(leaf, weights=plan.member_tokens, minlength=len(leaves))
    realized = tokens if unit == "tokens" else samples
    weights = [leaf["weight"] for leaf in leaves]
    total_weight = sum(w or 0 for w in weights)
    rows = []
    for number, described in enumerate(leaves):
        target = "-" if described["weight"] is None else f"{described['weight'] / total_weight:.4f}"
        rows.append({
            "metric": f"source {number} ({described['path']}): samples, tokens, share ({unit}) / target",
            "value": f"{samples[number]}, {int(tokens[number])}, {realized[number] / max(1, realized.sum()):.4f} / {target}",
        })
    return rows
