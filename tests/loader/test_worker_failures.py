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

import contextlib
import faulthandler
import gc
import os
import pickle
import signal
import time
from collections import Counter

import pytest

from energon_pack.config import PackingConfig
from energon_pack.loader import get_packing_loader
from energon_pack.runtime.inflight import InflightRecorder, WorkerDiedError
from energon_pack.runtime.task_encoder import QwenVLPackingTaskEncoder
from tests.support.loader_runs import EAGER, make_config, row_digest

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


# --- a sample whose decode kills its worker: named, excluded, the epoch finished ---------------


def _abort_when_decoding(monkeypatch, key: str) -> None:
    """Make the worker process abort (SIGABRT, as a native decoder's crash) right after it recorded
    that it decodes the pixels of sample ``key`` (the patch reaches the forked workers)."""
    record = InflightRecorder.decoding

    @contextlib.contextmanager
    def crashing(self, sample, stage, members=()):
        with record(self, sample, stage, members):
            if stage == "postencode" and sample.__key__ == key:
                faulthandler.disable()  # no traceback dump: the process just dies
                os.abort()
            yield

    monkeypatch.setattr(InflightRecorder, "decoding", crashing)


def _run_until_the_worker_dies(loader) -> tuple[list[str], object, WorkerDiedError]:
    """Keys delivered up to the last saved state, that state (pickled after every row), the error."""
    keys, delivered, state = [], [], None
    with pytest.raises(WorkerDiedError) as died:
        for row in loader:
            delivered.extend(row["__keys__"])
            state = pickle.loads(pickle.dumps(loader.save_state_rank()))
            keys = list(delivered)
    return keys, state, died.value


def _restart_excluding(error: WorkerDiedError, planted: str, make_loader, state) -> tuple[list[str], dict]:
    """Check the error names ``planted`` and its exclude line, then read the rest of the epoch from
    ``state`` with the entry the error printed excluded."""
    message = str(error)
    assert [record["key"] for record in error.samples] == [planted]
    entry = f"{error.samples[0]['shard']}#{planted}"
    assert f"sample key {planted!r}" in message and f"exclude: [{entry!r}]" in message, message
    assert f"get_packing_loader(..., exclude=[{entry!r}])" in message
    resumed = make_loader([entry])
    resumed.restore_state_rank(state)
    return [key for row in resumed for key in row["__keys__"]], resumed.stats()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_sample_that_kills_its_worker_is_named_and_a_restart_excluding_it_finishes_the_epoch(
    dataset, processor, reference, monkeypatch
):
    every_key = Counter(key for keys, _ in reference for key in keys)
    planted = reference[len(reference) // 2][0][0]
    _abort_when_decoding(monkeypatch, planted)
    config = make_config(2, timeout=KILL_TIMEOUT, **NARROW)
    before, state, error = _run_until_the_worker_dies(get_packing_loader(dataset, config, processor, **EAGER))
    after, stats = _restart_excluding(
        error, planted, lambda exclude: get_packing_loader(dataset, config, processor, exclude=exclude, **EAGER), state
    )
    assert Counter(before + after) == every_key - Counter([planted])
    assert stats["skipped"] == {"excluded": 1}


@pytest.fixture(scope="module")
def plan(dataset, processor):
    from energon_pack.plan.build import build_plan

    return build_plan(dataset, make_config(0, **NARROW), processor, num_workers=0, progress=False)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_plan_loader_names_a_killing_sample_and_a_restart_excluding_it_finishes_the_epoch(
    dataset, processor, plan, monkeypatch
):
    config = make_config(2, timeout=KILL_TIMEOUT, **NARROW)
    clean = [row["__keys__"] for row in get_packing_loader(dataset, config, processor, plan=plan)]
    every_key = Counter(key for keys in clean for key in keys)
    planted = clean[len(clean) // 2][0]
    _abort_when_decoding(monkeypatch, planted)
    before, state, error = _run_until_the_worker_dies(get_packing_loader(dataset, config, processor, plan=plan))
    def make_loader(exclude):
        return get_packing_loader(dataset, config, processor, plan=plan, exclude=exclude)

    after, stats = _restart_excluding(error, planted, make_loader, state)
    assert Counter(before + after) == every_key - Counter([planted])
    assert stats["skipped"] == {"excluded": 1}
