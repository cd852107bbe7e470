"""Sample types between the pipeline stages (one worker).

``PreparedSample`` (after preencode): cheap to buffer: compressed media bytes, token arrays and
geometry, no pixels. ``EncodedSample`` (after postencode): one ``PackedSegment`` with pixels and
rope positions. ``PackedRow`` (after pack_selected_samples): the segments of one row plus the
worker's statistics snapshot; ``batch`` turns it into the THD dict.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from megatron.energon import Sample
from megatron.energon.edataclass import edataclass

from energon_pack.qwen.template import VideoTiming
from energon_pack.thd import PackedSegment


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
    #: int64 [n_img, 3] / [n_vid, 3] patch grids (t, h, w), None without such media.
    image_grid_thw: Optional[torch.Tensor] = None
    video_grid_thw: Optional[torch.Tensor] = None
    #: Seconds per temporal grid step of each video.
    second_per_grid_ts: Optional[list[float]] = None
    #: Frame sampling of each video (source frame count, fps, sampled indices).
    video_timings: Optional[list[VideoTiming]] = None
    #: ``"<reason>: <detail>"`` for a bad sample, else None.
    skip_reason: Optional[str] = None

    @property
    def num_tokens(self) -> int:
        """Number of real tokens L."""
        return int(self.input_ids.numel())

    @property
    def vision_patches(self) -> int:
        """ViT input patches of all media: sum of t*h*w over the image and video grids (before the 2x2 merge)."""
        return sum(int(grid.prod(dim=-1).sum()) for grid in (self.image_grid_thw, self.video_grid_thw) if grid is not None)

    @property
    def num_media(self) -> int:
        """Images + videos."""
        return len(self.images) + len(self.videos)

    def nbytes(self) -> int:
        """Bytes this sample holds in a buffer: compressed media plus token arrays and grids."""
        tensors = (self.input_ids, self.labels, self.loss_mask, self.image_grid_thw, self.video_grid_thw)
        media = sum(len(data) for data in self.images) + sum(len(data) for data in self.videos)
        return media + sum(t.numel() * t.element_size() for t in tensors if t is not None)

    @classmethod
    def skipped(cls, base: Sample, reason: str) -> PreparedSample:
        """A marker for a bad sample derived from ``base`` (keeps its key and restore key)."""
        empty = torch.zeros(0, dtype=torch.int64)
        return cls.derive_from(
            base, input_ids=empty, labels=empty, loss_mask=empty.float(), images=[], videos=[], skip_reason=reason
        )


@edataclass
class EncodedSample(Sample):
    """A sample ready to be placed in a row: tokens, rope positions and pixels."""

    segment: PackedSegment


@edataclass
class PackedRow(Sample):
    """The segments of one row (in row order) and the emitting worker's statistics snapshot."""

    segments: list[PackedSegment]
    stats: dict[str, Any]
