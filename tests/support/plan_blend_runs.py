"""A metadataset of three sources (short / medium / long at 0.6 / 0.3 / 0.1) prepared with the
processor (so ``plan`` reads facts, no tar), and the per-source units of a plan's rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from energon_pack.data.blend_mix import BlendSource, metadataset_yaml, write_source_records
from energon_pack.data.prepare import prepare_dataset

#: Enough short samples for about 100 rows of 4096 tokens under ``tokens`` at 0.6 / 0.3 / 0.1.
SOURCES = (
    BlendSource(name="short", samples=1200, mean_tokens=200),
    BlendSource(name="medium", samples=250, mean_tokens=700),
    BlendSource(name="long", samples=40, mean_tokens=2000, image_side=112),
)
WEIGHTS = (0.6, 0.3, 0.1)


def make_plan_blend(root: Path, processor: Any) -> Path:
    """Prepare the three sources under ``root`` (with facts) and write ``root/blend.yaml``."""
    for offset, source in enumerate(SOURCES):
        raw = root / f"{source.name}_raw"
        records = write_source_records(raw, source, seed=offset)
        prepare_dataset(records, raw, root / source.name, samples_per_shard=256, progress=False, processor=processor)
    path = root / "blend.yaml"
    path.write_text(metadataset_yaml([s.name for s in SOURCES], weights=WEIGHTS), encoding="utf-8")
    return path


def plan_compositions(plan: Any) -> np.ndarray:
    """float [R, K]: real tokens of each leaf (source) in each row of a metadataset's plan, in stored order."""
    leaves = plan.fingerprint["dataset"]["blend"]["leaves"]
    starts = np.cumsum([0] + [leaf["samples"] for leaf in leaves])
    out = np.zeros((plan.num_rows, len(leaves)))
    for row in range(plan.num_rows):
        sources = np.searchsorted(starts, plan.global_indices(row), side="right") - 1
        np.add.at(out[row], sources, plan.row_tokens(row))
    return out


def worst_window(compositions: np.ndarray, target: np.ndarray, *, window: int = 64) -> float:
    """Largest distance (share points, 0-1) of any ``window`` consecutive rows' shares from ``target``."""
    sums = np.cumsum(np.vstack([np.zeros(compositions.shape[1]), compositions]), axis=0)
    stretches = sums[window:] - sums[:-window]
    return float(np.abs(stretches / stretches.sum(axis=1, keepdims=True) - target).max())
