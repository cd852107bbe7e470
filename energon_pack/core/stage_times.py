"""Where a worker's time goes: seconds spent per pipeline stage, accumulated per process and epoch.

The stages: ``probe`` (media headers), ``tokenise`` (chat template), ``decode`` (images and
video frames to pixels), ``resize/patchify`` (resize and patches into the row payload),
``rope`` (mrope positions), ``row assembly`` (segments -> THD row), ``statistics`` (telemetry
snapshots and their files) and ``other``: the rest of the worker's active time (Energon reading
and plumbing, the packing stage itself, state). The stages add up to the worker's active wall
time: the time since its packing stage started the epoch (:func:`start_epoch`) less the time
it spent suspended at a ``yield``, waiting for the consumer (:func:`suspended`; in-process,
that is the trainer's step). Every row's ``__stats__`` carries the worker's totals
(``stage_seconds`` and ``worker_seconds``), which ``energon-pack bench`` reports.
A ``timed`` block costs two ``perf_counter`` calls.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["STAGES", "reset", "stage_seconds", "start_epoch", "suspended", "timed", "worker_seconds"]

#: Stages of the packing loader, in pipeline order; ``other`` is the active time no stage names.
STAGES = ("probe", "tokenise", "decode", "resize/patchify", "rope", "row assembly", "statistics", "other")

_SECONDS: defaultdict[str, float] = defaultdict(float)
#: (wall, cpu) clocks at the epoch start (None before any), and the (wall, cpu) seconds spent suspended since.
_STARTED: tuple[float, float] | None = None
_SUSPENDED = [0.0, 0.0]


@contextmanager
def timed(stage: str) -> Iterator[None]:
    """Add the wall time of the ``with`` block to ``stage``'s total in this process.

    Example: ``with timed("decode"): decode_image(data)`` -> ``stage_seconds()["decode"]`` grows.
    Named stages must not nest (``other`` is what they leave of the active time).
    """
    start = time.perf_counter()
    try:
        yield
    finally:
        _SECONDS[stage] += time.perf_counter() - start


@contextmanager
def suspended() -> Iterator[None]:
    """Time of the ``with`` block (around a ``yield`` to the consumer) is not the worker's own.

    Example: ``with suspended(): yield row`` -> the consumer's time between rows leaves ``other`` alone.
    """
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        yield
    finally:
        _SUSPENDED[0] += time.perf_counter() - wall
        _SUSPENDED[1] += time.process_time() - cpu


def reset() -> None:
    """Forget every total and the epoch clock. Example: ``reset(); stage_seconds()`` -> ``{}``."""
    global _STARTED
    _SECONDS.clear()
    _STARTED = None
    _SUSPENDED[:] = [0.0, 0.0]


def start_epoch() -> None:
    """Start this process's totals afresh (a packing stage starting an epoch): earlier epochs' seconds
    would otherwise pile up. Example: ``start_epoch(); worker_seconds()["wall"]`` -> about 0.0."""
    global _STARTED
    reset()
    _STARTED = (time.perf_counter(), time.process_time())


def worker_seconds() -> dict[str, float]:
    """Active wall and CPU seconds of this process since :func:`start_epoch`, less the time suspended
    (``{}`` before any epoch). Example: 2.0 s since the start, 0.5 s of it suspended -> ``{"wall": 1.5, ...}``."""
    if _STARTED is None:
        return {}
    return {
        "wall": time.perf_counter() - _STARTED[0] - _SUSPENDED[0],
        "cpu": time.process_time() - _STARTED[1] - _SUSPENDED[1],
    }


def stage_seconds() -> dict[str, float]:
    """This process's seconds per stage so far (stages never entered are absent); once an epoch has
    started, ``other`` makes them add up to ``worker_seconds()["wall"]`` (never below 0)."""
    seconds = dict(_SECONDS)
    active = worker_seconds()
    if active:
        named = sum(value for stage, value in seconds.items() if stage != "other")
        seconds["other"] = max(0.0, active["wall"] - named)
    return seconds
