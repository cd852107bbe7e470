"""A loader's lifetime: workers stop after a failed epoch, and nothing is left behind when it goes."""

from __future__ import annotations

import gc
import multiprocessing
import multiprocessing.process
import os
import subprocess
import sys
import textwrap
import weakref
from pathlib import Path

import psutil
import pytest

from energon_pack import PackingConfig, get_packing_loader
from tests.support.paths import REPO



def overlong_config(num_workers: int) -> PackingConfig:
    """Every synthetic sample is longer than 64 tokens: the first one raises."""
    return PackingConfig(seq_length=64, num_workers=num_workers, repeat=False, on_overlong="error")


@pytest.mark.slow
def test_a_failed_epoch_stops_its_workers(synthetic_dataset, processor):
    loader = get_packing_loader(synthetic_dataset.out_dir, overlong_config(2), processor)
    with pytest.raises(ValueError, match="seq_length is 64"):
        list(loader)
    assert multiprocessing.active_children() == [], "the workers of a failed epoch must be shut down"


@pytest.mark.slow
def test_a_caught_overlong_error_exits_cleanly(synthetic_dataset, tmp_path):
    """The user catches the error and carries on, and leaves an in-process loader open; the
    interpreter exits with nothing on stderr (no ``AssertionError: can only test a child process``,
    no statistics published while modules are torn down) and leaves no statistics folder in its
    temporary folder."""
    script = textwrap.dedent(f"""
        import logging
        from energon_pack import PackingConfig, get_packing_loader, load_processor
        processor = load_processor()
        config = PackingConfig(seq_length=64, num_workers=2, repeat=False, on_overlong="error")
        loader = get_packing_loader({str(synthetic_dataset.out_dir)!r}, config, processor)
        try:
            for row in loader:
                pass
        except ValueError as err:
            saved = err
            print("caught")
        logging.disable(logging.WARNING)
        other = get_packing_loader({str(synthetic_dataset.out_dir)!r}, PackingConfig(seq_length=4096, num_workers=2, repeat=False), processor)
        print("rows", sum(1 for _ in other))
        in_process = get_packing_loader({str(synthetic_dataset.out_dir)!r}, PackingConfig(seq_length=4096, num_workers=0, repeat=False), processor)
        left_open = iter(in_process)  # an in-process loader never closed: finalized at interpreter exit
        next(left_open)
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "caught" in done.stdout and "rows" in done.stdout
    for marker in ("Exception ignored", "AssertionError", "Traceback"):
        assert marker not in done.stderr, done.stderr[-4000:]
    assert not list(tmp_path.glob("energon_pack_*")), "the loaders' statistics folders must be gone at exit"


@pytest.mark.slow
def test_a_loader_dropped_without_close_stops_its_workers_when_the_next_one_starts(synthetic_dataset, processor, monkeypatch):
    """A notebook cell run again: the old loader is dropped (no ``with``, no ``close()``) and a new
    one built. The new loader's collection frees the old one, whose workers must receive their
    shutdown signal and exit within it, not outlive torch's timed joins (5 s each) and be killed."""
    outlived: list[int] = []
    join = multiprocessing.process.BaseProcess.join

    def recording_join(process, timeout=None):
        join(process, timeout)
        if timeout is not None and process.is_alive():
            outlived.append(process.pid)

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "join", recording_join)
    config = PackingConfig(seq_length=4096, num_workers=2, repeat=True)
    loader = get_packing_loader(synthetic_dataset.out_dir, config, processor)
    next(iter(loader))
    old_workers = [psutil.Process(worker.pid) for worker in loader._iterator._workers]
    dropped = weakref.ref(loader)
    loader = None  # dropped without close(): Energon's loader is in a reference cycle, so it lives on
    assert dropped() is not None and all(worker.is_running() for worker in old_workers)

    loader = get_packing_loader(synthetic_dataset.out_dir, config, processor)
    next(iter(loader))
    try:
        assert dropped() is None, "the dropped loader must be freed (nothing may keep it alive)"
        assert not any(worker.is_running() for worker in old_workers), "the dropped loader's workers must be gone"
        assert outlived == [], f"workers {outlived} outlived their shutdown (never got the signal; killed after 5 s)"
    finally:
        loader.close()


def stats_folder(loader) -> Path:
    return Path(loader._stats_dir.name)


def test_the_statistics_folder_goes_with_the_loader(synthetic_dataset, processor):
    config = PackingConfig(seq_length=4096, num_workers=0, repeat=False)
    loader = get_packing_loader(synthetic_dataset.out_dir, config, processor)
    next(iter(loader))
    folder = stats_folder(loader)
    assert folder.is_dir()
    del loader
    gc.collect()
    assert not folder.exists(), "a garbage-collected loader must remove its statistics folder"

    with get_packing_loader(synthetic_dataset.out_dir, config, processor) as loader:
        rows = sum(1 for _ in loader)
        folder = stats_folder(loader)
        assert loader.stats()["rows"] == rows
    assert not folder.exists(), "a closed loader must remove its statistics folder"
    assert loader.stats()["rows"] == rows, "statistics stay readable after close()"


def test_in_process_loading_runs_no_periodic_full_collection(synthetic_dataset, processor, monkeypatch):
    """Without workers Energon's gc.collect every 10 rows would scan the trainer's whole heap: off,
    unless the caller asks for it."""
    calls = []
    monkeypatch.setattr(gc, "collect", lambda *args: calls.append(args) or 0)
    config = PackingConfig(seq_length=1024, num_workers=0, repeat=False)
    rows = sum(1 for _ in get_packing_loader(synthetic_dataset.out_dir, config, processor))
    assert rows >= 10 and calls == []
    asked = get_packing_loader(synthetic_dataset.out_dir, config, processor, gc_collect_every_n_steps=2)
    assert sum(1 for _ in asked) == rows and len(calls) >= rows // 2
