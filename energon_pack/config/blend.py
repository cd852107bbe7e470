"""Blend settings of the packing policy: what a metadataset's blend weights are shares of, and how
they change over training (``blend_unit``, ``blend_schedule``, ``blend_schedule_mode``).

Pure value rules only; the weights themselves stay in the metadataset (``weight:`` of its blend
entries, ``repetitions:`` of ``blend_epochized``), and ``energon_pack.packing.blend`` turns them
into per-step targets (docs/configuration.md, "Blends").
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: ``samples``: Energon's meaning (a source per sample by weight; rows as without the setting);
#: ``tokens``: shares of real (non-padding) row tokens; ``supervised_tokens``: shares of trained
#: tokens (non-zero ``loss_mask``).
BLEND_UNITS: tuple[str, ...] = ("samples", "tokens", "supervised_tokens")

#: ``step``: each point's weights hold until the next point; ``linear``: interpolated between points.
BLEND_SCHEDULE_MODES: tuple[str, ...] = ("step", "linear")


@dataclass(frozen=True, kw_only=True)
class BlendPoint:
    """From global training step ``step`` on, blend entry i has weight ``weights[i]`` (metadataset order)."""

    step: int
    weights: tuple[float, ...]

    def to_dict(self) -> dict[str, Any]:
        """Plain YAML form. Example: ``BlendPoint(step=0, weights=(0.9, 0.1)).to_dict()`` ->
        ``{"step": 0, "weights": [0.9, 0.1]}``."""
        return {"step": self.step, "weights": list(self.weights)}


def blend_point(value: Any) -> BlendPoint | Any:
    """A schedule point from its YAML form (``{step: S, weights: [...]}``); anything else is returned
    as it is, for :func:`schedule_problems` to name.

    Example: ``blend_point({"step": 100, "weights": [1, 3]})`` -> ``BlendPoint(step=100, weights=(1, 3))``.
    """
    if isinstance(value, Mapping) and set(value) == {"step", "weights"} and isinstance(value["weights"], Iterable) \
            and not isinstance(value["weights"], (str, bytes)):
        return BlendPoint(step=value["step"], weights=tuple(value["weights"]))
    return value


def weights_problem(where: str, weights: Sequence[Any]) -> str | None:
    """Blend weights must be finite numbers >= 0, not all 0.

    Example: ``weights_problem("blend weights", [1, -1])`` -> ``"blend weights [1, -1]: weight -1 is
    negative; ..."``; ``weights_problem("blend weights", [0.6, 0.4])`` -> None.
    """
    fix = "fix: give every blend entry a finite weight >= 0, at least one above 0"
    for weight in weights:
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            return f"{where} {list(weights)}: weight {weight!r} is not a finite number; {fix}"
        if weight < 0:
            return f"{where} {list(weights)}: weight {weight!r} is negative; {fix}"
    if not any(weight > 0 for weight in weights):
        return f"{where} {list(weights)}: all weights are 0, nothing could be drawn; {fix}"
    return None


def schedule_problems(schedule: Any) -> Iterator[str | None]:
    """One line per violated rule of ``blend_schedule`` (None: no schedule): a non-empty list of
    points, the first at step 0, steps strictly increasing, the same number of valid weights in each.
    (That number must also equal the metadataset's blend entries: checked when the loader is built.)

    Example: ``[BlendPoint(step=5, weights=(1, 1))]`` -> ``"blend_schedule: the first point is at step
    5, ...; fix: ..."``.
    """
    if schedule is None:
        return
    fix_form = "fix: write blend_schedule as a list of {step: S, weights: [w_0, w_1, ...]}, the first at step 0"
    if not isinstance(schedule, tuple) or not schedule:
        yield f"blend_schedule={schedule!r}: must be a non-empty list of points; {fix_form}"
        return
    bad = [point for point in schedule if not isinstance(point, BlendPoint)]
    if bad:
        yield f"blend_schedule point {bad[0]!r} is not a mapping of step and weights; {fix_form}"
        return
    steps = [point.step for point in schedule]
    bad_steps = [step for step in steps if isinstance(step, bool) or not isinstance(step, int) or step < 0]
    if bad_steps:
        yield f"blend_schedule step {bad_steps[0]!r}: must be an integer >= 0 (a global training step); {fix_form}"
        return
    if steps[0] != 0:
        yield (f"blend_schedule: the first point is at step {steps[0]}, but the weights before it would be "
               f"undefined; fix: start the schedule with a point at step 0")
    for before, after in zip(steps, steps[1:]):
        if after <= before:
            yield (f"blend_schedule steps {steps}: step {after} follows step {before}, steps must increase; "
                   "fix: list the points in increasing step order, each step once")
            break
    sizes = sorted({len(point.weights) for point in schedule})
    if len(sizes) > 1:
        yield (f"blend_schedule: points have {sizes} weights; every point needs one weight per blend entry; "
               "fix: give every point the same number of weights, in the metadataset's order")
    for point in schedule:
        yield weights_problem(f"blend_schedule step {point.step} weights", point.weights)


def schedule_size_problem(schedule: tuple[BlendPoint, ...] | None, entries: int) -> str | None:
    """A schedule needs one weight per blend entry of the metadataset.

    Example: a schedule of 2 weights a point on a blend of 3 entries -> ``"blend_schedule step 0 has
    2 weights, but the metadataset blends 3 datasets; fix: ..."``.
    """
    for point in schedule or ():
        if len(point.weights) != entries:
            return (
                f"blend_schedule step {point.step} has {len(point.weights)} weights, but the metadataset blends "
                f"{entries} datasets; fix: give each point {entries} weights, in the order of the metadataset's "
                "blend entries"
            )
    return None
