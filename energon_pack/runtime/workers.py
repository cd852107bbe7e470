"""Process plumbing for loaders that fork Energon worker processes."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["frozen_gc"]


@contextlib.contextmanager
def frozen_gc(enabled: bool = True) -> Iterator[None]:
    """Collect, then move every live object to the permanent generation for the ``with`` block.

    Processes forked inside the block keep them frozen (their collector never touches those
    objects, so the memory pages holding them stay shared copy-on-write); this process
    unfreezes on exit. ``enabled=False`` does nothing: without forked workers the full collection
    of the trainer's heap only costs time. Example: ``with frozen_gc(): gc.get_freeze_count() > 0``.
    """
    if not enabled:
        yield
        return
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()

