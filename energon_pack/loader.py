"""``get_packing_loader``: one call from a dataset path to Energon's savable loader of THD rows.

The returned ``PackingDataLoader`` is Energon's ``SavableDataLoader`` plus two things:
``save_state_rank`` records a fingerprint of everything exact resume depends on and
``restore_state_rank`` refuses a state saved under a different one (naming the fields) and a
damaged one (naming what is wrong, ``energon_pack.runtime.state_check``); ``stats()`` aggregates the
per-worker packing statistics carried by the rows. ``LoaderOptions.timeout`` turns a worker that
delivers no row for that long into an error instead of a hang.
A worker process that dies (a native decoder's crash, the OOM killer) ends iteration with a
``WorkerDiedError`` naming the sample it was decoding and the ``exclude`` entry that skips it
(``energon_pack.runtime.inflight``). ``len(loader)`` raises ``TypeError``: the rows of an epoch are not known before packing.
"""

from __future__ import annotations

import itertools
import tempfile
import warnings
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from megatron.energon import (
    SavableDataLoader,
    WorkerConfig,
    get_train_dataset,
    get_val_dataset,
)

from energon_pack.config import PackingConfig
from energon_pack.identity import dataset_config_fingerprint, online_balance_fingerprint, resume_fingerprint
from energon_pack.config.blend import weights_problem
from energon_pack.core.dataset_path import METADATASET_SUFFIXES, as_dataset_path, check_dataset_path
from energon_pack.errors import UsageError
from energon_pack.formats.dispatch import reading_formats
from energon_pack.metrics import SourceInfo, source_infos
from energon_pack.formats.sample_mapping import SampleMapping, loader_sample_mapping, mapping_name, resolve_mapping
from energon_pack.runtime.pinning import pin_only_with_accelerator
from energon_pack.plan.loader import PlanDataLoader, plan_data_loader
from energon_pack.qwen.rope import RopeSpec
from energon_pack.runtime.balanced_stage import balance_report
from energon_pack.runtime.state_check import check_loader_state, check_restored_type
from energon_pack.runtime.inflight import naming_dead_workers
from energon_pack.runtime.workers import frozen_gc, stop_workers_when_collected
from energon_pack.runtime.stats import ROW_COUNTS, PackingStats, aggregate_stats, latest_snapshots, read_snapshots
from energon_pack.runtime.task_encoder import BlendConfigError, QwenVLPackingTaskEncoder, WeightedBlendWithoutRepeatError


class BlendShareWarning(UserWarning):
    """A sample blend whose token shares are far from its weights (``blend_unit`` is the fix)."""


#: Rows after which (and every so many after) a sample blend's token shares are compared with its weights.
BLEND_CHECK_ROWS = 16
#: A realized token share this many times above or below its weight's share is warned about (once).
BLEND_WARN_RATIO = 2.0


def blend_sources(entries: Sequence[Mapping[str, Any]], sources: Mapping[int, Mapping[str, int]]) -> list[dict[str, Any]]:
    """Each blend entry (index, path, subflavors, weight, repetitions) with its counters (samples,
    real tokens, supervised tokens, skipped) and its realized shares of samples, real and supervised
    tokens (``*_share``, None before anything was counted).

    Example: entries of weight 1 and 1, counters ``{0: {"samples": 10, "real_tokens": 2000, ...},
    1: {"samples": 10, "real_tokens": 20000, ...}}`` -> ``real_tokens_share`` 0.0909 and 0.909.
    """
    rows = []
    for entry in entries:
        counters = sources.get(entry["index"], {})
        rows.append({**entry, **{name: counters.get(name, 0) for name in ("samples", "real_tokens", "supervised_tokens", "skipped")}})
    for name in ("samples", "real_tokens", "supervised_tokens"):
        total = sum(row[name] for row in rows)
        for row in rows:
            row[f"{name}_share"] = row[name] / total if total else None
    return rows


def blend_share_warning(sources: Sequence[Mapping[str, Any]]) -> str | None:
    """The warning for a weighted sample blend whose realized real-token shares differ from its
    weights' shares by more than ``BLEND_WARN_RATIO`` times, else None.

    Example: weights 1:1, token shares 0.09 / 0.91 -> a line naming the entry at 9 % of tokens
    against 50 % and ``blend_unit: tokens`` as the fix.
    """
    weights = [row["weight"] for row in sources]
    if len(sources) < 2 or any(w is None for w in weights) or sum(weights) <= 0:
        return None
    for row, weight in zip(sources, weights):
        target, realized = weight / sum(weights), row["real_tokens_share"]
        if realized is None or target <= 0:
            continue
        if realized > target * BLEND_WARN_RATIO or realized < target / BLEND_WARN_RATIO:
            return (
                f"blend entry {row['index']} ({row['path']}) carries {realized:.1%} of the rows' real tokens against its "
                f"weight's {target:.1%}: with blend_unit 'samples' Energon's weights are shares of samples, and its "
                f"samples are {'shorter' if realized < target else 'longer'} than the others; fix: set blend_unit: tokens "
                "(or supervised_tokens) in the packing config if the weights are meant as shares of tokens"
            )
    return None


@dataclass
class PackingLoaderState:
    """Picklable loader state of one data-parallel rank: Energon's state plus the fingerprint."""

    energon_state: Any
    fingerprint: dict[str, Any]
    #: Latest statistics snapshot per worker at the save point (so ``stats()`` stays complete).
    worker_stats: dict[int, dict[str, Any]]
    #: Sum of the per-row counters of in-batch rows consumed so far (``PackingStats.snapshot()``).
    row_stats: dict[str, Any] | None = None


class PackingDataLoader(SavableDataLoader):
    """Energon's savable loader with a resume fingerprint and aggregated packing statistics."""

    def __init__(
        self,
        dataset: Any,
        *,
        fingerprint: dict[str, Any],
        allow_inexact_resume: bool,
        stats_dir: tempfile.TemporaryDirectory,
        packing_stage: bool = True,
        timeout: float = 0,
        blend_entries: Sequence[Mapping[str, Any]] = (),
        blend_unit: str = "samples",
        step_rows: int | None = None,
        source_entries: Sequence[Mapping[str, Any]] = (),
        dataset_path: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(dataset, **kwargs)
        #: The datasets ``row["segment_source"]`` numbers (``blend_entry`` each), and the dataset path.
        self._source_entries = [dict(entry) for entry in source_entries]
        self._dataset_path = dataset_path
        #: Rows of this rank per step (``micro_batches_per_step``) when it balances steps online: a
        #: state is saved after whole steps only. None: any row.
        self.step_rows = step_rows
        #: Rows yielded since this iteration started (or since the restored state's step boundary).
        self._rows_in_iteration = 0
        pin_only_with_accelerator(self)
        #: torch DataLoader's timeout (Energon passes none): seconds to wait for a worker's next row.
        self.timeout = timeout
        #: Whether this loader's workers run the packing stage (mode "online"), whose saved state is checked.
        self.packing_stage = packing_stage
        self.fingerprint = fingerprint
        self.allow_inexact_resume = allow_inexact_resume
        #: Where workers publish their statistics (kept alive, and removed, with the loader).
        self._stats_dir = stats_dir
        #: Latest snapshot per worker carried by a consumed row: exact at the consumer's position.
        self._worker_stats: dict[int, dict[str, Any]] = {}
        #: Per-row counters of in-batch rows (``stats.row_counts``) summed at the consumer's position.
        self._row_stats: PackingStats | None = None
        #: The metadataset's blend entries (index, path, subflavors, weight, repetitions); [] without a blend.
        self.blend_entries = [dict(entry) for entry in blend_entries]
        self.blend_unit = blend_unit
        self._blend_warned = blend_unit != "samples" or not self.blend_entries
        #: Stops the worker processes of the current iteration when this loader is garbage-collected
        #: without ``close()`` (``runtime.workers.stop_workers_when_collected``); None without workers.
        self._workers_finalizer: weakref.finalize | None = None

    def __len__(self) -> int:
        raise TypeError(
            "len() of a packing loader is not defined: how many rows one epoch yields is only known after "
            "packing (it depends on token lengths, bin selection and media that fail to decode, and this "
            "rank's share); fix: count rows as you iterate, or estimate them with "
            "`energon-pack simulate --dataset DIR`"
        )

    def __iter__(self):
        try:
            yield from self._rows()
        except Exception:
            # A failed epoch (a worker raised, e.g. on_overlong="error"): stop its workers now,
            # not at interpreter exit; the next iteration starts fresh ones.
            self._shutdown_workers()
            raise

    def _rows(self) -> Iterator[dict]:
        with naming_dead_workers(self._stats_dir.name):
            yield from self._batches()

    def _batches(self) -> Iterator[dict]:
        batches = super().__iter__()
        # Workers fork on the first request. Objects alive now go to the permanent generation
        # first, so a worker's garbage collector (and Energon's gc_init_worker scan) never writes
        # to their headers: those pages stay shared with this process instead of being copied
        # into every worker. The parent unfreezes as soon as the workers exist. In-process loading
        # (num_workers=0) forks nothing, so it skips the collection.
        with frozen_gc(enabled=self.num_workers > 0):
            first = next(batches, None)
        self._guard_workers()
        self._rows_in_iteration = 0
        if first is None:
            return
        for index, batch in enumerate(itertools.chain([first], batches)):
            if not self._blend_warned and index and index % BLEND_CHECK_ROWS == 0:
                self._check_blend_shares()
            snapshot = batch.get("__stats__") if isinstance(batch, dict) else None
            if snapshot and snapshot.get("kind") == ROW_COUNTS:
                self._row_stats = self._row_stats or PackingStats()
                self._row_stats.add_row_counts(snapshot)
            elif snapshot:
                self._worker_stats[snapshot["worker_id"]] = snapshot
            if batch.get("__empty__"):
                continue  # a batch whose samples were all skipped: counted, no row
            self._rows_in_iteration += 1
            yield batch

    def _check_blend_shares(self) -> None:
        """Warn once when a sample blend's token shares are far from its weights (``blend_share_warning``)."""
        message = blend_share_warning(blend_sources(self.blend_entries, aggregate_stats(self._worker_stats.values())["sources"]))
        if message is not None:
            self._blend_warned = True
            warnings.warn(message, BlendShareWarning, stacklevel=3)

    def _guard_workers(self) -> None:
        """Have the worker processes just started stopped promptly if this loader is dropped without
        ``close()`` (a notebook cell run again): see ``stop_workers_when_collected``."""
        iterator = self._iterator
        if self._workers_finalizer is None and iterator is not None and hasattr(iterator, "_shutdown_workers"):
            self._workers_finalizer = stop_workers_when_collected(self, iterator)

    def _shutdown_workers(self) -> None:
        """Stop this loader's worker processes (torch keeps persistent workers until then)."""
        iterator, self._iterator = self._iterator, None
        finalizer, self._workers_finalizer = self._workers_finalizer, None
        if finalizer is not None:
            finalizer()
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()  # a no-op once the finalizer ran for it

    def close(self) -> None:
        """Stop the workers and remove the statistics folder; ``stats()`` keeps the last figures.

        Also done when the loader is garbage-collected; ``with get_packing_loader(...) as loader:``
        closes it at the end of the block.
        """
        self._shutdown_workers()
        self._worker_stats = latest_snapshots(self._worker_stats, read_snapshots(self._stats_dir.name))
        self._stats_dir.cleanup()

    def __enter__(self) -> PackingDataLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def stats(self) -> dict[str, Any]:
        """Aggregated statistics of this rank's workers (latest snapshot each), skips by reason,
        and the model ``family`` the rows are encoded for (e.g. ``"qwen3.5"``).

        Per worker the most advanced of the snapshot its last consumed row carried and the one it
        published (which includes skips after its last row, and may be a little ahead of the
        consumer while workers prefetch, or behind it: workers publish at most every few seconds).
        """
        snapshots = list(latest_snapshots(self._worker_stats, read_snapshots(self._stats_dir.name)).values())
        if self._row_stats is not None:
            snapshots.append(self._row_stats.snapshot())
        report = aggregate_stats(snapshots)
        report["worker_peak_rss_bytes"] = max((s.get("peak_rss_bytes", 0) for s in snapshots), default=0)
        report["buffered_samples"] = sum(s.get("buffered_samples", 0) for s in snapshots)
        report["buffered_bytes"] = sum(s.get("buffered_bytes", 0) for s in snapshots)
        # Samples read again by restore key in the workers' current processes (docs/balanced_steps.md).
        report["restore_reads"] = sum(s.get("restore_reads", 0) for s in snapshots)
        report["parked_reads"] = sum(s.get("parked_reads", 0) for s in snapshots)
        report["family"] = self.family()
        report["blend_unit"] = self.blend_unit
        report["sources"] = blend_sources(self.blend_entries, report["sources"]) if self.blend_entries else []
        report.update(balance_report(snapshots))
        return report

    def sources(self) -> list[SourceInfo]:
        """The sources ``row["segment_source"]`` indexes: each metadataset entry (one for a plain
        dataset) with its metric name, path, subflavors and weight (``energon_pack.metrics.source_infos``;
        ``SourceNameError`` when two entries get the same name)."""
        return source_infos(self._source_entries, self._dataset_path)

    def family(self) -> str:
        """The model family the rows are encoded for (e.g. ``"qwen2.5-vl"``)."""
        return self.fingerprint["vision.family"]

    def save_state_rank(self) -> PackingLoaderState:
        if self.step_rows is not None and self._rows_in_iteration % self.step_rows:
            raise ValueError(
                f"save_state_rank after {self._rows_in_iteration} rows of this iteration, in the middle of a step of "
                f"micro_batches_per_step={self.step_rows} rows: a loader balancing steps saves after whole steps "
                "(its workers' rows are laid out in steps); fix: save at a step boundary (after the optimizer step)"
            )
        with naming_dead_workers(self._stats_dir.name):  # a worker that died is found here too
            energon_state = super().save_state_rank()
        return PackingLoaderState(
            energon_state=energon_state,
            fingerprint=dict(self.fingerprint),
            worker_stats={worker: dict(snapshot) for worker, snapshot in self._worker_stats.items()},
            row_stats=None if self._row_stats is None else self._row_stats.snapshot(),
        )

    def restore_state_rank(self, state: PackingLoaderState | None) -> None:
        if state is None:
            return
        check_restored_type(  # a fingerprint that is no mapping: check_loader_state names it
            state, PackingLoaderState, loader_name="PackingDataLoader", current_fingerprint=self.fingerprint,
            allow_inexact=self.allow_inexact_resume,
        )
        check_loader_state(
            state.fingerprint, state.energon_state, state.worker_stats,
            num_workers=self.num_workers, micro_batch_size=self._get_batch_size(), packing_stage=self.packing_stage,
        )
        super().restore_state_rank(state.energon_state)
        self._rows_in_iteration = 0
        self._worker_stats = {worker: dict(snapshot) for worker, snapshot in state.worker_stats.items()}
        self._row_stats = None
        if state.row_stats is not None:
            self._row_stats = PackingStats()
            self._row_stats.restore_state(state.row_stats)


def _distributed_rank_info(
    rank: int | None, world_size: int | None, data_parallel_group: Any
) -> tuple[int, int, Any]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        group_rank = dist.get_rank(data_parallel_group)
        group_size = dist.get_world_size(data_parallel_group)
        if (rank is not None and rank != group_rank) or (world_size is not None and world_size != group_size):
            raise ValueError(
                f"rank={rank}, world_size={world_size} disagree with torch.distributed "
                f"(data-parallel rank {group_rank} of {group_size}); drop the explicit values or pass the "
                "right data_parallel_group"
            )
        return group_rank, group_size, data_parallel_group
    rank, world_size = (0 if rank is None else rank), (1 if world_size is None else world_size)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
    return rank, world_size, None


def check_blend_weights(path: Any, split: str) -> None:
    """Raise ``UsageError`` (a ValueError) when a metadataset's ``blend`` weights for ``split`` are
    negative, not finite or all 0 (Energon would divide by their sum or draw nonsense); nothing for
    a dataset folder or a metadataset that is not readable here (Energon then reports it).

    Example: a metadataset with ``blend: [{weight: 1, path: a}, {weight: -1, path: b}]`` -> UsageError
    naming ``[1, -1]``, the rule and the fix.
    """
    import yaml

    text = str(path)
    if not text.lower().endswith(METADATASET_SUFFIXES):
        return
    try:
        document = yaml.safe_load(as_dataset_path(path).read_text())
        entries = document["splits"][split]["blend"]
        weights = [entry.get("weight", 1.0) for entry in entries]
    except Exception:  # not a weighted blend of this split, or not readable: Energon decides
        return
    problem = weights_problem(f"{text}: the blend weights of split {split!r}", weights)
    if problem is not None:
        raise UsageError(problem)


def get_packing_loader(
    path: Any,
    config: PackingConfig,
    processor: Any = None,
    *,
    split: Literal["train", "val", "test"] | str = "train",
    rank: int | None = None,
    world_size: int | None = None,
    data_parallel_group: Any = None,
    rope_spec: RopeSpec | None = None,
    plan: Any = None,
    sample_mapping: SampleMapping | str | None = None,
    exclude: Sequence[str] = (),
    **loader_kwargs: Any,
) -> PackingDataLoader | PlanDataLoader:
    """Build the packing loader of one data-parallel rank.

    Rank, world size and group come from ``torch.distributed`` when it is initialized, else
    from ``rank`` / ``world_size`` (default 0 / 1). ``split="train"`` repeats as
    ``config.loader.repeat`` says; other splits are read once (a validation "batch" is one packed
    row, not one conversation). Other keyword arguments (``checkpoint_every_sec``,
    ``checkpoint_every_min_n_samples``, ...) go to Energon's ``SavableDataLoader``; by default a
    worker checkpoints every row (``ROW_CHECKPOINTS``), so a restore re-makes no rows.

    ``config.balance_steps`` without ``plan`` (with ``micro_batches_per_step``): each worker emits
    its rows at cost quantiles of a sliding pool every rank lays out alike
    (``energon_pack.runtime.balanced_stage``; train split only, states saved at step boundaries;
    docs/balanced_steps.md).

    ``plan`` (a ``PackPlan`` or the path of one written by ``energon-pack plan``): rows come
    from the plan instead of online selection; the result is a ``PlanDataLoader`` whose state
    restores at any data-parallel size and worker count (see ``energon_pack.plan.loader``).

    ``sample_mapping`` (a callable ``sample -> record`` or ``"module:function"``; default
    ``config.loader.sample_mapping``): how samples of foreign datasets (Energon sample types, crude
    datasets) become our record form, replacing the types' defaults (docs/foreign_datasets.md).

    ``exclude``: more entries for ``config.loader.exclude`` (sample keys or ``"SHARD#KEY"``),
    skipped as ``excluded``; a saved state resumes with them (docs/state_contract.md).
    """
    check_dataset_path(path, split=split)
    check_blend_weights(path, split)
    rank, world_size, group = _distributed_rank_info(rank, world_size, data_parallel_group)
    if isinstance(exclude, str):
        raise TypeError(f"exclude={exclude!r}: pass a list of entries; fix: exclude=[{exclude!r}]")
    if exclude:
        config = PackingConfig(
            row=config.row, policy=config.policy, loader=config.loader, trainer=config.trainer,
            exclude=(*config.loader.exclude, *exclude),
        )
    mapping = resolve_mapping(sample_mapping if sample_mapping is not None else config.loader.sample_mapping)
    stats_dir = tempfile.TemporaryDirectory(prefix="energon_pack_stats_")
    if plan is not None:
        task_encoder = QwenVLPackingTaskEncoder(config, processor, rope_spec=rope_spec, stats_dir=stats_dir.name)
        with loader_sample_mapping(mapping):
            return plan_data_loader(
                path, plan, config, task_encoder, split=split, rank=rank, world_size=world_size,
                data_parallel_group=group, stats_dir=stats_dir, **loader_kwargs,
            )
    if split != "train" and config.policy.balance_steps:
        # A validation or test split is read once, row by row: no optimizer steps to balance.
        config = PackingConfig(row=config.row, policy=config.policy, loader=config.loader, trainer=config.trainer,
                               balance_steps=False)
    task_encoder = QwenVLPackingTaskEncoder(config, processor, rope_spec=rope_spec, stats_dir=stats_dir.name)
    worker_config = WorkerConfig(
        rank=rank,
        world_size=world_size,
        num_workers=config.loader.num_workers,
        data_parallel_group=group,
        seed_offset=config.loader.seed,
    )
    # The reader of each dataset's format (formats.dispatch), foreign samples mapped by ``mapping``.
    with reading_formats(), loader_sample_mapping(mapping):
        if split == "train":
            try:
                dataset = get_train_dataset(
                    path,
                    split_part=split,
                    worker_config=worker_config,
                    batch_size=1,
                    shuffle_buffer_size=config.loader.shuffle_buffer_size,
                    max_samples_per_sequence=config.loader.max_samples_per_sequence,
                    task_encoder=task_encoder,
                    repeat=config.loader.repeat,
                )
            except (WeightedBlendWithoutRepeatError, BlendConfigError) as err:
                raise type(err)(f"{path}: {err}") from None
        else:
            dataset = get_val_dataset(path, split_part=split, worker_config=worker_config, batch_size=1, task_encoder=task_encoder)
    fingerprint = resume_fingerprint(
        config, task_encoder, rank=rank, world_size=world_size, split=split,
        dataset=dataset_config_fingerprint(dataset.config()),
    )
    if mapping is not None:
        fingerprint["sample_mapping"] = mapping_name(mapping)
    return PackingDataLoader(
        dataset,
        fingerprint=fingerprint,
        allow_inexact_resume=config.loader.allow_inexact_resume,
        stats_dir=stats_dir,
        packing_stage=config.mode == "online",
        timeout=config.loader.timeout,
        blend_entries=task_encoder.blend_entries,
        blend_unit=config.policy.blend_unit,
        source_entries=task_encoder.source_entries,
        dataset_path=path,
        step_rows=config.trainer.micro_batches_per_step if online_balance_fingerprint(config) else None,
        **{"prefetch_factor": config.loader.prefetch_factor, **_gc_settings(config.loader.num_workers),
           **ROW_CHECKPOINTS, **loader_kwargs},
    )


#: Energon's worker checkpoints, one per row (the caller's ``checkpoint_every_sec`` /
#: ``checkpoint_every_min_n_samples`` win). A saved state is a worker's last checkpoint plus the rows
#: it made since, and a restore makes those rows again, decode included: under Energon's defaults
#: (a checkpoint a minute at most) a restore re-made up to a minute of rows (DP4 rank, 2 workers, 512
#: rows read: 6.7 s to the first restored row, 0.45 s with a checkpoint a row). A checkpoint is the
#: workers' small state (restore keys, counters): no slower to read with (docs/state_contract.md).
ROW_CHECKPOINTS = {"checkpoint_every_sec": 0, "checkpoint_every_min_n_samples": 1}


#: Energon's ``gc_collect_every_n_steps`` for in-process loading: never (its GcDataset wrapper stays,
#: so a loader's saved state keeps the same nesting).
IN_PROCESS_GC_EVERY = 2**62


def _gc_settings(num_workers: int) -> dict[str, Any]:
    """Energon's garbage-collection settings: its defaults with workers (a heap freeze at each epoch
    start, a full ``gc.collect`` every 10 rows); in-process neither, as both would scan the whole
    trainer heap (0.1-0.3 s a time; Python's own generational collector still runs). A caller's
    ``gc_freeze_at_start`` / ``gc_collect_every_n_steps`` win.
    Example: ``_gc_settings(0)`` -> ``{"gc_freeze_at_start": False, "gc_collect_every_n_steps": 2**62}``."""
    if num_workers > 0:
        return {"gc_freeze_at_start": True}
    return {"gc_freeze_at_start": False, "gc_collect_every_n_steps": IN_PROCESS_GC_EVERY}
