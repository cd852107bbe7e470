"""The test suite's own machinery (``tests/support``): units of work and their order for the two
test processes, the per-folder timing table, the golden references shared by two tests, the
large-tensor comparison, the watch that ends a stalled run with its stacks, and clip encoding
that leaves the process's scheduling as it was."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch

from tests.support import hf_reference, stall_watch
from tests.support.folder_times import FolderTimes, folder_of
from tests.support.paths import REPO
from tests.support.real_corpus import encode_clip, scheduling_kept, thread_scheduling
from tests.support.scheduling import collection_order, unit_of
from tests.support.tensor_checks import max_abs_difference


def test_units_are_files_except_the_golden_mix_and_each_notebook():
    assert unit_of("tests/qwen/test_rope.py::test_x[a]") == "tests/qwen/test_rope.py"
    assert unit_of("tests/golden/test_preencode.py::t") == unit_of("tests/golden/test_postencode.py::u") == "golden-mix"
    notebook = "tests/tutorials/test_notebooks.py::test_notebook_runs[01_quickstart.ipynb]"
    assert unit_of(notebook) == notebook


def test_long_folders_come_first_and_postencode_before_preencode():
    ids = ["tests/qwen/test_rope.py::a", "tests/golden/test_preencode.py::b", "tests/data/test_prepare.py::c",
           "tests/golden/test_postencode.py::d", "tests/loader/test_soak.py::e"]
    assert sorted(ids, key=collection_order) == [
        "tests/golden/test_postencode.py::d", "tests/golden/test_preencode.py::b", "tests/loader/test_soak.py::e",
        "tests/data/test_prepare.py::c", "tests/qwen/test_rope.py::a"]


def test_folder_times_sum_every_phase_and_count_each_test_once():
    times = FolderTimes()
    for nodeid, when, seconds in [("tests/qwen/test_a.py::x", "setup", 1.0), ("tests/qwen/test_a.py::x", "call", 2.0),
                                  ("tests/qwen/test_a.py::x", "teardown", 0.5), ("tests/cli/test_b.py::y", "call", 1.5)]:
        times.pytest_runtest_logreport(SimpleNamespace(nodeid=nodeid, when=when, duration=seconds, skipped=False))
    assert folder_of("tests/qwen/test_a.py::x") == "tests/qwen"
    header, first, second, total = times.table()
    assert first.split() == ["tests/qwen", "1", "3.5", "70.0%"] and second.split()[:3] == ["tests/cli", "1", "1.5"]
    assert total.split()[:3] == ["total", "2", "5.0"]


def test_golden_references_run_the_processor_once_per_sample(monkeypatch):
    calls = []

    def fake_reference(processor, messages, images, videos):
        calls.append(messages)
        return {"input_ids": len(calls), "pixel_values": "big"}

    monkeypatch.setattr(hf_reference, "hf_reference", fake_reference)
    references = hf_reference.GoldenReferences()
    golden = SimpleNamespace(messages="m", images=[], videos=[])
    assert references.full("processor", 7, 3, None, golden)["pixel_values"] == "big"
    assert references.tokens("processor", 7, 3, None, golden) == {"input_ids": 1}  # kept: no second run
    assert references.tokens("processor_qwen3", 7, 3, None, golden) == {"input_ids": 2, "pixel_values": "big"}
    assert len(calls) == references.processor_runs == 2


def test_golden_mixes_are_generated_once_and_shorter_ones_are_prefixes(monkeypatch):
    from tests.support import golden_media

    made = []
    monkeypatch.setattr(golden_media, "golden_samples", lambda n, seed, family: made.append(n) or list(range(n)))
    references = hf_reference.GoldenReferences()
    assert references.samples(5, 1, "qwen3-vl") == [0, 1, 2, 3, 4]
    assert references.samples(3, 1, "qwen3-vl") == [0, 1, 2] and made == [5]
    assert references.samples(6, 1, "qwen3-vl") == list(range(6)) and made == [5, 6]


def test_max_abs_difference_reads_like_float64_without_its_copies():
    assert max_abs_difference(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5])) == 0.5
    assert max_abs_difference(torch.zeros(0, 3), torch.zeros(0, 3)) == 0.0
    generator = torch.Generator().manual_seed(0)
    ours = torch.rand(1000, 64, generator=generator) * 4 - 2
    reference = ours + (torch.rand(1000, 64, generator=generator) - 0.5) * 4e-6
    exact = float((ours.double() - reference.double()).abs().max())
    assert abs(max_abs_difference(ours, reference) - exact) <= exact * 2**-23
    with pytest.raises(AssertionError, match="shape"):
        max_abs_difference(torch.zeros(2, 3), torch.zeros(3, 2))


def test_stall_limit_comes_from_the_environment():
    assert stall_watch.stall_seconds({"ENERGON_PACK_STALL_S": "90"}) == 90.0
    assert stall_watch.stall_seconds({}) == stall_watch.DEFAULT_STALL_S > 900  # above pytest-timeout's limit
    with pytest.raises(ValueError, match="ENERGON_PACK_STALL_S='soon'"):
        stall_watch.stall_seconds({"ENERGON_PACK_STALL_S": "soon"})


def test_a_test_process_writes_its_stacks_on_sigusr1(tmp_path):
    script = (
        "import sys, time; from pathlib import Path; sys.path.insert(0, sys.argv[1])\n"
        "from tests.support.stall_watch import dump_stacks_on_sigusr1\n"
        "def stuck_in_native_code():\n"
        "    print('ready', flush=True); time.sleep(60)\n"
        "dump_stacks_on_sigusr1(Path(sys.argv[2])); stuck_in_native_code()\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script, str(REPO), str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        os.kill(child.pid, signal.SIGUSR1)
        stacks = tmp_path / f"{child.pid}.txt"
        deadline = time.monotonic() + 30
        while "stuck_in_native_code" not in (stacks.read_text() if stacks.exists() else "") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "stuck_in_native_code" in stacks.read_text()
    finally:
        child.kill()
        child.wait()


def test_a_run_without_a_finished_test_ends_with_its_processes_and_stacks(tmp_path):
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    (stacks / "4242.txt").write_text('File "x.py", line 3 in stuck_here\n')
    exits: list[int] = []
    with open(tmp_path / "stderr.txt", "w+") as stream:  # a real file: faulthandler writes to its descriptor
        watch = stall_watch.StallWatch(0.4, stacks, stream, exit=exits.append, grace_s=0.0)
        watch.pytest_sessionstart(None)
        deadline = time.monotonic() + 30
        while not exits and time.monotonic() < deadline:
            time.sleep(0.05)
    text = (tmp_path / "stderr.txt").read_text()
    assert exits == [stall_watch.STALL_EXIT], text
    assert "no test finished for" in text and "the run is stalled" in text
    assert f"{os.getpid():>7}" in text  # the process table starts with the reporting process
    assert "Python stacks of test process 4242" in text and "stuck_here" in text
    assert "in _watch" in text  # the reporting process's own stacks, its watch thread among them


def test_a_finished_test_keeps_the_run_alive(tmp_path):
    stream, exits = io.StringIO(), []
    watch = stall_watch.StallWatch(2.0, tmp_path, stream, exit=exits.append, grace_s=0.0)
    watch.pytest_sessionstart(None)
    watch._last -= 1.5  # 1.5 s without a finished test: 1 s more would be a stall
    watch.pytest_runtest_logreport(None)
    time.sleep(1.0)
    assert watch.stalled_for() < 2.0 and exits == [] and stream.getvalue() == ""
    watch.pytest_sessionfinish(None)
    assert not tmp_path.exists()


def test_an_av1_encode_leaves_the_scheduling_policy_as_it_was():
    """SVT-AV1 run as root raises the encoding thread to real-time FIFO 99; ``encode_clip`` undoes it."""
    before = thread_scheduling()
    data = encode_clip("mp4", "libsvtav1", size=(128, 64), options={"svtav1-params": "log-level=0"})
    assert data[4:8] == b"ftyp" and thread_scheduling() == before
    with scheduling_kept():
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))  # allowed without privileges
    assert thread_scheduling() == before
