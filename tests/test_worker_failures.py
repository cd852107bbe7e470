"""Killed and hung workers: a clear error instead of a hang, and an exact continuation from the last state.

* A worker killed with SIGKILL mid-epoch ends iteration with torch's ``RuntimeError`` naming the
  killed worker (the loader's ``timeout`` of 60 s bounds the wait: had the death gone unnoticed,
  the error would be a timeout instead); restoring the last saved state in a fresh loader yields
  exactly the rows an uninterrupted run yields after that point.
* A worker stuck in decoding (``postencode_sample`` patched to sleep, reaching the forked
  workers) becomes ``RuntimeError: DataLoader timed out`` after ``timeout`` seconds
  (``LoaderOptions.timeout``).
"""

from __future__ import annotations

import gc
import os
import pickle
import signal
import time

import pytest

from energon_pack.config import PackingConfig
from energon_pack.loader import get_packing_loader
from energon_pack.runtime.task_encoder import QwenVLPackingTaskEncoder
from tests.test_loader_resume import EAGER, make_config, row_digest

#: Seconds without a row after which the loader raises: bounds how long a killed worker may go unnoticed.
KILL_TIMEOUT = 60
#: The timeout knob for the hung-worker test.
HANG_TIMEOUT = 10
#: Narrow rows and no read-ahead beyond one row per worker: the killed worker still owes rows.
NARROW = dict(seq_length=1024, prefetch_factor=1)


@pytest.fixture(scope="module")
def dataset(synthetic_dataset):
    return synthetic_dataset.out_dir


@pytest.fixture(scope="module")
def reference(dataset, processor) -> list:
    """Row digests of an uninterrupted epoch with two workers."""
    return [row_digest(row) for row in get_packing_loader(dataset, make_config(2, **NARROW), processor, **EAGER)]


def _worker_pids(loader) -> list[int]:
    return [worker.pid for worker in loader._iterator._workers]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_killed_worker_is_a_clear_error_and_the_saved_state_continues_exactly(dataset, processor, reference):
    config = make_config(2, timeout=KILL_TIMEOUT, **NARROW)
    save_after = 2
    loader = get_packing_loader(dataset, config, processor, **EAGER)
    iterator = iter(loader)
    for _ in range(save_after):
        next(iterator)
    state = pickle.loads(pickle.dumps(loader.save_state_rank()))
    next(iterator)  # training goes on past the save point, then a worker dies
    assert len(reference) >= save_after + 6, "the killed worker must still owe rows"
    victim = _worker_pids(loader)[0]
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=rf"DataLoader worker \(pid.*{victim}.*\) (is killed by signal|exited)"):
        os.kill(victim, signal.SIGKILL)
        for _ in iterator:
            pass
    print(f"SIGKILL of worker pid {victim}: error after {time.monotonic() - start:.2f} s")
    del iterator, loader
    gc.collect()  # shut the broken loader's remaining worker down now
    resumed = get_packing_loader(dataset, config, processor, **EAGER)
    resumed.restore_state_rank(state)
    assert [row_digest(row) for row in resumed] == reference[save_after:]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_hung_worker_becomes_a_clear_error_after_the_timeout(dataset, processor, reference, monkeypatch):
    stuck_key = reference[len(reference) // 2][0][0]
    postencode = QwenVLPackingTaskEncoder.postencode_sample

    def hangs_on_one_sample(self, sample, *args, **kwargs):
        if sample.__key__ == stuck_key:
            time.sleep(3600)
        return postencode(self, sample, *args, **kwargs)

    monkeypatch.setattr(QwenVLPackingTaskEncoder, "postencode_sample", hangs_on_one_sample)
    loader = get_packing_loader(dataset, make_config(2, timeout=HANG_TIMEOUT, **NARROW), processor)
    rows, last_row = 0, time.monotonic()
    with pytest.raises(RuntimeError, match=f"DataLoader timed out after {HANG_TIMEOUT} seconds"):
        for _ in loader:
            rows += 1
            last_row = time.monotonic()
    print(f"decode hung on {stuck_key!r}: error {time.monotonic() - last_row:.1f} s after row {rows}")
    assert rows < len(reference)
    del loader
    gc.collect()  # terminates the sleeping worker


@pytest.mark.parametrize(("options", "message"), [
    ({"num_workers": 0, "timeout": 5}, "num_workers=0"),
    ({"num_workers": 1, "timeout": -1}, "timeout=-1"),
])
def test_timeout_is_validated(options, message):
    with pytest.raises(ValueError, match=message):
        PackingConfig(seq_length=4096, **options)
