"""``QwenVLPackingTaskEncoder``: the Energon task encoder that packs Qwen-VL chat samples.

Stages (one worker): ``preencode_sample`` (tokens and geometry from headers, no pixels) ->
``PendingGroupPackingDataset`` (bin selection with pending groups, installed by
``build_batch``) -> ``postencode_sample`` (pixels and rope positions, only for the emitted
bin) -> ``pack_selected_samples`` (segments of one row) -> ``batch`` (the THD dict, MBS=1).
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch
from megatron.energon import TaskEncoder
from megatron.energon.flavors.base_dataset import SavableDataset
from megatron.energon.task_encoder.base import stateless
from megatron.energon.worker import WorkerConfig
from megatron.energon.wrappers.batch_dataset import BatchDataset

from energon_pack.alignment import aligned_length
from energon_pack.config import PackingConfig
from energon_pack.encoded import EncodedSample, PackedRow, PackedSegment, PreparedSample
from energon_pack.errors import BadSampleError, row_budget, sample_misfit
from energon_pack.packing.wrapper import PendingGroupPackingDataset
from energon_pack.qwen.fit import MediaGeometry, MediaLimits, media_geometry, shrink_limits
from energon_pack.qwen.geometry import VisionSpec
from energon_pack.qwen.media import ImageInfo, VideoInfo, probe_image, probe_video
from energon_pack.qwen.pixels import PixelSlots, allocate_row_pixels, image_pixels, in_loader_worker, video_pixels
from energon_pack.qwen.family import processor_family
from energon_pack.qwen.processor import load_processor
from energon_pack.qwen.rope import RopeSpec, mrope_position_ids
from energon_pack.qwen.template import (
    ChatMarkers,
    TokenizedConversation,
    placeholder_token_count,
    tokenize_conversation,
)
from energon_pack.samples import QwenVLChatSample
from energon_pack.stats import row_counts
from energon_pack.thd import build_layout_row, collate_rows
from energon_pack.visual import VisualInputs

_LOG = logging.getLogger(__name__)

# Forked Energon workers must not share the tokenizer's Rust thread pool.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

#: tokens_per_second of the released Qwen2.5-VL checkpoints (used when no model config is known).
QWEN25_TOKENS_PER_SECOND = 2


def default_rope_spec(processor: Any) -> RopeSpec:
    """Rope constants for a processor: from the model config ``load_processor(path)`` found next
    to it, else from the processor (family, merge size, pad token ids; Qwen2.5-VL
    ``tokens_per_second`` = 2 as in the released checkpoints).

    Example: ``default_rope_spec(load_processor())`` -> ``RopeSpec(family="qwen2.5-vl",
    tokens_per_second=2, ...)``.
    """
    model_config = getattr(processor, "energon_pack_model_config", None)
    if model_config is not None:
        return RopeSpec.from_model_config(model_config)
    family = processor_family(processor)
    return RopeSpec(
        family=family,
        spatial_merge_size=int(processor.image_processor.merge_size),
        tokens_per_second=QWEN25_TOKENS_PER_SECOND if family == "qwen2.5-vl" else None,
        image_token_id=int(processor.image_token_id),
        video_token_id=int(processor.video_token_id),
    )


class QwenVLPackingTaskEncoder(TaskEncoder[QwenVLChatSample, PreparedSample, PackedRow, dict]):
    """Packs Qwen-VL chat samples into fixed-width THD rows (docs/batch_contract.md, docs/state_contract.md).

    ``processor``: a Qwen-VL processor (``load_processor()`` when None); its pixel limits
    decide token counts. ``rope_spec``: rope constants (from the model config when known;
    otherwise derived from the processor).
    """

    decoder = None  # raw bytes reach preencode: media stay compressed until postencode

    def __init__(self, config: PackingConfig, processor: Any = None, *, rope_spec: RopeSpec | None = None) -> None:
        super().__init__()
        self.config = config
        self.processor = processor if processor is not None else load_processor()
        self.vision = VisionSpec.from_processor(self.processor)
        self.rope_spec = rope_spec or default_rope_spec(self.processor)
        self.markers = ChatMarkers.from_tokenizer(self.processor.tokenizer)
        self.pad_token_id = int(self.processor.tokenizer.pad_token_id)
        self.uint8_pixels = config.row.pixel_dtype == "uint8"
        #: What one row may hold (width, segments, vision limits): a sample alone over it is skipped.
        self.budget = row_budget(config.row, config.policy)
        #: Folder where the packing stage publishes per-worker statistics (set by get_packing_loader).
        self.stats_dir: str | None = None

    # --- preencode: tokens and geometry, no pixels ---------------------------------------

    @stateless
    def preencode_sample(self, sample: QwenVLChatSample) -> PreparedSample:
        """Tokenize and measure ``sample`` from media headers; a bad sample becomes a skip marker."""
        try:
            return self._prepare(sample)
        except BadSampleError as err:
            return PreparedSample.skipped(sample, str(err))

    def _prepare(self, sample: QwenVLChatSample) -> PreparedSample:
        if sample.invalid_reason is not None:
            reason, _, detail = sample.invalid_reason.partition(": ")
            raise BadSampleError(reason, detail)
        images = [probe_image(data) for data in sample.images]
        videos = [probe_video(data) for data in sample.videos]
        geometry = media_geometry(images, videos, self.vision)
        tokens = self._tokenize(sample, geometry)
        limits = tokens_before_shrink = None
        if self.config.policy.on_overlong == "shrink" and not self._fits_row(len(tokens.input_ids), geometry):
            limits = self._shrink_limits(images, videos, geometry, len(tokens.input_ids))
            if limits is not None:
                tokens_before_shrink = len(tokens.input_ids)
                geometry = media_geometry(images, videos, limits.apply(self.vision))
                tokens = self._tokenize(sample, geometry)
        return PreparedSample.derive_from(
            sample,
            input_ids=torch.from_numpy(tokens.input_ids),
            labels=torch.from_numpy(tokens.labels),
            loss_mask=torch.from_numpy(tokens.loss_mask),
            images=sample.images,
            videos=sample.videos,
            image_grid_thw=None if geometry.image_grid_thw is None else torch.from_numpy(geometry.image_grid_thw),
            video_grid_thw=None if geometry.video_grid_thw is None else torch.from_numpy(geometry.video_grid_thw),
            second_per_grid_ts=list(geometry.second_per_grid_ts) or None,
            video_timings=list(geometry.timings) or None,
            image_max_pixels=None if limits is None else limits.image_max_pixels,
            video_max_frames=None if limits is None else limits.max_frames,
            tokens_before_shrink=tokens_before_shrink,
        )

    def _tokenize(self, sample: QwenVLChatSample, geometry: MediaGeometry) -> TokenizedConversation:
        return tokenize_conversation(
            self.processor,
            sample.conversation,
            image_grid_thw=geometry.image_grid_thw,
            video_grid_thw=geometry.video_grid_thw,
            videos=geometry.timings,
            markers=self.markers,
        )

    def _fits_row(self, num_tokens: int, geometry: MediaGeometry) -> bool:
        """Whether a sample of ``num_tokens`` tokens with this media geometry fits one row (width,
        vision patch budget); the media count limit is the packing stage's to check."""
        budget = self.config.policy.max_row_vision_patches
        return aligned_length(num_tokens, self.config.row.pad_multiple) <= self.config.row.seq_length and (
            budget is None or geometry.vision_patches <= budget
        )

    def _shrink_limits(
        self, images: list[ImageInfo], videos: list[VideoInfo], geometry: MediaGeometry, num_tokens: int
    ) -> MediaLimits | None:
        """The largest per-sample media limits under which the sample fits one row (None: none does).

        Only the placeholder expansions change with the limits, so a candidate's token count is
        ``num_tokens`` less the current expansions plus the candidate's (`placeholder_token_count`).
        """

        def expansion(candidate: MediaGeometry) -> int:
            return placeholder_token_count(
                self.processor,
                image_grid_thw=candidate.image_grid_thw,
                video_grid_thw=candidate.video_grid_thw,
                videos=candidate.timings,
            )

        text_tokens = num_tokens - expansion(geometry)
        return shrink_limits(
            images, videos, self.vision, fits=lambda candidate: self._fits_row(text_tokens + expansion(candidate), candidate)
        )

    # --- postencode: pixels and rope positions, only for emitted bins ---------------------

    @stateless
    def postencode_sample(self, sample: PreparedSample, slots: PixelSlots | None = None) -> EncodedSample:
        """Decode and patchify the media of ``sample`` (into ``slots`` of its row's payload when
        given, see :meth:`allocate_row_pixels`); raises ``BadSampleError`` on bad media."""
        slots = slots or PixelSlots()
        pixel_values = pixel_values_videos = None
        if sample.images:
            pixel_values = image_pixels(
                self.processor,
                sample.images,
                sample.image_grid_thw.numpy(),
                uint8=self.uint8_pixels,
                max_pixels=sample.image_max_pixels,
                out=slots.images,
            )
        if sample.videos:
            pixel_values_videos = video_pixels(
                self.processor,
                sample.videos,
                sample.video_timings,
                sample.video_grid_thw.numpy(),
                uint8=self.uint8_pixels,
                out=slots.videos,
            )
        seconds = None if sample.second_per_grid_ts is None else torch.tensor(sample.second_per_grid_ts, dtype=torch.float32)
        mrope = mrope_position_ids(
            sample.input_ids,
            spec=self.rope_spec,
            image_grid_thw=sample.image_grid_thw,
            video_grid_thw=sample.video_grid_thw,
            second_per_grid_ts=seconds,
        )
        visual = VisualInputs(
            pixel_values=pixel_values,
            image_grid_thw=sample.image_grid_thw,
            pixel_values_videos=pixel_values_videos,
            video_grid_thw=sample.video_grid_thw,
            second_per_grid_ts=seconds if self.rope_spec.family == "qwen2.5-vl" else None,
            **(self._normalisation_constants() if self.uint8_pixels and (sample.images or sample.videos) else {}),
        )
        segment = PackedSegment(
            key=sample.__key__,
            input_ids=sample.input_ids,
            labels=sample.labels,
            loss_mask=sample.loss_mask,
            mrope_position_ids=mrope,
            visual=visual,
            subflavors=sample.__subflavors__,
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
            dtype=torch.uint8 if self.uint8_pixels else torch.float32,
            shared=in_loader_worker(),
        )

    def _normalisation_constants(self) -> dict[str, Any]:
        processor = self.processor.image_processor
        return {
            "image_mean": tuple(float(v) for v in processor.image_mean),
            "image_std": tuple(float(v) for v in processor.image_std),
            "rescale_factor": float(processor.rescale_factor),
        }

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
    def encode_row(self, samples: Sequence[PreparedSample]) -> dict:
        """One THD row from a fixed set of prepared samples (an in-batch micro-batch, a plan row).

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
                _LOG.warning("energon_pack: skipping sample %r: %s", sample.__key__, err)
        if not encoded:
            return {"__empty__": True, "__stats__": row_counts(samples_in=len(samples), skipped=skipped)}
        packed = self.pack_selected_samples(encoded)
        row = self.batch([packed])
        row["__stats__"] = row_counts(
            samples_in=len(samples),
            skipped=skipped,
            width=row["total_tokens"],
            cost=packed.row_cost,
            shrunk=[(s.tokens_before_shrink, s.num_tokens) for s in samples if s.tokens_before_shrink is not None],
        )
        row["__restore_key__"] = ()
        return row

    def _member_problem(self, sample: PreparedSample) -> BadSampleError | None:
        """Why a member of a fixed row cannot be postencoded (skip marker, misfit), else None."""
        if sample.skip_reason is not None:
            reason, _, detail = sample.skip_reason.partition(": ")
            problem = BadSampleError(reason, detail)
        else:
            problem = sample_misfit(sample, self.budget, self.config.row, self.config.policy)
        if problem is not None:
            _LOG.warning("energon_pack: skipping sample %r: %s", sample.__key__, problem)
        return problem

    def _thd_row(self, row: PackedRow) -> dict:
        out = build_layout_row(row.segments, self.config.row, pad_token_id=self.pad_token_id)
        out["__stats__"] = row.stats
        out["row_cost"] = row.row_cost
        out["__restore_key__"] = row.__restore_key__
        return out

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
        packed = PendingGroupPackingDataset(
            dataset,
            row=self.config.row,
            policy=self.config.policy,
            postencode=self.postencode_sample,
            allocate_pixels=self.allocate_row_pixels,
            pack=self.pack_selected_samples,
            worker_config=worker_config,
            stats_dir=self.stats_dir,
        )
        return BatchDataset(
            packed,
            batch_size=1,
            batcher=self.batch,
            batcher_stateless=True,
            drop_last=False,
            worker_config=worker_config,
        )
