"""Where a worker's time goes: seconds spent per pipeline stage, accumulated per process.

The stages: ``probe`` (media headers), ``tokenise`` (chat template), ``decode`` (images and
video frames to pixels), ``resize/patchify`` (the processor's image / video processors),
``rope`` (mrope positions), ``row assembly`` (segments -> THD row) and ``statistics``
(telemetry snapshots and their files). Every row's ``__stats__`` carries the worker's totals
(``stage_seconds``), which ``energon-pack bench`` reports side by side with the eager design.
A ``timed`` block costs two ``perf_counter`` calls.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["STAGES", "stage_seconds", "timed"]

#: Stages of the packing loader, in pipeline order.
STAGES = ("probe", "tokenise", "decode", "resize/patchify", "rope", "row assembly", "statistics")

_SECONDS: defaultdict[str, float] = defaultdict(float)


@contextmanager
def timed(stage: str) -> Iterator[None]:
    """Add the wall time of the ``with`` block to ``stage``'s total in this process.

    Example: ``with timed("decode"): decode_image(data)`` -> ``stage_seconds()["decode"]`` grows.
    """
    start = time.perf_counter()
    try:
        yield
    finally:
        _SECONDS[stage] += time.perf_counter() - start


def stage_seconds() -> dict[str, float]:
    """This process's seconds per stage so far (stages never entered are absent)."""
    return dict(_SECONDS)
