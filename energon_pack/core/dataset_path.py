"""Checks that a path given as a dataset is one Energon can load, before any worker starts."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from energon_pack.errors import UsageError

METADATASET_SUFFIXES = (".yaml", ".yml")


def _local_path(path: Any) -> Path | None:
    """``path`` as a local ``Path``, or None for a remote one (``msc://...``) or an Energon ``EPath``."""
    if isinstance(path, (str, os.PathLike)) and "://" not in os.fspath(path):
        return Path(path)
    return None


def dataset_splits(dataset: Path) -> dict[str, int] | None:
    """Shard count per split in ``.nv-meta/split.yaml``, or None when there is no readable one.

    Example: a split.yaml with ``train: [shards/train-000000.tar]``, ``val: []`` -> ``{"train": 1, "val": 0}``.
    """
    try:
        parts = yaml.safe_load((dataset / ".nv-meta" / "split.yaml").read_text(encoding="utf-8"))["split_parts"]
        return {str(name): len(shards or []) for name, shards in parts.items()}
    except (OSError, yaml.YAMLError, TypeError, KeyError, AttributeError):
        return None


def check_dataset_path(path: Any, *, split: str | None = None) -> None:
    """Raise ``UsageError`` when ``path`` is not a prepared dataset (or metadataset YAML) with ``split``.

    Remote paths are left to Energon. Example: ``check_dataset_path("records.jsonl")`` ->
    UsageError("'records.jsonl' is a file, not a prepared dataset; fix: run energon-pack prepare ...").
    """
    local = _local_path(path)
    if local is None:
        return
    prepare_hint = "run `energon-pack prepare RECORDS --media-root DIR --out DATASET` and pass DATASET"
    if not local.exists():
        raise UsageError(f"dataset path {str(local)!r} does not exist; fix: {prepare_hint}, or correct the path")
    if local.is_file():
        if local.suffix.lower() in METADATASET_SUFFIXES:
            return  # an Energon metadataset: Energon checks it
        raise UsageError(f"{str(local)!r} is a file, not a prepared dataset; fix: {prepare_hint}")
    if not (local / ".nv-meta").is_dir():
        raise UsageError(f"{str(local)!r} is not a prepared dataset (it has no .nv-meta folder); fix: {prepare_hint}")
    splits = dataset_splits(local)
    if split is None or splits is None or splits.get(split, 0) > 0:
        return
    present = ", ".join(name for name, shards in splits.items() if shards) or "none"
    raise UsageError(
        f"dataset {str(local)!r} has no {split!r} split (splits with data: {present}); fix: use one of those, "
        f"or prepare again with a --split-ratio that gives {split!r} a share (e.g. 8,2,0 for train,val)"
    )
