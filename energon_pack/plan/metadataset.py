"""The leaf datasets of an Energon metadataset, as a pack plan addresses them.

Energon's own metadataset loader reads the YAML: ``traverse`` gives each leaf's path, split and
subflavors, ``get_datasets`` the blend mode and each leaf's weight (``blend``) or repetitions
(``blend_epochized``), in the same order. A plan over a metadataset numbers samples in one global
index space: leaf i's samples follow those of leaves 0..i-1 (``global = leaf offset + leaf index``).
In a plan's fingerprint a leaf's path is kept relative to the metadataset's folder, so a plan
stays valid when the metadataset and its datasets move together.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from energon_pack.core.dataset_path import METADATASET_SUFFIXES
from energon_pack.errors import UsageError

__all__ = ["BlendLeaf", "PlannedLeaf", "blend_leaves", "is_metadataset", "planned_leaves"]


@dataclass(frozen=True, kw_only=True)
class BlendLeaf:
    """One leaf dataset of a metadataset's split: where it is, which split and subflavors Energon
    reads it with, and its blend ``weight`` (``blend``) or ``repetitions`` (``blend_epochized``)."""

    path: str
    split: str
    subflavors: dict[str, Any]
    weight: float | None
    repetitions: float | None


@dataclass(frozen=True, kw_only=True)
class PlannedLeaf:
    """A leaf as a plan loader reads it: ``path`` resolved (a folder, ``msc://`` URL or ``EPath``),
    and its first global sample index ``offset``."""

    path: Any
    split: str
    subflavors: dict[str, Any]
    offset: int


def is_metadataset(path: Any) -> bool:
    """Whether ``path`` names an Energon metadataset YAML (a ``.yaml`` / ``.yml`` file, not a folder).

    Example: ``is_metadataset("blend.yaml")`` -> True; ``is_metadataset("datasets/short")`` -> False.
    """
    return isinstance(path, (str, os.PathLike)) and os.fspath(path).lower().endswith(METADATASET_SUFFIXES)


def blend_leaves(path: Any, split: str) -> tuple[str, list[BlendLeaf]]:
    """``(mode, leaves)`` of ``split`` of the metadataset at ``path``: mode ``"weights"`` (``blend``,
    or one dataset: weight 1) or ``"repetitions"`` (``blend_epochized``). A file Energon cannot read
    as a metadataset with that split raises ``UsageError`` (Energon's reason on one line), and so
    does a leaf whose split holds a subset of its samples (``subset:``): a plan addresses whole splits.
    """
    from megatron.energon import WorkerConfig
    from megatron.energon.metadataset.loader import load_dataset
    from megatron.energon.metadataset.loader_interface import DatasetBlendMode

    from energon_pack.formats.dispatch import reading_formats

    try:
        with reading_formats():
            metadataset = load_dataset(path)
            references = metadataset.traverse(split_part=split)
            loaded = metadataset.get_datasets(
                training=False, split_part=split, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0)
            )
    except Exception as err:  # Energon's own errors about the YAML, its leaves or the split
        detail = " ".join(f"{type(err).__name__}: {err}".split())
        raise UsageError(
            f"{os.fspath(path)}: Energon cannot read split {split!r} of this metadataset ({detail}); fix: pass a split "
            "it defines (--split) of an Energon metadataset (v2: __module__: megatron.energon, __class__: MetadatasetV2, "
            "splits: {train: {blend: [{weight: 1, path: ./dataset}, ...]}}) whose leaves are prepared datasets"
        ) from err
    mode = "repetitions" if loaded.blend_mode == DatasetBlendMode.SAMPLE_REPETITIONS else "weights"
    leaves = []
    for reference, entry in zip(references, loaded.datasets, strict=True):
        factory = entry.dataset
        shards = getattr(factory, "shards", None)
        if shards is not None and len(factory) != sum(int(s.count) for s in shards) - len(factory.sample_excludes):
            raise UsageError(
                f"{path}: leaf {reference.path} reads {len(factory)} samples of split {reference.split_part!r}, "
                "a subset of it; a pack plan addresses whole splits; fix: remove `subset:` from the metadataset, "
                "or plan without a pack plan (the online loader reads subsets)"
            )
        leaves.append(BlendLeaf(
            path=str(reference.path), split=reference.split_part, subflavors=dict(reference.subflavors or {}),
            weight=None if entry.weight is None else float(entry.weight),
            repetitions=None if entry.repetitions is None else float(entry.repetitions),
        ))
    if mode == "weights" and all(leaf.weight is None for leaf in leaves):
        leaves = [BlendLeaf(**{**vars(leaf), "weight": 1.0}) for leaf in leaves]
    return mode, leaves


def leaf_name(leaf_path: str, metadataset: Any) -> str:
    """A leaf's path as a plan records it: relative to the metadataset's folder when both are local.

    Example: ``leaf_name("/d/short", "/d/blend.yaml")`` -> ``"short"``.
    """
    if "://" in leaf_path or "://" in os.fspath(metadataset):
        return leaf_path
    return os.path.relpath(leaf_path, Path(metadataset).resolve().parent)


def planned_leaves(blend: dict[str, Any], metadataset: Any) -> list[PlannedLeaf]:
    """The leaves of a plan's ``fingerprint["dataset"]["blend"]``, paths resolved against the
    metadataset's folder. Example: leaves of 400 and 200 samples -> offsets 0 and 400."""
    base = Path(metadataset).resolve().parent if "://" not in os.fspath(metadataset) else None
    out, offset = [], 0
    for leaf in blend["leaves"]:
        path = leaf["path"] if base is None or "://" in leaf["path"] else str(base / leaf["path"])
        out.append(PlannedLeaf(path=path, split=leaf["split"], subflavors=dict(leaf["subflavors"]), offset=offset))
        offset += int(leaf["samples"])
    return out
