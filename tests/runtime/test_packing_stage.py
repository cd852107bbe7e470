"""The packing stage on an in-memory source (no workers, no processor, no media): rows equal the
simulator's, skips are counted, exact resume from any row boundary, a finished epoch stays done."""  # noqa: E501

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from megatron.energon.flavors.base_dataset import SavableDataset
from megatron.energon.worker import WorkerConfig

from energon_pack.config import PackingPolicy, RowLayout
from energon_pack.rows.encoded import EncodedSample, PackedRow, PackedSegment, PreparedSample
from energon_pack.errors import BadSampleError
from energon_pack.packing.algorithms import RoundSize, RowBudget
from energon_pack.packing.simulate import iter_rounds
from energon_pack.runtime.packing_stage import PendingGroupPackingDataset, RowSteps
from energon_pack.core.visual import VisualInputs

#: Token lengths of the stream (W = 32): enough rounds for pending groups, waits and a flush.
LENGTHS = [20, 9, 7, 30, 3, 12, 16, 5, 25, 8, 11, 2, 14, 6, 19, 4, 13, 10, 22, 1, 17, 15, 9, 18]
ROW = RowLayout(seq_length=32)
POLICY = PackingPolicy(buffer_size=4, max_wait_rounds=2, min_fill=0.95)


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


def make_stage(
    lengths: list[int] = LENGTHS,
    *,
    bad: frozenset[int] = frozenset(),
    undecodable: frozenset[str] = frozenset(),
    row: RowLayout = ROW,
    policy: PackingPolicy = POLICY,
) -> PendingGroupPackingDataset:
    worker_config = WorkerConfig(rank=0, world_size=1, num_workers=0)

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

    source = ListSource(lengths, worker_config=worker_config, bad=bad)
    return PendingGroupPackingDataset(
        source, row=row, policy=policy, steps=RowSteps(postencode=postencode, pack=pack), worker_config=worker_config
    )


#: Telemetry that measures the process (memory, seconds per stage), not packing state.
MEASUREMENTS = ("peak_rss_bytes", "stage_seconds", "worker_seconds")


def take(stage: PendingGroupPackingDataset, count: int | None = None) -> tuple[list[tuple[list[str], dict]], Any]:
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


def simulated_rows(lengths: list[int], undecodable: frozenset[int] = frozenset()) -> list[list[str]]:
    rounds = iter_rounds(lengths, RowBudget(tokens=ROW.seq_length), round_size=RoundSize(samples=POLICY.buffer_size), min_fill=POLICY.min_fill, max_wait_rounds=POLICY.max_wait_rounds, decode_failures=undecodable)
    return [[f"s{item.index}" for item in row] for packing_round in rounds for row in packing_round.rows]


@pytest.mark.parametrize("undecodable", [frozenset(), frozenset({2, 9, 13})], ids=["clean", "decode-failures"])
def test_rows_are_the_simulators_rows(undecodable):
    """The stage and the simulator drive one round planner: same rows, re-pends included."""
    rows, _ = take(make_stage(undecodable=frozenset(f"s{i}" for i in undecodable)))
    assert [keys for keys, _ in rows] == simulated_rows(LENGTHS, undecodable)
    keys = [key for row_keys, _ in rows for key in row_keys]
    assert sorted(keys) == sorted(f"s{i}" for i in range(len(LENGTHS)) if i not in undecodable)


def test_skips_are_counted_and_never_buffered():
    lengths = [*LENGTHS, 40]  # the last one is overlong at W=32
    rows, _ = take(make_stage(lengths, bad=frozenset({0, 5}), undecodable=frozenset({"s7"})))
    stats = rows[-1][1]
    assert stats["skipped"] == {"malformed_conversation": 2, "overlong": 1, "corrupt_image": 1}
    assert stats["samples_in"] == len(lengths)
    assert stats["samples_packed"] == len(lengths) - 4 == sum(len(keys) for keys, _ in rows)
    assert stats["buffered_samples"] == 0 and stats["pending_samples"] == 0
    assert stats["rows"] == len(rows) and stats["max_wait_rounds_seen"] <= POLICY.max_wait_rounds


def test_overlong_sample_raises_with_on_overlong_error():
    with pytest.raises(ValueError, match="'s1' has 40 tokens .* seq_length is 32"):
        take(make_stage([5, 40], policy=PackingPolicy(on_overlong="error")))


@pytest.mark.parametrize("undecodable", [frozenset(), frozenset({"s2", "s9"})], ids=["clean", "decode-failures"])
def test_restore_from_every_row_boundary_continues_identically(undecodable):
    reference, _ = take(make_stage(undecodable=undecodable))
    assert any(stats["pending_samples"] for _, stats in reference), "no row leaves pending groups"
    for saved_after in range(len(reference) + 1):
        _, state = take(make_stage(undecodable=undecodable), saved_after)
        resumed = make_stage(undecodable=undecodable)
        resumed.restore_state(state)
        continuation, _ = take(resumed)
        assert continuation == reference[saved_after:], f"saved after row {saved_after}"


def test_a_finished_epoch_restored_yields_nothing():
    """Energon 7.4.1 replays a finished worker's share on restore; the stage's exhausted flag stops it."""
    rows, state = take(make_stage())
    assert rows
    restored = make_stage()
    restored.restore_state(state)
    assert take(restored)[0] == []
