"""The data iterator Megatron-Bridge trains from: endless rows, checkpointable through Bridge."""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import cached_property
from typing import Any

from energon_pack.loader import PackingDataLoader, PackingLoaderState
from energon_pack.metrics import RowMetrics
from energon_pack.plan.loader import PlanDataLoader, PlanLoaderState

__all__ = ["PackingIterator", "packing_iterator_of"]

_STATE_CLASSES = {cls.__name__: cls for cls in (PackingLoaderState, PlanLoaderState)}


class PackingIterator:
    """Rows of one rank's packing loader (online, or from a pack plan), epoch after epoch.

    Bridge draws ``next()`` once per micro-batch and never expects the stream to end, so a
    finite loader (``repeat=False``, validation splits) starts its next epoch when one ends, as
    Bridge's own Energon data module does. Bridge's checkpointing calls :meth:`save_state`
    (one file per data-parallel rank) and, on resume, :meth:`restore_state` before the first
    ``next()``.

    Each row carries ``row["__loader_wait_s__"]``: the seconds (float) this ``next()`` waited
    for the loader, which :class:`~energon_pack.RowMetrics` reports as ``data/loader wait s``.
    """

    def __init__(self, loader: PackingDataLoader | PlanDataLoader) -> None:
        self.loader = loader
        self._rows = self._epochs()

    def __iter__(self) -> PackingIterator:
        return self

    def __next__(self) -> dict[str, Any]:
        started = time.perf_counter()
        row = next(self._rows)
        row["__loader_wait_s__"] = time.perf_counter() - started
        return row

    @cached_property
    def row_metrics(self) -> RowMetrics:
        """The :class:`~energon_pack.RowMetrics` of this loader's sources (built on first use)."""
        return RowMetrics.from_loader(self.loader)

    def save_state(self) -> dict[str, Any]:
        """The loader's state at this point of the stream (fingerprint included), as a plain dict.

        The loader state's fields hold only builtins and Energon's state objects, so this dict has
        no class of ours in it and Bridge's restricted checkpoint unpickler (Energon's state
        classes and builtins only) reads it back. Example: ``{"state_class": "PackingLoaderState",
        "fields": {"energon_state": ..., "fingerprint": {...}, ...}}``.
        """
        state = self.loader.save_state_rank()
        return {"state_class": type(state).__name__, "fields": dict(vars(state))}

    def restore_state(self, saved: dict[str, Any]) -> None:
        """Continue exactly after the row at which ``saved`` was taken; call before the first ``next()``.

        Refuses a state saved under a different fingerprint (config, processor, rope, data-parallel
        size, split), naming the fields that differ.
        """
        state_class = _STATE_CLASSES.get(saved.get("state_class")) if isinstance(saved, dict) else None
        if state_class is None:
            raise ValueError(
                f"restore_state got {type(saved).__name__} "
                f"{sorted(saved) if isinstance(saved, dict) else ''}: not a state written by "
                "PackingIterator.save_state(); fix: restore the dataloader state saved by the same training setup"
            )
        self.loader.restore_state_rank(state_class(**saved["fields"]))
        self._rows = self._epochs()

    def _epochs(self) -> Iterator[dict[str, Any]]:
        while True:
            rows = 0
            for row in self.loader:
                rows += 1
                yield row
            if rows == 0:
                raise RuntimeError(
                    "the packing loader yielded no row in a whole epoch (every sample skipped, or an empty "
                    "split for this rank); fix: check loader.stats()['skipped'] and the dataset split"
                )


def packing_iterator_of(data_iterator: Any) -> PackingIterator:
    """The :class:`PackingIterator` that ``data_iterator`` is or wraps (Megatron-Core's
    ``RerunDataIterator`` keeps what it wraps as ``.iterable``).

    Example: ``RerunDataIterator(PackingIterator(loader))`` -> that ``PackingIterator``.
    """
    found = data_iterator
    while not isinstance(found, PackingIterator):
        if not hasattr(found, "iterable"):
            raise TypeError(
                f"the data iterator {type(data_iterator).__name__} does not yield through a PackingIterator, "
                "which names the rows' sources for the per-source metrics; fix: give Bridge "
                "PackingDatasetProvider as cfg.dataset, or wrap your loader as PackingIterator(loader)"
            )
        found = found.iterable
    return found
