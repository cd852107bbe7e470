"""``energon-pack bench --stage prepare``: ``prepare`` from a Parquet file with embedded JPEGs
against the same records as JSON Lines + JPEG files: samples/s and peak memory, side by side.

Each prepare runs in its own process, after a warm-up prepare of two records of the same kind
(imports, caches), so its figures are its own (``measure_prepare``): seconds for the prepare
call, and its peak RSS above the RSS just before it (Linux ``VmHWM``, reset by ``clear_refs``
just before: a child's ``ru_maxrss`` starts at its parent's RSS), next to the size of one row
group (uncompressed bytes, the Parquet footer's). The two kinds alternate for
``rounds`` rounds (``--rounds``, default ``ROUNDS``); the best samples/s and the largest peak of each are shown. The input is
generated once per ``--samples`` under the bench folder (``make_jpeg_records``, ``records_to_parquet``).
``--row-group-rows 100`` writes the Parquet file as the Hub's image datasets are (``datasets``
writes 100 rows a group, each group's images one page). ``--baseline DIR`` also prepares the
Parquet file with the ``energon_pack`` of another checkout ``DIR`` (its root first on
``PYTHONPATH``) in each round, interleaved with this one: a before/after on one machine at one time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from energon_pack.errors import UsageError
from energon_pack.tools.common import BenchRows

ROUNDS = 2
COLUMNS = ["what", "parquet", "json", "ratio"]
#: Run in a fresh process: argv = records, media root, out folder, warm-up records.
_PROBE = """
import json, os, re, sys, time
from pathlib import Path
import psutil
from energon_pack.data.prepare import prepare_dataset
records, media, out, warm = map(Path, sys.argv[1:5])
prepare_dataset(warm, warm.parent, out.parent / (out.name + "-warm"), progress=False)
Path("/proc/self/clear_refs").write_text("5")  # VmHWM := RSS now
before = psutil.Process().memory_info().rss
start, times = time.perf_counter(), os.times()
report = prepare_dataset(records, media, out, progress=False, samples_per_shard=500)
seconds = time.perf_counter() - start
cpu = sum(after - before for after, before in zip(os.times()[:4], times[:4]))  # its own and its ended children's
peak = int(re.search(r"VmHWM:\\s+(\\d+) kB", Path("/proc/self/status").read_text()).group(1)) * 1024
print(json.dumps({"seconds": seconds, "cpu": cpu, "written": report.written, "extra": peak - before}))
"""


@dataclass(frozen=True, kw_only=True)
class PrepareBenchOptions:
    """Rows per row group of the Parquet file, the JPEGs' side in pixels, the root of another
    checkout whose ``energon_pack`` also prepares the Parquet file (None: none), and the rounds."""

    row_group_rows: int = 1000
    image_side: int = 256
    baseline: Path | None = None
    rounds: int | None = None  # None: ROUNDS


def prepare_options(args: Any) -> PrepareBenchOptions:
    """The prepare benchmark's knobs from the command line (defaults where ``args`` lacks one)."""
    defaults = PrepareBenchOptions()
    baseline = getattr(args, "baseline", None)
    if baseline is not None and not (Path(baseline) / "energon_pack" / "__init__.py").is_file():
        raise UsageError(f"--baseline {str(baseline)!r} holds no energon_pack package; fix: pass the root of a checkout, "
                         "e.g. one made by `git worktree add /tmp/before main`")
    return PrepareBenchOptions(row_group_rows=getattr(args, "row_group_rows", defaults.row_group_rows),
                               baseline=None if baseline is None else Path(baseline), rounds=getattr(args, "rounds", None))


def _inputs(folder: Path, num_samples: int, options: PrepareBenchOptions) -> tuple[Path, Path]:
    """The JSONL records and the Parquet file of ``num_samples`` one-JPEG records (made once)."""
    from energon_pack.data.synthetic import make_jpeg_records, records_to_parquet

    records, parquet = folder / "raw" / "records.jsonl", folder / "records.parquet"
    if not parquet.is_file():
        make_jpeg_records(folder / "raw", num_samples, side=options.image_side)
        records_to_parquet(records, folder / "raw", folder / "partial.parquet", row_group_rows=options.row_group_rows)
        (folder / "partial.parquet").rename(parquet)
    return records, parquet


def measure_prepare(records: Path, media: Path, out: Path, warm: Path, *, tree: Path | None = None) -> dict[str, float]:
    """Prepare ``records`` into ``out`` in a fresh process (Linux) after a warm-up prepare of
    ``warm`` (its media beside it): ``{"seconds", "cpu", "written", "extra"}``, cpu = CPU seconds of
    the call (the process's and its ended children's: on a shared machine they vary less than the
    wall seconds), extra = peak RSS above the RSS before the call, in bytes. ``tree``: the checkout whose ``energon_pack`` runs (None: this one)."""
    import shutil

    for path in (out, out.parent / (out.name + "-warm")):
        shutil.rmtree(path, ignore_errors=True)
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(tree), env.get("PYTHONPATH"))))
    result = subprocess.run([sys.executable, "-c", _PROBE, str(records), str(media), str(out), str(warm)],
                            capture_output=True, text=True, check=True, env=env)
    return json.loads(result.stdout.strip().splitlines()[-1])


def bench_prepare(num_samples: int, work_dir: Path, options: PrepareBenchOptions | None = None) -> list[tuple[str, BenchRows, list[str]]]:
    """Prepare ``num_samples`` one-JPEG records from Parquet and from JSON + files; one table."""
    import pyarrow.parquet as pq

    options = options or PrepareBenchOptions()
    folder = work_dir / f"prepare-{num_samples}-{options.row_group_rows}-{options.image_side}"
    records, parquet = _inputs(folder, num_samples, options)
    warm_records, warm_parquet = _inputs(work_dir / "prepare-warm", 2, options)
    runs: dict[str, list[dict[str, float]]] = {"parquet": [], "json": []}
    if options.baseline is not None:
        runs["baseline parquet"] = []
    rounds = options.rounds or ROUNDS
    for _ in range(rounds):
        runs["json"].append(measure_prepare(records, records.parent, folder / "out-json", warm_records))
        runs["parquet"].append(measure_prepare(parquet, folder, folder / "out-parquet", warm_parquet))
        if options.baseline is not None:
            runs["baseline parquet"].append(
                measure_prepare(parquet, folder, folder / "out-baseline", warm_parquet, tree=options.baseline))
    metadata = pq.ParquetFile(parquet).metadata
    group = max(metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups))
    rate = {kind: max(run["written"] / run["seconds"] for run in kind_runs) for kind, kind_runs in runs.items()}
    per_cpu = {kind: max(run["written"] / run["cpu"] for run in kind_runs) for kind, kind_runs in runs.items()}
    peak = {kind: max(run["extra"] for run in kind_runs) / (1 << 20) for kind, kind_runs in runs.items()}
    mib = group / (1 << 20)
    rows: BenchRows = [
        {"what": "samples/s (higher is better)", "parquet": f"{rate['parquet']:.0f}", "json": f"{rate['json']:.0f}",
         "ratio": f"{rate['parquet'] / rate['json']:.2f}"},
        {"what": "samples per CPU second", "parquet": f"{per_cpu['parquet']:.0f}", "json": f"{per_cpu['json']:.0f}",
         "ratio": f"{per_cpu['parquet'] / per_cpu['json']:.2f}"},
        {"what": "peak MiB above start", "parquet": f"{peak['parquet']:.1f}", "json": f"{peak['json']:.1f}",
         "ratio": f"{peak['parquet'] / max(peak['json'], 1e-9):.2f}"},
        {"what": "peak / one row group", "parquet": f"{peak['parquet'] / mib:.2f}", "json": "-", "ratio": "-"},
    ]
    title = (f"prepare ({num_samples} one-JPEG records of {options.image_side}px; Parquet: {metadata.num_row_groups} row "
             f"groups of {options.row_group_rows} rows, {mib:.1f} MiB each; best of {rounds} alternating runs; ratio = parquet / json)")
    if options.baseline is None:
        return [(title, rows, COLUMNS)]
    base = "baseline parquet"
    figures = ((rate, "{:.0f}"), (per_cpu, "{:.0f}"), (peak, "{:.1f}"))
    for row, (values, shown) in zip(rows, figures):
        row.update({base: shown.format(values[base]), "parquet / baseline": f"{values['parquet'] / values[base]:.2f}"})
    rows[3].update({base: f"{peak[base] / mib:.2f}", "parquet / baseline": "-"})
    return [(f"{title[:-1]}; baseline = {options.baseline}, interleaved)", rows, [*COLUMNS, base, "parquet / baseline"])]
