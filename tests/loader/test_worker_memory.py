"""Worker memory levers of the loader: gc frozen while workers fork, prefetch depth as a knob."""

from __future__ import annotations

import gc

import pytest

from energon_pack.config import PackingConfig
from energon_pack.loader import frozen_gc, get_packing_loader
from energon_pack.core.stage_times import STAGES


def test_frozen_gc_freezes_only_inside_the_block() -> None:
    assert gc.get_freeze_count() == 0
    with frozen_gc():
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
    with frozen_gc(enabled=False):  # in-process loading: no collection, no freeze
        assert gc.get_freeze_count() == 0


def test_in_process_loader_skips_energons_heap_freeze(synthetic_dataset) -> None:
    from energon_pack.qwen.processor import load_processor

    processor = load_processor()
    for workers in (0, 1):
        loader = get_packing_loader(synthetic_dataset.out_dir, PackingConfig(seq_length=4096, num_workers=workers, repeat=False),
                                    processor)
        wrapper = loader.dataset
        while type(wrapper).__name__ != "GcDataset":  # Energon's wrapper that freezes the heap per epoch
            wrapper = wrapper.dataset
        assert wrapper.freeze is (workers > 0)
        loader.close()


@pytest.mark.slow
@pytest.mark.parametrize("prefetch_factor", [1, 3])
def test_loader_uses_the_prefetch_knob_and_unfreezes_after_forking(synthetic_dataset, processor, prefetch_factor):
    config = PackingConfig(seq_length=4096, buffer_size=4, num_workers=2, repeat=False, prefetch_factor=prefetch_factor)
    loader = get_packing_loader(synthetic_dataset.out_dir, config, processor)
    assert loader.prefetch_factor == prefetch_factor
    rows = iter(loader)
    first = next(rows)
    assert gc.get_freeze_count() == 0 and first["__keys__"]
    rest = list(rows)
    # Each worker reports where its time went, every stage of the pipeline included.
    assert rest and set(STAGES) <= set(rest[-1]["__stats__"]["stage_seconds"])
    keys = [*first["__keys__"], *(key for row in rest for key in row["__keys__"])]
    assert len(keys) == len(set(keys)) and len(keys) + loader.stats()["skipped_total"] == synthetic_dataset.written


@pytest.mark.slow
def test_a_balanced_worker_holds_no_more_than_plain_as_the_pool_grows(tmp_path, processor) -> None:
    """Photos of about 1 MB each: a balanced worker with a 1024-row pool (filled at 32 rows a row,
    up to 4096 samples: hundreds of rows planned ahead by row 24) holds the pool's rows as restore
    keys, so its peak USS stays within 1.25x the plain worker's; holding the pool's samples it would
    hold every sample read."""
    from energon_pack.data.synthetic import SyntheticSpec, make_synthetic_dataset
    from energon_pack.tools.bench_loader import WorkerMemorySampler

    spec = SyntheticSpec(min_image_side=1000, max_image_side=1400, max_video_seconds=1.5, max_video_side=64,
                         max_images_per_sample=2)
    dataset = make_synthetic_dataset(tmp_path, 8, seed=3, spec=spec, samples_per_shard=4).out_dir
    peaks = {}
    for balance in (False, True):
        config = PackingConfig(seq_length=8192, num_workers=1, repeat=True, cost_model="qwen2.5-vl-3b",
                               balance_steps=balance, micro_batches_per_step=2, balance_window_rows=1024)
        sampler = WorkerMemorySampler()
        sampler.start()
        with get_packing_loader(dataset, config, processor) as loader:
            rows = iter(loader)
            for _ in range(24):
                next(rows)
            stats = loader.stats()
        sampler.stop()
        peaks[balance] = sampler.peak_uss
        assert (stats["parked_reads"] > 0) is balance
    assert peaks[True] <= 1.25 * peaks[False], {k: v / 2**20 for k, v in peaks.items()}
