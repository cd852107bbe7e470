"""An in-memory source of prepared samples and trivial row builders for packing-stage tests
(no workers, no processor, no media)."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

import torch
from megatron.energon.flavors.base_dataset import SavableDataset
from megatron.energon.worker import WorkerConfig

from energon_pack.core.visual import VisualInputs
from energon_pack.errors import BadSampleError
from energon_pack.rows.encoded import EncodedSample, PackedRow, PackedSegment, PreparedSample
from energon_pack.runtime.packing_stage import RowSteps


class ListSource(SavableDataset[PreparedSample]):
    """Prepared samples of the given token lengths (key ``s<i>``), restorable by key; sample i is a
    bad-sample marker when i is in ``bad``. Its savable state is its read position."""

    _savable_fields = ("_position",)

    def __init__(self, lengths: list[int], *, worker_config: WorkerConfig, bad: frozenset[int] = frozenset()) -> None:
        super().__init__(worker_config)
        self.lengths = lengths
        self.bad = bad
        self.reset_state_own()

    def reset_state_own(self) -> None:
        self._position = 0

    def __iter__(self) -> Iterator[PreparedSample]:
        while self._position < len(self.lengths):
            self._position += 1
            yield self.sample(self._position - 1)

    def sample(self, index: int) -> PreparedSample:
        ids = torch.arange(self.lengths[index], dtype=torch.int64) + 1000 * index
        return PreparedSample(
            __key__=f"s{index}",
            __restore_key__=("ListSource", index),
            __subflavors__=None,
            __sources__=None,
            input_ids=ids,
            labels=ids,
            loss_mask=torch.ones(len(ids)),
            images=[],
            videos=[],
            skip_reason="malformed_conversation" if index in self.bad else None,
            skip_detail="bad" if index in self.bad else None,
        )

    def restore_sample(self, restore_key: tuple[Any, ...]) -> PreparedSample:
        return self.sample(restore_key[1])

    def can_restore_sample(self) -> bool:
        return True

    def len_worker(self, worker_idx: int | None = None) -> int:
        return len(self.lengths)

    def worker_has_samples(self) -> bool:
        return True

    def config(self) -> dict[str, Any]:
        return {"type": type(self).__qualname__, "lengths": self.lengths}


def row_builders(undecodable: frozenset[str] = frozenset()) -> dict[str, RowSteps]:
    """A stage's ``steps``: ``postencode`` (raises ``corrupt_image`` for the keys in ``undecodable``) and ``pack``."""

    def postencode(sample: PreparedSample) -> EncodedSample:
        if sample.__key__ in undecodable:
            raise BadSampleError("corrupt_image", f"{sample.__key__} does not decode")
        n = sample.num_tokens
        segment = PackedSegment(
            key=sample.__key__, input_ids=sample.input_ids, labels=sample.labels, loss_mask=sample.loss_mask,
            mrope_position_ids=torch.arange(n).expand(3, n), visual=VisualInputs(),
        )
        return EncodedSample.derive_from(sample, segment=segment)

    def pack(samples: list[EncodedSample]) -> PackedRow:
        return PackedRow.derive_from(samples[0], segments=[s.segment for s in samples], stats={})

    return {"steps": RowSteps(postencode=postencode, pack=pack)}


#: Telemetry that measures the process (memory, bytes of samples held, seconds per stage, samples it
#: read again by key), not packing state: a restored balanced worker holds its pending samples parked.
MEASUREMENTS = ("peak_rss_bytes", "buffered_bytes", "stage_seconds", "worker_seconds", "restore_reads",
                "parked_reads")


def take(stage: Any, count: int | None = None) -> tuple[list[tuple[list[str], dict]], Any]:
    """Up to ``count`` rows (all when None) as (keys, stats without telemetry), and the state after them."""
    stage.worker_config.worker_activate(0)
    try:
        rows = []
        iterator = iter(stage)
        while count is None or len(rows) < count:
            row = next(iterator, None)
            if row is None:
                break
            stats = {k: v for k, v in row.stats.items() if k not in MEASUREMENTS}
            rows.append(([segment.key for segment in row.segments], stats))
        state = pickle.loads(pickle.dumps(stage.save_state()))
    finally:
        stage.worker_config.worker_deactivate()
    return rows, state
