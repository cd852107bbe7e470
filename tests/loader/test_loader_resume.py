"""Real Energon loaders: nothing dropped over an epoch, and exact resume from any saved state."""

from __future__ import annotations


import pytest

from energon_pack.identity import ResumeMismatchError
from energon_pack.loader import get_packing_loader
from tests.support.loader_runs import EAGER, ENERGON_CHECKPOINTS, W, full_run, full_run_with_pending, make_config, row_digest, rows_after_resume

# Slow: real Energon loaders (worker processes, whole epochs).
pytestmark = pytest.mark.slow

@pytest.fixture(scope="module")
def dataset(synthetic_dataset):
    return synthetic_dataset.out_dir


@pytest.fixture(scope="module")
def all_keys(synthetic_dataset):
    return sorted(f"sample{i:05d}" for i in range(synthetic_dataset.written))


#: A round once the new samples hold one row of tokens, instead of per 4 new samples. On the
#: 40-sample dataset one worker's share then leaves bins pending (two workers' halves do not).
TOKEN_BUFFER = {"buffer_size": None, "buffer_tokens": W}


@pytest.mark.parametrize("num_workers", [0, 1, 2])
@pytest.mark.parametrize("buffer", [{}, TOKEN_BUFFER], ids=["buffer_size", "buffer_tokens"])
def test_epoch_yields_every_key_once_minus_counted_skips(dataset, processor, all_keys, num_workers, buffer):
    rows, stats = full_run(dataset, processor, make_config(num_workers, **buffer))
    keys = [key for row_keys, _ in rows for key in row_keys]
    assert len(keys) == len(set(keys))
    assert stats["samples_in"] == len(all_keys)
    assert len(keys) + stats["skipped_total"] == len(all_keys)
    assert set(keys) <= set(all_keys)
    assert stats["fill"] > 0.5


#: Worker checkpoints of the resume tests: the loader's default (one a row), and Energon's own
#: defaults (a restore replays the rows made since the last checkpoint).
CHECKPOINTS = {"default": {}, "energon": ENERGON_CHECKPOINTS}


def test_a_worker_checkpoints_every_row_unless_the_caller_says_otherwise(dataset, processor):
    """A restore re-makes the rows a worker made since its last checkpoint: one a row by default."""
    with get_packing_loader(dataset, make_config(1), processor) as loader:
        assert (loader.dataset.checkpoint_every_sec, loader.dataset.checkpoint_every_min_n_samples) == (0, 1)
    with get_packing_loader(dataset, make_config(1), processor, **ENERGON_CHECKPOINTS) as loader:
        assert (loader.dataset.checkpoint_every_sec, loader.dataset.checkpoint_every_min_n_samples) == (60, 2)


@pytest.mark.parametrize(
    ("num_workers", "checkpoints", "buffer"),
    [
        *[(workers, checkpoints, {}) for workers in (0, 1, 2) for checkpoints in CHECKPOINTS],
        (1, "default", TOKEN_BUFFER),
    ],
)
def test_restore_continues_with_identical_rows(dataset, processor, num_workers, checkpoints, buffer):
    kwargs = CHECKPOINTS[checkpoints]
    config = make_config(num_workers, **buffer)
    reference, pending, _ = full_run_with_pending(dataset, processor, config, **kwargs)
    assert len(reference) >= 4
    with_pending = [i + 1 for i, count in enumerate(pending) if count > 0]
    assert with_pending, "no row boundary has pending groups: the test would not exercise them"
    for save_after in sorted({1, with_pending[0], with_pending[-1], len(reference) - 1}):
        rows = rows_after_resume(dataset, processor, config, save_after, **kwargs)
        assert rows == reference[save_after:], f"save after row {save_after}"


@pytest.mark.parametrize("rank", [0, 1])
def test_restore_per_data_parallel_rank(dataset, processor, all_keys, rank):
    config = make_config(2)
    reference, _ = full_run(dataset, processor, config, rank=rank, world_size=2, **EAGER)
    other, _ = full_run(dataset, processor, config, rank=1 - rank, world_size=2, **EAGER)
    mine = {k for keys, _ in reference for k in keys}
    theirs = {k for keys, _ in other for k in keys}
    assert not mine & theirs and mine | theirs <= set(all_keys)
    save_after = len(reference) // 2
    loader = get_packing_loader(dataset, config, processor, rank=rank, world_size=2, **EAGER)
    iterator = iter(loader)
    for _ in range(save_after):
        next(iterator)
    state = loader.save_state_rank()
    del iterator, loader
    resumed = get_packing_loader(dataset, config, processor, rank=rank, world_size=2, **EAGER)
    resumed.restore_state_rank(state)
    assert [row_digest(row) for row in resumed] == reference[save_after:]


def test_finished_worker_does_not_replay_its_share(dataset, processor):
    """Energon 7.4.1 replays a finished worker's share on restore; the packing stage stops it."""
    config = make_config(2)
    reference, _ = full_run(dataset, processor, config, **EAGER)
    loader = get_packing_loader(dataset, config, processor, **EAGER)
    iterator = iter(loader)
    for _ in range(len(reference) - 1):
        next(iterator)
    state = loader.save_state_rank()
    del iterator, loader
    resumed = get_packing_loader(dataset, config, processor, **EAGER)
    resumed.restore_state_rank(state)
    assert [row_digest(row) for row in resumed] == reference[-1:]


@pytest.mark.parametrize(
    ("field", "change"),
    [
        ("buffer_size", {"buffer_size": 8}),
        ("seq_length", {"seq_length": 8192}),
        ("loss_reduction: saved 'token', current 'sample'", {"loss_reduction": "sample"}),
    ],
    ids=["buffer_size", "seq_length", "loss_reduction"],
)
def test_restore_under_a_changed_config_names_the_field(dataset, processor, field, change):
    loader = get_packing_loader(dataset, make_config(0), processor)
    next(iter(loader))
    state = loader.save_state_rank()
    changed = get_packing_loader(dataset, make_config(0, **change), processor)
    with pytest.raises(ResumeMismatchError, match=field):
        changed.restore_state_rank(state)
    inexact = get_packing_loader(dataset, make_config(0, allow_inexact_resume=True, **change), processor)
    inexact.restore_state_rank(state)
    assert sum(1 for _ in inexact) > 0


def test_second_epoch_of_a_finite_loader_starts_over(dataset, processor):
    """Iterating a finished loader again is a new epoch (Energon reshuffles), not an empty one."""
    loader = get_packing_loader(dataset, make_config(0), processor)
    first = sorted(key for row in loader for key in row["__keys__"])
    second = sorted(key for row in loader for key in row["__keys__"])
    assert first == second and first


@pytest.mark.parametrize("max_wait_rounds", [1, 20])
def test_decode_failures_are_counted_and_leave_no_holes(corrupt_dataset, processor, max_wait_rounds):
    """A bin that loses a sample at decode time goes back to pending (within the wait bound)."""
    config = make_config(0, max_wait_rounds=max_wait_rounds, buffer_size=8)
    rows, stats = full_run(corrupt_dataset.out_dir, processor, config)
    keys = [key for row_keys, _ in rows for key in row_keys]
    assert stats["skipped"].get("corrupt_image", 0) >= 1
    assert len(keys) == len(set(keys)) and len(keys) + stats["skipped_total"] == corrupt_dataset.written
    assert stats["max_wait_rounds_seen"] <= max_wait_rounds
    if max_wait_rounds == 20:  # nothing is due before the end: every row before the flush is full
        assert stats["fill_before_flush"] >= config.min_fill


def test_restore_with_decode_failures(corrupt_dataset, processor):
    config = make_config(2, buffer_size=8)
    reference, _ = full_run(corrupt_dataset.out_dir, processor, config, **EAGER)
    for save_after in (1, len(reference) // 2):
        loader = get_packing_loader(corrupt_dataset.out_dir, config, processor, **EAGER)
        iterator = iter(loader)
        for _ in range(save_after):
            next(iterator)
        state = loader.save_state_rank()
        del iterator, loader
        resumed = get_packing_loader(corrupt_dataset.out_dir, config, processor, **EAGER)
        resumed.restore_state_rank(state)
        assert [row_digest(row) for row in resumed] == reference[save_after:]


def test_a_row_is_rebuilt_from_its_restore_key(dataset, processor):
    """Energon's debugging path: ``loader.restore_sample(row["__restore_key__"])`` gives the same row."""
    loader = get_packing_loader(dataset, make_config(0), processor)
    rows = list(loader)
    for row in (rows[0], rows[-1]):
        assert row_digest(loader.restore_sample(row["__restore_key__"])) == row_digest(row)
