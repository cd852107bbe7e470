"""Soak: ``repeat=True``, two workers, many epochs of a small dataset with bad samples in it.

Over ``SOAK_ROWS`` rows (W small so that it runs in minutes; ~80 epochs):

* no worker memory growth after the first epoch: a worker's resident memory grows by less than
  5% of its private memory (USS) at the end of epoch 1. USS itself is printed, not bounded: it
  also grows while a worker writes to pages it shares copy-on-write with the parent (the
  allocator reusing the parent's free space; measured +10-25%, levelling off, resident memory
  flat), which is no new memory;
* skip warnings do not grow the log without bound: each bad sample is warned about at most
  once per worker, however many epochs re-read it (its skips are still counted every epoch);
* statistics stay consistent: per worker, rows x W = row slots, and the real tokens counted
  equal the non-gap tokens of the rows received (row width = real + gap tokens).

Each memory figure is the smallest of ``WINDOW`` readings, one per row, so that a row in flight
(its pixels) does not count as growth.
"""

from __future__ import annotations

import logging
from collections import defaultdict

import psutil
import pytest

from energon_pack.config import PackingConfig
from energon_pack.loader import get_packing_loader
from energon_pack.data.synthetic import SyntheticSpec, make_synthetic_dataset

W = 1024
SOAK_ROWS = 2000
NUM_SAMPLES = 120
NUM_WORKERS = 2
MAX_GROWTH = 0.05
WINDOW = 20


@pytest.fixture(scope="module")
def soak_dataset(tmp_path_factory):
    """Small media, a tenth of the images truncated (decode-time skips), some samples longer than W."""
    spec = SyntheticSpec(max_image_side=160, max_video_seconds=1.5, max_video_side=64, corrupt_fraction=0.1)
    return make_synthetic_dataset(tmp_path_factory.mktemp("soak"), NUM_SAMPLES, seed=5, spec=spec)


def test_reading_a_shard_by_offset_keeps_no_record_of_its_members(tmp_path):
    """Energon's cached shard readers call ``TarFile.next()`` at every sample; after
    ``forget_read_tar_members`` the tar file records none of them (unpatched: every member of
    every epoch, the worker leak this soak found)."""
    import webdataset as wds
    from megatron.energon.flavors.webdataset.itar import ITarFile

    from energon_pack.core.energon_fixes import forget_read_tar_members

    with wds.TarWriter(str(tmp_path / "shard.tar")) as writer:
        for index in range(20):
            writer.write({"__key__": f"s{index}", "json": b"[]", "0.jpg": b"x" * 100})
    forget_read_tar_members()
    with open(tmp_path / "shard.tar", "rb") as file, ITarFile.open(fileobj=file, mode="r:") as tar:
        names = []
        for _epoch in range(3):
            tar.offset = 0
            while (info := tar.next()) is not None:
                names.append(info.name)
        assert len(names) == 3 * 40 and tar.members == []


def _memory(pids: list[int]) -> dict[int, tuple[int, int]]:
    """(USS, RSS) in bytes of each worker process."""
    return {pid: (psutil.Process(pid).memory_full_info().uss, psutil.Process(pid).memory_info().rss) for pid in pids}


def _low_water(readings: list[dict[int, tuple[int, int]]]) -> dict[int, tuple[int, int]]:
    """Per worker, the smallest USS and the smallest RSS over several readings."""
    return {pid: tuple(min(r[pid][i] for r in readings) for i in (0, 1)) for pid in readings[0]}


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_many_epochs_keep_memory_logs_and_statistics_bounded(soak_dataset, processor, tmp_path):
    log_path = tmp_path / "skips.log"
    handler = logging.FileHandler(log_path)  # forked workers inherit it
    package_logger = logging.getLogger("energon_pack")
    package_logger.addHandler(handler)
    config = PackingConfig(seq_length=W, buffer_size=8, num_workers=NUM_WORKERS, repeat=True, timeout=120)
    rows_by_worker: dict[int, int] = defaultdict(int)
    real_by_worker: dict[int, int] = defaultdict(int)
    last_snapshot: dict[int, dict] = {}
    after_first_epoch: list[dict[int, tuple[int, int]]] = []
    at_end: list[dict[int, tuple[int, int]]] = []
    try:
        loader = get_packing_loader(soak_dataset.out_dir, config, processor)
        iterator = iter(loader)
        for index in range(SOAK_ROWS):
            row = next(iterator)
            snapshot = row["__stats__"]
            worker = snapshot["worker_id"]
            rows_by_worker[worker] += 1
            real_by_worker[worker] += W - int(row["padding_mask"].sum())
            last_snapshot[worker] = snapshot
            first_epoch_done = sum(s["samples_in"] for s in last_snapshot.values()) >= NUM_SAMPLES
            pids = [process.pid for process in loader._iterator._workers]
            if first_epoch_done and len(after_first_epoch) < WINDOW:
                if not after_first_epoch:
                    first_epoch_row = index + 1
                after_first_epoch.append(_memory(pids))
            if index >= SOAK_ROWS - WINDOW:
                at_end.append(_memory(pids))
        epochs = sum(s["samples_in"] for s in last_snapshot.values()) / NUM_SAMPLES
        skipped = loader.stats()["skipped"]
        del iterator, loader
    finally:
        package_logger.removeHandler(handler)
        handler.close()
    base, end = _low_water(after_first_epoch), _low_water(at_end)
    mib = {pid: [f"{value / 2**20:.1f}" for value in (*base[pid], *end[pid])] for pid in base}
    warnings = [line for line in log_path.read_text().splitlines() if "skipping sample" in line]
    print(f"{SOAK_ROWS} rows, {epochs:.1f} epochs; worker MiB (USS, RSS after epoch 1 at row {first_epoch_row}; "
          f"USS, RSS at the end): {mib}; skipped {skipped}; {len(warnings)} skip warnings")
    assert epochs >= 10, "too few epochs for a soak"
    for pid, (uss, rss) in base.items():
        assert end[pid][1] - rss < MAX_GROWTH * uss, f"worker {pid} grew: {mib[pid]}"
    distinct_skipped_keys = {line.split("skipping sample ", 1)[1].split(":", 1)[0] for line in warnings}
    assert sum(skipped.values()) > len(distinct_skipped_keys) * 5, "bad samples should be met every epoch"
    assert len(warnings) <= len(distinct_skipped_keys) * NUM_WORKERS
    for worker, snapshot in last_snapshot.items():
        assert snapshot["rows"] == rows_by_worker[worker]
        assert snapshot["row_slots"] == rows_by_worker[worker] * W
        assert snapshot["real_tokens"] == real_by_worker[worker]
