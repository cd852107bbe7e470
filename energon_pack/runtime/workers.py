"""Process plumbing for loaders that fork Energon worker processes."""

from __future__ import annotations

import contextlib
import gc
import weakref
from collections.abc import Iterator
from typing import Any

__all__ = ["frozen_gc", "stop_workers_when_collected"]


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



def stop_workers_when_collected(owner: object, iterator: Any) -> weakref.finalize:
    """Shut ``iterator``'s worker processes down (torch's own ``_shutdown_workers``) when ``owner``,
    the loader, is garbage-collected; call the returned finalizer to do it earlier (it runs once).

    Energon's loader keeps its epoch generator on itself, a reference cycle, so a loader dropped
    without ``close()`` is freed only by the cyclic collector (typically the ``gc.collect`` of the
    next loader's :func:`frozen_gc`). In that pass the ``multiprocessing`` queues' own finalizers
    (weakref callbacks) run before the torch iterator's ``__del__``: their feeder threads stop, the
    workers never receive the shutdown signal, and torch waits ``MP_STATUS_CHECK_INTERVAL`` (5 s)
    per worker before it kills them. The finalizer holds the iterator, so the iterator and its
    queues stay out of that garbage and the ordinary shutdown runs: each worker reads its signal
    and exits (status 0) at once. Not run at interpreter exit (torch's exit handling stays as is).
    Example: ``stop = stop_workers_when_collected(loader, loader._iterator); stop()`` stops them now.
    """
    finalizer = weakref.finalize(owner, iterator._shutdown_workers)
    finalizer.atexit = False
    return finalizer
