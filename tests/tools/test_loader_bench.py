"""The loader benchmark: settings, run order, row bytes, worker memory sampling, and one tiny run."""

from __future__ import annotations

import argparse
import multiprocessing

import pytest
import torch

from energon_pack.tools import run_bench
from energon_pack.tools.bench_loader import (
    LoaderBenchOptions,
    LoaderSetting,
    WorkerMemorySampler,
    interleaved,
    loader_options,
    measure_run,
    row_pixel_bytes,
    settings_of,
)
from energon_pack.core.visual import VisualInputs


def test_every_buffer_has_ours_per_payload_then_eager() -> None:
    labels = [s.label for s in settings_of(LoaderBenchOptions(buffer_sizes=(16, 64), pixel_dtypes=("float32", "uint8")))]
    assert labels == [
        "ours float32 B16", "ours uint8 B16", "eager float32 B16",
        "ours float32 B64", "ours uint8 B64", "eager float32 B64",
    ]


def test_each_decode_threads_setting_is_a_setting_of_ours() -> None:
    options = LoaderBenchOptions(buffer_sizes=(16,), pixel_dtypes=("uint8",), decode_threads=(None, 1))
    settings = settings_of(options)
    assert [s.label for s in settings] == ["ours uint8 B16", "ours uint8 B16 T1", "eager float32 B16"]
    assert [s.decode_threads for s in settings] == [None, 1, None]


def test_runs_are_interleaved_and_alternate_their_order() -> None:
    a, b = (LoaderSetting(side="ours", pixel_dtype="uint8", buffer_size=n) for n in (1, 2))
    assert list(interleaved([a, b], 3)) == [(0, a), (0, b), (1, b), (1, a), (2, a), (2, b)]


def test_row_pixel_bytes_reads_ours_and_eager_rows() -> None:
    visual = VisualInputs(pixel_values=torch.zeros(10, 1176, dtype=torch.uint8), image_grid_thw=torch.tensor([[1, 2, 5]]),
                          image_mean=(0.5,) * 3, image_std=(0.5,) * 3, rescale_factor=1 / 255)
    assert row_pixel_bytes({"visual_inputs": visual}) == 11760
    assert row_pixel_bytes({"pixel_values": torch.zeros(2, 3), "pixel_values_videos": None}) == 24


def _hold_memory(ready, done) -> None:
    block = bytearray(64 * 2**20)  # touched: private memory
    block[::4096] = b"x" * len(block[::4096])
    ready.set()
    done.wait(30)


def test_memory_sampler_sees_a_child_process_private_memory() -> None:
    context = multiprocessing.get_context("fork")
    ready, done = context.Event(), context.Event()
    sampler = WorkerMemorySampler()
    child = context.Process(target=_hold_memory, args=(ready, done))
    child.start()
    try:
        assert ready.wait(30)
        sampler.sample()
    finally:
        done.set()
        child.join()
    assert sampler.peak_uss >= 64 * 2**20 and sampler.peak_rss >= sampler.peak_uss


def _one_row_with_a_short_lived_worker():
    """A loader stand-in: a worker process holding 64 MiB, one row, the worker gone before the end."""
    context = multiprocessing.get_context("fork")
    ready, done = context.Event(), context.Event()
    child = context.Process(target=_hold_memory, args=(ready, done))
    child.start()
    try:
        assert ready.wait(30)
        yield {"__keys__": ["a"], "cu_seqlens_q": torch.tensor([0, 5]), "__stats__": {}}
    finally:
        done.set()
        child.join()


def test_an_epoch_shorter_than_one_sampling_interval_still_reads_its_workers(monkeypatch) -> None:
    """Under load a one-row epoch can end before the sampler's first reading (both figures were 0)."""
    monkeypatch.setattr(WorkerMemorySampler.__init__, "__defaults__", (3600.0,))
    figures = measure_run(_one_row_with_a_short_lived_worker, "one row")
    assert figures.rows == 1 and figures.peak_uss >= 64 * 2**20 and figures.peak_rss >= figures.peak_uss


def test_loader_options_come_from_the_command_line() -> None:
    args = argparse.Namespace(samples=8, dataset=None, seq_length=4096, buffer_sizes=[4], workers=1,
                              pixel_dtype=["uint8"], epochs=2, prefetch_factor=1, decode_threads=[None, 2])
    assert loader_options(args) == LoaderBenchOptions(samples=8, seq_length=4096, buffer_sizes=(4,), workers=1,
                                                      pixel_dtypes=("uint8",), epochs=2, prefetch_factor=1,
                                                      decode_threads=(None, 2))


@pytest.mark.slow
def test_loader_bench_prints_ours_and_eager_on_a_prepared_dataset(synthetic_dataset, tmp_path, capsys) -> None:
    args = argparse.Namespace(stage="loader", samples=0, out=tmp_path, dataset=synthetic_dataset.out_dir,
                              seq_length=4096, buffer_sizes=[8], workers=1, pixel_dtype=["uint8"], epochs=1,
                              prefetch_factor=1)
    assert run_bench(args) == 0
    lines = capsys.readouterr().out.splitlines()
    ours = next(line for line in lines if line.strip().startswith("ours uint8 B8"))
    eager = next(line for line in lines if line.strip().startswith("eager float32 B8"))
    assert "where worker time goes" in "\n".join(lines)
    # ours against the decode+resize floor of the samples it emitted, in wall and CPU seconds
    header = next(i for i, line in enumerate(lines) if line.startswith("efficiency: decode+resize floor"))
    assert lines[header + 1].split()[-1] == "cpu" and "efficiency" in lines[header + 1]
    values = lines[header + 3].split()[3:]
    assert lines[header + 3].strip().startswith("ours uint8 B8") and all(float(v) > 0 for v in values)
    # samples/s, USS and fill are positive numbers on both sides.
    for line in (ours, eager):
        values = line.split()[3:]
        assert float(values[0]) > 0 and float(values[3]) > 0


def test_efficiency_is_the_best_floor_over_the_best_active_seconds() -> None:
    from energon_pack.tools.bench_loader import RunFigures, efficiency_rows
    from energon_pack.tools.floor import FloorSeconds

    ours, eager = (LoaderSetting(side=side, pixel_dtype="uint8", buffer_size=4) for side in ("ours", "eager"))
    runs = {
        ours: [
            RunFigures(last_telemetry={0: {"worker_seconds": {"wall": 1.5, "cpu": 1.0}}, 1: {"worker_seconds": {"wall": 0.5, "cpu": 0.5}}}),
            RunFigures(last_telemetry={0: {"worker_seconds": {"wall": 1.25, "cpu": 1.6}}}),
        ],
        eager: [RunFigures()],
    }
    floors = [FloorSeconds(wall=1.5, cpu=1.2), FloorSeconds(wall=1.0, cpu=1.3)]
    (row,) = efficiency_rows(runs, floors)
    assert row["setting"] == "ours uint8 B4" and row["efficiency wall"] == 1.0 / 1.25 and row["efficiency cpu"] == 1.2 / 1.5
    assert runs[ours][0].worker_seconds == {"wall": 2.0, "cpu": 1.5}  # summed over the workers' last totals


def test_floor_plans_only_the_emitted_samples(synthetic_dataset, processor) -> None:
    from energon_pack.tools.floor import floor_media, run_floor

    everything = floor_media(synthetic_dataset.out_dir, [f"sample{i:05d}" for i in range(1000)], processor)
    none = floor_media(synthetic_dataset.out_dir, [], processor)
    assert not none.images and not none.videos and run_floor(none).wall < 0.01
    assert everything.images and all(w % 28 == 0 and h % 28 == 0 for _, (w, h) in everything.images)
    assert all(last == max(kept) for _, last, kept, _ in everything.videos)
