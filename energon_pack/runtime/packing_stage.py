"""The savable Energon packing stage: one buffer of samples, the round planner, exact resume.

Energon's own ``PackingDataset`` drops every sample its selector does not return and cannot
carry under-filled bins across rounds, so this stage replaces it. Per worker it

1. admits prepared samples (bad-sample markers and samples that fit no row, being overlong or
   over a per-row vision or audio budget on their own, are counted and dropped, never buffered): each
   gets an arrival index from the round planner and waits in one buffer of samples by arrival
   index;
2. when ``buffer_size`` new samples (or new samples holding ``buffer_tokens`` aligned tokens; by
   default 2 * seq_length tokens)
   have arrived, or the stream ended, lets the planner
   (``packing/planner.py``) run one selection round over new + pending samples, within the
   row's width and vision budgets: full bins and bins holding a sample that waited
   ``max_wait_rounds`` rounds become ready, the rest stays pending;
3. takes one ready bin at a time, postencodes only its samples (pixels), packs them and yields
   the row. A bin that loses a sample at decode time goes back to pending while it may wait.
   At the end of a finite stream everything is flushed.

All state lives in ``_savable_fields``: the sample buffer as restore keys, the planner's plain
state, the statistics and ``SampleIndex`` counters; state is mutated only between yields, and a
bin is taken from the planner before its row is yielded.
"""

from __future__ import annotations

import copy
import logging
import math
import sys
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from megatron.energon.flavors.base_dataset import (
    FlexState,
    Savable,
    SavableDataset,
    add_sample_restore_key,
    set_sample_restore_key,
)
from megatron.energon.worker import WorkerConfig
from megatron.energon.wrappers.base import (
    BaseWrapperDataset,
    SampleIndex,
    get_sample_restore_key,
)

from energon_pack.core.alignment import aligned_length
from energon_pack.config import PackingPolicy, RowLayout
from energon_pack.rows.encoded import EncodedSample, PackedRow, PreparedSample
from energon_pack.errors import BadSampleError, TooManyBadSamplesError
from energon_pack.packing.algorithms import PackItem
from energon_pack.packing.budget import round_size, row_budget, sample_misfit
from energon_pack.packing.planner import RoundPlanner, is_count, plan_state_problems, planned_indices
from energon_pack.runtime.blend_stage import ShareBlendDataset, blend_source
from energon_pack.runtime.skip_log import warn_skip
from energon_pack.core import stage_times
from energon_pack.core.storage_retries import take_storage_retries
from energon_pack.core.stage_times import timed
from energon_pack.runtime.stats import STATS_PUBLISH_INTERVAL_S, PackingStats, publish_snapshot, worker_telemetry
from energon_pack.rows.thd import row_width

logger = logging.getLogger(__name__)


def packing_state_problems(state: Any) -> list[str]:
    """What is wrong with a saved packing-stage state (its ``FlexState`` mapping); [] when consistent.

    Checks that every savable field is present, the planner state is sound, the sample buffer
    holds exactly the planned items, and the counters are non-negative integers.
    Example: a state whose plan holds item 5 while the buffer has no sample 5 ->
    ``["planned items [5] have no buffered sample"]``.
    """
    if not isinstance(state, Mapping):
        return [f"the packing stage state is a {type(state).__name__}, not a mapping"]
    missing = [name for name in PendingGroupPackingDataset._savable_fields if name not in state]
    if missing:
        return [f"fields {missing} are missing"]
    problems = [f"_plan: {problem}" for problem in plan_state_problems(state["_plan"])]
    problems += [f"{name}={state[name]!r} is not a non-negative integer"
                 for name in ("_encode_index", "_pack_index", "_consecutive_skips") if not is_count(state[name])]
    if not isinstance(state["_stats"], Mapping) or not isinstance(state["_stats"].get("skipped"), Mapping):
        problems.append("_stats is not a saved statistics mapping")
    buffered = state["_samples"].get("_restore_keys") if isinstance(state["_samples"], Mapping) else None
    if not isinstance(buffered, Mapping):
        return problems + ["_samples is not a saved sample buffer (restore keys by arrival index)"]
    if not problems:
        planned = set(planned_indices(state["_plan"]))
        if planned - set(buffered):
            problems.append(f"planned items {sorted(planned - set(buffered))} have no buffered sample")
        if set(buffered) - planned:
            problems.append(f"buffered samples {sorted(set(buffered) - planned)} are in no planned bin")
    return problems


@dataclass(frozen=True, kw_only=True)
class ParkedSample:
    """What the buffer keeps of a parked sample (its data dropped until its row is next): the
    tokens it fills (after a restore, its aligned slots: the same row position)."""

    num_tokens: int

    def nbytes(self) -> int:
        """Bytes of its data held: none."""
        return 0


def own_state(dataset: SavableDataset, *, shallow: Collection[str]) -> FlexState:
    """``SavableDataset.save_state`` of ``dataset`` (each of its ``_savable_fields``: a Savable's
    own state, else a deep copy), the fields in ``shallow`` copied one level only: containers of
    immutable values (restore keys, item tuples), built anew or copied here. A worker checkpoints
    every row (``loader.ROW_CHECKPOINTS``), and deep copies of a balanced worker's 1024-row pool
    took most of its time.

    Example: a stage whose ``_plan`` is ``{"ready": [[(0, 9, 0, 0, 0)]], ...}`` -> the same dict
    (a new one), its item tuples shared.
    """
    state = FlexState()
    state["__class__"] = type(dataset).__name__
    for key in dataset._savable_fields:
        value = getattr(dataset, key)
        if isinstance(value, Savable):
            state[key] = value.save_state()
        else:
            state[key] = copy.copy(value) if key in shallow else copy.deepcopy(value)
    return state


class ArrivalBuffer(BaseWrapperDataset[PreparedSample, PreparedSample]):
    """The stage's buffered samples by arrival index; saved as Energon restore keys and re-read
    from the source when a restored worker starts (``worker_start``).

    A sample may be *parked*: only its restore key (and token count) is held, and it is read
    again by key (Energon's random access, deterministic) when it is taken. ``reads`` counts, in
    this process, samples read again by key: ``"restore"`` when a restored worker starts,
    ``"parked"`` when a parked sample is taken (not saved: telemetry).

    ``slots(sample)``: the row slots a sample (or a parked one) takes; :attr:`slots_total`, their
    sum over the buffered samples, is kept as samples come and go (O(1) each) and recomputed on
    restore (derived, never saved).
    """

    _savable_fields = ("_restore_keys",)

    def __init__(
        self, dataset: SavableDataset[PreparedSample], *, slots: Callable[[PreparedSample | ParkedSample], int],
        worker_config: WorkerConfig,
    ) -> None:
        super().__init__(dataset, worker_config=worker_config)
        self._slots = slots
        self._restore_pending = False
        self.reads = {"restore": 0, "parked": 0}
        self.reset_state_own()

    def reset_state_own(self) -> None:
        self._samples: dict[int, PreparedSample | ParkedSample] = {}
        self._restore_keys: dict[int, tuple[Any, ...]] = {}
        #: Row slots of the buffered samples, summed.
        self.slots_total = 0

    def worker_start(self, parked: Mapping[int, int] | None = None) -> None:
        """Re-read the samples of a restored state (once), but for ``parked`` ones (arrival index ->
        aligned slots), which stay parked until taken."""
        if self._restore_pending:
            self._restore_pending = False
            parked = parked or {}
            self._samples = {index: ParkedSample(num_tokens=parked[index]) if index in parked
                             else self.restore_sample(key) for index, key in self._restore_keys.items()}
            self.reads["restore"] += sum(index not in parked for index in self._restore_keys)
            self.slots_total = sum(self._slots(sample) for sample in self._samples.values())

    def put(self, index: int, sample: PreparedSample) -> None:
        """Hold ``sample`` under arrival index ``index``."""
        self._samples[index] = sample
        self._restore_keys[index] = get_sample_restore_key(sample)
        self.slots_total += self._slots(sample)

    def park(self, index: int) -> None:
        """Drop the data of the sample of arrival index ``index``, keeping its restore key."""
        self._samples[index] = ParkedSample(num_tokens=self._samples[index].num_tokens)

    def peek(self, index: int) -> PreparedSample:
        """The sample of arrival index ``index`` (kept; a parked one is read again and stays parked)."""
        sample = self._samples[index]
        if isinstance(sample, ParkedSample):
            self.reads["parked"] += 1
            return self.restore_sample(self._restore_keys[index])
        return sample

    def pop(self, index: int) -> PreparedSample:
        """Remove and return the sample of arrival index ``index`` (a parked one read again)."""
        self.slots_total -= self._slots(self._samples[index])
        sample = self.peek(index)
        del self._restore_keys[index], self._samples[index]
        return sample

    def __iter__(self) -> Iterator[PreparedSample | ParkedSample]:
        """The buffered samples in arrival order (parked ones as :class:`ParkedSample`)."""
        return iter([self._samples[index] for index in sorted(self._samples)])

    def nbytes(self) -> Iterator[int]:
        """Bytes held by each buffered sample (0 for a parked one)."""
        return (sample.nbytes() for sample in self._samples.values())

    def len_worker(self, worker_idx: int | None = None) -> int:
        return len(self._restore_keys)

    def save_state(self) -> FlexState:
        # Own state only: the wrapped dataset is saved by the stage's other fields. Restore keys
        # are tuples: a copy of the mapping is a copy of the state.
        return own_state(self, shallow=self._savable_fields)

    def restore_state(self, state: FlexState) -> None:
        SavableDataset.restore_state(self, state)
        self._restore_pending = True

    def config(self) -> dict[str, Any]:
        return {"type": type(self).__qualname__, "dataset": self.dataset.config()}


@dataclass(frozen=True, kw_only=True)
class RowSteps:
    """How the stage turns a selected bin into a row (the task encoder's methods): ``postencode(sample)``
    each sample, or ``postencode(sample, slot)`` with ``allocate_pixels`` (one pixel slot per sample
    of a bin, carved from one payload for the whole row); ``pack`` the encoded samples into a
    ``PackedRow``; ``row_cost(row, width=W)``, the row's cost for the statistics (None: ``row.row_cost``)."""

    postencode: Callable[..., EncodedSample]
    pack: Callable[[list[EncodedSample]], PackedRow]
    allocate_pixels: Callable[[list[PreparedSample]], list[Any]] | None = None
    row_cost: Callable[..., dict[str, int]] | None = None


class PendingGroupPackingDataset(BaseWrapperDataset[PreparedSample, PackedRow]):
    """Packs prepared samples into fixed-width rows, carrying under-filled bins across rounds."""

    _samples: ArrivalBuffer

    _savable_fields = (
        "_samples",
        "_plan",
        "_stats",
        "_encode_index",
        "_pack_index",
        "_consecutive_skips",
    )

    def __init__(
        self,
        dataset: SavableDataset[PreparedSample],
        *,
        row: RowLayout,
        policy: PackingPolicy,
        steps: RowSteps,
        worker_config: WorkerConfig,
        stats_dir: str | None = None,
        blend: ShareBlendDataset | None = None,
    ) -> None:
        super().__init__(dataset, worker_config=worker_config)
        #: Row width, alignment multiple and segment limit of the rows this stage fills.
        self.row = row
        #: Buffer size, wait bound, min fill, vision budgets and overlong policy of the bin selection.
        self.policy = policy
        #: What one row may hold: width, segments, vision patches, media.
        self.budget = row_budget(row, policy)
        #: Postencode, pixel slots, pack and row cost of a selected bin.
        self.steps = steps
        #: Folder where each worker publishes its statistics for ``PackingDataLoader.stats()``.
        self.stats_dir = stats_dir
        #: The share blend upstream (``blend_unit`` tokens, a schedule), told where this worker's
        #: next row is and which samples failed to decode; None without one.
        self.blend = blend
        #: Rounds of the default size are one row under a share blend of tokens (``TOKEN_BLEND_ROUND_ROWS``).
        self._round = round_size(row, policy, token_blend=blend is not None and blend.unit != "samples")
        if blend is not None:
            blend.row_position = self._upcoming_row
        self._published_at = -math.inf
        self._restored = False
        self.reset_state_own()

    def reset_state_own(self) -> None:
        self._samples = ArrivalBuffer(self.dataset, slots=self._slots, worker_config=self.worker_config)
        self._planner = RoundPlanner(
            budget=self.budget,
            round_size=self._round,
            min_fill=self.policy.min_fill,
            max_wait_rounds=self.policy.max_wait_rounds,
        )
        self._stats = PackingStats()
        self._encode_index = SampleIndex(self.worker_config, src=self)
        self._pack_index = SampleIndex(self.worker_config, src=self)
        #: Bad samples since the last good one (buffered or decoded), for ``max_consecutive_skips``.
        self._consecutive_skips = 0

    @property
    def _plan(self) -> dict[str, Any]:
        """The planner's state as plain data (a savable field)."""
        return self._planner.state()

    @_plan.setter
    def _plan(self, state: dict[str, Any]) -> None:
        self._planner.restore(state)

    #: Savable fields whose getters build plain data anew on every save (copied one level only).
    _shallow_fields: tuple[str, ...] = ("_plan",)

    def save_state(self) -> FlexState:
        # BaseWrapperDataset.save_state (the inner datasets' states and this stage's own fields),
        # without deep copies of the fields built anew for the save (see own_state).
        return FlexState(datasets=[dataset.save_state() for dataset in self.datasets],
                         **own_state(self, shallow=self._shallow_fields))

    def restore_state(self, state: FlexState) -> None:
        super().restore_state(state)
        self._restored = True

    def len_worker(self, worker_idx: int | None = None) -> int:
        # Rows per worker are unknown before packing; the source length bounds them.
        return self.dataset.len_worker(worker_idx)

    # --- stream -------------------------------------------------------------------------

    def __iter__(self) -> Iterator[PackedRow]:
        self._samples.worker_start(self._parked_at_restore())
        stage_times.start_epoch()
        restored, self._restored = self._restored, False
        self._stats.worker_id = self.worker_config.rank_worker_id()
        self._publish_stats(force=True)
        try:
            for row in self._stream(restored):
                with stage_times.suspended():  # the consumer's time (in-process: the trainer's step)
                    yield row
        finally:
            # A generator left open (an in-process loader never closed) is finalized at interpreter
            # exit, when the modules a publish needs may be gone: nothing is left to read it then.
            if not sys.is_finalizing():
                self._publish_stats(force=True)

    def _parked_at_restore(self) -> dict[int, int]:
        """Buffered samples a restored worker leaves parked (arrival index -> aligned slots): none;
        the balanced stage parks its window's."""
        return {}

    def _stream(self, restored: bool) -> Iterator[PackedRow]:
        planner = self._planner
        if planner.exhausted and planner.is_empty():
            # A finished epoch. Restored from such a state, the worker is done (this also stops
            # Energon 7.4.1 from replaying a finished worker's share); otherwise start anew.
            planner.exhausted = False
            if restored:
                return
        source = None if planner.exhausted else iter(self.dataset)
        while True:
            yield from self._emit_ready()
            if not planner.exhausted:
                assert source is not None
                self._read(source)
            elif planner.is_empty():
                return
            self._run_round()

    def _read(self, source: Iterator[PreparedSample]) -> None:
        """Admit samples until the new ones fill a round (``buffer_size`` samples or
        ``buffer_tokens`` aligned tokens) or the source ends."""
        while self._planner.wants_samples():
            try:
                sample = next(source)
            except StopIteration:
                self._planner.end_of_source()
                return
            self._admit(sample)

    def _admit(self, sample: PreparedSample) -> None:
        """Count ``sample`` (and the storage retries its read took); buffer it unless it is a
        bad-sample marker or fits no row."""
        self._stats.samples_in += 1
        self._stats.storage_retries += take_storage_retries()
        if sample.skip_reason is not None:
            self._skip(sample, sample.skip_reason, sample.skip_detail)
            return
        misfit = sample_misfit(sample, self.budget, self.row, self.policy)
        if misfit is not None:
            self._skip(sample, misfit.reason, misfit.detail)
            return
        if sample.tokens_before_shrink is not None:
            self._stats.count_shrunk(sample.tokens_before_shrink, sample.num_tokens)
            logger.info(
                "energon_pack: sample %r shrunk from %d to %d tokens (image max_pixels %s, max_frames %s)",
                sample.__key__, sample.tokens_before_shrink, sample.num_tokens, sample.image_max_pixels,
                sample.video_max_frames,
            )
        item = self._planner.admit(
            self._slots(sample), vision=sample.vision_patches, media=sample.num_media, audio=sample.audio_frames
        )
        self._samples.put(item.index, sample)
        self._consecutive_skips = 0

    def _slots(self, sample: PreparedSample) -> int:
        return aligned_length(sample.num_tokens, self.row.pad_multiple)

    def _upcoming_row(self) -> int:
        """The index of the row (of this worker) that a sample read now is expected to land in:
        rows emitted plus the rows the buffered samples fill (their slots, kept summed by the buffer)."""
        return self._stats.rows + self._samples.slots_total // self.row.seq_length

    def _skip(self, sample: Any, reason: str, detail: str | None) -> None:
        self._stats.count_skip(reason, source=blend_source(getattr(sample, "__restore_key__", None) or ()))
        self._consecutive_skips += 1
        key = getattr(sample, "__key__", None)
        warn_skip(key, f"{reason}: {detail}")
        self._publish_stats()
        limit = self.policy.max_consecutive_skips
        if limit is not None and self._consecutive_skips > limit:
            raise TooManyBadSamplesError(
                f"worker {self._stats.worker_id}: {self._consecutive_skips} bad samples in a row (the last, {key!r}: "
                f"{reason}: {detail}; skipped so far by reason: {self._stats.skipped}); rule: "
                f"max_consecutive_skips={limit}; fix: repair the data (the skip warnings name each sample), or "
                "raise max_consecutive_skips, or set it to null to skip bad samples without limit"
            )

    def _telemetry_snapshot(self) -> dict[str, Any]:
        with timed("statistics"):
            return self._measure_telemetry()

    def _measure_telemetry(self) -> dict[str, Any]:
        return {
            **self._stats.snapshot(),
            **worker_telemetry(self._samples.nbytes(), pending_samples=len(self._planner.pending),
                               reads=self._samples.reads),
        }

    def _publish_stats(self, snapshot: dict[str, Any] | None = None, *, force: bool = False) -> None:
        """Write this worker's statistics file when ``force``d (its iteration starts or ends, so
        skips after its last row still reach ``loader.stats()``) or ``STATS_PUBLISH_INTERVAL_S``
        after the last write."""
        if self.stats_dir is None:
            return
        now = time.monotonic()
        if force or now - self._published_at >= STATS_PUBLISH_INTERVAL_S:
            snapshot = snapshot or self._telemetry_snapshot()
            with timed("statistics"):
                publish_snapshot(self.stats_dir, snapshot)
            self._published_at = now

    def _run_round(self) -> None:
        """One selection round; counts it and the longest wait among the bins it made ready."""
        planned = self._planner.run_round()
        for group in planned.result.emitted:
            waited = max(planned.index - item.arrival_round for item in group)
            self._stats.max_wait_rounds_seen = max(self._stats.max_wait_rounds_seen, waited)
        self._stats.rounds += 1

    def _next_bin(self) -> list[PackItem] | None:
        """The next ready bin to emit (the balanced stage, ``runtime/balanced_stage.py``, reorders them)."""
        return self._planner.take_bin()

    def _emit_ready(self) -> Iterator[PackedRow]:
        while (group := self._next_bin()) is not None:
            members = [(item, self._samples.pop(item.index)) for item in group]
            encoded, kept = [], []
            slots = self._pixel_slots([sample for _, sample in members])
            for (item, sample), slot in zip(members, slots):
                result = self._postencode_or_skip(sample, slot)
                if result is not None:
                    encoded.append(result)
                    kept.append((item, sample))
            if not encoded:
                continue
            if len(kept) < len(members) and self._planner.repend([item for item, _ in kept]):
                # A sample failed to decode: rather than emit a row with a hole, its bin mates
                # go back to pending and are packed again next round.
                for item, sample in kept:
                    self._samples.put(item.index, sample)
                continue
            member_keys = tuple(get_sample_restore_key(sample) for _, sample in kept)
            for key, (_, sample) in zip(member_keys, kept):
                self._stats.count_source_sample(
                    blend_source(key), real_tokens=sample.num_tokens, supervised_tokens=sample.supervised_tokens
                )
            with self._pack_index.ctx() as pack_index:
                row = self.steps.pack(encoded)
            width = row_width([e.segment.length for e in encoded], self.row)
            cost = row.row_cost if self.steps.row_cost is None else self.steps.row_cost(row, width=width)
            self._stats.count_row(cost["real_tokens"], width, len(encoded), flush=self._planner.exhausted, cost=cost)
            row.stats = self._telemetry_snapshot()
            self._publish_stats(row.stats)
            yield set_sample_restore_key(row, pack_index, *member_keys, src=self)

    def _pixel_slots(self, group: list[PreparedSample]) -> list[Any]:
        """Each sample's slot in its row's pixel payload (None each without ``allocate_pixels``)."""
        return [None] * len(group) if self.steps.allocate_pixels is None else self.steps.allocate_pixels(group)

    def _postencode(self, sample: PreparedSample, slot: Any) -> EncodedSample:
        return self.steps.postencode(sample) if slot is None else self.steps.postencode(sample, slot)

    def _postencode_or_skip(self, sample: PreparedSample, slot: Any = None) -> EncodedSample | None:
        if sample.skip_reason is not None:
            # A buffered sample restored from a state as a skip marker (newly excluded).
            self._skip(sample, sample.skip_reason, sample.skip_detail)
            return None
        try:
            with self._encode_index.ctx() as encode_index:
                encoded = self._postencode(sample, slot)
        except BadSampleError as err:
            self._skip(sample, err.reason, err.detail)
            if self.blend is not None:
                self.blend.take_back(sample)
            return None
        self._consecutive_skips = 0
        return add_sample_restore_key(encoded, encode_index, src=self)

    # --- restore by key (Energon's sample restore) -----------------------------------------

    def restore_sample(self, restore_key: tuple[Any, ...]) -> PackedRow:
        """Rebuild the row whose restore key is ``(name, pack_index, *member restore keys)``.

        Members are the samples that decoded when the row was first built, so postencode is
        deterministic here; nothing is counted and no stage state changes.
        """
        name, pack_index, *member_keys = restore_key
        assert name == type(self).__name__, f"restore key {restore_key!r} is not from {type(self).__name__}"
        members = [self.dataset.restore_sample(member_key) for member_key in member_keys]
        encoded = [self._postencode(sample, slot) for sample, slot in zip(members, self._pixel_slots(members))]
        with self._pack_index.ctx(pack_index):
            row = self.steps.pack(encoded)
        row.stats = {}
        return set_sample_restore_key(row, pack_index, *member_keys, src=self)

    def config(self) -> dict[str, Any]:
        return {
            "type": type(self).__qualname__,
            "row": self.row.fingerprint(),
            "policy": self.policy.fingerprint(),
            "dataset": self.dataset.config(),
        }

    def __str__(self) -> str:
        return (
            f"PendingGroupPackingDataset(seq_length={self.row.seq_length}, {self._round}, "
            f"dataset={self.dataset})"
        )
