"""Dataset paths: local folders or object-storage URLs (``msc://profile/prefix``), and the check
that one is a dataset Energon can load, before any worker starts.

A dataset path is kept as text (or Energon's ``EPath``), never a ``pathlib.Path``: ``Path`` folds
``msc://profile/ds`` into ``msc:/profile/ds``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from energon_pack.errors import UsageError

METADATASET_SUFFIXES = (".yaml", ".yml")


def as_dataset_path(path: Any) -> Any:
    """Energon's ``EPath`` of ``path`` (a local path or an ``msc://`` URL kept whole).

    Example: ``str(as_dataset_path("msc://s3data/ds"))`` -> ``"msc://s3data/ds"``.
    """
    from megatron.energon.epathlib import EPath

    return path if isinstance(path, EPath) else EPath(os.fspath(path) if isinstance(path, os.PathLike) else path)


def _local_path(path: Any) -> Path | None:
    """``path`` as a local ``Path``, or None for a remote one (``msc://...``) or an Energon ``EPath``."""
    if isinstance(path, (str, os.PathLike)) and "://" not in os.fspath(path):
        return Path(path)
    return None


def dataset_splits(dataset: Any) -> dict[str, int] | None:
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

    Remote paths are read through ``EPath`` (``.nv-meta/split.yaml`` must be there). Example:
    ``check_dataset_path("records.jsonl")`` ->
    UsageError("'records.jsonl' is a file, not a prepared dataset; fix: run energon-pack prepare ...").
    """
    local = _local_path(path)
    prepare_hint = "run `energon-pack prepare RECORDS --media-root DIR --out DATASET` and pass DATASET"
    if local is None:
        _check_remote(path, split, prepare_hint)
        return
    if not local.exists():
        raise UsageError(f"dataset path {str(local)!r} does not exist; fix: {prepare_hint}, or correct the path")
    if local.is_file():
        if local.suffix.lower() in METADATASET_SUFFIXES:
            return  # an Energon metadataset: Energon checks it
        raise UsageError(f"{str(local)!r} is a file, not a prepared dataset; fix: {prepare_hint}")
    if not (local / ".nv-meta").is_dir():
        raise UsageError(f"{str(local)!r} is not a prepared dataset (it has no .nv-meta folder); fix: {prepare_hint}")
    _check_split(local, dataset_splits(local), split)


def _check_remote(path: Any, split: str | None, prepare_hint: str) -> None:
    """:func:`check_dataset_path` for an object-storage path (one HEAD or GET per check)."""
    try:
        remote = as_dataset_path(path)
        is_file = remote.is_file()
        prepared = (remote / ".nv-meta" / "split.yaml").is_file()
    except Exception as err:  # the storage client's own errors (unknown profile, no access, ...)
        detail = " ".join(f"{type(err).__name__}: {err}".split())
        raise UsageError(
            f"dataset path {str(path)!r} cannot be read ({detail}); fix: check the profile in the MSC "
            "config (MSC_CONFIG) and the path"
        ) from err
    if is_file:
        if str(remote).lower().endswith(METADATASET_SUFFIXES):
            return
        raise UsageError(f"{str(remote)!r} is a file, not a prepared dataset; fix: {prepare_hint}")
    if not prepared:
        raise UsageError(
            f"dataset path {str(remote)!r} does not exist or is not a prepared dataset (no .nv-meta/split.yaml "
            f"under it); fix: {prepare_hint} (then upload it), or correct the path"
        )
    _check_split(remote, dataset_splits(remote), split)


def _check_split(dataset: Any, splits: dict[str, int] | None, split: str | None) -> None:
    """Raise ``UsageError`` when ``split`` is given, the split table known, and ``split`` empty there."""
    if split is None or splits is None or splits.get(split, 0) > 0:
        return
    present = ", ".join(name for name, shards in splits.items() if shards) or "none"
    raise UsageError(
        f"dataset {str(dataset)!r} has no {split!r} split (splits with data: {present}); fix: use one of those, "
        f"or prepare again with a --split-ratio that gives {split!r} a share (e.g. 8,2,0 for train,val)"
    )
