"""``QwenVLPackingTaskEncoder``: the Energon task encoder that packs Qwen-VL chat samples.

Stages (one worker): ``preencode_sample`` (tokens and geometry from headers, no pixels) ->
``PendingGroupPackingDataset`` (bin selection with pending groups, installed by
``build_batch``) -> ``postencode_sample`` (pixels and rope positions, only for the emitted
bin) -> ``pack_selected_samples`` (segments of one row) -> ``batch`` (the THD dict, MBS=1).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

import torch
from megatron.energon import TaskEncoder
from megatron.energon.flavors.base_dataset import SavableDataset
from megatron.energon.metadataset.loader_interface import DatasetBlendMode
from megatron.energon.task_encoder.base import stateless
from megatron.energon.worker import WorkerConfig
from megatron.energon.wrappers.batch_dataset import BatchDataset
from megatron.energon.wrappers.log_sample_dataset import LogSampleDataset
from megatron.energon.wrappers.repeat_dataset import RepeatDataset
from megatron.energon.wrappers.shuffle_buffer_dataset import ShuffleBufferDataset

from energon_pack.config import PackingConfig
from energon_pack.rows.encoded import EncodedSample, PackedRow, PreparedSample
from energon_pack.rows.flops import CostModel, grid_rows
from energon_pack.errors import BadSampleError
from energon_pack.formats.energon_webdataset import AuxLoading
from energon_pack.packing.budget import fits_one_row, row_budget, sample_misfit
from energon_pack.config.blend import schedule_size_problem, weights_problem
from energon_pack.runtime.blend_stage import ShareBlendDataset, segment_source
from energon_pack.runtime.balanced_stage import BalancedPackingDataset, online_balance
from energon_pack.runtime.packing_stage import PendingGroupPackingDataset, RowSteps
from energon_pack.qwen.encode import PreparedChat, QwenChatEncoder
from energon_pack.qwen.fit import MediaGeometry
from energon_pack.qwen.geometry import VisionSpec
from energon_pack.qwen.pixels import PixelSlots, allocate_row_pixels, in_loader_worker
from energon_pack.qwen.processor import load_processor
from energon_pack.qwen.rope import RopeSpec
from energon_pack.core.samples import QwenVLChatSample
from energon_pack.core.storage_retries import install_storage_retries, take_storage_retries
from energon_pack.runtime.exclude import ExcludeList
from energon_pack.runtime.inflight import InflightRecorder
from energon_pack.runtime.skip_log import warn_skip
from energon_pack.core.stage_times import timed
from energon_pack.runtime.stats import row_counts
from energon_pack.rows.thd import build_layout_row, collate_rows, row_width


# Forked Energon workers must not share the tokenizer's Rust thread pool.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


class WeightedBlendWithoutRepeatError(ValueError):
    """A weighted metadataset blend was asked for as one finite epoch (``repeat=False``)."""


class BlendConfigError(ValueError):
    """The blend settings do not fit the metadataset (weights, schedule size, epochized schedule)."""


def blend_entry(index: int, loaded: Any) -> dict[str, Any]:
    """How a blend entry is named in statistics and errors: its index, path, subflavors, weight and
    repetitions (``loaded``: Energon's ``LoadedDataset``)."""
    factory = loaded.dataset
    path = getattr(factory, "path", None) or next(iter(getattr(factory, "paths", []) or []), None)
    return {
        "index": index,
        "path": None if path is None else str(path),
        "subflavors": dict(getattr(factory, "subflavors", None) or {}),
        "weight": loaded.weight,
        "repetitions": loaded.repetitions,
    }


def entry_name(entry: dict[str, Any]) -> str:
    """Example: ``{"index": 1, "path": "/d/video", "subflavors": {"source": "v"}, ...}`` ->
    ``"blend entry 1 (/d/video, subflavors {'source': 'v'})"``."""
    subflavors = f", subflavors {entry['subflavors']}" if entry["subflavors"] else ""
    return f"blend entry {entry['index']} ({entry['path']}{subflavors})"


class QwenVLPackingTaskEncoder(AuxLoading, TaskEncoder[QwenVLChatSample, PreparedSample, PackedRow, dict]):
    """Packs Qwen-VL chat samples into fixed-width THD rows (docs/batch_contract.md, docs/state_contract.md).

    Energon glue around :class:`QwenChatEncoder` (tokens, grids and pixels of one chat) and the
    packing stage. ``processor``: a Qwen-VL processor (``load_processor()`` when None); its pixel
    limits decide token counts. ``rope_spec``: rope constants (from the model config when known;
    otherwise derived from the processor). ``stats_dir``: folder where each worker's packing
    stage publishes its statistics and each worker records the sample it is decoding
    (``runtime.inflight``; ``get_packing_loader`` sets one; None publishes nothing).
    Samples on ``config.loader.exclude`` become skip markers (reason ``excluded``) in preencode.
    """

    decoder = None  # raw bytes reach preencode: media stay compressed until postencode

    def __init__(
        self,
        config: PackingConfig,
        processor: Any = None,
        *,
        rope_spec: RopeSpec | None = None,
        stats_dir: str | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.chat = QwenChatEncoder(
            processor if processor is not None else load_processor(),
            rope_spec=rope_spec,
            uint8_pixels=config.row.pixel_dtype == "uint8",
            fast_jpeg=config.row.fast_jpeg_decode,
            apply_exif_orientation=config.row.apply_exif_orientation,
            max_image_pixels=config.row.max_image_pixels,
            decode_threads=config.loader.resolved_decode_threads(),
            chat_template_kwargs=config.row.chat_template_kwargs,
            max_audio_seconds=config.row.max_audio_seconds,
            trim_long_audio=config.row.on_overlong_audio == "trim",
        )
        self.pad_token_id = int(self.processor.tokenizer.pad_token_id)
        #: What one row may hold (width, segments, vision limits): a sample alone over it is skipped.
        self.budget = row_budget(config.row, config.policy)
        self.stats_dir = stats_dir
        install_storage_retries(config.loader.max_storage_retries, config.loader.storage_retry_delay)
        #: Where each worker records the sample it is decoding (named when the worker dies).
        self.inflight = InflightRecorder(stats_dir)
        self.exclude = ExcludeList(config.loader.exclude)
        #: The metadataset's blend entries (``blend_entry``) once the train dataset is built; [] without a blend.
        self.blend_entries: list[dict[str, Any]] = []
        #: Every dataset the rows' ``segment_source`` numbers (``blend_entry``; one for a plain dataset)
        #: once the train or validation dataset is built.
        self.source_entries: list[dict[str, Any]] = []
        #: The share blend of a token unit or schedule (one per worker after forking), else None.
        self._share_blend: ShareBlendDataset | None = None
        #: Modelled FLOPs of rows (``row_cost["flops"]``) when ``config.policy.cost_model`` is set.
        self.cost_model = (
            None if config.policy.cost_model is None
            else CostModel.of(config.policy.cost_model, frozen_vision=config.policy.frozen_vision)
        )

    @property
    def processor(self) -> Any:
        """The Qwen-VL processor."""
        return self.chat.processor

    @property
    def vision(self) -> VisionSpec:
        """The processor's ``VisionSpec`` (pixel limits, frame sampling)."""
        return self.chat.vision

    @property
    def rope_spec(self) -> RopeSpec:
        """The rope constants."""
        return self.chat.rope_spec

    # --- preencode: tokens and geometry, no pixels ---------------------------------------

    @stateless
    def preencode_sample(self, sample: QwenVLChatSample) -> PreparedSample:
        """Tokenize and measure ``sample`` from media headers; a bad or excluded sample becomes a skip marker."""
        try:
            excluded = self.exclude.of_sample(sample)
            if excluded is not None:
                raise BadSampleError("excluded", f"{excluded!r} is on the exclude list")
            if sample.invalid_reason is not None:
                raise BadSampleError(sample.invalid_reason, sample.invalid_detail)
            shrink = self.config.policy.on_overlong == "shrink"
            with self.inflight.decoding(sample, "preencode"):
                prepared = self.chat.prepare(
                    sample.conversation, sample.images, sample.videos, tools=sample.tools,
                    chat_template_kwargs=sample.chat_template_kwargs, fits=self._fits_row if shrink else None,
                    audios=sample.audios or (), use_audio_in_video=sample.use_audio_in_video,
                )
        except BadSampleError as err:
            return PreparedSample.skipped(sample, err)
        return PreparedSample.derive_from(
            sample, images=sample.images, videos=sample.videos, **({"audios": sample.audios} if sample.audios else {}),
            **vars(prepared),
        )

    @property
    def token_blend(self) -> bool:
        """Whether the train dataset built is a share blend of tokens or supervised tokens (its
        default round is one row: ``TOKEN_BLEND_ROUND_ROWS``)."""
        return self._share_blend is not None and self.config.policy.blend_unit != "samples"

    def blend_units(self, sample: PreparedSample) -> int:
        """What ``sample`` counts toward its source's share under ``blend_unit``: 1, its real tokens
        or its supervised tokens; 0 for a sample no row will carry (a skip marker, a misfit)."""
        if sample.skip_reason is not None or sample_misfit(sample, self.budget, self.config.row, self.config.policy):
            return 0
        unit = self.config.policy.blend_unit
        if unit == "tokens":
            return sample.num_tokens
        if unit == "supervised_tokens":
            return sample.supervised_tokens
        return 1

    def _fits_row(self, num_tokens: int, geometry: MediaGeometry) -> bool:
        """Whether a sample of ``num_tokens`` tokens with this media geometry fits one row (``fits_one_row``)."""
        return fits_one_row(num_tokens, geometry.vision_patches, self.config.row, self.config.policy)

    # --- postencode: pixels and rope positions, only for emitted bins ---------------------

    @stateless
    def postencode_sample(self, sample: PreparedSample, slots: PixelSlots | None = None) -> EncodedSample:
        """Decode and patchify the media of ``sample`` (into ``slots`` of its row's payload when
        given, see :meth:`allocate_row_pixels`); raises ``BadSampleError`` on bad media."""
        prepared = PreparedChat(**{f.name: getattr(sample, f.name) for f in fields(PreparedChat)})
        with self.inflight.decoding(sample, "postencode"):
            encoded = self.chat.encode(prepared, sample.images, sample.videos, slots=slots, audios=sample.audios or ())
        segment = sample.segment(
            encoded.mrope_position_ids, encoded.visual, encoded.audio,
            source=segment_source(getattr(sample, "__restore_key__", None)),
        )
        return EncodedSample.derive_from(sample, segment=segment)

    def allocate_row_pixels(self, samples: list[PreparedSample]) -> list[PixelSlots]:
        """One preallocated pixel payload (per media kind) for the row of ``samples``, one slot
        per sample (shared memory inside a loader worker); see ``qwen.pixels.allocate_row_pixels``."""
        vision = self.vision
        return allocate_row_pixels(
            [sample.image_grid_thw for sample in samples],
            [sample.video_grid_thw for sample in samples],
            patch_dim=3 * vision.temporal_patch_size * vision.patch_size**2,
            dtype=torch.uint8 if self.chat.uint8_pixels else torch.float32,
            shared=in_loader_worker(),
        )

    # --- rows ----------------------------------------------------------------------------

    @stateless
    def pack_selected_samples(self, samples: list[EncodedSample]) -> PackedRow:
        """The segments of one row, in selection order (statistics are attached by the packing stage)."""
        return PackedRow.derive_from(samples[0], segments=[s.segment for s in samples], stats={})

    @stateless
    def batch(self, rows: list[PackedRow]) -> dict:
        """One THD row (docs/batch_contract.md) from a micro-batch of exactly one packed row."""
        return collate_rows([self._thd_row(row) for row in rows])

    @stateless
    def encode_row(self, samples: Sequence[PreparedSample], *, planned_tokens: Sequence[int] = ()) -> dict:
        """One THD row from a fixed set of prepared samples (an in-batch micro-batch, a plan row).
        ``planned_tokens``: the planned members' token counts (a plan row); the row is at least as
        wide as they make it (``row_width``), so a member that fails leaves padding, not a narrower row.

        Same path as online rows: ``postencode_sample`` each, ``pack_selected_samples``, ``batch``.
        Bad samples (skip markers, samples that alone exceed the row budget, media that fail to
        decode) are left out and counted; ``__stats__`` holds the counters of this batch, shrunk
        samples and the row cost included (``stats.row_counts``). When no sample is
        left the result is an empty marker ``{"__empty__": True, "__stats__": ...}``, which the
        loaders count and drop.
        """
        skipped: Counter[str] = Counter()
        members = []
        for sample in samples:
            problem = self._member_problem(sample)
            if problem is None:
                members.append(sample)
            else:
                skipped[problem.reason] += 1
        encoded = []
        for sample, slot in zip(members, self.allocate_row_pixels(members)):
            try:
                encoded.append(self.postencode_sample(sample, slot))
            except BadSampleError as err:
                skipped[err.reason] += 1
                warn_skip(sample.__key__, err)
        retries = take_storage_retries()  # of reading these samples
        if not encoded:
            return {
                "__empty__": True,
                "__stats__": row_counts(samples_in=len(samples), skipped=skipped, storage_retries=retries),
            }
        packed = self.pack_selected_samples(encoded)
        row = collate_rows([self._thd_row(packed, min_width=row_width(planned_tokens, self.config.row) if planned_tokens else 0)])
        row["__stats__"] = row_counts(
            samples_in=len(samples),
            skipped=skipped,
            width=row["total_tokens"],
            cost=self.row_cost(packed, width=row["total_tokens"]),
            shrunk=[(s.tokens_before_shrink, s.num_tokens) for s in samples if s.tokens_before_shrink is not None],
            storage_retries=retries,
        )
        row["__restore_key__"] = ()
        return row

    def _member_problem(self, sample: PreparedSample) -> BadSampleError | None:
        """Why a member of a fixed row cannot be postencoded (skip marker, misfit), else None."""
        if sample.skip_reason is not None:
            problem = BadSampleError(sample.skip_reason, sample.skip_detail)
        else:
            problem = sample_misfit(sample, self.budget, self.config.row, self.config.policy)
        if problem is not None:
            warn_skip(sample.__key__, problem)
        return problem

    def row_cost(self, row: PackedRow, *, width: int) -> dict[str, int]:
        """``row.row_cost``, plus ``flops`` (modelled fwd+bwd FLOPs of the row of ``width`` slots)
        when a cost model is configured."""
        cost = row.row_cost
        if self.cost_model is not None:
            grids = grid_rows(*(g for s in row.segments for g in (s.visual.image_grid_thw, s.visual.video_grid_thw)))
            cost["flops"] = self.cost_model.row([s.length for s in row.segments], grids, width=width)
        return cost

    def planned_row_flops(self, samples: list[PreparedSample]) -> int:
        """Modelled FLOPs of the row ``samples`` will make, from their headers (token counts and
        media grids; nothing decoded): what the balanced stage orders its windows by."""
        assert self.cost_model is not None, "planned_row_flops needs config.policy.cost_model"
        lengths = [sample.num_tokens for sample in samples]
        grids = grid_rows(*(g for s in samples for g in (s.image_grid_thw, s.video_grid_thw)))
        return self.cost_model.row(lengths, grids, width=row_width(lengths, self.config.row))

    def _thd_row(self, row: PackedRow, *, min_width: int = 0) -> dict:
        with timed("row assembly"):
            out = build_layout_row(row.segments, self.config.row, pad_token_id=self.pad_token_id, min_width=min_width)
        out["__stats__"] = row.stats
        out["row_cost"] = self.row_cost(row, width=out["total_tokens"])
        out["__restore_key__"] = row.__restore_key__
        return out

    def build_train_datasets(
        self,
        *,
        datasets: list[Any],
        worker_config: WorkerConfig,
        blend_mode: DatasetBlendMode = DatasetBlendMode.NONE,
        repeat: bool = True,
        **kwargs: Any,
    ) -> SavableDataset[dict]:
        """Energon's, with the blend settings (``blend_unit``, ``blend_schedule``) checked against the
        metadataset, and a share blend after preencode when they ask for one (:meth:`_build_share_blend`).

        A weighted blend read as one finite epoch is refused with a ValueError and its fix (a
        weighted blend samples datasets forever; Energon would stop on an assertion).
        """
        if blend_mode == DatasetBlendMode.DATASET_WEIGHT and not repeat:
            raise WeightedBlendWithoutRepeatError(
                "a weighted metadataset blend cannot be read as one finite epoch (repeat=False); "
                "fix: set repeat=True, or use blend_epochized with repetitions in the metadataset"
            )
        self._share_blend = None
        blended = len(datasets) > 1 and blend_mode in (DatasetBlendMode.DATASET_WEIGHT, DatasetBlendMode.SAMPLE_REPETITIONS)
        self.source_entries = [blend_entry(i, d) for i, d in enumerate(datasets)]
        self.blend_entries = self.source_entries if blended else []
        self._check_blend(datasets, blend_mode, blended)
        policy = self.config.policy
        if blended and (policy.blend_unit != "samples" or policy.blend_schedule is not None):
            return self._build_share_blend(datasets, worker_config=worker_config, blend_mode=blend_mode, repeat=repeat, **kwargs)
        return super().build_train_datasets(
            datasets=datasets, worker_config=worker_config, blend_mode=blend_mode, repeat=repeat, **kwargs
        )

    def build_val_datasets(self, *, datasets: list[Any], **kwargs: Any) -> SavableDataset[dict]:
        """Energon's, recording the datasets (``source_entries``) its ``ConcatDataset`` numbers."""
        self.source_entries = [blend_entry(i, d) for i, d in enumerate(datasets)]
        return super().build_val_datasets(datasets=datasets, **kwargs)

    def _check_blend(self, datasets: list[Any], blend_mode: DatasetBlendMode, blended: bool) -> None:
        """Refuse blend settings that do not fit the metadataset, naming the value, the rule and the fix."""
        policy = self.config.policy
        schedule = policy.blend_schedule
        if schedule is not None and blend_mode == DatasetBlendMode.SAMPLE_REPETITIONS:
            raise BlendConfigError(
                "blend_schedule sets blend weights over training steps, but the metadataset is blend_epochized "
                "(repetitions, one finite epoch); fix: use `blend:` with `weight:` entries (and repeat=True), or "
                "remove blend_schedule"
            )
        problem = schedule_size_problem(schedule, len(datasets)) if schedule is not None else None
        if problem is None and blend_mode == DatasetBlendMode.DATASET_WEIGHT and blended:
            weights = [1.0 if d.weight is None else d.weight for d in datasets]
            problem = weights_problem("the metadataset's blend weights", weights)
            if problem is None and policy.blend_unit == "samples" and schedule is None and min(weights) <= 0:
                problem = (
                    f"the metadataset's blend weights {weights}: Energon's sample blend needs every weight above 0; "
                    "fix: remove the entries of weight 0, or set blend_unit: tokens (or a blend_schedule), which "
                    "leave a source of weight 0 out"
                )
        if problem is not None:
            raise BlendConfigError(problem)

    def _build_share_blend(
        self,
        datasets: list[Any],
        *,
        worker_config: WorkerConfig,
        blend_mode: DatasetBlendMode,
        repeat: bool,
        batch_size: int | None,
        batch_drop_last: bool = False,
        packing_buffer_size: int | None = None,
        virtual_epoch_length: int = 0,
        shuffle_buffer_size: int | None = None,
    ) -> SavableDataset[dict]:
        """Energon's train pipeline with the blend moved after preencode: each source is loaded (cooked)
        and preencoded on its own (looping for ``blend``, repeated ``repetitions`` times for
        ``blend_epochized``), a :class:`ShareBlendDataset` draws from them by shares, then shuffle
        buffer, packing stage and batching as usual."""
        weighted = blend_mode == DatasetBlendMode.DATASET_WEIGHT
        global_workers = max(1, worker_config.num_workers) * worker_config.world_size
        offsets, total = [], 0
        for loaded in datasets:  # Energon's worker rotation: each source starts where the previous ended
            offsets.append(total % global_workers)
            total += len(loaded.dataset)
        sources = []
        for loaded, offset in zip(datasets, offsets):
            source = self._load_dataset(loaded, offset, worker_config=worker_config)
            if weighted:
                source = RepeatDataset(source, worker_config=worker_config)
            elif loaded.repetitions not in (None, 1):
                source = RepeatDataset(source, repeats=loaded.repetitions, worker_config=worker_config)
            sources.append(self.build_encode_sample(source, worker_config=worker_config))
        policy = self.config.policy
        dataset: SavableDataset = ShareBlendDataset(
            sources,
            weights=[1.0 if d.weight is None else float(d.weight) for d in datasets] if weighted else None,
            units=self.blend_units,
            unit=policy.blend_unit,
            schedule=policy.blend_schedule,
            schedule_mode=policy.blend_schedule_mode,
            micro_batches_per_step=self.config.trainer.micro_batches_per_step or 1,
            names=[entry_name(entry) for entry in self.blend_entries],
            worker_config=worker_config,
        )
        self._share_blend = dataset
        if repeat and not weighted:
            dataset = RepeatDataset(dataset, worker_config=worker_config)
        if shuffle_buffer_size is not None and shuffle_buffer_size > 1:
            dataset = ShuffleBufferDataset(dataset, size=shuffle_buffer_size, worker_config=worker_config)
        dataset = self.build_batch(
            dataset, batch_size=batch_size, batch_drop_last=batch_drop_last,
            packing_buffer_size=packing_buffer_size, worker_config=worker_config,
        )
        if virtual_epoch_length > 0:
            raise BlendConfigError(
                f"virtual_epoch_length={virtual_epoch_length} is not supported with blend_unit/blend_schedule; "
                "fix: leave virtual_epoch_length at 0"
            )
        if worker_config.should_log(level=1):
            dataset = LogSampleDataset(dataset, mode="train", worker_config=worker_config)
        return dataset

    def build_batch(
        self,
        dataset: SavableDataset[PreparedSample],
        *,
        batch_size: int | None,
        batch_drop_last: bool = False,
        packing_buffer_size: int | None = None,
        worker_config: WorkerConfig,
    ) -> SavableDataset[dict]:
        """Install the pending-group packing stage, then batch one row per micro-batch.

        In mode ``in_batch`` Energon batches ``micro_batch_size`` prepared samples instead and the
        batcher (``encode_row``) builds one variable-width row of each batch.
        """
        if batch_size != 1 or packing_buffer_size is not None:
            raise ValueError(
                f"batch_size={batch_size}, packing_buffer_size={packing_buffer_size}: packed rows need "
                "micro-batch size 1 and no Energon packing buffer (PackingConfig.buffer_size replaces it); "
                "build the loader with get_packing_loader"
            )
        if self.config.mode == "in_batch":
            return BatchDataset(
                dataset,
                batch_size=self.config.micro_batch_size,
                batcher=self.encode_row,
                batcher_stateless=True,
                drop_last=False,
                worker_config=worker_config,
            )
        stage: dict[str, Any] = dict(
            row=self.config.row,
            policy=self.config.policy,
            steps=RowSteps(postencode=self.postencode_sample, allocate_pixels=self.allocate_row_pixels,
                           row_cost=self.row_cost, pack=self.pack_selected_samples),
            worker_config=worker_config,
            stats_dir=self.stats_dir,
            blend=self._share_blend,
        )
        balance = online_balance(self.config, self.planned_row_flops)
        packed = (PendingGroupPackingDataset(dataset, **stage) if balance is None
                  else BalancedPackingDataset(dataset, balance=balance, **stage))
        return BatchDataset(
            packed,
            batch_size=1,
            batcher=self.batch,
            batcher_stateless=True,
            drop_last=False,
            worker_config=worker_config,
        )
