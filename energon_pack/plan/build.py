"""``energon-pack plan``: measure every sample of a split from its headers, then pack it globally.

1. **Measure** (:func:`measure_split`): an Energon validation loader (worker processes, one
   pass, no shuffling) runs the task encoder's ``preencode_sample`` on every sample (tokens
   and media geometry from headers, no pixel decode) and sends back only
   ``(Energon sample index, tokens, skip reason)``. Under torchrun (``energon-pack plan`` with
   ``WORLD_SIZE`` > 1, gloo) every rank measures the slice Energon gives it and rank 0 gathers
   the slices (:func:`measure_split_distributed`).
2. **Plan** (:func:`plan_measurement`): bad samples and samples that fit no row are counted
   by reason (or raise, with ``on_overlong="error"``), the rest packed by
   :func:`energon_pack.packing.global_plan.plan_rows_flat` under the online budgets (``seq_length``
   slots after alignment, ``max_segments``, ``max_row_vision_patches``, ``max_row_media``);
   with ``balance_steps`` the rows are then balanced toward equal modelled FLOPs
   (:func:`energon_pack.packing.balance.balance_rows`, same budgets and row count) and the plan
   stores each row's FLOPs (``row_constant(W)`` plus its samples' ``sample_flops``, measured
   in the workers from the sample's token count and media grids).
3. **Fingerprint**: the dataset (split, shard names, sample counts and byte sizes), the
   encoder (processor, vision and rope identity) and the config fields that decide rows.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import numpy as np

from energon_pack.config import PackingConfig
from energon_pack.errors import UsageError
from energon_pack.formats.dispatch import reading_formats
from energon_pack.formats.sample_mapping import current_loader_mapping, loader_sample_mapping, mapping_name, resolve_mapping
from energon_pack.identity import encoder_fingerprint, plan_fingerprint, processor_fingerprint, split_fingerprint
from energon_pack.packing.balance import balance_rows
from energon_pack.packing.budget import row_budget, sample_misfit
from energon_pack.packing.global_plan import plan_rows_flat, rows_to_lists
from energon_pack.plan.accounting import TokenAccounting, card_facts
from energon_pack.plan.facts import Facts, TextTokens, fresh_facts, local_split
from energon_pack.plan.file import PackPlan
from energon_pack.plan.blend import (
    PlanSchedule,
    blend_plan_problem,
    blend_report,
    blend_row_order,
    blend_selection,
    reorder_rows,
    scheduled_rows,
    seeded_streams,
)
from energon_pack.plan.metadataset import blend_leaves, is_metadataset, leaf_name, planned_leaves
from energon_pack.qwen.fit import media_geometry, shrink_limits
from energon_pack.qwen.media import BadMediaError
from energon_pack.rows.flops import CostModel, grid_rows

__all__ = [
    "Measurement",
    "build_plan",
    "measure_blend",
    "dataset_fingerprint",
    "MeasuredSlice",
    "measure_dataset",
    "measure_from_facts",
    "FactSample",
    "iter_fact_samples",
    "measure_split",
    "measure_split_distributed",
    "merge_slices",
    "plan_split",
    "plan_measurement",
    "synthetic_shards",
    "webdataset_index",
]

#: Marker in ``Measurement.tokens`` for a sample that was not measured (bad or excluded).
UNMEASURED = -1


def webdataset_index(restore_key: Sequence[Any]) -> int:
    """The Energon sample index inside a restore key: the int after its last ``"Webdataset"``.

    Example: ``("SimpleSavableDatasetWrapper", 0, 7, "MapDataset", 7, "Webdataset", 42)`` -> 42.
    """
    for position in range(len(restore_key) - 2, -1, -1):
        if restore_key[position] == "Webdataset" and isinstance(restore_key[position + 1], int):
            return restore_key[position + 1]
    raise ValueError(
        f"restore key {restore_key!r} names no WebDataset sample index; a pack plan reads prepared "
        "WebDataset splits; fix: pass a prepared dataset folder, or a metadataset YAML of them"
    )


def open_split(path: str | Path, split: str, worker_config: Any, *, subflavors: Mapping[str, Any] | None = None) -> Any:
    """Energon's dataset factory of one prepared WebDataset split (no shuffling, no repeat), its
    samples carrying ``subflavors`` (those of a metadataset's leaf).

    A metadataset or a JSONL file raises ValueError: a plan reads each leaf of a metadataset as one WebDataset.
    """
    from megatron.energon.dataset_config import get_dataset_from_config
    from megatron.energon.epathlib import EPath
    from megatron.energon.flavors.webdataset.metadata import EnergonDatasetType, get_dataset_type

    kind = get_dataset_type(EPath(path))
    if kind != EnergonDatasetType.WEBDATASET:
        raise ValueError(
            f"{path}: a pack plan reads one prepared WebDataset (a folder with .nv-meta), got a {kind.value} "
            "dataset; fix: prepare the data with energon-pack prepare, and pass the dataset folder or an Energon "
            "metadataset YAML blending such folders"
        )
    with reading_formats():
        return get_dataset_from_config(
            path, split_part=split, training=False, worker_config=worker_config, subflavors=dict(subflavors or {}) or None
        )


def dataset_fingerprint(path: str | Path, split: str) -> dict[str, Any]:
    """Split name and shard table ``[[name, samples, bytes], ...]`` of a prepared dataset (in
    Energon's shard order), read from ``.nv-meta`` for a local dataset ``prepare`` wrote
    (``plan.facts.local_split``, no Energon import), else from Energon's dataset factory.

    Example: ``{"split": "train", "shards": [["shards/data-000000.tar", 16, 1048576], ...], "excluded_samples": 0}``.

    A metadataset YAML: every leaf's shard table in one (names prefixed ``"<leaf>:"``, so the
    global sample index is the leaf's offset plus its own index), the excluded samples of all
    leaves, and ``blend``: the mode and each leaf's path (relative to the YAML's folder), split,
    subflavors, weight, repetitions and sample count.
    """
    if is_metadataset(path):
        return metadataset_fingerprint(path, split)
    local = local_split(path, split)
    if local is not None:
        return local
    from megatron.energon import WorkerConfig

    return split_fingerprint(open_split(path, split, WorkerConfig(rank=0, world_size=1, num_workers=0)), split)


def metadataset_fingerprint(path: str | Path, split: str) -> dict[str, Any]:
    """:func:`dataset_fingerprint` of a metadataset YAML (see there)."""
    mode, leaves = blend_leaves(path, split)
    shards, excluded, described = [], 0, []
    for number, leaf in enumerate(leaves):
        own = dataset_fingerprint(leaf.path, leaf.split)
        shards += [[f"{number}:{name}", count, size] for name, count, size in own["shards"]]
        excluded += int(own.get("excluded_samples", 0))
        described.append({
            "path": leaf_name(leaf.path, path), "split": leaf.split, "subflavors": leaf.subflavors,
            "weight": leaf.weight, "repetitions": leaf.repetitions, "samples": sum(int(s[1]) for s in own["shards"]),
        })
    return {"split": split, "shards": shards, "excluded_samples": excluded, "blend": {"mode": mode, "leaves": described}}


# --------------------------------------------------------------------------- measure


@dataclass
class Measurement:
    """Tokens, ViT input patches, media count and modelled FLOPs (``sample_flops``; 0 without a
    cost model) of every Energon sample index of a split (tokens ``UNMEASURED`` for samples that
    are skipped or excluded)."""

    tokens: np.ndarray
    vision: np.ndarray
    media: np.ndarray
    flops: np.ndarray
    #: Skipped samples by reason (preencode's skip markers, samples that fit no row).
    skipped: Counter[str] = field(default_factory=Counter)
    #: Samples measured per worker process, by ``"rank:worker"`` (``"0:-1"``: the main process).
    per_worker: Counter[str] = field(default_factory=Counter)

    @classmethod
    def empty(cls, size: int) -> Measurement:
        """Nothing measured yet for ``size`` sample indices."""
        return cls(
            tokens=np.full(size, UNMEASURED, dtype=np.int64),
            vision=np.zeros(size, dtype=np.int64),
            media=np.zeros(size, dtype=np.int64),
            flops=np.zeros(size, dtype=np.int64),
        )

    @property
    def samples_in(self) -> int:
        return int((self.tokens != UNMEASURED).sum()) + sum(self.skipped.values())


def _length_encoder(encoder: Any) -> Any:
    """An Energon task encoder that maps a sample to ``(index, tokens, vision patches, media,
    FLOPs, skip reason)``, in batches tagged with the worker process id (-1: the main process);
    a sample that fits no row (``sample_misfit``) is a skip."""
    from megatron.energon import Sample, TaskEncoder
    from megatron.energon.edataclass import edataclass
    from megatron.energon.task_encoder.base import stateless

    @edataclass
    class SampleSize(Sample):
        index: int
        tokens: int
        vision: int
        media: int
        flops: int
        skip_reason: Optional[str] = None

    cost_model = encoder.cost_model if encoder.config.policy.balance_steps else None

    class LengthEncoder(TaskEncoder):
        decoder = None  # media stay compressed bytes: only headers are read

        @stateless
        def encode_sample(self, sample: Any) -> SampleSize:
            prepared = encoder.preencode_sample(sample)
            reason = prepared.skip_reason
            if reason is None:
                misfit = sample_misfit(prepared, encoder.budget, encoder.config.row, encoder.config.policy)
                reason = None if misfit is None else misfit.reason
            return SampleSize.derive_from(
                sample,
                index=webdataset_index(sample.__restore_key__),
                tokens=prepared.num_tokens,
                vision=prepared.vision_patches if reason is None else 0,
                media=prepared.num_media if reason is None else 0,
                flops=0 if reason is not None or cost_model is None else cost_model.sample(
                    prepared.num_tokens, grid_rows(prepared.image_grid_thw, prepared.video_grid_thw)
                ),
                skip_reason=reason,
            )

        @stateless
        def batch(self, samples: list[SampleSize]) -> tuple[int, list[tuple[int, int, int, int, int, str | None]]]:
            import torch.utils.data

            info = torch.utils.data.get_worker_info()
            worker = -1 if info is None else info.id
            return worker, [(s.index, s.tokens, s.vision, s.media, s.flops, s.skip_reason) for s in samples]

    return LengthEncoder()


def measure_split(
    path: str | Path, encoder: Any, *, split: str = "train", num_workers: int = 2, progress: bool = True
) -> Measurement:
    """Preencode (headers only) every sample of ``split`` with ``num_workers`` processes."""
    return _measure_slice(path, encoder, split=split, num_workers=num_workers, progress=progress, rank=0, world_size=1)[0]


def split_fact_rows(path: str | Path, split: str, facts: Facts) -> np.ndarray:
    """Fact row of every Energon sample index of ``split`` (int64 [n]): its shards in Energon's order."""
    starts, position = {}, 0
    for name, count, *_ in facts.meta["shards"]:
        starts[name] = position
        position += int(count)
    parts = [starts[name] + np.arange(int(count), dtype=np.int64) for name, count, _ in dataset_fingerprint(path, split)["shards"]]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def accounting_of(encoder: Any) -> TokenAccounting:
    """``encoder`` when it is a ``TokenAccounting``, else the accounting of that task encoder."""
    return encoder if isinstance(encoder, TokenAccounting) else TokenAccounting.of_encoder(encoder)


@dataclass(frozen=True, kw_only=True)
class FactSample:
    """One sample of a split read from facts: Energon ``index``, skip ``reason`` (None: good),
    ``tokens`` and media ``geometry`` as preencode gives them (shrunk with
    ``on_overlong="shrink"``), its image / video counts and media bytes."""

    index: int
    reason: str | None
    tokens: int
    geometry: Any
    images: int
    videos: int
    media_bytes: int


def iter_fact_samples(path: str | Path, encoder: Any, facts: Facts, tokens: TextTokens, *, split: str = "train") -> Iterator[FactSample]:
    """Every sample of ``split`` as preencode would measure it, from facts (no tar read);
    ``encoder``: a task encoder or a ``TokenAccounting``. A Qwen-Omni encoder counts each sample's
    sounds from their recorded lengths (``TokenAccounting.sound_tokens``); shrinking it, as
    preencode, keeps its sounds whole and the frames of videos heard with their sound."""
    accounting = accounting_of(encoder)
    vision, expansion, fits = accounting.vision, accounting.expansion, accounting.fits_row
    hears = accounting.sound is not None
    if hears:
        _check_sound_facts(facts, accounting.sound.spec)
    shrink = accounting.config.policy.on_overlong == "shrink"
    text_tokens, columns = tokens.columns["text_tokens"], facts.columns
    for index, row in enumerate(split_fact_rows(path, split, facts).tolist()):
        reason, images, videos = facts.sample_infos(row)
        reason = reason or tokens.skip_reason(row)
        geometry, count, sound = None, 0, None
        # Recorded at the model's cap with trim, a sound without a token stays without one under any cap;
        # only the order of the checks (length first) can name another reason.
        if reason is None or (hears and reason == "empty_audio"):
            try:
                sound = accounting.sound_tokens(*facts.sample_sounds(row))
            except BadMediaError as err:
                reason = err.reason
        if reason is None:
            text = int(text_tokens[row])
            geometry = media_geometry(images, videos, vision)
            count = text + expansion(geometry, sound)
            if shrink and not fits(count, geometry):
                # As QwenChatEncoder._shrink_limits: only the placeholder expansions change with the limits.
                heard = sound is not None and any(tokens is not None for tokens in sound.videos)
                limits = shrink_limits(images, videos, vision, lower_frames=not heard,
                                       fits=lambda candidate: fits(text + expansion(candidate, sound), candidate))
                if limits is not None:
                    geometry = media_geometry(images, videos, limits.apply(vision))
                    count = text + expansion(geometry, sound)
        yield FactSample(
            index=index, reason=reason, tokens=count, geometry=geometry, images=int(columns["images"][row]),
            videos=int(columns["videos"][row]), media_bytes=int(columns["media_bytes"][row]),
        )


def _check_sound_facts(facts: Facts, spec: Any) -> None:
    """ValueError unless the facts' sound lengths were counted at ``spec``'s rate and at least up
    to its cap (``spec``: the encoder's ``AudioSpec``), so that its counts from them are exact."""
    recorded = facts.meta.get("sound")
    if recorded is None:
        return
    if recorded["sampling_rate"] != spec.sampling_rate or recorded["counted_up_to"] < spec.max_samples:
        raise ValueError(
            f"the facts count sounds at {recorded['sampling_rate']} Hz up to {recorded['counted_up_to']} samples, the "
            f"processor reads {spec.sampling_rate} Hz up to {spec.max_samples}; fix: plan with --measure"
        )


def measure_from_facts(path: str | Path, encoder: Any, facts: Facts, tokens: TextTokens, *, split: str = "train") -> Measurement:
    """The ``Measurement`` of ``split`` from facts: the one preencoding every sample gives (same
    tokens, vision patches, media, FLOPs and skip counts), without reading a tar; ``encoder``:
    a task encoder or a ``TokenAccounting``."""
    accounting = accounting_of(encoder)
    config = accounting.config
    cost_model = accounting.cost_model if config.policy.balance_steps else None
    budget = accounting.budget
    samples = list(iter_fact_samples(path, accounting, facts, tokens, split=split))
    measurement = Measurement.empty(len(samples))
    for sample in samples:
        reason = sample.reason
        if reason is None:
            probe = SimpleNamespace(
                __key__=f"sample #{sample.index} of {split}", num_tokens=sample.tokens,
                vision_patches=sample.geometry.vision_patches, num_media=sample.images + sample.videos,
            )
            misfit = sample_misfit(probe, budget, config.row, config.policy)
            reason = None if misfit is None else misfit.reason
        if reason is not None:
            measurement.skipped[reason] += 1
            continue
        geometry, index = sample.geometry, sample.index
        measurement.tokens[index] = sample.tokens
        measurement.vision[index] = geometry.vision_patches
        measurement.media[index] = sample.images + sample.videos
        if cost_model is not None:
            measurement.flops[index] = cost_model.sample(sample.tokens, grid_rows(geometry.image_grid_thw, geometry.video_grid_thw))
    return measurement


def measure_dataset(
    path: str | Path, encoder: Any, *, split: str = "train", num_workers: int = 2, progress: bool = True, facts: bool = True
) -> tuple[Measurement, str]:
    """:func:`measure_split`, or the same Measurement from prepare's facts sidecar
    (``plan.facts.measure_from_facts``) when ``facts`` and the sidecar is present and fresh for
    this dataset and processor (and the row layout sets no ``chat_template_kwargs``, which the
    facts' text tokens were measured without); also returns one line saying which was done and why.

    Example: a dataset prepared with ``--processor`` -> ``(Measurement, "measured from facts
    (.nv-meta/energon_pack.facts.npz, fresh)")``.
    """
    if not facts:
        why = "--measure"
    elif encoder.chat.chat_template_kwargs:
        # prepare measured text tokens with each record's own template options only
        why = "the row layout sets chat_template_kwargs, which the facts' text tokens do not include"
    elif encoder.config.loader.exclude:
        why = "the config has an exclude list; facts do not name samples"
    else:
        found = fresh_facts(path, processor_fingerprint(encoder.processor))
        if not isinstance(found, str):
            return measure_from_facts(path, encoder, *found, split=split), "measured from facts (.nv-meta/energon_pack.facts.npz, fresh)"
        why = found
    measurement = measure_split(path, encoder, split=split, num_workers=num_workers, progress=progress)
    return measurement, f"measured by preencoding every sample ({why})"


def measure_split_distributed(
    path: str | Path, encoder: Any, *, split: str = "train", num_workers: int = 2, progress: bool = True
) -> Measurement | None:
    """:func:`measure_split` over the ranks of the initialised ``torch.distributed`` group: each
    rank preencodes the slice of samples Energon gives it (``WorkerConfig(rank, world_size)``,
    ``num_workers`` processes each), and rank 0 gathers the slices into the split's
    ``Measurement`` (the single-process one: it is indexed by Energon sample index). Returns it
    on rank 0 and None on the other ranks; a sample measured never or twice raises RuntimeError.
    """
    import torch.distributed as dist

    rank, world_size = dist.get_rank(), dist.get_world_size()
    measurement, seen = _measure_slice(
        path, encoder, split=split, num_workers=num_workers, progress=progress and rank == 0, rank=rank, world_size=world_size
    )
    mine = np.flatnonzero(seen)
    part = MeasuredSlice(
        indices=mine,
        times=seen[mine],
        tokens=measurement.tokens[mine],
        vision=measurement.vision[mine],
        media=measurement.media[mine],
        flops=measurement.flops[mine],
        skipped=dict(measurement.skipped),
        per_worker=dict(measurement.per_worker),
    )
    parts: list[Any] | None = [None] * world_size if rank == 0 else None
    dist.gather_object(part, parts, dst=0)
    return merge_slices(parts, len(seen)) if parts is not None else None


@dataclass(frozen=True, kw_only=True)
class MeasuredSlice:
    """What one rank measured: the Energon sample ``indices`` it read (``times`` each), their
    tokens / vision / media (tokens ``UNMEASURED`` for its skips), its skip counts and its
    per-worker sample counts."""

    indices: np.ndarray
    times: np.ndarray
    tokens: np.ndarray
    vision: np.ndarray
    media: np.ndarray
    flops: np.ndarray
    skipped: dict[str, int]
    per_worker: dict[str, int]


def merge_slices(parts: Sequence[MeasuredSlice], total: int) -> Measurement:
    """The ``Measurement`` of a split of ``total`` samples from its ranks' slices; every sample
    must have been read exactly once (RuntimeError naming how many were not).

    Example: slices with indices ``[0, 2]`` and ``[1]`` of a 3-sample split -> one Measurement
    whose ``tokens[i]`` come from the slice that read ``i``.
    """
    measurement = Measurement.empty(total)
    seen = np.zeros(total, dtype=np.int64)
    for part in parts:
        np.add.at(seen, part.indices, part.times)
        measurement.tokens[part.indices] = part.tokens
        measurement.vision[part.indices] = part.vision
        measurement.media[part.indices] = part.media
        measurement.flops[part.indices] = part.flops
        measurement.skipped.update(part.skipped)
        measurement.per_worker.update(part.per_worker)
    if not (seen == 1).all():
        raise RuntimeError(
            f"the ranks read {int((seen == 0).sum())} of {total} samples never and {int((seen > 1).sum())} more than once; "
            "fix: give every rank the same dataset path, split and Energon version"
        )
    return measurement


def _measure_slice(
    path: str | Path, encoder: Any, *, split: str, num_workers: int, progress: bool, rank: int, world_size: int
) -> tuple[Measurement, np.ndarray]:
    """The samples Energon gives ``rank`` of ``world_size`` (all of them at world size 1):
    their Measurement (the other indices stay unmeasured and uncounted) and how often each
    Energon sample index was read (int8 [total])."""
    from megatron.energon import WorkerConfig, get_loader, get_val_dataset
    from tqdm import tqdm

    from energon_pack.runtime.pinning import pin_only_with_accelerator

    worker_config = WorkerConfig(rank=rank, world_size=world_size, num_workers=num_workers)
    total = len(open_split(path, split, WorkerConfig(rank=0, world_size=1, num_workers=0)))
    with reading_formats():
        dataset = get_val_dataset(
            path, split_part=split, worker_config=worker_config, batch_size=64, task_encoder=_length_encoder(encoder)
        )
    measurement = Measurement.empty(total)
    seen = np.zeros(total, dtype=np.int8)
    with tqdm(total=-(-total // world_size), desc="preencode (headers)", unit="sample", disable=not progress) as bar:
        for worker, batch in pin_only_with_accelerator(get_loader(dataset)):
            for index, tokens, vision, media, flops, reason in batch:
                seen[index] += 1
                if reason is None:
                    measurement.tokens[index] = tokens
                    measurement.vision[index] = vision
                    measurement.media[index] = media
                    measurement.flops[index] = flops
                else:
                    measurement.skipped[reason] += 1
            measurement.per_worker[f"{rank}:{worker}"] += len(batch)
            bar.update(len(batch))
    return measurement, seen


# --------------------------------------------------------------------------- plan


def plan_measurement(
    measurement: Measurement,
    config: PackingConfig,
    fingerprint: dict[str, Any],
    *,
    kept: np.ndarray | None = None,
    row_order: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
    rows: tuple[np.ndarray, np.ndarray] | None = None,
) -> PackPlan:
    """Pack the measured samples globally within the online budgets (aligned width, segments,
    vision patches and media per row); skipped samples stay counted by reason. With
    ``balance_steps`` the rows are balanced by ``measurement.flops`` and carry their FLOPs.

    ``kept``: the sample indices to pack (a sample listed twice is packed twice; default: every
    measured sample once). ``row_order(row_offsets, members)``: the order to store the packed rows
    in (a permutation of the rows, given their CSR arrays of sample indices); default: as packed.
    ``rows``: rows already packed (CSR ``(row_offsets, sample indices)``, e.g. by
    :func:`pack_samples` in parts), stored as they are.
    """
    if rows is not None:
        return _plan_of_rows(measurement, fingerprint, *rows, {})
    if kept is None:
        kept = np.flatnonzero(measurement.tokens != UNMEASURED)
    aligned, budget, limits = _row_inputs(measurement, config, kept)
    row_offsets, members = plan_rows_flat(aligned, budget, min_fill=config.min_fill, **limits)
    row_arrays: dict[str, np.ndarray] = {}
    if config.policy.balance_steps:
        flops = measurement.flops[kept]
        rows = balance_rows(rows_to_lists(row_offsets, members), aligned, flops.astype(np.float64), budget, **limits)
        row_offsets = np.concatenate([[0], np.cumsum([len(row) for row in rows], dtype=np.int64)])
        members = np.array([i for row in rows for i in row], dtype=np.int64)
        summed = np.concatenate([[0], np.cumsum(flops[members], dtype=np.int64)])
        constant = CostModel.of(config.policy.cost_model).constant(config.seq_length)
        row_arrays["row_flops"] = constant + summed[row_offsets[1:]] - summed[row_offsets[:-1]]
    members = kept[members]
    if row_order is not None:
        row_offsets, members, row_arrays = reorder_rows(row_offsets, members, row_arrays, row_order(row_offsets, members))
    return _plan_of_rows(measurement, fingerprint, row_offsets, members, row_arrays)


def _plan_of_rows(
    measurement: Measurement, fingerprint: dict[str, Any], row_offsets: np.ndarray, members: np.ndarray,
    row_arrays: dict[str, np.ndarray],
) -> PackPlan:
    return PackPlan.from_csr(
        row_offsets,
        members,
        measurement.tokens,
        fingerprint=fingerprint,
        samples_in=measurement.samples_in,
        skipped=dict(sorted(measurement.skipped.items())),
        row_arrays=row_arrays,
    )


def _row_inputs(measurement: Measurement, config: PackingConfig, kept: np.ndarray) -> tuple[np.ndarray, Any, dict[str, np.ndarray]]:
    """Aligned lengths, row budget and vision / media limits of the samples ``kept``."""
    aligned = -(-measurement.tokens[kept] // config.pad_multiple) * config.pad_multiple
    return aligned, row_budget(config.row, config.policy), dict(vision=measurement.vision[kept], media=measurement.media[kept])


def pack_samples(measurement: Measurement, config: PackingConfig, kept: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR rows ``(row_offsets, sample indices)`` of the samples ``kept`` packed within the online budgets."""
    aligned, budget, limits = _row_inputs(measurement, config, kept)
    row_offsets, members = plan_rows_flat(aligned, budget, min_fill=config.min_fill, **limits)
    return row_offsets, kept[members]


def build_plan(
    path: str | Path,
    config: PackingConfig,
    processor: Any = None,
    *,
    split: str = "train",
    num_workers: int | None = None,
    rope_spec: Any = None,
    progress: bool = True,
) -> PackPlan:
    """Measure ``split`` of the dataset at ``path`` and plan its rows (``config.num_workers`` by default)."""
    from energon_pack.runtime.task_encoder import QwenVLPackingTaskEncoder

    check_plan_budgets(config)
    encoder = QwenVLPackingTaskEncoder(config, processor, rope_spec=rope_spec)
    workers = config.num_workers if num_workers is None else num_workers
    if is_metadataset(path):
        check_blend_plan(config)
        measurement, _ = measure_blend(path, encoder, split=split, num_workers=workers, progress=progress, facts=False)
    else:
        measurement = measure_split(path, encoder, split=split, num_workers=workers, progress=progress)
    return plan_split(measurement, path, split, encoder, config)


def check_plan_budgets(config: PackingConfig) -> None:
    """Raise ``UsageError`` for a row budget a plan does not keep: ``max_row_audio_frames`` (a plan
    measures tokens, vision patches and media, not audio frames)."""
    if config.policy.max_row_audio_frames is not None:
        raise UsageError(
            f"max_row_audio_frames={config.policy.max_row_audio_frames}: a pack plan does not measure audio frames, "
            "so its rows could exceed it; fix: remove max_row_audio_frames for the plan, or pack online "
            "(get_packing_loader without plan), which keeps it"
        )


def check_blend_plan(config: PackingConfig) -> None:
    """Raise ``UsageError`` when ``config`` cannot plan a metadataset's blend (``plan.blend.blend_plan_problem``)."""
    problem = blend_plan_problem(config)
    if problem is not None:
        raise UsageError(problem)


def measure_blend(
    path: str | Path, encoder: Any, *, split: str, num_workers: int, progress: bool = True, facts: bool = True
) -> tuple[Measurement, str]:
    """The ``Measurement`` of a metadataset's split over its global sample indices (leaf i's
    samples after those of leaves 0..i-1): each leaf measured as :func:`measure_dataset` measures
    one dataset; also one line per leaf saying how."""
    leaves = planned_leaves(dataset_fingerprint(path, split)["blend"], path)
    parts, lines = [], []
    for leaf in leaves:
        part, line = measure_dataset(leaf.path, encoder, split=leaf.split, num_workers=num_workers, progress=progress, facts=facts)
        parts.append(part)
        lines.append(f"{leaf.path} ({leaf.split}): {line}")
    merged = Measurement(
        **{name: np.concatenate([getattr(p, name) for p in parts]) for name in ("tokens", "vision", "media", "flops")},
        skipped=sum((p.skipped for p in parts), Counter()),
        per_worker=sum((p.per_worker for p in parts), Counter()),
    )
    return merged, "\n".join(lines)


def plan_split(measurement: Measurement, path: str | Path, split: str, encoder: Any, config: PackingConfig) -> PackPlan:
    """Plan ``measurement`` of ``split`` at ``path``, fingerprinted with the dataset, ``encoder``
    (a task encoder or a ``TokenAccounting``) and ``config``. A metadataset's blend packs the
    samples ``plan.blend.blend_selection`` picks and stores its rows in ``interleave_rows`` order."""
    check_plan_budgets(config)
    identity = encoder.fingerprint if isinstance(encoder, TokenAccounting) else encoder_fingerprint(encoder)
    fingerprint = plan_fingerprint(
        dataset_fingerprint(path, split), identity, config, sample_mapping=mapping_name(current_loader_mapping())
    )
    blend = fingerprint["dataset"].get("blend")
    if blend is None:
        return plan_measurement(measurement, config, fingerprint)
    check_blend_plan(config)
    unit, seed = config.policy.blend_unit, config.seed
    schedule = PlanSchedule.of(config, blend)
    units = measurement.tokens if unit == "tokens" else np.ones_like(measurement.tokens)
    if schedule is not None:
        streams = seeded_streams(measurement.tokens, blend, seed=seed)
        good = np.concatenate(streams)
        row_units = config.seq_length * float(units[good].sum()) / max(1.0, float(measurement.tokens[good].sum()))
        rows = scheduled_rows(
            streams, units, schedule, seed=seed, row_units=row_units,
            pack=lambda kept: pack_samples(measurement, config, kept),
        )
        return plan_measurement(measurement, config, fingerprint, rows=rows)
    kept, source_of = blend_selection(measurement.tokens, blend, unit=unit, seed=seed)
    return plan_measurement(measurement, config, fingerprint, kept=kept, row_order=blend_row_order(source_of, units, seed=seed))


def plan_report(
    plan: PackPlan,
    *,
    seq_length: int,
    seconds: float,
    path: Path | None = None,
    per_worker: Mapping[str, int] | None = None,
) -> list[dict[str, Any]]:
    """Rows of the ``energon-pack plan`` report table (``per_worker``: samples measured by each
    ``"rank:worker"`` process, shown when given)."""
    real = int(plan.member_tokens.sum())
    rows: list[dict[str, Any]] = [
        {"metric": "samples read", "value": plan.samples_in},
        {"metric": "samples planned", "value": plan.num_samples},
        {"metric": f"rows (W={seq_length})", "value": plan.num_rows},
        {"metric": "fill (real tokens / row slots)", "value": f"{real / max(1, plan.num_rows * seq_length):.4f}"},
        {"metric": "skipped (total)", "value": sum(plan.skipped.values())},
        *({"metric": f"  skipped: {reason}", "value": count} for reason, count in plan.skipped.items()),
        {"metric": "plan time (s)", "value": f"{seconds:.2f}"},
    ]
    if plan.row_flops is not None:
        flops = plan.row_flops.astype(np.float64)
        rows.insert(4, {"metric": "row FLOPs: mean (TFLOP), CV, max/mean",
                        "value": f"{flops.mean() / 1e12:.2f}, {flops.std() / flops.mean():.3f}, {flops.max() / flops.mean():.3f}"})
    if per_worker:
        shares = " ".join(f"{name}={count}" for name, count in sorted(per_worker.items()))
        rows.append({"metric": "samples measured per process (rank:worker)", "value": shares})
    if path is not None:
        rows.append({"metric": "plan file (KiB)", "value": f"{path.stat().st_size / 1024:.1f}"})
    return rows


def config_from_cli(path: str | os.PathLike[str]) -> PackingConfig:
    """The packing config YAML given as ``--config``; a missing or invalid file is a one-line
    ``UsageError`` naming the file and the fix.

    Example: ``config_from_cli("missing.yaml")`` -> UsageError("--config 'missing.yaml' does not exist; fix: ...").
    """
    if not os.path.isfile(path):
        raise UsageError(
            f"--config {os.fspath(path)!r} does not exist; fix: pass a packing config YAML (e.g. "
            "configs/qwen25vl_8k.yaml) or write one holding at least 'seq_length: 8192'"
        )
    try:
        return PackingConfig.from_yaml(path)
    except (ValueError, TypeError) as err:
        raise UsageError(f"--config {' '.join(str(err).split())}") from err


def run_plan(args: Any) -> int:
    """``energon-pack plan DATASET --config packing.yaml [--processor PATH] --out PLAN``; under
    torchrun (``WORLD_SIZE`` > 1) every rank measures its slice and rank 0 writes the plan.

    With fresh facts and a processor card filed for ``--processor`` (``qwen.card``), the plan is
    built from them without loading the processor (nor torch or Energon); else the processor is
    loaded, the split read from facts or measured, and the processor's card filed for next time.
    Foreign samples are read under the config's ``sample_mapping``, which the plan records.
    """
    from energon_pack.core.dataset_path import check_dataset_path

    check_dataset_path(args.dataset, split=args.split)
    if getattr(args, "facts_dir", None) is not None and Path(args.facts_dir).exists() and not Path(args.facts_dir).is_dir():
        raise UsageError(f"--facts-dir {str(args.facts_dir)!r} is a file; fix: pass a folder (it is created when missing)")
    config = config_from_cli(args.config)
    with loader_sample_mapping(resolve_mapping(config.loader.sample_mapping)):
        return _run_plan(args, config)


def _run_plan(args: Any, config: PackingConfig) -> int:
    """:func:`run_plan` under its sample mapping."""
    start = time.perf_counter()
    check_plan_budgets(config)
    blend = is_metadataset(args.dataset)
    if blend:
        check_blend_plan(config)
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise UsageError(
                f"{args.dataset}: a metadataset is planned in one process (each leaf measured by its own worker "
                "processes), not under torchrun; fix: run energon-pack plan without torchrun"
            )
    # Facts hold no sample keys: an exclude list needs the samples read.
    if not blend and not args.measure and not config.loader.exclude and int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        found = card_facts(args.dataset, args.processor, config)
        if found is not None:
            measurement = measure_from_facts(args.dataset, found.accounting, found.facts, found.tokens, split=args.split)
            _write_plan(args, config, measurement, found.accounting, found.line(), start=start)
            return 0
    from energon_pack.qwen.card import file_processor_card
    from energon_pack.qwen.processor import load_processor
    from energon_pack.runtime.task_encoder import QwenVLPackingTaskEncoder

    processor = load_processor(args.processor)
    encoder = QwenVLPackingTaskEncoder(config, processor)
    workers = config.num_workers if args.workers is None else args.workers
    start = time.perf_counter()
    with _torchrun_group() as group:
        if blend:
            measurement, source = measure_blend(
                args.dataset, encoder, split=args.split, num_workers=workers, facts=not args.measure
            )
        elif group is None and read_in_place(args.dataset):
            measurement, source = measure_in_place(args, encoder, config, num_workers=workers)
        elif group is None:
            measurement, source = measure_dataset(
                args.dataset, encoder, split=args.split, num_workers=workers, facts=not args.measure
            )
            if file_processor_card(args.processor, processor, rope=encoder.rope_spec) is not None:
                source += "; processor loaded, its card filed for the next plan"
        else:
            measurement = measure_split_distributed(args.dataset, encoder, split=args.split, num_workers=workers)
            source = "measured by preencoding every sample (torchrun: each rank its slice)"
        if measurement is not None:
            _write_plan(args, config, measurement, encoder, source, start=start)
    return 0


def read_in_place(dataset: Any) -> bool:
    """Whether ``dataset`` is of a format other than ours (``formats.dispatch``): plan then keeps
    its facts outside it (``plan.kept_facts``)."""
    from energon_pack.formats.dispatch import format_of, read_dataset_yaml

    try:
        config = read_dataset_yaml(dataset)
    except (OSError, ValueError):
        return False
    return format_of(config, dataset=dataset).name != "energon-pack"


def measure_in_place(args: Any, encoder: Any, config: PackingConfig, *, num_workers: int) -> tuple[Measurement, str]:
    """The measurement of a dataset read in place: the kept facts (``--facts-dir``, default the
    folder of ``--out``) when they were measured for this dataset, encoder and config, else
    preencoding every sample, kept there for the next plan; nothing is written into the dataset."""
    from energon_pack.plan.kept_facts import facts_key, kept_facts_path, load_kept_facts, save_kept_facts

    facts_dir = Path(args.facts_dir) if getattr(args, "facts_dir", None) is not None else Path(args.out).resolve().parent
    path = kept_facts_path(args.dataset, args.split, facts_dir)
    mapping = mapping_name(current_loader_mapping())
    key = facts_key(
        plan_fingerprint(dataset_fingerprint(args.dataset, args.split), encoder_fingerprint(encoder), config, sample_mapping=mapping)
    )
    kept = "--measure" if args.measure else load_kept_facts(path, key)
    if not isinstance(kept, str):
        return Measurement(**kept), f"measured from kept facts ({path}; the dataset is read in place)"
    measurement = measure_split(args.dataset, encoder, split=args.split, num_workers=num_workers)
    save_kept_facts(path, key, measurement)
    return measurement, f"measured by preencoding every sample ({kept}); facts kept at {path}, none written into the dataset"


def _write_plan(args: Any, config: PackingConfig, measurement: Measurement, encoder: Any, source: str, *, start: float) -> None:
    """Plan ``measurement``, write it to ``args.out`` and print the report, ``source`` and the digest."""
    from energon_pack.core.tables import format_table

    plan = plan_split(measurement, args.dataset, args.split, encoder, config)
    plan.save(args.out)
    seconds = time.perf_counter() - start
    report = plan_report(plan, seq_length=config.seq_length, seconds=seconds, path=Path(args.out), per_worker=measurement.per_worker)
    if "blend" in plan.fingerprint["dataset"]:
        report += blend_report(plan, config.policy.blend_unit)
    print(format_table(report))
    print(source)
    print(f"plan written to {args.out} (digest {plan.digest[:16]})")


@contextlib.contextmanager
def _torchrun_group() -> Iterator[Any]:
    """``torch.distributed`` (gloo, initialised here unless it already is) when run by torchrun
    with ``WORLD_SIZE`` > 1, else None; on exit the ranks meet at a barrier (rank 0 has written)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        yield None
        return
    import torch.distributed as dist

    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo")
    try:
        yield dist
        dist.barrier()
    finally:
        if created:
            dist.destroy_process_group()


def synthetic_shards(num_samples: int, samples_per_shard: int = 1000) -> list[list[Any]]:
    """A shard table for ``num_samples`` samples in shards of ``samples_per_shard`` (0 bytes each),
    standing for a dataset in plan benchmarks.

    Example: ``synthetic_shards(2500)`` -> ``[["shards/data-000000.tar", 1000, 0], [..., 1000, 0],
    ["shards/data-000002.tar", 500, 0]]``.
    """
    return [
        [f"shards/data-{i:06d}.tar", min(samples_per_shard, num_samples - start), 0]
        for i, start in enumerate(range(0, num_samples, samples_per_shard))
    ]


def lengths_plan_table(
    lengths: Sequence[int], *, widths: Sequence[int], min_fill: float, samples_per_shard: int = 1000
) -> list[dict[str, Any]]:
    """Plan size and time for a split of ``lengths`` (tokens per sample), one table row per W.

    The lengths stand for a dataset in shards of ``samples_per_shard``; each plan is written to
    and read back from a temporary file. Keys: ``W, samples, rows, fill, plan_s, file_kib, load_s``.
    """
    import tempfile

    from energon_pack.plan.file import open_plan

    shards = synthetic_shards(len(lengths), samples_per_shard)
    table = []
    for width in widths:
        config = PackingConfig(seq_length=width, min_fill=min_fill)
        fingerprint = plan_fingerprint({"split": "train", "shards": shards}, {}, config)
        measurement = Measurement.empty(len(lengths))
        fits = np.asarray(lengths, dtype=np.int64) <= width
        measurement.tokens[fits] = np.asarray(lengths, dtype=np.int64)[fits]
        measurement.skipped["overlong"] = int((~fits).sum())
        start = time.perf_counter()
        plan = plan_measurement(measurement, config, fingerprint)
        planned = time.perf_counter() - start
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "plan"
            plan.save(path)
            size = path.stat().st_size
            start = time.perf_counter()
            opened = open_plan(path)
            if opened.num_rows:
                opened.global_indices(0)
            loaded = time.perf_counter() - start
        table.append({
            "W": width,
            "samples": plan.num_samples,
            "rows": plan.num_rows,
            "fill": float(plan.member_tokens.sum()) / (plan.num_rows * width),
            "plan_s": planned,
            "file_kib": size / 1024,
            "load_s": loaded,
        })
    return table
