"""The realistic media bench: its mix (sizes, EXIF, fixed GOP, cache), its arithmetic, one tiny run."""

from __future__ import annotations

import argparse
import math
from dataclasses import replace

import pytest

from energon_pack.tools.bench_realistic import (
    REALISTIC_FAMILIES,
    REALISTIC_LOADER,
    RealisticBenchOptions,
    bench_realistic,
    cores_per_gpu,
    realistic_options,
)
from energon_pack.tools.realistic_mix import RealisticMix, clip_durations, realistic_dataset

#: A mix small enough for a test: the same kinds of media as the real one, tiny.
TINY_MIX = RealisticMix(
    photos=2, photo_size=(640, 480), clip_seconds=(1.0, 2.0), clip_size=(320, 180),
    uhd_seconds=1.0, uhd_size=(640, 360), fps=10,
)


def test_clip_durations_span_30_s_to_5_min_geometrically() -> None:
    durations = clip_durations(6)
    assert durations[0] == 30.0 and math.isclose(durations[-1], 300.0)
    ratios = [b / a for a, b in zip(durations, durations[1:])]
    assert all(math.isclose(r, ratios[0]) for r in ratios)
    assert clip_durations(1) == (300.0,) and clip_durations(0) == ()


def test_the_options_compare_one_setting_per_side() -> None:
    with pytest.raises(ValueError, match=r"buffer_sizes=\(16, 64\).*fix: give one of each"):
        RealisticBenchOptions(loader=replace(REALISTIC_LOADER, buffer_sizes=(16, 64)))


def test_scaling_shortens_clips_and_keeps_sizes_and_at_least_two_frames() -> None:
    mix = RealisticMix().scaled(0.1)
    assert mix.clip_seconds == tuple(s * 0.1 for s in RealisticMix().clip_seconds) and mix.uhd_seconds == 6.0
    assert (mix.photo_size, mix.clip_size, mix.uhd_size) == ((4000, 3000), (1920, 1080), (3840, 2160))
    assert RealisticMix().scaled(1e-9).clip_seconds[0] * 30 == pytest.approx(2)
    assert mix.folder_name != RealisticMix().folder_name  # the cache is keyed by every parameter


def test_cores_per_gpu_is_gpu_throughput_times_cpu_seconds_per_token() -> None:
    assert cores_per_gpu(8000.0, worker_cpu_seconds=30.0, tokens=60000) == 4.0
    assert math.isnan(cores_per_gpu(8000.0, worker_cpu_seconds=1.0, tokens=0))


def test_options_come_from_the_command_line() -> None:
    args = argparse.Namespace(photos=3, clips=2, mix_scale=0.5, family="all", seq_length=None, buffer_sizes=[8, 64],
                              workers=1, epochs=2, prefetch_factor=1, max_frames=32, gpu_tokens_per_s=5000.0)
    options = realistic_options(args)
    assert options.families == REALISTIC_FAMILIES and options.loader.seq_length == RealisticBenchOptions().loader.seq_length
    assert options.mix == RealisticMix(photos=3, clip_seconds=(15.0, 150.0), uhd_seconds=30.0)
    loader = options.loader
    assert (loader.buffer_sizes, loader.workers, loader.epochs, loader.prefetch_factor, options.max_frames) == ((8,), 1, 2, 1, 32)
    assert loader.pixel_dtypes == REALISTIC_LOADER.pixel_dtypes == ("uint8",)
    assert realistic_options(argparse.Namespace(**{**vars(args), "family": "qwen3.5", "seq_length": 4096})).families == ("qwen3.5",)


@pytest.mark.slow
def test_the_mix_has_exif_photos_fixed_gop_clips_and_is_made_once(tmp_path) -> None:
    import json

    import av
    from PIL import Image

    dataset = realistic_dataset(tmp_path, TINY_MIX)
    raw = dataset.parent / "raw"
    records = [json.loads(line) for line in (raw / "records.jsonl").read_text().splitlines()]
    assert sorted(len(r.get("images", [])) + len(r.get("videos", [])) for r in records) == [1] * 5
    photo = Image.open(raw / records[[bool(r.get("images")) for r in records].index(True)]["images"][0])
    assert photo.size == (640, 480) and photo.getexif()[0x0112] in (1, 3, 6, 8)
    with av.open(str(raw / "clip001.mp4")) as container:
        stream = container.streams.video[0]
        keyframes = [packet.pts for packet in container.demux(stream) if packet.is_keyframe]
        assert (stream.width, stream.height, stream.frames) == (320, 180, 20)
    assert len(keyframes) == 2  # one keyframe per second
    stamp = (raw / "records.jsonl").stat().st_mtime_ns
    assert realistic_dataset(tmp_path, TINY_MIX) == dataset and (raw / "records.jsonl").stat().st_mtime_ns == stamp


@pytest.mark.slow
def test_a_tiny_realistic_bench_prints_sane_figures_per_family(tmp_path) -> None:
    loader = replace(REALISTIC_LOADER, seq_length=8192, buffer_sizes=(4,), workers=1, epochs=1, prefetch_factor=1)
    options = RealisticBenchOptions(mix=TINY_MIX, families=("qwen2.5-vl", "qwen3-vl"), loader=loader, max_frames=8)
    (title, rows, columns), (cores_title, cores, _) = bench_realistic(tmp_path, options)
    assert "realistic mix" in title and "cores per GPU" in cores_title and "8000" in cores_title
    assert [(r["family"], r["side"]) for r in rows] == [
        (family, side) for family in options.families for side in ("ours", "eager", "ours / eager")
    ]
    for row in rows:
        insane = {
            name: row[name] for name in columns[2:]
            if name in row and not (isinstance(row[name], (int, float)) and math.isfinite(row[name]) and row[name] > 0)
        }
        assert not insane, f"{row['family']} {row['side']}: not positive and finite: {insane}"
        if row["side"] != "ours / eager":
            assert row["samples"] == 5 and row["worker peak RSS MiB"] >= row["worker peak USS MiB"]
            assert row["samples/worker CPU s"] == pytest.approx(5 / row["worker CPU s"])
    for row in rows[2::3]:  # ratio rows: ours / eager of the rows above
        ours, eager = rows[rows.index(row) - 2], rows[rows.index(row) - 1]
        assert row["samples/s"] == pytest.approx(ours["samples/s"] / eager["samples/s"])
    assert [c["family"] for c in cores] == list(options.families) and all(c["ours"] > 0 and c["floor"] > 0 for c in cores)
