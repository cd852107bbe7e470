"""The savable Energon packing stage: reading buffer, pending groups, ready bins, exact resume.

Energon's own ``PackingDataset`` drops every sample its selector does not return and cannot
carry under-filled bins across rounds, so this stage replaces it. Per worker it

1. admits prepared samples into the reading buffer (bad-sample markers and samples that fit
   no row, being overlong or over a per-row vision budget on their own, are counted and
   dropped, never buffered);
2. when ``buffer_size`` new samples (or new samples holding ``buffer_tokens`` aligned tokens)
   have arrived, or the stream ended, runs one selection
   round over new + pending samples (``select_bins``, within the row's width and vision
   budgets): full bins and bins holding a sample that waited ``max_wait_rounds`` rounds
   become ready, the rest stays pending;
3. pops one ready bin at a time, postencodes only its samples (pixels), packs them and yields
   the row. At the end of a finite stream everything pending is flushed.

All state lives in ``_savable_fields``: buffers as restore keys, plain lists/ints and
``SampleIndex`` counters; state is mutated only between yields, and a bin is popped before
its row is yielded.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from megatron.energon.flavors.base_dataset import (
    FlexState,
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
from megatron.energon.wrappers.buffer import SavableSampleBuffer

from energon_pack.config import PackingPolicy, RowLayout
from energon_pack.encoded import EncodedSample, PackedRow, PreparedSample
from energon_pack.alignment import aligned_length
from energon_pack.errors import BadSampleError, row_budget, sample_misfit
from energon_pack.packing.algorithms import PackItem, RoundSize, select_bins
from energon_pack.stats import STATS_PUBLISH_INTERVAL_S, PackingStats, publish_snapshot, worker_telemetry
from energon_pack.thd import row_width

logger = logging.getLogger(__name__)


class PendingGroupPackingDataset(BaseWrapperDataset[PreparedSample, PackedRow]):
    """Packs prepared samples into fixed-width rows, carrying under-filled bins across rounds."""

    _reading_buffer: SavableSampleBuffer
    _pending_buffer: SavableSampleBuffer
    _ready_buffer: SavableSampleBuffer

    _savable_fields = (
        "_reading_buffer",
        "_pending_buffer",
        "_pending_items",
        "_ready_buffer",
        "_ready_items",
        "_ready_sizes",
        "_next_index",
        "_round_index",
        "_source_exhausted",
        "_stats",
        "_encode_index",
        "_pack_index",
    )

    def __init__(
        self,
        dataset: SavableDataset[PreparedSample],
        *,
        row: RowLayout,
        policy: PackingPolicy,
        postencode: Callable[..., EncodedSample],
        pack: Callable[[list[EncodedSample]], PackedRow],
        allocate_pixels: Callable[[list[PreparedSample]], list[Any]] | None = None,
        worker_config: WorkerConfig,
        stats_dir: str | None = None,
    ) -> None:
        super().__init__(dataset, worker_config=worker_config)
        #: Row width, alignment multiple and segment limit of the rows this stage fills.
        self.row = row
        #: Buffer size, wait bound, min fill, vision budgets and overlong policy of the bin selection.
        self.policy = policy
        #: What one row may hold: width, segments, vision patches, media.
        self.budget = row_budget(row, policy)
        #: When a round runs: after buffer_size new samples or buffer_tokens new aligned tokens.
        self._round_size = RoundSize(samples=policy.buffer_size, tokens=policy.buffer_tokens)
        #: ``postencode(sample)``, or ``postencode(sample, slot)`` with ``allocate_pixels``.
        self.postencode = postencode
        self.pack = pack
        #: One pixel slot per sample of a bin, carved from one payload for the whole row.
        self.allocate_pixels = allocate_pixels
        #: Folder where each worker publishes its statistics for ``PackingDataLoader.stats()``.
        self.stats_dir = stats_dir
        self._published_at = -math.inf
        self._restored = False
        self.reset_state_own()

    def reset_state_own(self) -> None:
        self._reading_buffer = SavableSampleBuffer(self.dataset, worker_config=self.worker_config)
        self._pending_buffer = SavableSampleBuffer(self.dataset, worker_config=self.worker_config)
        #: (arrival index, arrival round) of each pending sample, parallel to _pending_buffer.
        self._pending_items: list[tuple[int, int]] = []
        self._ready_buffer = SavableSampleBuffer(self.dataset, worker_config=self.worker_config)
        #: (arrival index, arrival round) of each ready sample, parallel to _ready_buffer.
        self._ready_items: list[tuple[int, int]] = []
        #: Sizes of the ready bins stored back to back in _ready_buffer.
        self._ready_sizes: list[int] = []
        self._next_index = 0
        self._round_index = 0
        #: The source ended (finite stream): only flush what is buffered, never read it again.
        self._source_exhausted = False
        self._stats = PackingStats()
        self._encode_index = SampleIndex(self.worker_config, src=self)
        self._pack_index = SampleIndex(self.worker_config, src=self)

    def restore_state(self, state: FlexState) -> None:
        super().restore_state(state)
        self._restored = True

    def len_worker(self, worker_idx: int | None = None) -> int:
        # Rows per worker are unknown before packing; the source length bounds them.
        return self.dataset.len_worker(worker_idx)

    # --- stream -------------------------------------------------------------------------

    def __iter__(self) -> Iterator[PackedRow]:
        for buffer in (self._reading_buffer, self._pending_buffer, self._ready_buffer):
            buffer.worker_start()
        restored, self._restored = self._restored, False
        self._stats.worker_id = self.worker_config.rank_worker_id()
        self._publish_stats(force=True)
        try:
            yield from self._stream(restored)
        finally:
            self._publish_stats(force=True)

    def _stream(self, restored: bool) -> Iterator[PackedRow]:
        if self._source_exhausted and not self._has_buffered():
            # A finished epoch. Restored from such a state, the worker is done (this also stops
            # Energon 7.4.1 from replaying a finished worker's share); otherwise start anew.
            self._source_exhausted = False
            if restored:
                return
        source = None if self._source_exhausted else iter(self.dataset)
        while True:
            yield from self._emit_ready()
            if not self._source_exhausted:
                assert source is not None
                self._fill_reading_buffer(source)
            elif not self._has_buffered():
                return
            self._run_round(flush=self._source_exhausted)

    def _has_buffered(self) -> bool:
        return bool(self._reading_buffer.buffer or self._pending_items or self._ready_sizes)

    def _fill_reading_buffer(self, source: Iterator[PreparedSample]) -> None:
        """Admit samples until the new ones fill a round (``buffer_size`` samples or
        ``buffer_tokens`` aligned tokens) or the source ends."""
        reading = self._reading_buffer.buffer
        tokens = sum(self._slots(sample) for sample in reading)
        while not self._round_size.is_full(len(reading), tokens):
            try:
                sample = next(source)
            except StopIteration:
                self._source_exhausted = True
                return
            buffered = len(reading)
            self._admit(sample)
            if len(reading) > buffered:
                tokens += self._slots(sample)

    def _admit(self, sample: PreparedSample) -> None:
        """Count ``sample``; buffer it unless it is a bad-sample marker or fits no row."""
        self._stats.samples_in += 1
        if sample.skip_reason is not None:
            self._skip(sample, sample.skip_reason)
            return
        misfit = sample_misfit(sample, self.budget, self.row, self.policy)
        if misfit is not None:
            self._skip(sample, str(misfit))
            return
        if sample.tokens_before_shrink is not None:
            self._stats.count_shrunk(sample.tokens_before_shrink, sample.num_tokens)
            logger.info(
                "energon_pack: sample %r shrunk from %d to %d tokens (image max_pixels %s, max_frames %s)",
                sample.__key__, sample.tokens_before_shrink, sample.num_tokens, sample.image_max_pixels,
                sample.video_max_frames,
            )
        self._reading_buffer.append(sample)

    def _skip(self, sample: Any, reason: str) -> None:
        self._stats.count_skip(reason.split(":", 1)[0])
        logger.warning("energon_pack: skipping sample %r: %s", getattr(sample, "__key__", None), reason)
        self._publish_stats()

    def _telemetry_snapshot(self) -> dict[str, Any]:
        return {
            **self._stats.snapshot(),
            **worker_telemetry(self._buffered_nbytes(), pending_samples=len(self._pending_items)),
        }

    def _publish_stats(self, snapshot: dict[str, Any] | None = None, *, force: bool = False) -> None:
        """Write the statistics file when ``force``d or ``STATS_PUBLISH_INTERVAL_S`` after the last write."""
        if self.stats_dir is None:
            return
        now = time.monotonic()
        if force or now - self._published_at >= STATS_PUBLISH_INTERVAL_S:
            publish_snapshot(self.stats_dir, snapshot or self._telemetry_snapshot())
            self._published_at = now

    def _run_round(self, *, flush: bool) -> None:
        """Select bins over pending + new samples; ready bins move to the ready buffer."""
        samples: dict[int, PreparedSample] = {}
        candidates: list[PackItem] = []
        for sample, (index, arrival) in zip(self._pending_buffer.buffer, self._pending_items):
            samples[index] = sample
            candidates.append(self._item(sample, index, arrival))
        for sample in self._reading_buffer.buffer:
            index = self._next_index
            self._next_index += 1
            samples[index] = sample
            candidates.append(self._item(sample, index, self._round_index))
        result = select_bins(
            candidates,
            capacity=self.budget.tokens,
            round_index=self._round_index,
            min_fill=self.policy.min_fill,
            max_wait_rounds=self.policy.max_wait_rounds,
            max_segments=self.budget.segments,
            max_vision_patches=self.budget.vision_patches,
            max_media=self.budget.media,
            flush=flush,
        )
        self._reading_buffer.clear()
        self._pending_buffer.clear()
        self._pending_items = []
        for group in result.pending:
            for item in group:
                self._pending_buffer.append(samples[item.index])
                self._pending_items.append((item.index, item.arrival_round))
        for group in result.emitted:
            self._ready_buffer.extend([samples[item.index] for item in group])
            self._ready_items.extend((item.index, item.arrival_round) for item in group)
            self._ready_sizes.append(len(group))
            waited = max(self._round_index - item.arrival_round for item in group)
            self._stats.max_wait_rounds_seen = max(self._stats.max_wait_rounds_seen, waited)
        self._round_index += 1
        self._stats.rounds += 1

    def _slots(self, sample: PreparedSample) -> int:
        return aligned_length(sample.num_tokens, self.row.pad_multiple)

    def _item(self, sample: PreparedSample, index: int, arrival_round: int) -> PackItem:
        return PackItem(
            index=index,
            length=self._slots(sample),
            arrival_round=arrival_round,
            vision=sample.vision_patches,
            media=sample.num_media,
        )

    def _emit_ready(self) -> Iterator[PackedRow]:
        while self._ready_sizes:
            size = self._ready_sizes.pop(0)
            group, items = self._ready_buffer.buffer[:size], self._ready_items[:size]
            del self._ready_buffer[:size], self._ready_items[:size]
            encoded, kept = [], []
            for sample, item, slot in zip(group, items, self._pixel_slots(group)):
                result = self._postencode_or_skip(sample, slot)
                if result is not None:
                    encoded.append(result)
                    kept.append((sample, item))
            if not encoded:
                continue
            if len(kept) < len(group) and self._can_wait(item for _, item in kept):
                # A sample failed to decode: rather than emit a row with a hole, its bin mates
                # go back to pending and are packed again next round.
                for sample, item in kept:
                    self._pending_buffer.append(sample)
                    self._pending_items.append(item)
                continue
            member_keys = tuple(get_sample_restore_key(sample) for sample, _ in kept)
            with self._pack_index.ctx() as pack_index:
                row = self.pack(encoded)
            cost = row.row_cost
            width = row_width([e.segment.length for e in encoded], self.row)
            self._stats.count_row(cost["real_tokens"], width, len(encoded), flush=self._source_exhausted, cost=cost)
            row.stats = self._telemetry_snapshot()
            self._publish_stats(row.stats)
            yield set_sample_restore_key(row, pack_index, *member_keys, src=self)

    def _can_wait(self, items: Iterable[tuple[int, int]]) -> bool:
        """Whether samples of a ready bin may go back to pending without waiting past the bound."""
        if self._source_exhausted:
            return False
        # The bin came from round _round_index - 1; pending, a sample is next a candidate in
        # round _round_index, where it is forced once it has waited max_wait_rounds.
        return all(self._round_index - arrival <= self.policy.max_wait_rounds for _, arrival in items)

    def _buffered_nbytes(self) -> Iterator[int]:
        for buffer in (self._reading_buffer, self._pending_buffer, self._ready_buffer):
            yield from (sample.nbytes() for sample in buffer.buffer)

    def _pixel_slots(self, group: list[PreparedSample]) -> list[Any]:
        """Each sample's slot in its row's pixel payload (None each without ``allocate_pixels``)."""
        return [None] * len(group) if self.allocate_pixels is None else self.allocate_pixels(group)

    def _postencode(self, sample: PreparedSample, slot: Any) -> EncodedSample:
        return self.postencode(sample) if slot is None else self.postencode(sample, slot)

    def _postencode_or_skip(self, sample: PreparedSample, slot: Any = None) -> EncodedSample | None:
        try:
            with self._encode_index.ctx() as encode_index:
                encoded = self._postencode(sample, slot)
        except BadSampleError as err:
            self._skip(sample, str(err))
            return None
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
            row = self.pack(encoded)
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
            f"PendingGroupPackingDataset(seq_length={self.row.seq_length}, buffer_size={self.policy.buffer_size}, "
            f"buffer_tokens={self.policy.buffer_tokens}, dataset={self.dataset})"
        )
