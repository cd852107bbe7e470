"""``PlanDataLoader``: THD rows read from a pack plan, with a state valid for any DP size and worker count.

Stream: position ``p`` holds global row ``g = p - base`` of the epoch being read, i.e. plan row
``epoch_row_order(R, seed, epoch)[g]`` (``repeat=True``: one endless stream, ``base = 0``,
epoch ``p // R``; ``repeat=False``: one epoch per iteration, ``base = epoch * R``). Position
``p`` goes to data-parallel rank ``(p - base) % world_size``; inside a rank, torch DataLoader
workers take the rank's rows round-robin, and torch's in-order delivery hands them to the
trainer in position order.

Rows: members are fetched by Energon restore key (random access through the dataset's index,
no scan), preencoded and turned into a THD row by the task encoder's ``encode_row``: the same
postencode and row builder as online packing. A member that fails to decode (or is excluded) is a
counted skip under the same reason as online, and the row keeps its planned width (the member's
slots become padding, with no loss); a row whose members all fail arrives as an empty marker and
is dropped (counted) in the main process, so positions stay aligned.

State: ``PlanLoaderState.cursor``: every position below it is consumed by some rank. With
ranks in lock step (the same number of rows each), every rank saves the same cursor, so a
state saved at DP=4 restores at DP=2 or 8, with any worker count, and the union of the rows
continues exactly.

Balanced steps: a plan built with ``balance_steps`` (it holds ``row_flops``) read with
``micro_batches_per_step`` = m reads the stream of :class:`~energon_pack.packing.balance.BalancedStream`
(cost windows of ``balance_window_steps`` steps) and deals each step's ``G = dp * m`` positions
to ranks by cost (:func:`~energon_pack.packing.balance.deal_step`), exactly m per rank (the
short last step of an epoch: as many as it holds); workers take the rank's rows round-robin as
above. States are saved after whole steps and restore exactly at any DP size with the same
``G`` (DP4 x 2 -> DP2 x 4); see ``docs/balanced_steps.md``.
"""

from __future__ import annotations

import itertools
import logging
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import numpy as np
import torch

from energon_pack.config import PackingConfig
from energon_pack.core.token_rules import check_token_rules, recorded_rules
from energon_pack.identity import (
    check_plan_fingerprint,
    encoder_fingerprint,
    plan_fingerprint,
    plan_loader_fingerprint,
)
from energon_pack.metrics import SourceInfo, source_infos
from energon_pack.formats.sample_mapping import current_loader_mapping, loader_sample_mapping, mapping_name
from energon_pack.packing.balance import BalancedStream, check_balanced_resume, deal_step
from energon_pack.packing.global_plan import epoch_row_order, first_rank_position, rank_positions
from energon_pack.plan.build import dataset_fingerprint, open_split
from energon_pack.plan.blend import planned_sources
from energon_pack.plan.file import MappedPlan, PackPlan, open_plan
from energon_pack.plan.metadataset import PlannedLeaf, planned_leaves
from energon_pack.packing.planner import is_count
from energon_pack.runtime.state_check import check_restored_type, raise_if_state_problems
from energon_pack.runtime.stats import PackingStats, aggregate_stats

__all__ = ["PlanDataLoader", "PlanLoaderState", "check_plan_matches", "plan_data_loader", "plan_state_problems"]

_LOG = logging.getLogger(__name__)


@dataclass
class PlanLoaderState:
    """Picklable plan-loader state: one global cursor (any DP size, any worker count)."""

    #: Plan digest, seed and row-building settings the rows depend on.
    fingerprint: dict[str, Any]
    #: Every stream position below ``cursor`` has been consumed.
    cursor: int
    #: Epoch being read (``repeat=False``; 0 with ``repeat=True``, where the cursor says it all).
    epoch: int
    #: This rank's row statistics at the save point (``PackingStats.snapshot()``).
    stats: dict[str, Any]
    #: Rank and world size that saved the state (informational).
    rank: int
    world_size: int
    #: Rows per step (dp x micro_batches_per_step) of a balanced loader; None with plain dealing.
    step_rows: int | None = None


def plan_state_problems(state: PlanLoaderState, *, num_rows: int, repeat: bool) -> list[str]:
    """What is wrong with a plan-loader state for a plan of ``num_rows`` rows read with ``repeat``
    ([] when consistent): field types, an epoch and cursor the stream can hold, sound statistics.

    Example: ``cursor=-3`` -> ``["cursor=-3 is not a non-negative integer"]``; ``repeat=False``,
    ``epoch=1``, ``cursor=5`` of a 10-row plan -> ``["cursor=5 is outside epoch 1's positions [10, 20]"]``.
    """
    problems = [] if isinstance(state.fingerprint, Mapping) else [f"fingerprint is a {type(state.fingerprint).__name__}, not a mapping"]
    problems += [
        f"{name}={getattr(state, name)!r} is not a non-negative integer"
        for name in ("cursor", "epoch", "rank", "world_size") if not is_count(getattr(state, name))
    ]
    if is_count(state.rank) and is_count(state.world_size) and state.rank >= state.world_size:
        problems.append(f"rank={state.rank} is not below world_size={state.world_size}")
    if state.step_rows is not None and not (is_count(state.step_rows) and state.step_rows > 0):
        problems.append(f"step_rows={state.step_rows!r} is neither None nor a positive integer")
    if not isinstance(state.stats, Mapping) or not isinstance(state.stats.get("skipped"), Mapping):
        problems.append("stats is not a saved statistics mapping (PackingStats.snapshot())")
    if is_count(state.cursor) and is_count(state.epoch):
        if repeat and state.epoch != 0:
            problems.append(f"epoch={state.epoch}: a repeating loader's state has epoch 0 (its cursor counts every row)")
        elif not repeat and not state.epoch * num_rows <= state.cursor <= (state.epoch + 1) * num_rows:
            problems.append(
                f"cursor={state.cursor} is outside epoch {state.epoch}'s positions "
                f"[{state.epoch * num_rows}, {(state.epoch + 1) * num_rows}] of this {num_rows}-row plan"
            )
    return problems


def check_plan_matches(
    plan: PackPlan | MappedPlan, path: Any, split: str, encoder: Any, config: PackingConfig
) -> None:
    """Raise ``TokenRulesError`` when ``plan`` counted tokens under other token rules (always), then
    ``ResumeMismatchError`` naming every field where it was built for something else (dataset
    shards, processor, packing budgets) unless ``config.allow_inexact_resume``."""
    where = f"pack plan {plan.path}" if isinstance(plan, MappedPlan) else f"pack plan (digest {plan.digest[:16]})"
    check_token_rules(
        recorded_rules(plan.fingerprint.get("encoder", {})), where,
        "rebuild the plan with this energon_pack's `energon-pack plan DATASET --config CONFIG --out PLAN`",
    )
    current = plan_fingerprint(
        dataset_fingerprint(path, split), encoder_fingerprint(encoder), config,
        sample_mapping=mapping_name(current_loader_mapping()),
    )
    check_plan_fingerprint(plan.fingerprint, current, digest=plan.digest, allow_inexact=config.allow_inexact_resume)


@dataclass(eq=False)
class PlanRowSource:
    """Builds the row at a stream position: plan row lookup, member fetch by restore key, encoding.

    The Energon dataset is opened lazily in each process that builds rows (main process or
    DataLoader worker), with a worker config matching that process.
    """

    plan: PackPlan | MappedPlan
    #: The dataset (a folder or ``msc://`` path) and split the plan was built over.
    path: Any
    split: str
    encoder: Any
    _: KW_ONLY
    seed: int
    #: The balanced stream order (a balanced plan read with micro_batches_per_step), else None.
    balance: BalancedStream | None = None
    #: The sample mapping foreign samples are read under (the loader's, captured when built).
    sample_mapping: Any = field(default_factory=current_loader_mapping)
    _orders: dict[int, list[int]] = field(default_factory=dict, init=False, repr=False)
    #: (pid, worker config, {leaf number: dataset}) of the process that builds rows.
    _reader: tuple[int, Any, dict[int, Any]] | None = field(default=None, init=False, repr=False)
    #: The datasets the plan's global sample indices address: the metadataset's leaves, or the one dataset.
    _leaves: list[PlannedLeaf] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        blend = self.plan.fingerprint["dataset"].get("blend")
        self._leaves = (
            [PlannedLeaf(path=self.path, split=self.split, subflavors={}, offset=0)] if blend is None
            else planned_leaves(blend, self.path)
        )

    def plan_row(self, position: int) -> tuple[int, int]:
        """``(epoch, plan row)`` at stream ``position``. Example: R=10, position 23 -> (2, order_2[3]);
        a metadataset's plan is read in its stored (interleaved) order every epoch: (2, 3)."""
        epoch, row = divmod(position, self.plan.num_rows)
        if self.balance is not None:
            return epoch, self.balance.plan_row(position)
        if "blend" in self.plan.fingerprint["dataset"]:
            return epoch, row
        if epoch not in self._orders:
            self._orders = {epoch: epoch_row_order(self.plan.num_rows, seed=self.seed, epoch=epoch)}
        return epoch, self._orders[epoch][row]

    def fetch(self, index: int) -> Any:
        """The raw Energon sample at global index ``index``: sample ``index - offset`` of the leaf
        holding it (restore key ``("Webdataset", index - offset)``), with the leaf's subflavors.
        A metadataset's sample carries the restore key Energon's blend gives it, ``("BlendDataset",
        leaf, ...)``, so its row segment names the same source as online (``row["segment_source"]``)."""
        number = int(np.searchsorted([leaf.offset for leaf in self._leaves], index, side="right")) - 1
        local = index - self._leaves[number].offset
        worker_config, dataset = self._open(number)
        worker_config.worker_activate(index)
        try:
            sample = dataset.restore_sample(("MapDataset", local, "Webdataset", local))
        finally:
            worker_config.worker_deactivate()
        if "blend" in self.plan.fingerprint["dataset"]:
            sample.__restore_key__ = ("BlendDataset", number, *sample.__restore_key__)
        return sample

    def _open(self, number: int) -> tuple[Any, Any]:
        if self._reader is None or self._reader[0] != os.getpid():
            from megatron.energon import WorkerConfig

            info = torch.utils.data.get_worker_info()
            worker_config = WorkerConfig(rank=0, world_size=1, num_workers=0 if info is None else info.num_workers)
            self._reader = (os.getpid(), worker_config, {})
        _, worker_config, datasets = self._reader
        if number not in datasets:
            leaf = self._leaves[number]
            with loader_sample_mapping(self.sample_mapping):
                datasets[number] = open_split(leaf.path, leaf.split, worker_config, subflavors=leaf.subflavors).build()
        return worker_config, datasets[number]

    def row(self, position: int) -> dict[str, Any]:
        """The THD row (or empty marker) at ``position``, tagged with ``__plan__`` and a restore key."""
        epoch, plan_row = self.plan_row(position)
        prepared = [self.encoder.preencode_sample(self.fetch(index)) for index in self.plan.global_indices(plan_row)]
        row = self.encoder.encode_row(prepared, planned_tokens=self.plan.row_tokens(plan_row))
        row["__plan__"] = {"position": position, "epoch": epoch, "row": plan_row}
        row["__restore_key__"] = ("PackPlan", position)
        return row


class _RankRows(torch.utils.data.IterableDataset):
    """The rows of one rank from ``cursor``; each DataLoader worker builds its round-robin share."""

    def __init__(self, source: PlanRowSource, *, cursor: int, base: int, end: int | None, rank: int, world_size: int) -> None:
        super().__init__()
        self.source = source
        self.positions = dict(cursor=cursor, base=base, end=end, rank=rank, world_size=world_size)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = torch.utils.data.get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        balance = self.source.balance
        if balance is None:
            positions = rank_positions(**self.positions, worker=worker, num_workers=workers)
        else:
            mine = balance.rank_positions(
                self.positions["cursor"], self.positions["end"], rank=self.positions["rank"],
                dp=self.positions["world_size"],
            )
            positions = itertools.islice(mine, worker, None, workers)
        for position in positions:
            yield self.source.row(position)


def _identity(row: Any) -> Any:
    return row


class PlanDataLoader:
    """Rows of a pack plan for one data-parallel rank, with an elastic global-cursor state."""

    def __init__(
        self,
        source: PlanRowSource,
        *,
        rank: int,
        world_size: int,
        num_workers: int,
        prefetch_factor: int,
        repeat: bool,
        fingerprint: dict[str, Any],
        allow_inexact_resume: bool,
        data_parallel_group: Any = None,
        stats_dir: tempfile.TemporaryDirectory | None = None,
    ) -> None:
        self.source = source
        #: Where workers record the sample they decode (``runtime.inflight``); removed with the loader.
        self._stats_dir = stats_dir
        self.rank = rank
        self.world_size = world_size
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.repeat = repeat
        self.fingerprint = fingerprint
        self.allow_inexact_resume = allow_inexact_resume
        self.data_parallel_group = data_parallel_group
        self._epoch = 0
        self._start = 0  # cursor when the current iteration started
        self._consumed = 0  # positions of this rank consumed since _start
        self._stats = PackingStats(worker_id=rank)
        self._iterating = False
        #: The torch DataLoader iterator of the iteration in progress (its workers), if any.
        self._rows: Any = None

    # ----------------------------------------------------------------------- stream

    @property
    def plan(self) -> PackPlan:
        return self.source.plan

    def _bounds(self) -> tuple[int, int | None]:
        """``(base, end)`` of the positions read now: one epoch, or the endless stream."""
        if self.repeat:
            return 0, None
        rows = self.plan.num_rows
        return self._epoch * rows, (self._epoch + 1) * rows

    @property
    def balance(self) -> BalancedStream | None:
        return self.source.balance

    def _rank_rows_left(self) -> int | None:
        base, end = self._bounds()
        if end is None:
            return None
        if self.balance is not None:  # whole steps of m rows, then this rank's share of the short last one
            g = self.balance.step_rows
            whole = max(0, end - self._start) // g
            last = self._start + whole * g
            costs = [self.balance.row_costs[self.balance.plan_row(p)] for p in range(last, end)]
            share = deal_step(costs, self.world_size, g // self.world_size).count(self.rank) if costs else 0
            return whole * (g // self.world_size) + share - self._consumed
        first = first_rank_position(self._start, base=base, rank=self.rank, world_size=self.world_size)
        return max(0, -(-(end - first) // self.world_size)) - self._consumed

    def cursor(self) -> int:
        """Every position below this one is consumed (assuming ranks in lock step); balanced: the
        last step boundary reached."""
        base, end = self._bounds()
        if end is not None and self._rank_rows_left() == 0:
            return max(self._start, end)
        if self.balance is not None:
            micro = self.balance.step_rows // self.world_size
            return self._start + self.balance.step_rows * (self._consumed // micro)
        return self._start + self.world_size * self._consumed

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self._iterating:
            raise RuntimeError("PlanDataLoader is already being iterated; finish or drop that iterator first")
        base, end = self._bounds()
        self._start, self._consumed = self.cursor(), 0
        dataset = _RankRows(
            self.source, cursor=self._start, base=base, end=end, rank=self.rank, world_size=self.world_size
        )
        loader = torch.utils.data.DataLoader(
            dataset,
            batch_size=None,
            num_workers=self.num_workers,
            collate_fn=_identity,
            prefetch_factor=self.prefetch_factor if self.num_workers else None,
        )
        from energon_pack.runtime.workers import frozen_gc

        with frozen_gc():  # workers fork here: keep the parent's objects' pages shared (see frozen_gc)
            self._rows = rows = iter(loader)
        self._iterating = True
        try:
            for row in self._named_deaths(rows):
                self._consumed += 1
                self._stats.add_row_counts(row["__stats__"])
                if row.get("__empty__"):
                    continue
                yield row
        finally:
            self._iterating = False
            self.close()
        if end is not None:  # a finished epoch: the next iteration reads the next one
            self._epoch += 1
            self._start, self._consumed = self._epoch * self.plan.num_rows, 0

    def _named_deaths(self, rows: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """``rows``, with torch's error about a dead worker replaced by a ``WorkerDiedError`` naming
        the sample it was decoding (``runtime.inflight``)."""
        from energon_pack.runtime.inflight import naming_dead_workers

        with naming_dead_workers(None if self._stats_dir is None else self._stats_dir.name):
            yield from rows

    def close(self) -> None:
        """Stop the workers of the iteration in progress (a failed or abandoned epoch does too);
        the rows consumed so far stay the state. ``with get_packing_loader(..., plan=...) as
        loader:`` closes at the end of the block."""
        rows, self._rows = self._rows, None
        if rows is not None and hasattr(rows, "_shutdown_workers"):
            rows._shutdown_workers()

    def __enter__(self) -> PlanDataLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __len__(self) -> int:
        left = self._rank_rows_left()
        if left is None:
            raise TypeError("a repeating plan loader (repeat=True) has no length")
        return left

    def restore_sample(self, restore_key: Sequence[Any]) -> dict[str, Any]:
        """Rebuild the row whose ``__restore_key__`` is ``("PackPlan", position)`` (in this process)."""
        name, position = restore_key
        if name != "PackPlan":
            raise ValueError(f"restore key {restore_key!r} is not from a plan loader; pass row['__restore_key__']")
        return self.source.row(position)

    def sources(self) -> list[SourceInfo]:
        """The sources ``row["segment_source"]`` indexes: the metadataset's leaves the plan was built
        over (one for a plain dataset), as ``PackingDataLoader.sources()`` gives them."""
        blend = self.plan.fingerprint["dataset"].get("blend")
        entries = [] if blend is None else [
            {"index": number, "path": str(leaf.path), "subflavors": leaf.subflavors, "weight": described["weight"]}
            for number, (leaf, described) in enumerate(zip(self.source._leaves, blend["leaves"]))
        ]
        return source_infos(entries, self.source.path)

    def family(self) -> str:
        """The model family the rows are encoded for (e.g. ``"qwen2.5-vl"``)."""
        return self.source.encoder.vision.family

    def stats(self) -> dict[str, Any]:
        """This rank's row statistics (decode-time skips by reason) plus the plan's own skips, and
        the model ``family`` the rows are encoded for (as the online loader reports it); for a
        metadataset's plan, ``plan_sources``: what the plan holds of each leaf (``plan.blend.planned_sources``)."""
        report = aggregate_stats([self._stats.snapshot()])
        report["plan_rows"] = self.plan.num_rows
        report["plan_skipped"] = dict(self.plan.skipped)
        report["family"] = self.family()
        if "blend" in self.plan.fingerprint["dataset"]:  # a metadataset's plan: what it holds of each leaf
            report["plan_sources"] = planned_sources(self.plan)
        if self.plan.row_flops is not None:
            flops = self.plan.row_flops.astype("float64")
            report["plan_row_flops"] = {
                "mean": float(flops.mean()),
                "cv": float(flops.std() / flops.mean()),
                "max_over_mean": float(flops.max() / flops.mean()),
            }
        return report

    # ----------------------------------------------------------------------- state

    def save_state_rank(self) -> PlanLoaderState:
        """This rank's state; equal on every rank in lock step (apart from rank and stats). A balanced
        loader saves only after whole steps (ValueError inside a step)."""
        if self.balance is not None and self._rank_rows_left() != 0:
            micro = self.balance.step_rows // self.world_size
            if self._consumed % micro:
                raise ValueError(
                    f"rank {self.rank} has read {self._consumed % micro} of the {micro} micro-batches of a balanced "
                    "step: a balanced plan state is saved after whole steps; fix: save at a step boundary "
                    "(after the optimizer step)"
                )
        return PlanLoaderState(
            fingerprint=dict(self.fingerprint),
            cursor=self.cursor(),
            epoch=self._epoch,
            stats=self._stats.snapshot(),
            rank=self.rank,
            world_size=self.world_size,
            step_rows=None if self.balance is None else self.balance.step_rows,
        )

    def restore_state_rank(self, state: PlanLoaderState | None) -> None:
        """Continue from ``state``'s cursor, whatever world size and worker count saved it."""
        if state is None:
            return
        if self._iterating:
            raise RuntimeError("cannot restore a plan loader while it is being iterated")
        check_restored_type(  # a fingerprint that is no mapping: plan_state_problems names it
            state, PlanLoaderState, loader_name="PlanDataLoader", current_fingerprint=self.fingerprint,
            allow_inexact=self.allow_inexact_resume, note=" (a state of the online loader cannot seed a plan loader)",
        )
        raise_if_state_problems(
            plan_state_problems(state, num_rows=self.plan.num_rows, repeat=self.repeat), saved_by="PlanDataLoader"
        )
        if self.balance is not None and not self.allow_inexact_resume:
            check_balanced_resume(
                cursor=state.cursor, base=self.balance.base(state.cursor),
                saved_step_rows=state.step_rows, step_rows=self.balance.step_rows,
            )
        self._epoch, self._start, self._consumed = state.epoch, state.cursor, 0
        self._stats.restore_state(state.stats if state.rank == self.rank else None)

    def save_state_global(self, global_dst_rank: int = 0) -> list[PlanLoaderState] | None:
        """Gather every rank's state on ``global_dst_rank`` (a list indexed by rank; None elsewhere)."""
        import torch.distributed as dist

        state = self.save_state_rank()
        if not (dist.is_available() and dist.is_initialized()) or self.world_size == 1:
            return [state]
        gathered: list[Any] | None = [None] * self.world_size if dist.get_rank() == global_dst_rank else None
        dist.gather_object(state, gathered, dst=global_dst_rank, group=self.data_parallel_group)
        return gathered

    def restore_state_global(self, states: Sequence[PlanLoaderState]) -> None:
        """Restore from the list saved by ``save_state_global`` at any world size.

        All saved cursors must agree (ranks in lock step); this rank's statistics continue from
        the saved rank of the same index when there is one.
        """
        cursors = {(s.epoch, s.cursor) for s in states}
        if len(cursors) != 1:
            raise ValueError(
                f"the saved ranks disagree on the (epoch, cursor) {sorted(cursors)}: they were not in lock "
                "step when saved; fix: save at a step boundary, or restore one rank's state with "
                "restore_state_rank to continue from its cursor"
            )
        mine = [s for s in states if s.rank == self.rank]
        self.restore_state_rank(mine[0] if mine else states[0])


def plan_data_loader(
    path: Any,
    plan: PackPlan | MappedPlan | str | os.PathLike[str],
    config: PackingConfig,
    encoder: Any,
    *,
    split: str,
    rank: int,
    world_size: int,
    data_parallel_group: Any = None,
    stats_dir: tempfile.TemporaryDirectory | None = None,
    **loader_kwargs: Any,
) -> PlanDataLoader:
    """The plan loader of one rank (``get_packing_loader(..., plan=...)`` calls this).

    The plan must have been built for this dataset split, processor and packing budgets
    (``ResumeMismatchError`` otherwise). ``repeat`` follows ``config.repeat`` on the train split;
    other splits are read once. A balanced plan (built with ``balance_steps``) with
    ``config.trainer.micro_batches_per_step`` set deals balanced steps (see the module docstring).
    """
    if loader_kwargs:
        raise ValueError(
            f"{', '.join(sorted(loader_kwargs))}: options of Energon's SavableDataLoader do not apply to a "
            "plan loader (its state is one cursor, exact after every row); fix: drop them when passing plan="
        )
    if config.mode != "online":
        raise ValueError(
            f"mode={config.mode!r}: a pack plan fixes each row's samples in advance, so it cannot be combined "
            "with in-batch rows; fix: set mode: online (the plan replaces online selection) or drop plan="
        )
    plan = plan if isinstance(plan, (PackPlan, MappedPlan)) else open_plan(plan)
    check_plan_matches(plan, path, split, encoder, config)
    if plan.num_rows == 0:
        raise ValueError(
            f"the pack plan has no rows: all {plan.samples_in} samples were skipped ({plan.skipped}); "
            "fix: see docs/bad_input_policy.md for each reason, then rebuild the plan"
        )
    repeat = config.repeat if split == "train" else False
    balance = balanced_stream(plan, config, world_size=world_size, repeat=repeat)
    fingerprint = plan_loader_fingerprint(plan.digest, config, repeat=repeat, balanced=balance is not None)
    return PlanDataLoader(
        PlanRowSource(plan, path, split, encoder, seed=config.seed, balance=balance),
        rank=rank,
        world_size=world_size,
        num_workers=config.num_workers,
        prefetch_factor=config.loader.prefetch_factor,
        repeat=repeat,
        fingerprint=fingerprint,
        allow_inexact_resume=config.allow_inexact_resume,
        data_parallel_group=data_parallel_group,
        stats_dir=stats_dir,
    )


def balanced_stream(plan: PackPlan | MappedPlan, config: PackingConfig, *, world_size: int, repeat: bool) -> BalancedStream | None:
    """The balanced stream of a plan with ``row_flops`` read with ``micro_batches_per_step``, else None."""
    micro = config.trainer.micro_batches_per_step
    if plan.row_flops is None or micro is None:
        return None
    return BalancedStream(
        plan.row_flops, seed=config.seed, step_rows=world_size * micro,
        window_steps=config.policy.balance_window_steps, repeat=repeat,
    )
