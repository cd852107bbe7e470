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

Schedules (:class:`PlanSchedule`, :func:`scheduled_rows`): position p of the plan is in global step
``p // (topology.dp * micro_batches_per_step)``; the plan is built in parts (at most 64 rows, ending
at the points of a ``step`` schedule), each selected, packed and interleaved toward its positions'
shares.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from energon_pack.config import PackingConfig
from energon_pack.config.blend import BlendPoint, schedule_size_problem, weights_problem
from energon_pack.errors import UsageError
from energon_pack.identity import schedule_step_rows
from energon_pack.packing.blend import scheduled_weights

__all__ = [
    "PlanSchedule",
    "blend_plan_problem",
    "blend_report",
    "blend_row_order",
    "blend_selection",
    "good_samples",
    "interleave_rows",
    "interleave_setup",
    "planned_sources",
    "reorder_rows",
    "row_compositions",
    "scheduled_rows",
    "seeded_streams",
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
    good, source_of = good_samples(tokens, blend)
    weights = [leaf["weight"] for leaf in leaves]
    if blend["mode"] == "weights":
        problem = weights_problem("the metadataset's blend weights", weights)
        if problem is not None:
            raise UsageError(problem)
    for leaf, samples in zip(leaves, good):
        if not len(samples) and blend["mode"] == "weights" and leaf["weight"] > 0:
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
        chosen = select_by_weights(units, weights, seed=seed)
    kept = np.concatenate([g[c] for g, c in zip(good, chosen)]) if good else np.zeros(0, dtype=np.int64)
    return kept.astype(np.int64), source_of


def good_samples(tokens: np.ndarray, blend: Mapping[str, Any]) -> tuple[list[np.ndarray], np.ndarray]:
    """``(good, source_of)``: per source the global indices of its measured samples (``tokens`` >= 0),
    and each global index's source. Example: leaves of 2 and 2 samples, tokens ``[5, -1, 7, 8]`` ->
    ``([[0], [2, 3]], [0, 0, 1, 1])``."""
    sizes = [int(leaf["samples"]) for leaf in blend["leaves"]]
    starts = np.concatenate([[0], np.cumsum(sizes)])
    good = [lo + np.flatnonzero(tokens[lo:hi] >= 0) for lo, hi in zip(starts[:-1], starts[1:])]
    return good, np.repeat(np.arange(len(sizes)), sizes)


def blend_row_order(
    source_of: np.ndarray, units: np.ndarray, *, seed: int
) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """The ``row_order`` of ``plan.build.plan_measurement`` for a blend: :func:`interleave_rows` over
    each row's units per source (``units``: int [N] per global sample index, ``source_of`` its source)."""

    def order(row_offsets: np.ndarray, members: np.ndarray) -> np.ndarray:
        return interleave_rows(row_compositions(row_offsets, members, source_of, units), seed=seed)

    return order


def row_compositions(row_offsets: np.ndarray, members: np.ndarray, source_of: np.ndarray, units: np.ndarray) -> np.ndarray:
    """float [R, K]: units of each source in each CSR row. Example: offsets ``[0, 2, 3]``, members
    ``[0, 2, 1]``, sources ``[0, 0, 1]``, units ``[5, 6, 7]`` -> ``[[5, 7], [6, 0]]``."""
    rows = np.repeat(np.arange(len(row_offsets) - 1), np.diff(row_offsets))
    compositions = np.zeros((len(row_offsets) - 1, int(source_of.max(initial=0)) + 1))
    np.add.at(compositions, (rows, source_of[members]), units[members])
    return compositions


#: Rows of one part of a scheduled plan: packed on their own, toward their positions' shares.
SCHEDULE_PART_ROWS = 64


def seeded_streams(tokens: np.ndarray, blend: Mapping[str, Any], *, seed: int) -> list[np.ndarray]:
    """Per source, the global indices of its good samples (``tokens`` >= 0) in a seeded order."""
    good, _ = good_samples(tokens, blend)
    return [g[_seeded_order(len(g), seed=seed, source=source)] for source, g in enumerate(good)]


def scheduled_rows(
    streams: Sequence[np.ndarray],
    units: np.ndarray,
    schedule: PlanSchedule,
    *,
    seed: int,
    row_units: float,
    pack: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
    part_rows: int = SCHEDULE_PART_ROWS,
) -> tuple[np.ndarray, np.ndarray]:
    """CSR rows ``(row_offsets, global sample indices)`` of a blend whose shares follow ``schedule``.

    ``streams[i]``: source i's good samples (global indices) in the order it gives them; ``units``:
    float [N], each global index's units; ``row_units``: a first estimate of the units a row carries.
    The plan is built in parts of about ``part_rows`` rows (ending at the points of a ``step``
    schedule, :meth:`PlanSchedule.part_rows`): a part's units due per source are its
    positions' mean shares times the units a row carries (measured on the parts so far); each source
    gives the next samples of its stream until it has given what is due (to within half a sample,
    the rest carried to the next part); the part is packed on its own (``pack``: sample indices ->
    CSR rows) and its rows interleaved toward its positions' shares. The last part is as long as
    the first source to run out can fill at its share. Example: two sources of 1-unit samples, shares (0.5, 0.5)
    then (0.9, 0.1), rows of 10 units -> parts of 64 rows of 5:5, then 9:1 units a row on average.
    """
    source_of = np.zeros(len(units), dtype=np.int64)
    for source, stream in enumerate(streams):
        source_of[stream] = source
    heads, due, drawn = [0] * len(streams), np.zeros(len(streams)), np.zeros(len(streams))
    offsets, members, position = [np.zeros(1, dtype=np.int64)], [np.zeros(0, dtype=np.int64)], 0
    left = [float(units[stream].sum()) for stream in streams]
    while True:
        size = schedule.part_rows(position, part_rows)
        per_row = schedule.targets(size, start=position).mean(axis=0) * row_units
        # The last part: as many rows as the first source to run out can still fill at its share.
        fits = min((left[i] + drawn[i] - due[i]) / per_row[i] for i in range(len(streams)) if per_row[i] > 0)
        size = min(size, int(fits))
        if size <= 0:
            return np.concatenate(offsets), np.concatenate(members)
        want = due + per_row * size
        taken, ends = [], []
        for source, stream in enumerate(streams):
            end, got = heads[source], float(drawn[source])
            while end < len(stream) and got + units[stream[end]] / 2 <= want[source]:
                got += float(units[stream[end]])
                end += 1
            taken.append(stream[heads[source]:end])
            ends.append((end, got))
        part = np.concatenate(taken)
        if not len(part):
            return np.concatenate(offsets), np.concatenate(members)
        row_offsets, part_members = pack(part)
        rows = len(row_offsets) - 1
        order = interleave_rows(
            row_compositions(row_offsets, part_members, source_of, units), seed=seed,
            targets=schedule.targets(rows, start=position),
        )
        row_offsets, part_members, _ = reorder_rows(row_offsets, part_members, {}, order)
        offsets.append(offsets[-1][-1] + row_offsets[1:])
        members.append(part_members)
        row_units, position, due = float(units[part].sum()) / rows, position + rows, want
        for source, (end, got) in enumerate(ends):
            left[source] -= got - drawn[source]
            heads[source], drawn[source] = end, got


def reorder_rows(
    row_offsets: np.ndarray, members: np.ndarray, row_arrays: Mapping[str, np.ndarray], order: np.ndarray
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """CSR rows (and per-row arrays) in ``order`` (new row i is old row ``order[i]``).

    Example: offsets ``[0, 2, 3]``, members ``[5, 6, 7]``, order ``[1, 0]`` -> offsets ``[0, 1, 3]``,
    members ``[7, 5, 6]``.
    """
    sizes = np.diff(row_offsets)[order]
    starts = row_offsets[:-1][order]
    new_offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    gather = np.repeat(starts - new_offsets[:-1], sizes) + np.arange(int(new_offsets[-1]))
    return new_offsets, members[gather], {name: values[order] for name, values in row_arrays.items()}


@dataclass(frozen=True, kw_only=True)
class PlanSchedule:
    """A ``blend_schedule`` over a plan's global positions: position p is in global step
    ``p // step_rows`` (``step_rows`` = data-parallel size x ``micro_batches_per_step``: the rows of
    one global step, whatever the DP size that reads the plan)."""

    points: tuple[BlendPoint, ...]
    mode: str
    step_rows: int

    @classmethod
    def of(cls, config: PackingConfig, blend: Mapping[str, Any]) -> PlanSchedule | None:
        """The schedule of ``config`` for the plan fingerprint's ``blend`` (None without one);
        ``step_rows`` from its topology's ``dp``. A schedule of the wrong size or on a
        ``blend_epochized`` metadataset raises ``UsageError``."""
        points = config.policy.blend_schedule
        if points is None:
            return None
        if blend["mode"] != "weights":
            raise UsageError(
                "blend_schedule sets blend weights over training steps, but the metadataset is blend_epochized "
                "(repetitions); fix: use `blend:` with `weight:` entries, or remove blend_schedule"
            )
        problem = schedule_size_problem(points, len(blend["leaves"]))
        if problem is not None:
            raise UsageError(problem)
        return cls(points=tuple(points), mode=config.policy.blend_schedule_mode, step_rows=schedule_step_rows(config))

    def part_rows(self, position: int, rows: int) -> int:
        """``rows``, or fewer so that a part from ``position`` ends at the next point of a ``step``
        schedule. Example: a point at step 10, 4 rows a step, position 20, rows 64 -> 20."""
        if self.mode == "step":
            ahead = [point.step * self.step_rows - position for point in self.points if point.step * self.step_rows > position]
            if ahead:
                return min(rows, ahead[0])
        return rows

    def targets(self, rows: int, *, start: int = 0) -> np.ndarray:
        """float [rows, K]: the target shares at positions ``start .. start + rows - 1``.

        Example: points (0: [0.9, 0.1]), (2: [0.1, 0.9]), step_rows 2, 5 rows -> rows 0-3 at
        (0.9, 0.1), row 4 (step 2) at (0.1, 0.9).
        """
        steps = (start + np.arange(rows)) // self.step_rows
        unique, inverse = np.unique(steps, return_inverse=True)
        shares = np.array([scheduled_weights(self.points, int(step), mode=self.mode) for step in unique])
        return shares[inverse].reshape(rows, -1)


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


def interleave_rows(compositions: np.ndarray, *, seed: int, targets: np.ndarray | None = None) -> np.ndarray:
    """The order to read rows in so that every stretch of rows carries the target shares.

    ``compositions``: float [R, K], units of each source in each row; ``targets``: float [R, K],
    the shares due at each position (default: the plan's own, column sums over the total, at every
    position). Rows are grouped into one bucket per source (the source holding most of a row's
    units), each bucket in a seeded order. Each row read adds its units to what was read and its
    total times the position's shares to what is due; the next row is the head of the bucket after
    which the squared distance between read and due is smallest (the first bucket on a tie).
    Returns int [R], a permutation of the rows.
    Example: rows ``[[10, 0], [10, 0], [0, 10], [0, 10]]`` -> the sources alternate, e.g.
    ``[0, 2, 1, 3]`` (up to the seeded order inside each source's rows).
    """
    if len(compositions) == 0:
        return np.zeros(0, dtype=np.int64)
    targets, buckets = interleave_setup(compositions, seed=seed, targets=targets)
    return _GreedyInterleave(np.asarray(compositions, dtype=np.float64), np.asarray(targets, dtype=np.float64), buckets).order()


def interleave_setup(
    compositions: np.ndarray, *, seed: int, targets: np.ndarray | None = None
) -> tuple[np.ndarray, list[np.ndarray]]:
    """What :func:`interleave_rows` chooses among: the targets (float [R, K]; by default the
    compositions' column shares at every position) and one bucket of row indices per source (the
    rows whose largest units are that source's; a seeded order per source).

    Example: rows ``[[10, 0], [0, 10], [10, 0]]`` -> targets ``[[2/3, 1/3]] * 3`` and buckets
    ``[rows 0 and 2 in a seeded order, [1]]``.
    """
    if targets is None:
        totals = compositions.sum(axis=0)
        targets = np.broadcast_to(totals / max(totals.sum(), 1e-12), compositions.shape)
    dominant = np.argmax(compositions, axis=1)
    buckets = []
    for source in range(compositions.shape[1]):
        members = np.flatnonzero(dominant == source)
        buckets.append(members[_seeded_order(len(members), seed=seed, source=source)])
    return targets, buckets


class _GreedyInterleave:
    """:func:`interleave_rows`' greedy choice, decided a block of positions at a time with numpy.

    A block's choices are guessed (:meth:`_guess`), then checked all at once: along the guessed
    path, what was read and what is due before each position are cumulative sums (added in the
    order a step-by-step loop adds them, so the values are the same), and every bucket head's
    squared distance is computed for every position. The guess holds up to the first position
    where the greedy choice differs; that choice is taken and the next block starts after it. The
    order is the step-by-step greedy's, exactly; the guess only decides how many positions one
    block settles (with two sources nearly all of them: about 30 blocks per 100k rows).
    """

    #: Positions checked per block: the first, and the bounds it adapts within.
    BLOCK, MIN_BLOCK, MAX_BLOCK = 64, 16, 4096

    def __init__(self, compositions: np.ndarray, targets: np.ndarray, buckets: list[np.ndarray]) -> None:
        self.units = compositions
        self.targets = targets
        self.row_totals = compositions.sum(axis=1)
        self.sizes = np.array([len(bucket) for bucket in buckets], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)
        self.flat = np.concatenate(buckets).astype(np.int64)
        self.last = np.maximum(self.starts + self.sizes - 1, 0)
        sources = compositions.shape[1]
        self.heads = np.zeros(sources, dtype=np.int64)
        self.read = np.zeros(sources)
        self.due = np.zeros(sources)

    def order(self) -> np.ndarray:
        """The rows in reading order (int [R])."""
        rows = len(self.units)
        order = np.empty(rows, dtype=np.int64)
        position, block = 0, self.BLOCK
        while position < rows:
            guess = self._guess(position, min(block, rows - position))
            settled = self._settle(position, guess, order)
            if settled == len(guess):
                block = min(block * 2, self.MAX_BLOCK)
            elif settled < len(guess) // 4:
                block = max(block // 2, self.MIN_BLOCK)
            position += settled
        return order

    def _guess(self, position: int, size: int) -> np.ndarray:
        """Likely choices (source per position) for ``size`` positions from ``position``: each
        bucket's next rows keyed by half the source's current lead (read - due) plus its rows'
        excess over their share (units - share * total) summed up to the row's middle, merged by
        key. With two sources and rows that exceed their own source's share this is the greedy
        choice in exact arithmetic."""
        shares = self.targets[position]
        lead = self.read - self.due
        keys, labels = [], []
        for source, (start, head, size_of) in enumerate(zip(self.starts, self.heads, self.sizes)):
            rows = self.flat[start + head: start + min(size_of, head + size)]
            excess = self.units[rows, source] - shares[source] * self.row_totals[rows]
            keys.append(lead[source] / 2 + np.cumsum(excess) - excess / 2)
            labels.append(np.full(len(rows), source, dtype=np.int64))
        merged = np.concatenate(labels)[np.argsort(np.concatenate(keys), kind="stable")]
        return merged[:size]

    def _settle(self, position: int, guess: np.ndarray, order: np.ndarray) -> int:
        """Check ``guess`` from ``position``; write the positions it gets right, plus the greedy
        choice at the first it gets wrong, into ``order``; advance the state; return how many."""
        size, sources = len(guess), len(self.heads)
        chosen = guess[:, None] == np.arange(sources)[None, :]
        taken_before = np.cumsum(chosen, axis=0) - chosen
        at = self.heads[None, :] + taken_before
        available = at < self.sizes[None, :]
        candidates = self.flat[np.minimum(self.starts[None, :] + at, self.last[None, :])]
        rows = candidates[np.arange(size), guess]
        shares = self.targets[position: position + size]
        read = np.cumsum(np.vstack([self.read, self.units[rows]]), axis=0)
        due = np.cumsum(np.vstack([self.due, shares * self.row_totals[rows][:, None]]), axis=0)
        gap = (read[:-1, None, :] + self.units[candidates]) - (
            due[:-1, None, :] + shares[:, None, :] * self.row_totals[candidates][:, :, None])
        squared = gap * gap
        error = squared[..., 0]
        for source in range(1, sources):
            error = error + squared[..., source]
        error[~available] = np.inf
        greedy = np.argmin(error, axis=1)
        wrong = np.flatnonzero(greedy != guess)
        right = int(wrong[0]) if len(wrong) else size
        order[position: position + right] = rows[:right]
        self.heads = self.heads + chosen[:right].sum(axis=0)
        self.read, self.due = read[right], due[right]
        if right == size:
            return right
        source = int(greedy[right])
        row = int(candidates[right, source])
        order[position + right] = row
        self.heads[source] += 1
        self.read = self.read + self.units[row]
        self.due = self.due + shares[right] * self.row_totals[row]
        return right + 1


def planned_sources(plan: Any) -> list[dict[str, Any]]:
    """Per leaf of a metadataset's plan (``PackPlan`` or ``MappedPlan``): its blend entry (index,
    path, subflavors, weight, repetitions) and what the plan holds of it: ``samples``,
    ``real_tokens`` and their shares of the plan's.

    Example: ``[{"index": 0, "path": "short", ..., "samples": 1200, "real_tokens": 227837,
    "samples_share": 0.8664, "real_tokens_share": 0.6009}, ...]``.
    """
    leaves = plan.fingerprint["dataset"]["blend"]["leaves"]
    leaf_of_shard = np.array([int(name.split(":", 1)[0]) for name, _, _ in plan.shards], dtype=np.int64)
    members = plan.num_samples
    leaf = leaf_of_shard[plan._slice("member_shard", 0, members)]
    samples = np.bincount(leaf, minlength=len(leaves))
    tokens = np.bincount(leaf, weights=plan._slice("member_tokens", 0, members), minlength=len(leaves))
    return [
        {
            "index": number, **{key: described[key] for key in ("path", "subflavors", "weight", "repetitions")},
            "samples": int(samples[number]), "real_tokens": int(tokens[number]),
            "samples_share": float(samples[number] / max(1, samples.sum())),
            "real_tokens_share": float(tokens[number] / max(1.0, tokens.sum())),
        }
        for number, described in enumerate(leaves)
    ]


def blend_report(plan: Any, unit: str) -> list[dict[str, Any]]:
    """Rows of the ``energon-pack plan`` report for a metadataset's plan: per leaf, its samples and
    real tokens in the plan and its share in ``unit`` against its weight's share (``blend``).

    Example: ``[{"metric": "source 0 (short): samples, tokens, share (tokens) / target", "value":
    "1200, 227837, 0.6009 / 0.6000"}, ...]``.
    """
    sources = planned_sources(plan)
    total_weight = sum(source["weight"] or 0 for source in sources)
    share = "real_tokens_share" if unit == "tokens" else "samples_share"
    rows = []
    for source in sources:
        target = "-" if source["weight"] is None else f"{source['weight'] / total_weight:.4f}"
        rows.append({
            "metric": f"source {source['index']} ({source['path']}): samples, tokens, share ({unit}) / target",
            "value": f"{source['samples']}, {source['real_tokens']}, {source[share]:.4f} / {target}",
        })
    return rows
