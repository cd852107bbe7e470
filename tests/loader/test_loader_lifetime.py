"""A loader's lifetime: workers stop after a failed epoch, and nothing is left behind when it goes."""

from __future__ import annotations

import gc
import multiprocessing
import os
import subprocess
import sys
import textwrap
from pathlib import Path

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
    """The user catches the error and carries on; the interpreter exits with nothing on stderr
    about worker processes (no ``AssertionError: can only test a child process``) and leaves no
    statistics folder in its temporary folder."""
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
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "caught" in done.stdout and "rows" in done.stdout
    for marker in ("Exception ignored", "AssertionError", "Traceback"):
        assert marker not in done.stderr, done.stderr[-4000:]
    assert not list(tmp_path.glob("energon_pack_*")), "the loaders' statistics folders must be gone at exit"


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
