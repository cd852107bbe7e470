"""``energon-pack bench --media realistic``: ours and the eager design on the realistic media mix,
per model family.

The mix (`realistic_mix`: 12 MP phone photos, 1080p clips of 30 s to 5 min, one 4K clip) is
prepared once. For each family the offline processor of that family (``load_processor(family=...,
max_frames=...)``) runs ours (the package's default pixel payload, uint8) and the eager design
(`bench_loader.HFProcessorPackingTaskEncoder`: the Hugging Face processor in ``encode_sample``,
float32 pixels, first-fit-decreasing per buffer) at the same row width, buffer size and worker
count, interleaved ``epochs`` times (`bench_loader.measure_settings`), with one floor pass per round.

Per side: samples/s and tokens/s (median over runs), samples per worker CPU second (best run: what
samples/s would be on cores of its own), worker peak USS and RSS (max over runs), workers' CPU
seconds (best run), efficiency = decode-and-resize floor CPU seconds / workers' CPU
seconds (best of each), and cores per GPU: the CPU cores that feed one GPU training at
``gpu_tokens_per_s`` real tokens per second, ``gpu_tokens_per_s * worker CPU seconds / tokens``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from energon_pack.tools.bench_loader import (
    LoaderBenchOptions, RunFigures, check_one_setting, measure_settings, one_setting_from_args, settings_of, side_figures,
)
from energon_pack.tools.realistic_mix import RealisticMix, clip_durations, realistic_dataset

__all__ = [
    "DEFAULT_GPU_TOKENS_PER_S",
    "REALISTIC_FAMILIES",
    "REALISTIC_LOADER",
    "RealisticBenchOptions",
    "bench_realistic",
    "cores_per_gpu",
    "realistic_options",
    "realistic_tables",
]

#: Families the realistic bench runs by default, in order.
REALISTIC_FAMILIES = ("qwen2.5-vl", "qwen3-vl", "qwen3.5")
#: Real tokens per second one GPU trains a 7B Qwen-VL at (H100 SXM, BF16): 6 * 7.6e9 FLOP per token
#: * 8000 tokens/s = 3.6e14 FLOP/s, 37 % of the 989 TFLOP/s dense peak (docs/performance.md).
DEFAULT_GPU_TOKENS_PER_S = 8000.0
#: Pixel payload of ours: the package default (``RowLayout.pixel_dtype``).
OURS_PIXEL_DTYPE = "uint8"


#: The loader settings of the realistic bench, both sides: rows of 32k tokens (a long clip fills most of
#: one), one buffer size, 2 workers, 3 interleaved runs, and our side's pixel payload.
REALISTIC_LOADER = LoaderBenchOptions(seq_length=32768, buffer_sizes=(16,), pixel_dtypes=(OURS_PIXEL_DTYPE,))


@dataclass(frozen=True, kw_only=True)
class RealisticBenchOptions:
    """Knobs of ``bench --media realistic``: the mix, the families, the loader settings both sides
    share (one buffer size, one pixel payload of ours), the frame cap users set for long videos,
    and the GPU throughput for "cores per GPU"."""

    mix: RealisticMix = RealisticMix()
    families: tuple[str, ...] = REALISTIC_FAMILIES
    loader: LoaderBenchOptions = REALISTIC_LOADER
    max_frames: int = 64
    gpu_tokens_per_s: float = DEFAULT_GPU_TOKENS_PER_S

    def __post_init__(self) -> None:
        check_one_setting(self.loader, "the realistic bench")


def cores_per_gpu(gpu_tokens_per_s: float, worker_cpu_seconds: float, tokens: int) -> float:
    """CPU cores that keep one GPU fed: its tokens per second times the CPU seconds a token costs.

    Example: ``cores_per_gpu(8000.0, worker_cpu_seconds=30.0, tokens=60000)`` -> 4.0.
    """
    return gpu_tokens_per_s * worker_cpu_seconds / tokens if tokens else float("nan")


def _side_figures(runs: Sequence[RunFigures], floor_cpu: float, gpu_tokens_per_s: float) -> dict[str, float]:
    """One side's figures over its runs (`bench_loader.side_figures`, efficiency, cores per GPU)."""
    figures = side_figures(runs)
    cpu = figures["worker CPU s"]
    tokens = runs[0].real_tokens
    return {
        **figures,
        "efficiency (floor CPU / worker CPU)": floor_cpu / cpu,
        "cores per GPU": cores_per_gpu(gpu_tokens_per_s, cpu, tokens),
        "samples": runs[0].samples,
    }


def realistic_tables(options: RealisticBenchOptions, dataset: Path) -> list[tuple[str, list[dict[str, Any]], list[str]]]:
    """Ours and eager per family on ``dataset``: one table (a row per side, a ratio row ours / eager
    per family) and one "cores per GPU" table."""
    from energon_pack.qwen.processor import load_processor

    loader_options = replace(options.loader, dataset=dataset)
    ours, eager = settings_of(loader_options)
    figures, cores = [], []
    for family in options.families:
        processor = load_processor(family=family, max_frames=options.max_frames)  # type: ignore[arg-type]
        runs, passes = measure_settings([ours, eager], loader_options, dataset, processor)
        floor_cpu = min(seconds.cpu for _, seconds in passes)
        sides = {s.side: _side_figures(runs[s], floor_cpu, options.gpu_tokens_per_s) for s in (ours, eager)}
        for side, values in sides.items():
            figures.append({"family": family, "side": side, **values})
        ratio = {name: sides["ours"][name] / sides["eager"][name] for name in sides["ours"] if name != "samples"}
        figures.append({"family": family, "side": "ours / eager", **ratio})
        cores.append({
            "family": family,
            "ours": sides["ours"]["cores per GPU"],
            "eager": sides["eager"]["cores per GPU"],
            "floor": cores_per_gpu(options.gpu_tokens_per_s, floor_cpu, runs[ours][0].real_tokens),
        })
    mix = options.mix
    title = (
        f"realistic mix: {dataset} ({mix.photos} photos {mix.photo_size[0]}x{mix.photo_size[1]}, "
        f"{len(mix.clip_seconds)} clips {mix.clip_size[0]}x{mix.clip_size[1]} of "
        f"{', '.join(f'{s:.0f}' for s in mix.clip_seconds)} s, one {mix.uhd_size[0]}x{mix.uhd_size[1]} clip of "
        f"{mix.uhd_seconds:.0f} s, {mix.fps} fps; W={loader_options.seq_length}, B={ours.buffer_size}, "
        f"{loader_options.workers} workers, max_frames={options.max_frames}, {loader_options.epochs} interleaved runs; "
        f"ours {ours.pixel_dtype}, "
        "eager = HF processor in encode_sample + FFD per buffer, float32)"
    )
    cores_title = (
        f"cores per GPU: CPU cores one training GPU needs at {options.gpu_tokens_per_s:g} real tokens/s "
        "(--gpu-tokens-per-s; floor = decoding and resizing alone)"
    )
    return [(title, figures, list(figures[0])), (cores_title, cores, list(cores[0]))]


def bench_realistic(work_dir: Path, options: RealisticBenchOptions) -> list[tuple[str, list[dict[str, Any]], list[str]]]:
    """The realistic mix of ``options.mix`` prepared (once) under ``work_dir``, then `realistic_tables`."""
    return realistic_tables(options, realistic_dataset(work_dir, options.mix))


def realistic_options(args: Any) -> RealisticBenchOptions:
    """The realistic bench's knobs from the command line (``--family all`` is every family of `REALISTIC_FAMILIES`)."""
    mix = RealisticMix(photos=args.photos, clip_seconds=clip_durations(args.clips)).scaled(args.mix_scale)
    loader = one_setting_from_args(REALISTIC_LOADER, args)
    return RealisticBenchOptions(
        mix=mix,
        families=REALISTIC_FAMILIES if args.family == "all" else (args.family,),
        loader=loader,
        max_frames=args.max_frames,
        gpu_tokens_per_s=args.gpu_tokens_per_s,
    )
