"""``energon-pack bench``: side-by-side speed and memory figures, measured in one run; tools
apart from the library (nothing in ``energon_pack`` imports them).

Each stage is a function ``(num_samples, work_dir) -> table rows`` registered in `BENCHES`, one
module per benchmark; a row is ``{"what": ..., "ours": ..., "HF": ..., "ratio": ...}`` with
``ratio = ours / HF``. Both sides run on the same samples, interleaved sample by sample, so the
ratio holds on a noisy machine.

- ``preencode`` (`bench_preencode`): preencode against the full Hugging Face processor call.
- ``postencode`` (`bench_postencode`): postencode (float32 and uint8 payloads) against it.
- ``loader`` (`bench_loader`): the whole packing loader, per buffer size and pixel payload,
  against the eager design (the processor in ``encode_sample``, FFD with Energon's own
  ``PackingDataset``) on the bench mix or on ``--dataset``: samples/s, worker USS / RSS,
  buffered bytes, pixel bytes per row, fill and time per stage; its knobs come from the command
  line (`bench_loader.loader_options`) and it prints two tables.
- ``plan`` (`bench_plan`): the offline plan path alone (no HF side): plan seconds, peak RSS, file
  size, open and read seconds of a format-2 plan, on synthetic facts of ``--samples`` samples or
  on ``--dataset`` (then measured first).
- ``foreign`` (`bench_foreign`): preencode of a sample read in place (Megatron-Bridge's format,
  pickle load included) against the same sample in our format (prints its own table).
- ``--media realistic`` (`bench_realistic`, `realistic_mix`): the loader stage, ours against the
  eager design per model family on a mix of 12 MP phone photos, long 1080p clips and a 4K clip:
  samples/s, tokens/s, worker USS / RSS, efficiency against the floor, cores per GPU.
- ``--media audio`` (`bench_audio_mix`, `audio_mix`): the loader stage, ours against the eager design
  per Omni family on a mix of speech-like clips of 1-30 s (WAV, FLAC, MP3, AAC/M4A, Ogg/Opus; WAV
  44.1 kHz stereo on request), videos heard with their sound, images and text: samples/s, worker CPU s
  per sample, worker USS / RSS, the audio frames the rows carry against the sounds' real frames
  (eager pads every sound as the processor does), and ours against the floor of decoding,
  resampling and featurising the sounds alone (`audio_floor`).
- ``jpeg`` (`bench_jpeg`): the optional fast JPEG decode (``RowLayout.fast_jpeg_decode``, "ours")
  against the exact path ("HF"): images/s, max abs difference and PSNR of the patches.
- ``prepare`` (`bench_prepare`): ``prepare`` from Parquet with embedded JPEGs against the same
  records as JSON + files: samples/s and peak memory next to one row group.
- ``blend`` (`bench_blend`): a metadataset blend read under each ``blend_unit``: per source its
  weight's share against the realized shares of samples, real and supervised tokens, and fill
  (not in ``--stage all``: it compares units, not ours against HF).
- ``balance`` (`bench_balance`): balanced steps without a plan on real loaders of several ranks:
  step imbalance from the rows' own FLOPs, today's order against balanced windows, beside the rank floor
  no order of the same rows goes below (not in ``--stage all``).
- ``metrics`` (`bench_metrics`): a training step of a tiny Qwen2.5-VL on CPU with and without
  ``RowMetrics``, and the share of the step the metrics calls take (not in ``--stage all``).
- ``audio`` (`bench_audio`): Qwen2.5-Omni features of 1-30 s clips, their real frames against the
  Hugging Face processor's 300-s padding: milliseconds per clip and audio encoder input; then per
  format, the length count and decode against PyAV alone and the features against torch.stft alone.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from energon_pack.core.tables import format_table
from energon_pack.tools.bench_balance import balance_options, bench_balance
from energon_pack.tools.bench_blend import bench_blend, blend_options
from energon_pack.tools.bench_foreign import bench_foreign
from energon_pack.errors import UsageError
from energon_pack.tools.bench_audio import bench_audio
from energon_pack.tools.bench_audio_mix import audio_bench_options, bench_audio_mix
from energon_pack.tools.bench_jpeg import bench_jpeg
from energon_pack.tools.bench_loader import LoaderBenchOptions, bench_loader, loader_options
from energon_pack.tools.bench_metrics import bench_metrics
from energon_pack.tools.bench_plan import bench_plan, plan_options
from energon_pack.tools.bench_postencode import bench_postencode
from energon_pack.tools.bench_preencode import bench_preencode
from energon_pack.tools.bench_prepare import bench_prepare, prepare_options
from energon_pack.tools.bench_realistic import bench_realistic, realistic_options
from energon_pack.tools.common import BenchRows

__all__ = ["BENCHES", "STAGES", "TABLE_COLUMNS", "run_bench"]

TABLE_COLUMNS = ("what", "ours", "HF", "ratio")

#: Stage name -> benchmark.
BENCHES: dict[str, Callable[[int, Path], BenchRows]] = {
    "preencode": bench_preencode,
    "postencode": bench_postencode,
    "loader": bench_loader,
    "jpeg": bench_jpeg,
    "plan": bench_plan,
    "foreign": bench_foreign,
    "prepare": bench_prepare,
    "blend": bench_blend,
    "balance": bench_balance,
    "audio": bench_audio,
    "metrics": bench_metrics,
}
#: Stages whose benchmark takes options from the command line and prints its own tables.
OPTIONS: dict[str, Callable[[argparse.Namespace], Any]] = {
    "loader": loader_options, "plan": plan_options, "foreign": lambda args: None, "prepare": prepare_options,
    "blend": blend_options,
    "balance": balance_options,
    "metrics": lambda args: None,
}
#: Stages of ``--stage all``, in run order.
STAGES: tuple[str, ...] = ("preencode", "postencode", "loader", "jpeg", "plan", "foreign", "prepare", "audio")


def run_bench(args: argparse.Namespace) -> int:
    """Run ``args.stage`` ("all" = every stage in `STAGES`) on ``args.samples`` samples; print one table per stage."""
    from energon_pack.core.cache import cache_dir

    work_dir = Path(args.out) if args.out is not None else cache_dir("bench")
    media = getattr(args, "media", "synthetic")
    if media in ("realistic", "audio"):
        return _run_media_mix(args, work_dir)
    if getattr(args, "seq_length", 0) is None:
        args = argparse.Namespace(**{**vars(args), "seq_length": LoaderBenchOptions().seq_length})
    stages = STAGES if args.stage == "all" else (args.stage,)
    for stage in stages:
        bench = BENCHES.get(stage)
        if bench is None:
            print(f"energon-pack bench --stage {stage}: not implemented yet")
            continue
        if stage in OPTIONS:
            _print_tables(bench(args.samples, work_dir, OPTIONS[stage](args)))
            continue
        rows = bench(args.samples, work_dir)
        print(f"\n{stage} ({args.samples} samples; ratio = ours / HF)")
        print(format_table(rows, TABLE_COLUMNS))
    return 0


def _run_media_mix(args: argparse.Namespace, work_dir: Path) -> int:
    """``bench --media realistic`` / ``--media audio``: the loader stage on the realistic mix
    (`bench_realistic`) or on the audio mix (`bench_audio_mix`)."""
    if args.stage == "balance" and args.media == "realistic":
        _print_tables(bench_balance(args.samples, work_dir, balance_options(args)))
        return 0
    if args.stage not in ("all", "loader"):
        raise UsageError(
            f"--media {args.media} runs the loader stage, not --stage {args.stage}; fix: drop --stage or use --stage loader"
        )
    if args.media == "realistic":
        _print_tables(bench_realistic(work_dir, realistic_options(args)))
        return 0
    try:
        options = audio_bench_options(args)
    except ValueError as err:
        raise UsageError(str(err)) from None
    _print_tables(bench_audio_mix(work_dir, options))
    return 0


def _print_tables(tables: list[tuple[str, BenchRows, list[str]]]) -> None:
    """Each (title, rows, columns) table after a blank line and its title."""
    for title, rows, columns in tables:
        print(f"\n{title}")
        print(format_table(rows, columns))
