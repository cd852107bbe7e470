"""The savable blend of prepared samples by shares (``blend_unit`` tokens / supervised tokens, or a
``blend_schedule``): Energon's ``BlendDataset`` draws a source per sample at random by weight;
this one draws the source whose share of units is furthest behind its target
(``energon_pack.packing.blend``), one worker at a time, with no communication.

It sits after preencode (each source is ``cook -> preencode`` on its own), so it sees every
sample's exact token counts before the packing stage buffers it, and it counts what rows carry:
a skip marker or a sample that fits no row counts 0 units; a sample that fails to decode later is
taken back by the packing stage (:meth:`ShareBlendDataset.take_back`). The step of a schedule is
the global training step of the row the next sample will land in, from this worker's position in
Energon's worker order (``packing.blend.rank_row_step``).

State (``_savable_fields``): the tracker's units drawn and due per source, the samples per source
at the start of the epoch, and which sources are spent; restore keys are
``("ShareBlendDataset", source index, *the source's key)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from megatron.energon.flavors.base_dataset import SavableDataset, add_sample_restore_key
from megatron.energon.worker import WorkerConfig
from megatron.energon.wrappers.base import BaseWrapperDataset

from energon_pack.config.blend import BlendPoint
from energon_pack.packing.blend import ShareTracker, epoch_weights, rank_row_step, scheduled_weights
from energon_pack.rows.encoded import PreparedSample

#: Restore-key names of the blends a sample may come through (Energon's and ours).
BLEND_KEY_NAMES: tuple[str, ...] = ("BlendDataset", "ShareBlendDataset")

#: Samples in a row without supervised tokens, from one source, after which a
#: ``supervised_tokens`` blend stops with an error naming that source.
MAX_UNSUPERVISED_RUN = 64


#: Restore-key names that number a sample's source dataset: the blends, and the concatenation of a
#: metadataset's leaves that Energon reads a validation split through.
SOURCE_KEY_NAMES: tuple[str, ...] = (*BLEND_KEY_NAMES, "ConcatDataset")


def blend_source(restore_key: Sequence[Any], names: Sequence[str] = BLEND_KEY_NAMES) -> int | None:
    """The blend entry a sample came from, read from its Energon restore key (the first of ``names``
    in it); None outside a blend.

    Example: ``("MapDataset", 7, "BlendDataset", 1, "Webdataset", "shard-0.tar", 3)`` -> 1;
    ``("Webdataset", "shard-0.tar", 3)`` -> None.
    """
    for name, value in zip(restore_key, restore_key[1:]):
        if name in names and isinstance(value, int):
            return value
    return None


def segment_source(restore_key: Sequence[Any] | None) -> int:
    """A row segment's source index (``row["segment_source"]``): the metadataset entry its sample came
    from, 0 for a sample of a plain dataset (or without a restore key).

    Example: ``("BlendDataset", 2, "Webdataset", "s.tar", 9)`` -> 2; ``("ConcatDataset", 1, ...)``
    (a metadataset's validation split) -> 1; ``("Webdataset", "s.tar", 9)`` -> 0; ``None`` -> 0.
    """
    return blend_source(restore_key or (), SOURCE_KEY_NAMES) or 0


class UnsupervisedSourceError(ValueError):
    """A ``supervised_tokens`` blend met a source whose samples carry no supervised tokens."""


class ShareBlendDataset(BaseWrapperDataset[PreparedSample, PreparedSample]):
    """Blends prepared samples of several sources so that the units they carry track target shares.

    ``weights``: the metadataset's weights (``blend``) or None with ``repetitions`` (``blend_epochized``:
    each source read ``repetitions[i]`` times, then the epoch ends). ``units(sample)``: what a
    sample counts (0 for one the rows will not carry). ``schedule``: points replacing ``weights``
    over training steps (``micro_batches_per_step`` rows of a rank per step). ``names``: each
    source's description for error messages.
    """

    _savable_fields = ("_shares", "_epoch_start", "exhausted")

    def __init__(
        self,
        sources: Sequence[SavableDataset[PreparedSample]],
        *,
        weights: Sequence[float] | None,
        units: Callable[[PreparedSample], int],
        unit: str,
        schedule: Sequence[BlendPoint] | None = None,
        schedule_mode: str = "step",
        micro_batches_per_step: int = 1,
        names: Sequence[str] = (),
        worker_config: WorkerConfig,
    ) -> None:
        super().__init__(list(sources), worker_config=worker_config)
        self.weights = None if weights is None else tuple(float(w) for w in weights)
        self.units = units
        self.unit = unit
        self.schedule = None if schedule is None else tuple(schedule)
        self.schedule_mode = schedule_mode
        self.micro_batches_per_step = micro_batches_per_step
        self.names = list(names) or [f"source {i}" for i in range(len(sources))]
        #: This worker's rows emitted or planned so far (set by the packing stage downstream).
        self.row_position: Callable[[], int] = lambda: 0
        self.reset_state_own()

    def reset_state_own(self) -> None:
        self._tracker = ShareTracker.of(len(self.datasets))
        self._epoch_start = [0] * len(self.datasets)
        self.exhausted = [False] * len(self.datasets)
        self._unsupervised_run = [0] * len(self.datasets)

    @property
    def _shares(self) -> dict[str, Any]:
        """The tracker's plain state (a savable field)."""
        return self._tracker.state()

    @_shares.setter
    def _shares(self, state: dict[str, Any]) -> None:
        self._tracker = ShareTracker.from_state(state)

    def len_worker(self, worker_idx: int | None = None) -> int:
        return sum(dataset.len_worker(worker_idx) for dataset in self.datasets)

    def current_weights(self) -> list[float]:
        """The target weights for the next draw: the schedule's at the step of this worker's next
        row, the metadataset's weights, or (epochized blends under a token unit) the units each
        source has left this epoch."""
        if self.schedule is not None:
            wc = self.worker_config
            step = rank_row_step(
                self.row_position(), worker=wc.rank_worker_id(), num_workers=wc.num_workers,
                micro_batches_per_step=self.micro_batches_per_step,
            )
            return list(scheduled_weights(self.schedule, step, mode=self.schedule_mode))
        if self.weights is not None:
            return list(self.weights)
        planned = [dataset.len_worker() for dataset in self.datasets]
        epoch = ShareTracker(
            drawn=self._tracker.drawn,
            due=self._tracker.due,
            samples=[n - start for n, start in zip(self._tracker.samples, self._epoch_start)],
        )
        return epoch_weights(planned, epoch)

    def __iter__(self) -> Iterator[PreparedSample]:
        iterators: list[Iterator[PreparedSample] | None] = [
            iter(dataset) if dataset.worker_has_samples() and not spent else None
            for dataset, spent in zip(self.datasets, self.exhausted)
        ]
        self.exhausted = [iterator is None for iterator in iterators]
        while not all(self.exhausted):
            weights = self.current_weights()
            available = [not spent for spent in self.exhausted]
            if not any(w > 0 and ok for w, ok in zip(weights, available)):
                weights = [1.0] * len(weights)  # only zero-weight sources left this epoch: drain them evenly
            source = self._tracker.choose(weights, available)
            try:
                sample = next(iterators[source])  # type: ignore[arg-type]
            except StopIteration:
                self.exhausted[source] = True
                iterators[source] = None
                continue
            units = self.units(sample)
            self._check_supervised(source, sample, units)
            self._tracker.count(source, units, weights)
            yield add_sample_restore_key(sample, source, src=self)
        # The epoch is over (finite sources): the next one starts afresh.
        self.exhausted = [False] * len(self.datasets)
        self._epoch_start = list(self._tracker.samples)

    def _check_supervised(self, source: int, sample: PreparedSample, units: int) -> None:
        """Under ``supervised_tokens``, stop on a source whose good samples carry no supervised tokens."""
        if self.unit != "supervised_tokens" or sample.skip_reason is not None:
            return
        self._unsupervised_run[source] = 0 if units else self._unsupervised_run[source] + 1
        if self._unsupervised_run[source] >= MAX_UNSUPERVISED_RUN:
            raise UnsupervisedSourceError(
                f"blend_unit='supervised_tokens': {self.names[source]} gave {MAX_UNSUPERVISED_RUN} samples in a row "
                "with no supervised tokens (no assistant answer with loss), so its share of trained tokens can "
                "never be met; fix: use blend_unit: tokens for this blend, or give the dataset's samples "
                "assistant answers (or remove it from the blend)"
            )

    def take_back(self, sample: PreparedSample) -> None:
        """Un-count a sample the rows did not carry after all (it failed to decode in the packing stage)."""
        source = blend_source(sample.__restore_key__)
        if source is not None:
            self._tracker.uncount(source, self.units(sample), self.current_weights())

    def config(self) -> dict[str, Any]:
        return {
            "type": type(self).__qualname__,
            "unit": self.unit,
            "weights": self.weights,
            "schedule": None if self.schedule is None else [p.to_dict() for p in self.schedule],
            "schedule_mode": self.schedule_mode,
            "datasets": [dataset.config() for dataset in self.datasets],
            "worker_config": self.worker_config.config(),
        }

    def __str__(self) -> str:
        return f"ShareBlendDataset(unit={self.unit}, weights={self.weights}, sources={len(self.datasets)})"
