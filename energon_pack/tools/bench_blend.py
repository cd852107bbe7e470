"""``energon-pack bench --stage blend``: what a metadataset blend gives the model, per blend unit.

For each ``blend_unit`` (``samples``, ``tokens``, ``supervised_tokens``) a real loader (``--workers``
processes, rows of ``--seq-length``) reads ``--rows`` rows of the blend, and the table shows per
source its weight's share, the realized shares of samples, real tokens and supervised tokens (the
workers' own counters, ``loader.stats()["sources"]``), its mean real tokens per sample, and the fill
of the run. Without ``--dataset`` the blend is the synthetic 1:1 mix of a source of about 200 real
tokens a sample and one of about 2000 (``energon_pack.data.blend_mix``), generated once.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from energon_pack.config.blend import BLEND_UNITS
from energon_pack.errors import UsageError
from energon_pack.tools.common import BenchRows

COLUMNS = ["unit", "source", "weight share", "samples", "real tokens", "supervised", "tokens/sample", "fill"]
#: The default blend: about 200 real tokens a sample (60 % supervised) against about 2000 (10 %), 1:1.
DEFAULT_SOURCES = (
    {"name": "short", "samples": 400, "mean_tokens": 200, "answer_fraction": 0.6},
    {"name": "long", "samples": 100, "mean_tokens": 2000, "answer_fraction": 0.1, "image_side": 112},
)


@dataclass(frozen=True, kw_only=True)
class BlendBenchOptions:
    """The blend bench's knobs: the metadataset (None: the synthetic 1:1 blend), row width, rows
    per unit, worker processes and the units compared."""

    dataset: str | None = None
    seq_length: int = 8192
    rows: int = 200
    workers: int = 2
    units: tuple[str, ...] = BLEND_UNITS


def blend_options(args: Any) -> BlendBenchOptions:
    """The knobs from the command line (``--dataset``, ``--seq-length``, ``--rows``, ``--workers``, ``--blend-units``)."""
    units = tuple(getattr(args, "blend_units", None) or BLEND_UNITS)
    unknown = [unit for unit in units if unit not in BLEND_UNITS]
    if unknown:
        raise UsageError(f"--blend-units {','.join(units)}: {unknown[0]!r} is not a blend unit; fix: use some of {','.join(BLEND_UNITS)}")
    dataset = getattr(args, "dataset", None)
    if dataset is not None and not str(dataset).lower().endswith((".yaml", ".yml")):
        raise UsageError(f"--dataset {dataset!r}: the blend stage reads a metadataset YAML; fix: pass the blend's .yaml")
    return BlendBenchOptions(
        dataset=dataset, seq_length=args.seq_length or 8192, rows=getattr(args, "rows", 200) or 200,
        workers=args.workers, units=units,
    )


def default_blend(work_dir: Path) -> Path:
    """The synthetic 1:1 blend of a short and a long source under ``work_dir/blend`` (made once)."""
    from energon_pack.data.blend_mix import BlendSource, make_blend

    return make_blend(work_dir / "blend", [BlendSource(**source) for source in DEFAULT_SOURCES], weights=[1, 1])


def unit_rows(unit: str, sources: list[dict[str, Any]], fill: float) -> BenchRows:
    """The table rows of one unit's run: one per source (``loader.stats()["sources"]``).

    Example: a source of weight 0.5 with 10 % of the real tokens -> ``{"unit": "samples", "source":
    "0 short", "weight share": "50.0%", ..., "real tokens": "10.0%", ...}``.
    """
    total_weight = sum(source["weight"] or 0 for source in sources) or 1
    rows = []
    for source in sources:
        name = source["subflavors"].get("source") or Path(str(source["path"])).name
        rows.append({
            "unit": unit,
            "source": f"{source['index']} {name}",
            "weight share": f"{(source['weight'] or 0) / total_weight:.1%}",
            "samples": _percent(source["samples_share"]),
            "real tokens": _percent(source["real_tokens_share"]),
            "supervised": _percent(source["supervised_tokens_share"]),
            "tokens/sample": f"{source['real_tokens'] / source['samples']:.0f}" if source["samples"] else "-",
            "fill": f"{fill:.4f}",
        })
    return rows


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def bench_blend(num_samples: int, work_dir: Path, options: BlendBenchOptions) -> list[tuple[str, BenchRows, list[str]]]:
    """One table: per unit and source, the weight's share against the realized shares, and fill."""
    from tqdm import tqdm

    from energon_pack.config import PackingConfig
    from energon_pack.loader import get_packing_loader
    from energon_pack.qwen.processor import load_processor

    del num_samples  # the blend's own datasets are read
    path = options.dataset or str(default_blend(work_dir))
    processor = load_processor()
    rows: BenchRows = []
    for unit in options.units:
        config = PackingConfig(seq_length=options.seq_length, num_workers=options.workers, repeat=True, blend_unit=unit)
        with get_packing_loader(path, config, processor) as loader:
            for _ in tqdm(itertools.islice(loader, options.rows), total=options.rows, desc=f"blend_unit {unit}", unit="row"):
                pass
            stats = loader.stats()
        if not stats["sources"]:
            raise UsageError(f"--dataset {path!r} is not a blend of several datasets; fix: pass a metadataset that blends two or more")
        rows += unit_rows(unit, stats["sources"], stats["fill"])
    title = f"blend ({path}; {options.rows} rows of W={options.seq_length} per unit, {options.workers} workers; shares of the rows)"
    return [(title, rows, COLUMNS)]
