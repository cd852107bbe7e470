"""Sample types between the pipeline stages (one worker).

``PreparedSample`` (after preencode): cheap to buffer: compressed media bytes, token arrays and
geometry, no pixels. ``EncodedSample`` (after postencode): one ``PackedSegment`` with pixels and
rope positions. ``PackedRow`` (after pack_selected_samples): the segments of one row plus the
worker's statistics snapshot, and what the row costs the model (``row_cost``); ``batch`` turns
it into the THD dict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from megatron.energon import Sample
from megatron.energon.edataclass import edataclass

from energon_pack.errors import BadSampleError
from energon_pack.qwen.template import IGNORE_INDEX, VideoTiming
from energon_pack.core.audio_inputs import AudioInputs
from energon_pack.core.samples import media_nbytes
from energon_pack.core.visual import VisualInputs


@dataclass(frozen=True, kw_only=True)
class PackedSegment:
    """One encoded sample ready to be placed in a row; L = number of real tokens (>= 1).

    input_ids: int64 [L]; labels: int64 [L], already-shifted next-token targets
    (``labels[t] = input_ids[t+1]`` where there is loss, IGNORE_INDEX elsewhere);
    loss_mask: float32 [L]; mrope_position_ids: int64 [3, L] (Qwen-VL t/h/w positions of the
    unpacked sample); visual: the sample's pixels and grids; key: its source sample key.
    """

    key: str
    input_ids: torch.Tensor
    labels: torch.Tensor
    loss_mask: torch.Tensor
    mrope_position_ids: torch.Tensor
    visual: VisualInputs
    #: Energon subflavors of the source dataset (e.g. from a metadataset blend), or None.
    subflavors: dict[str, Any] | None = None
    #: Qwen-Omni: the sample's sounds as log-mel features (None: it hears nothing).
    audio: AudioInputs | None = None
    #: The blend entry the sample came from (its index in the metadataset's order; 0 outside a blend).
    source: int = 0

    def __post_init__(self) -> None:
        if self.input_ids.dim() != 1 or self.input_ids.numel() == 0:
            raise ValueError(
                f"segment {self.key!r}: input_ids has shape {tuple(self.input_ids.shape)}, it must be 1-D "
                "with at least one token; fix: pass the sample's token ids as a non-empty [L] tensor"
            )
        length = self.input_ids.numel()
        expected = {"labels": (length,), "loss_mask": (length,), "mrope_position_ids": (3, length)}
        for name, shape in expected.items():
            actual = tuple(getattr(self, name).shape)
            if actual != shape:
                raise ValueError(
                    f"segment {self.key!r}: {name} has shape {actual} but input_ids has {length} tokens, "
                    f"so {name} must have shape {shape}; fix: build all per-token tensors from the same token list"
                )

    @property
    def length(self) -> int:
        """Number of real tokens L."""
        return self.input_ids.numel()

    @property
    def vision_patches(self) -> int:
        """ViT input patches: sum of t*h*w over the image and video grids (before the 2x2 merge)."""
        return _grid_patches(self.visual.image_grid_thw, self.visual.video_grid_thw)


def _grid_patches(*grids: torch.Tensor | None) -> int:
    """Sum of t*h*w over [n, 3] grids (None counts 0). Example: [[1, 4, 6]], [[2, 2, 2]] -> 32."""
    return sum(int(grid.prod(dim=-1).sum()) for grid in grids if grid is not None)


@edataclass
class PreparedSample(Sample):
    """A tokenized sample whose media are still compressed; L = ``num_tokens``.

    A bad sample travels as a marker with ``skip_reason`` set (and empty fields) so that the
    packing stage counts it in its savable statistics.
    """

    #: int64 [L] token ids with media placeholders expanded.
    input_ids: torch.Tensor
    #: int64 [L] next-token targets (-100 where no loss).
    labels: torch.Tensor
    #: float32 [L], 1.0 where ``labels`` is a target.
    loss_mask: torch.Tensor
    #: Compressed image / video files, in placeholder order.
    images: list[bytes]
    videos: list[bytes]
    #: Qwen-Omni: compressed audio files (placeholder order), where each heard sound comes from and
    #: its model-rate samples (``qwen.encode.PreparedChat``), and the record's ``use_audio_in_video``.
    audios: Optional[list] = None
    audio_sources: Optional[list] = None
    audio_samples: Optional[list] = None
    #: Qwen-Omni: log-mel feature frames of all its sounds (``row_cost["audio_frames"]`` of it alone; 0 without sound).
    audio_frames: int = 0
    use_audio_in_video: bool = False
    #: int64 [n_img, 3] / [n_vid, 3] patch grids (t, h, w), None without such media.
    image_grid_thw: Optional[torch.Tensor] = None
    video_grid_thw: Optional[torch.Tensor] = None
    #: Seconds per temporal grid step of each video.
    second_per_grid_ts: Optional[list[float]] = None
    #: Frame sampling of each video (source frame count, fps, sampled indices).
    video_timings: Optional[list[VideoTiming]] = None
    #: Skip reason of a bad sample (``BadSampleError.reason``, the skip-count key), else None.
    skip_reason: Optional[str] = None
    #: What was wrong with it (``BadSampleError.detail``), else None.
    skip_detail: Optional[str] = None
    #: Per-sample limits that ``on_overlong="shrink"`` set: pixels per image and frames sampled
    #: per video (None: the processor's own).
    image_max_pixels: Optional[int] = None
    video_max_frames: Optional[int] = None
    #: Token count before ``on_overlong="shrink"`` lowered the media limits, else None.
    tokens_before_shrink: Optional[int] = None

    @property
    def num_tokens(self) -> int:
        """Number of real tokens L."""
        return int(self.input_ids.numel())

    @property
    def supervised_tokens(self) -> int:
        """Tokens that carry loss (``labels`` not IGNORE_INDEX)."""
        return int((self.labels != IGNORE_INDEX).sum())

    @property
    def vision_patches(self) -> int:
        """ViT input patches of all media: sum of t*h*w over the image and video grids (before the 2x2 merge)."""
        return _grid_patches(self.image_grid_thw, self.video_grid_thw)

    @property
    def num_media(self) -> int:
        """Images + videos."""
        return len(self.images) + len(self.videos)

    def nbytes(self) -> int:
        """Bytes this sample holds in a buffer: compressed media plus token arrays and grids."""
        tensors = (self.input_ids, self.labels, self.loss_mask, self.image_grid_thw, self.video_grid_thw)
        media = sum(map(media_nbytes, self.images)) + sum(map(media_nbytes, self.videos)) + sum(map(len, self.audios or ()))
        return media + sum(t.numel() * t.element_size() for t in tensors if t is not None)

    def segment(
        self, mrope_position_ids: torch.Tensor, visual: VisualInputs, audio: AudioInputs | None = None, *, source: int = 0
    ) -> PackedSegment:
        """This sample as a row segment, with its postencoded rope positions (int64 [3, L]), pixels and
        sounds, from blend entry ``source``."""
        return PackedSegment(
            key=self.__key__, input_ids=self.input_ids, labels=self.labels, loss_mask=self.loss_mask,
            mrope_position_ids=mrope_position_ids, visual=visual, subflavors=self.__subflavors__, audio=audio,
            source=source,
        )

    @classmethod
    def skipped(cls, base: Sample, error: BadSampleError) -> PreparedSample:
        """A marker for the bad sample ``base`` (keeps its key and restore key) skipped for ``error``."""
        empty = torch.zeros(0, dtype=torch.int64)
        return cls.derive_from(
            base,
            input_ids=empty,
            labels=empty,
            loss_mask=empty.float(),
            images=[],
            videos=[],
            skip_reason=error.reason,
            skip_detail=error.detail,
        )


@edataclass
class EncodedSample(Sample):
    """A sample ready to be placed in a row: tokens, rope positions and pixels."""

    segment: PackedSegment


#: Keys of `PackedRow.row_cost`, in report order.
ROW_COST_KEYS: tuple[str, ...] = (
    "real_tokens",
    "supervised_tokens",
    "segments",
    "images",
    "videos",
    "vision_patches",
    "sum_squared_lengths",
)


@edataclass
class PackedRow(Sample):
    """The segments of one row (in row order) and the emitting worker's statistics snapshot."""

    segments: list[PackedSegment]
    stats: dict[str, Any]

    @property
    def row_cost(self) -> dict[str, int]:
        """What the row costs the model, by `ROW_COST_KEYS`: real tokens, supervised tokens
        (loss_mask != 0), segments, images, videos, ViT input patches, and the sum of squared
        segment lengths (the attention term).

        Example: segments of 3 tokens (2 supervised) and 5 tokens (1 supervised, one 1x4x6
        image) -> ``{"real_tokens": 8, "supervised_tokens": 3, "segments": 2, "images": 1,
        "videos": 0, "vision_patches": 24, "sum_squared_lengths": 34}``. A row with Qwen-Omni
        sounds adds ``audios`` (sounds) and ``audio_frames`` (log-mel frames the audio encoder reads).
        """

        def count(grid: torch.Tensor | None) -> int:
            return 0 if grid is None else int(grid.shape[0])

        cost = {
            "real_tokens": sum(s.length for s in self.segments),
            "supervised_tokens": sum(int((s.loss_mask != 0).sum()) for s in self.segments),
            "segments": len(self.segments),
            "images": sum(count(s.visual.image_grid_thw) for s in self.segments),
            "videos": sum(count(s.visual.video_grid_thw) for s in self.segments),
            "vision_patches": sum(s.vision_patches for s in self.segments),
            "sum_squared_lengths": sum(s.length**2 for s in self.segments),
        }
        heard = [s.audio for s in self.segments if s.audio is not None]
        if heard:  # Qwen-Omni rows only: rows without sound keep the keys above
            cost["audios"] = sum(int(a.audio_feature_lengths.numel()) for a in heard)
            cost["audio_frames"] = sum(a.frames for a in heard)
        return cost
