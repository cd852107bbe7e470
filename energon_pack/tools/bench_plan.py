"""``energon-pack bench --stage plan``: the offline plan path at scale (plan seconds, peak memory,
file size, open seconds), on synthetic per-sample facts or on a prepared dataset.

Without ``--dataset`` the facts (tokens, ViT patches, media) of ``--samples`` samples come from
the reference mix (``energon_pack.packing.simulate.iter_reference_mix``), split into shards of
1000; with ``--dataset`` the split is measured first (header-only preencode, ``--workers``
processes) and the measure seconds are reported too. Then: plan (``plan_measurement``), save
(format 2), open (``open_plan``, header only) and read one rank's rows (rank 0 of 64).
Peak memory is the process's peak RSS over the whole run. A second table times the row interleave
of a metadataset's plan (``plan.blend.interleave_rows``) on ``--interleave-rows`` synthetic rows of
two sources.

Example: ``energon-pack bench --stage plan --samples 10000000`` -> a table with
``plan (s)``, ``peak RSS (MiB)``, ``open + first row (s)``, ...
"""

from __future__ import annotations

import resource
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from energon_pack.tools.common import BenchRows

__all__ = ["PlanBenchOptions", "bench_interleave", "bench_plan", "plan_options", "synthetic_compositions", "synthetic_measurement"]

#: Ranks of the "one rank reads its rows" figure.
READ_RANKS = 64


@dataclass(frozen=True, kw_only=True)
class PlanBenchOptions:
    """Knobs of the plan benchmark: the dataset to measure (None: synthetic facts), the row width
    and the measuring worker processes."""

    dataset: str | None = None
    seq_length: int = 8192
    workers: int = 2
    #: Rows of the interleave timing (0: none).
    interleave_rows: int = 1_000_000


def plan_options(args: Any) -> PlanBenchOptions:
    """The plan benchmark's knobs from the command line (defaults where ``args`` lacks one)."""
    defaults = PlanBenchOptions()
    return PlanBenchOptions(
        dataset=getattr(args, "dataset", None),
        seq_length=getattr(args, "seq_length", defaults.seq_length),
        workers=getattr(args, "workers", defaults.workers),
        interleave_rows=getattr(args, "interleave_rows", defaults.interleave_rows),
    )


def synthetic_measurement(num_samples: int, config: Any, *, seed: int = 0) -> Any:
    """A ``Measurement`` of ``num_samples`` reference-mix samples: samples whose aligned length
    exceeds ``config.seq_length`` are skipped as ``overlong``, as measuring would.

    Example: ``synthetic_measurement(1000, PackingConfig(seq_length=8192)).samples_in`` -> 1000.
    """
    from energon_pack.packing.simulate import iter_reference_mix
    from energon_pack.plan.build import UNMEASURED, Measurement

    facts = np.fromiter(
        (value for s in iter_reference_mix(num_samples, seed) for value in (s.tokens, s.vision_patches, s.media)),
        dtype=np.int64,
        count=3 * num_samples,
    ).reshape(num_samples, 3)
    measurement = Measurement.empty(num_samples)
    aligned = -(-facts[:, 0] // config.pad_multiple) * config.pad_multiple
    fits = aligned <= config.seq_length
    measurement.tokens[fits] = facts[fits, 0]
    measurement.tokens[~fits] = UNMEASURED
    measurement.vision[fits] = facts[fits, 1]
    measurement.media[fits] = facts[fits, 2]
    if not fits.all():
        measurement.skipped["overlong"] = int((~fits).sum())
    return measurement


def _peak_rss_mib() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB on Linux


def bench_plan(num_samples: int, work_dir: Path, options: PlanBenchOptions | None = None) -> list[tuple[str, BenchRows, list[str]]]:
    """Plan ``num_samples`` synthetic samples (or ``options.dataset``), save, open and read; one table."""
    from energon_pack.config import PackingConfig
    from energon_pack.identity import plan_fingerprint
    from energon_pack.plan.build import plan_measurement, synthetic_shards
    from energon_pack.plan.file import open_plan

    options = options or PlanBenchOptions()
    config = PackingConfig(seq_length=options.seq_length)
    rows: BenchRows = []
    start = time.perf_counter()
    if options.dataset is None:
        measurement = synthetic_measurement(num_samples, config)
        fingerprint = plan_fingerprint({"split": "train", "shards": synthetic_shards(num_samples)}, {}, config)
        rows.append({"metric": "synthetic facts (s)", "value": f"{time.perf_counter() - start:.1f}"})
        source = f"{num_samples} reference-mix samples"
    else:
        measurement, fingerprint = _measured(options, config)
        rows.append({"metric": f"measure ({options.workers} workers, s)", "value": f"{time.perf_counter() - start:.1f}"})
        source = options.dataset
    start = time.perf_counter()
    plan = plan_measurement(measurement, config, fingerprint)
    rows.append({"metric": "plan (s)", "value": f"{time.perf_counter() - start:.1f}"})
    del measurement
    folder = Path(tempfile.mkdtemp(prefix="plan-bench-", dir=_ensure(work_dir)))
    try:
        path = folder / "bench.plan"
        start = time.perf_counter()
        plan.save(path)
        rows.append({"metric": "save (s)", "value": f"{time.perf_counter() - start:.1f}"})
        fill = float(plan.member_tokens.sum()) / max(1, plan.num_rows * config.seq_length)
        summary = [
            {"metric": "samples planned", "value": plan.num_samples},
            {"metric": f"rows (W={config.seq_length})", "value": plan.num_rows},
            {"metric": "fill", "value": f"{fill:.4f}"},
            {"metric": "plan file (MiB)", "value": f"{path.stat().st_size / (1 << 20):.1f}"},
        ]
        del plan
        start = time.perf_counter()
        opened = open_plan(path)
        if opened.num_rows:
            opened.global_indices(0)
        rows.append({"metric": "open + first row (s)", "value": f"{time.perf_counter() - start:.3f}"})
        start = time.perf_counter()
        for row in range(0, opened.num_rows, READ_RANKS):
            opened.global_indices(row)
        rows.append({"metric": f"read one rank's rows (1 of {READ_RANKS}, s)", "value": f"{time.perf_counter() - start:.2f}"})
        del opened
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    rows.append({"metric": "peak RSS (MiB)", "value": f"{_peak_rss_mib():.0f}"})
    tables = [(f"plan: {source} (W={config.seq_length}, format 2)", summary + rows, ["metric", "value"])]
    if options.interleave_rows > 0:
        tables.append(bench_interleave(options.interleave_rows, seq_length=config.seq_length))
    return tables


def synthetic_compositions(num_rows: int, *, seq_length: int, seed: int = 0) -> np.ndarray:
    """float [num_rows, 2]: real tokens of each of two sources in each row, as best-fit-decreasing
    packs a blend (each row mostly one source's, a tenth of it the other's, full to within 2 %).

    Example: ``synthetic_compositions(3, seq_length=8192).sum(axis=1)`` -> three totals in 8028..8192.
    """
    rng = np.random.default_rng(seed)
    totals = rng.integers(int(seq_length * 0.98), seq_length + 1, num_rows)
    minor = rng.integers(0, totals // 10 + 1)
    major = rng.integers(0, 2, num_rows)
    compositions = np.empty((num_rows, 2))
    compositions[np.arange(num_rows), major] = totals - minor
    compositions[np.arange(num_rows), 1 - major] = minor
    return compositions


def bench_interleave(num_rows: int, *, seq_length: int = 8192) -> tuple[str, BenchRows, list[str]]:
    """Time ``interleave_rows`` (a metadataset plan's row order) on ``num_rows`` (> 0) synthetic rows
    of two sources; also the worst share of consecutive 64-row windows (points off the whole's)."""
    from energon_pack.plan.blend import interleave_rows

    compositions = synthetic_compositions(num_rows, seq_length=seq_length)
    start = time.perf_counter()
    order = interleave_rows(compositions, seed=0)
    seconds = time.perf_counter() - start
    read = compositions[order]
    share = read[:, 0].sum() / read.sum()
    window = min(64, num_rows)
    windows = read[: num_rows // window * window].reshape(-1, window, 2).sum(axis=1)
    worst = float(np.max(np.abs(windows[:, 0] / windows.sum(axis=1) - share)))
    rows: BenchRows = [
        {"metric": "rows", "value": num_rows},
        {"metric": "interleave (s)", "value": f"{seconds:.2f}"},
        {"metric": "rows per second", "value": f"{num_rows / max(seconds, 1e-9):,.0f}"},
        {"metric": f"worst {window}-row window, off the share (points)", "value": f"{100 * worst:.2f}"},
    ]
    return (f"plan interleave: {num_rows} rows of 2 sources (W={seq_length})", rows, ["metric", "value"])


def _ensure(folder: Path) -> Path:
    Path(folder).mkdir(parents=True, exist_ok=True)
    return Path(folder)


def _measured(options: PlanBenchOptions, config: Any) -> tuple[Any, dict[str, Any]]:
    """Measure ``options.dataset`` (train split, the offline processor) and fingerprint it."""
    from energon_pack.identity import encoder_fingerprint, plan_fingerprint
    from energon_pack.plan.build import dataset_fingerprint, measure_split
    from energon_pack.qwen.processor import load_processor
    from energon_pack.runtime.task_encoder import QwenVLPackingTaskEncoder

    encoder = QwenVLPackingTaskEncoder(config, load_processor())
    measurement = measure_split(options.dataset, encoder, num_workers=options.workers, progress=False)
    fingerprint = plan_fingerprint(dataset_fingerprint(options.dataset, "train"), encoder_fingerprint(encoder), config)
    return measurement, fingerprint
