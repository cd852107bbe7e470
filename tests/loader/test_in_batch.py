"""Rows of variable width through real Energon loaders: in-batch rows (``mode="in_batch"``, k
samples per row) and online rows with ``fixed_width=False``."""

from __future__ import annotations

import hashlib
import pickle
from typing import Any

import pytest

from energon_pack.config import PackingConfig
from energon_pack.loader import get_packing_loader
from energon_pack.rows.thd import row_width

K = 4
EAGER = dict(checkpoint_every_sec=0, checkpoint_every_min_n_samples=1)


def make_config(num_workers: int = 0, **overrides: Any) -> PackingConfig:
    values = dict(seq_length=2048, num_workers=num_workers, repeat=False, mode="in_batch", micro_batch_size=K,
                  fixed_width=False, width_multiple=64)
    return PackingConfig(**{**values, **overrides})


def row_record(row: dict[str, Any]) -> tuple[tuple[str, ...], str]:
    digest = hashlib.sha256()
    for name in ("input_ids", "labels", "loss_mask", "mrope_position_ids", "cu_seqlens_q_padded"):
        digest.update(row[name].contiguous().numpy().tobytes())
    pixels = row["visual_inputs"].pixel_values
    if pixels is not None:
        digest.update(pixels.contiguous().numpy().tobytes())
    return tuple(row["__keys__"]), digest.hexdigest()


@pytest.fixture(scope="module")
def dataset(synthetic_dataset):
    return synthetic_dataset.out_dir


def test_rows_hold_k_consecutive_samples_in_variable_width(dataset, processor, synthetic_dataset):
    config = make_config()
    loader = get_packing_loader(dataset, config, processor)
    rows = list(loader)
    keys = [key for row in rows for key in row["__keys__"]]
    stats = loader.stats()
    assert len(keys) == len(set(keys)) and len(keys) + stats["skipped_total"] == synthetic_dataset.written
    assert stats["samples_in"] == synthetic_dataset.written and stats["rows"] == len(rows)
    assert all(1 <= len(row["__keys__"]) <= K for row in rows)
    assert sum(len(row["__keys__"]) == K for row in rows) >= len(rows) - 2
    for row in rows:
        lengths = (row["cu_seqlens_q"][1:] - row["cu_seqlens_q"][:-1]).tolist()
        width = row["input_ids"].shape[1]
        assert width == row["total_tokens"] == int(row["cu_seqlens_q_padded"][-1]) == row_width(lengths, config.row)
        assert width % 64 == 0 and width - sum(lengths) < 64  # pad multiple 1: no alignment gaps
    assert stats["real_tokens"] / stats["row_slots"] == pytest.approx(stats["fill"])


def test_samples_longer_than_seq_length_are_counted_as_overlong(dataset, processor, synthetic_dataset):
    loader = get_packing_loader(dataset, make_config(seq_length=384), processor)
    rows = list(loader)
    stats = loader.stats()
    assert stats["skipped"].get("overlong", 0) >= 1
    assert sum(len(row["__keys__"]) for row in rows) + stats["skipped_total"] == synthetic_dataset.written
    assert all(int(n) <= 384 for row in rows for n in row["cu_seqlens_q"][1:] - row["cu_seqlens_q"][:-1])


@pytest.mark.slow
@pytest.mark.parametrize("num_workers", [0, 2])
def test_restore_continues_with_identical_rows_and_stats(dataset, processor, num_workers):
    config = make_config(num_workers)
    loader = get_packing_loader(dataset, config, processor, **EAGER)
    reference = [row_record(row) for row in loader]
    final = loader.stats()
    save_after = len(reference) // 2
    loader = get_packing_loader(dataset, config, processor, **EAGER)
    iterator = iter(loader)
    for _ in range(save_after):
        next(iterator)
    state = pickle.loads(pickle.dumps(loader.save_state_rank()))
    del iterator
    resumed = get_packing_loader(dataset, config, processor, **EAGER)
    resumed.restore_state_rank(state)
    assert [row_record(row) for row in resumed] == reference[save_after:]
    assert resumed.stats()["samples_in"] == final["samples_in"]


@pytest.mark.slow
def test_a_row_is_rebuilt_from_its_restore_key(dataset, processor):
    loader = get_packing_loader(dataset, make_config(), processor)
    rows = list(loader)
    for row in (rows[0], rows[-1]):
        assert row_record(loader.restore_sample(row["__restore_key__"])) == row_record(row)


@pytest.mark.slow
def test_decode_failures_leave_the_sample_out_and_are_counted(corrupt_dataset, processor):
    loader = get_packing_loader(corrupt_dataset.out_dir, make_config(), processor)
    rows = list(loader)
    stats = loader.stats()
    keys = [key for row in rows for key in row["__keys__"]]
    assert stats["skipped"].get("corrupt_image", 0) >= 1
    assert len(keys) + stats["skipped_total"] == corrupt_dataset.written == stats["samples_in"]


def test_online_variable_width_rows_have_no_tail_and_count_their_width(dataset, processor):
    config = PackingConfig(seq_length=2048, num_workers=0, repeat=False, fixed_width=False, width_multiple=64)
    loader = get_packing_loader(dataset, config, processor)
    widths = []
    for row in loader:
        lengths = (row["cu_seqlens_q"][1:] - row["cu_seqlens_q"][:-1]).tolist()
        width = row["input_ids"].shape[1]
        assert width == row["total_tokens"] == int(row["cu_seqlens_q_padded"][-1]) == row_width(lengths, config.row)
        assert width % 64 == 0 and width - sum(lengths) < 64 and width <= 2048
        widths.append(width)
    assert loader.stats()["row_slots"] == sum(widths)
