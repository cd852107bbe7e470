"""Shared fixtures: offline processors (built once per session) and small synthetic datasets."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def processor():
    from energon_pack.qwen.processor import load_processor

    return load_processor()


@pytest.fixture(scope="session")
def processor_qwen3():
    from energon_pack.qwen.processor import load_processor

    return load_processor(family="qwen3-vl")


@pytest.fixture(scope="session")
def processor_qwen35():
    """The offline Qwen3.5 / Qwen3.6 processor (first build ~20 s, then cached on disk)."""
    from energon_pack.qwen.processor import load_processor

    return load_processor(family="qwen3.5")


@pytest.fixture(scope="session")
def processor_qwen3_omni():
    """The offline Qwen3-Omni processor with the released Instruct template (built in 4-11 s)."""
    from energon_pack.qwen.processor import load_processor

    return load_processor(family="qwen3-omni")


@pytest.fixture(scope="session")
def processor_qwen3_omni_thinking():
    """The offline Qwen3-Omni processor with the released Thinking template."""
    from energon_pack.qwen.processor import load_processor

    return load_processor(family="qwen3-omni", variant="thinking")


@pytest.fixture(scope="session")
def processor_qwen35_saved(processor_qwen35, tmp_path_factory):
    """The offline Qwen3.5 processor saved as a Hugging Face folder beside a ``qwen3_5_moe``
    config.json, loaded back with ``load_processor(folder)``: transformers then rebuilds its own
    ``Qwen3_5Tokenizer`` from the folder's vocabulary, as for a released checkpoint."""
    from transformers import Qwen3_5MoeConfig

    from energon_pack.qwen.processor import load_processor

    folder = tmp_path_factory.mktemp("qwen35_saved")
    processor_qwen35.save_pretrained(folder)
    Qwen3_5MoeConfig().save_pretrained(folder)
    return load_processor(folder)


@pytest.fixture(scope="session")
def golden_references():
    """HF references of the golden mixes, run once per session for the postencode (pixels) and the
    preencode (tokens) golden tests (``tests.support.hf_reference.GoldenReferences``)."""
    from tests.support.hf_reference import GoldenReferences

    return GoldenReferences()


@pytest.fixture(scope="session")
def synthetic_dataset(tmp_path_factory):
    """A prepared synthetic dataset of 40 mixed samples (images, videos, multi-turn text)."""
    from energon_pack.data.synthetic import SyntheticSpec, make_synthetic_dataset

    root = tmp_path_factory.mktemp("synthetic")
    spec = SyntheticSpec(max_image_side=640, max_video_seconds=3.0, max_video_side=128)
    report = make_synthetic_dataset(root, 40, seed=1, spec=spec, samples_per_shard=16)
    return report


@pytest.fixture(scope="session")
def corrupt_dataset(tmp_path_factory):
    """40 samples, about a tenth of the images truncated (the header reads, decoding fails)."""
    from energon_pack.data.synthetic import SyntheticSpec, make_synthetic_dataset

    spec = SyntheticSpec(max_image_side=640, max_video_seconds=3.0, max_video_side=128, corrupt_fraction=0.1)
    return make_synthetic_dataset(tmp_path_factory.mktemp("corrupt"), 40, seed=3, spec=spec, samples_per_shard=16)


@pytest.fixture(autouse=True)
def _scheduling_stays_normal():
    """A test that leaves its process's main thread at another scheduling policy (SVT-AV1 leaves
    real-time FIFO 99 behind when run as root, see ``tests.support.real_corpus.scheduling_kept``)
    fails here and the policy is restored: at real-time priority two test processes can starve
    every other process on a 2-core machine."""
    from tests.support.real_corpus import restore_scheduling, thread_scheduling

    saved = thread_scheduling()
    yield
    changed = restore_scheduling(saved)
    if changed is not None:
        pytest.fail(
            f"the test left this process at scheduling policy {changed[0]} priority {changed[1].sched_priority} "
            f"(it had {saved[0]}); fix: encode with tests.support.real_corpus.scheduling_kept()"
        )


def pytest_addoption(parser):
    parser.addoption("--folder-times", action="store_true", help="print the seconds spent per test folder (make test-profile)")


def pytest_configure(config):
    if config.getoption("--folder-times") and not hasattr(config, "workerinput"):
        from tests.support.folder_times import FolderTimes

        config.pluginmanager.register(FolderTimes(), "folder-times")
    _watch_for_a_stalled_run(config)


def _watch_for_a_stalled_run(config) -> None:
    """A run in which no test finishes for ``ENERGON_PACK_STALL_S`` seconds ends with the stacks of
    its processes (``tests.support.stall_watch``); test processes dump theirs on SIGUSR1."""
    import tempfile
    from pathlib import Path

    from tests.support import stall_watch

    if hasattr(config, "workerinput"):
        stacks_dir = os.environ.get(stall_watch.STACKS_DIR_VARIABLE)
        if stacks_dir:
            stall_watch.dump_stacks_on_sigusr1(Path(stacks_dir))
        return
    limit = stall_watch.stall_seconds()
    if limit > 0:
        stacks_dir = Path(tempfile.mkdtemp(prefix="energon-pack-stacks-"))
        os.environ[stall_watch.STACKS_DIR_VARIABLE] = str(stacks_dir)  # inherited by the test processes
        stream = os.fdopen(os.dup(2), "w", buffering=1)  # stderr itself, not pytest's capture of it
        config.pluginmanager.register(stall_watch.StallWatch(limit, stacks_dir, stream), "stall-watch")


def pytest_collection_modifyitems(config, items):
    """Long units of work first (``tests.support.scheduling.collection_order``; a stable sort)."""
    from tests.support.scheduling import collection_order

    items.sort(key=lambda item: collection_order(item.nodeid))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Units of work for ``-n 2`` (``tests.support.scheduling``): files, the golden mix, each notebook."""
    from tests.support.scheduling import make_scheduler

    return make_scheduler(config, log)


def pytest_terminal_summary(terminalreporter):
    """List the tutorial notebooks that ``tests/tutorials/test_notebooks.py`` executed: outcome and run time."""
    lines = []
    for outcome in ("passed", "failed"):
        for report in terminalreporter.stats.get(outcome, []):
            properties = dict(getattr(report, "user_properties", ()))
            if "notebook" in properties and report.when == "call":
                seconds = properties.get("notebook_seconds")
                lines.append(f"  tutorials/{properties['notebook']}: {outcome}" + (f" in {seconds} s" if seconds is not None else ""))
    if lines:
        terminalreporter.write_sep("-", f"tutorial notebooks executed: {len(lines)}")
        for line in sorted(lines):
            terminalreporter.write_line(line)
