"""The packing stage on an in-memory source (no workers, no processor, no media): rows equal the
simulator's, skips are counted, exact resume from any row boundary, a finished epoch stays done."""  # noqa: E501

from __future__ import annotations

import pytest
from megatron.energon.worker import WorkerConfig

from energon_pack.config import PackingPolicy, RowLayout
from energon_pack.packing.algorithms import RoundSize, RowBudget
from energon_pack.packing.simulate import iter_rounds
from energon_pack.runtime.packing_stage import PendingGroupPackingDataset
from tests.support.stage_source import ListSource, row_builders, take

#: Token lengths of the stream (W = 32): enough rounds for pending groups, waits and a flush.
LENGTHS = [20, 9, 7, 30, 3, 12, 16, 5, 25, 8, 11, 2, 14, 6, 19, 4, 13, 10, 22, 1, 17, 15, 9, 18]
ROW = RowLayout(seq_length=32)
POLICY = PackingPolicy(buffer_size=4, max_wait_rounds=2, min_fill=0.95)


def make_stage(
    lengths: list[int] = LENGTHS,
    *,
    bad: frozenset[int] = frozenset(),
    undecodable: frozenset[str] = frozenset(),
    row: RowLayout = ROW,
    policy: PackingPolicy = POLICY,
) -> PendingGroupPackingDataset:
    worker_config = WorkerConfig(rank=0, world_size=1, num_workers=0)
    source = ListSource(lengths, worker_config=worker_config, bad=bad)
    return PendingGroupPackingDataset(source, row=row, policy=policy, **row_builders(undecodable), worker_config=worker_config)


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


@pytest.mark.parametrize("undecodable", [frozenset(), frozenset({"s2", "s9"})], ids=["clean", "decode-failures"])
def test_the_upcoming_row_kept_as_samples_come_and_go_equals_the_buffer_summed(undecodable):
    """``_upcoming_row`` (what a schedule's draw aims at) uses the buffer's running slot sum: at
    every draw it equals rows emitted plus the buffered samples' slots summed afresh, also after a
    restore from any row boundary (the sum is recomputed from the re-read samples, never saved)."""
    pad = RowLayout(seq_length=32, pad_to_multiple_of=4)  # slots differ from tokens: the sum is of slots

    def checked_stage() -> tuple[PendingGroupPackingDataset, list[tuple[int, int]]]:
        stage = make_stage(undecodable=undecodable, row=pad)
        seen: list[tuple[int, int]] = []
        reads = stage.dataset.sample

        def sample(index: int):
            summed = sum(stage._slots(buffered) for buffered in stage._samples)
            seen.append((stage._upcoming_row(), stage._stats.rows + summed // pad.seq_length))
            return reads(index)

        stage.dataset.sample = sample
        return stage, seen

    reference, _ = take(make_stage(undecodable=undecodable, row=pad))
    for saved_after in range(0, len(reference) + 1, 3):
        _, state = take(make_stage(undecodable=undecodable, row=pad), saved_after)
        resumed, seen = checked_stage()
        resumed.restore_state(state)
        continuation, _ = take(resumed)
        assert continuation == reference[saved_after:]
        assert seen and all(kept == summed for kept, summed in seen), (saved_after, seen)
        assert resumed._samples.slots_total == 0  # the stream ended: nothing buffered
