"""THD row assembly: several encoded samples -> one fixed-width packed row (docs/batch_contract.md).

Layout of a row of width W with alignment multiple m: segment i occupies
``ceil(len_i / m) * m`` physical slots starting at ``cu_seqlens_q_padded[i]``; its real
tokens come first and the rest of its slots are gap tokens. The last segment also absorbs
the fixed-width tail, so ``cu_seqlens_q_padded[-1] == W``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from energon_pack.config import RowLayout
from energon_pack.rows.encoded import PackedSegment
from energon_pack.rows.loss_reduction import loss_weight
from energon_pack.core.alignment import aligned_length
from energon_pack.qwen.template import IGNORE_INDEX
from energon_pack.core.audio_inputs import AudioInputs
from energon_pack.core.visual import VisualInputs

__all__ = ["build_layout_row", "build_thd_row", "collate_rows", "row_width"]


def row_width(lengths: Sequence[int], layout: RowLayout) -> int:
    """Width of a row holding segments of ``lengths`` real tokens under ``layout``.

    Fixed-width rows are ``seq_length`` wide (the last segment absorbs the tail); with
    ``fixed_width=False`` a row is the sum of the aligned lengths rounded up to
    ``lcm(width_multiple, pad_multiple)``, so no tail beyond that rounding.
    Example: lengths [5, 4], pad_multiple 4, width_multiple 8, seq_length 32 -> 16 (8 + 4 = 12,
    rounded up to 16); with ``fixed_width=True`` -> 32.
    """
    if layout.fixed_width:
        return layout.seq_length
    multiple = math.lcm(layout.pad_multiple, layout.width_multiple or 1)
    return aligned_length(sum(aligned_length(n, layout.pad_multiple) for n in lengths), multiple)


def build_thd_row(
    segments: Sequence[PackedSegment],
    *,
    seq_length: int,
    pad_multiple: int,
    pad_token_id: int,
    pad_cu_seqlens: bool = False,
    max_segments: int | None = None,
    loss_reduction: str = "token",
) -> dict[str, Any]:
    """Pack ``segments`` (in order) into one THD row of width W = seq_length, micro-batch size 1.

    Returns the docs/batch_contract.md dict: input_ids/labels/position_ids int64 [1, W], loss_mask
    float32 [1, W], mrope_position_ids int64 [3, 1, W], attention_mask None, padding_mask bool
    [1, W], cu_seqlens_{q,kv}(_padded) int32 [n+1], max_seqlen_{q,kv} int32 0-dim,
    total_tokens W, loss_tokens int32 [n], visual_inputs, __keys__, __subflavors__, segment_source
    int32 [n] (each segment's blend entry, ``PackedSegment.source``); Qwen-Omni rows with sound
    also ``audio_inputs`` (`AudioInputs`: features [n_mels, sum of frames], frames per sound).

    Each segment's last real token has no next token inside the segment, so its label is
    forced to IGNORE_INDEX and its loss weight to 0 whatever the input says.

    ``loss_tokens[i]`` counts the supervised tokens (loss_mask != 0) of segment i. With
    ``loss_reduction`` "sample" or "square" the supervised tokens of segment i are weighted by
    :func:`~energon_pack.rows.loss_reduction.loss_weight` (``W / n_i`` or ``sqrt(W / n_i)``);
    "token" leaves ``loss_mask`` as it is.

    Gap tokens (alignment padding and the tail) hold ``pad_token_id``, label IGNORE_INDEX,
    loss 0, ``padding_mask`` True. Their positions continue the segment's counting:
    ``position_ids`` run on (len, len+1, ...) and all three mrope axes take
    ``max(segment mrope) + 1, + 2, ...`` - exactly the positions the HF ``get_rope_index``
    would give extra text tokens appended to the sample. No attention reads them (cu_seqlens
    exclude gaps), so any finite value would do; continuing the count keeps ``position_ids``
    below W (inside any RoPE table sized for W) and every segment's positions increasing
    across its whole physical range, with no special value for kernels or the CP split to
    trip over.

    With ``pad_cu_seqlens=True`` (CUDA graphs) the four cu_seqlens tensors have the fixed
    length ``max_segments + 1`` (padded by repeating their last value) and max_seqlen_* = W.

    Example: lengths 5 and 4, W=12, m=4 -> cu_seqlens_q [0, 5, 9], cu_seqlens_q_padded
    [0, 8, 12], max_seqlen_q 8, padding_mask True exactly at slots {5, 6, 7}.
    """
    _check_row_args(segments, seq_length, pad_multiple, pad_cu_seqlens, max_segments)
    lengths = [seg.length for seg in segments]
    physical = [aligned_length(n, pad_multiple) for n in lengths]
    used = sum(physical)
    if used > seq_length:
        raise ValueError(
            f"segments of lengths {lengths} need {used} aligned slots (multiple {pad_multiple}) but the row "
            f"width is seq_length={seq_length}; fix: select fewer or shorter samples for this row"
        )
    physical[-1] += seq_length - used

    width = seq_length
    input_ids = torch.full((1, width), pad_token_id, dtype=torch.int64)
    labels = torch.full((1, width), IGNORE_INDEX, dtype=torch.int64)
    loss_mask = torch.zeros((1, width), dtype=torch.float32)
    position_ids = torch.empty((1, width), dtype=torch.int64)
    mrope = torch.empty((3, 1, width), dtype=torch.int64)
    padding_mask = torch.ones((1, width), dtype=torch.bool)
    loss_tokens = torch.zeros(len(segments), dtype=torch.int32)

    start = 0
    for index, (seg, n, slots) in enumerate(zip(segments, lengths, physical)):
        real = slice(start, start + n)
        gap = slice(start + n, start + slots)
        input_ids[0, real] = seg.input_ids
        labels[0, real] = seg.labels
        labels[0, start + n - 1] = IGNORE_INDEX
        loss_mask[0, real] = seg.loss_mask
        loss_mask[0, start + n - 1] = 0.0
        supervised = int(torch.count_nonzero(loss_mask[0, real]))
        weight = loss_weight(supervised, loss_reduction, width)
        if supervised and weight != 1.0:
            loss_mask[0, real] *= weight
        loss_tokens[index] = supervised
        position_ids[0, start : start + slots] = torch.arange(slots)
        mrope[:, 0, real] = seg.mrope_position_ids
        mrope[:, 0, gap] = seg.mrope_position_ids.max() + 1 + torch.arange(slots - n)
        padding_mask[0, real] = False
        start += slots

    cu_real = _cumulative(lengths)
    cu_padded = _cumulative(physical)
    max_seqlen = max(physical)
    if pad_cu_seqlens:
        cu_real = _repeat_last(cu_real, max_segments + 1)
        cu_padded = _repeat_last(cu_padded, max_segments + 1)
        max_seqlen = width

    return {
        "input_ids": input_ids,
        "labels": labels,
        "loss_mask": loss_mask,
        "position_ids": position_ids,
        "mrope_position_ids": mrope,
        "attention_mask": None,
        "padding_mask": padding_mask,
        "cu_seqlens_q": cu_real,
        "cu_seqlens_kv": cu_real.clone(),
        "cu_seqlens_q_padded": cu_padded,
        "cu_seqlens_kv_padded": cu_padded.clone(),
        "max_seqlen_q": torch.tensor(max_seqlen, dtype=torch.int32),
        "max_seqlen_kv": torch.tensor(max_seqlen, dtype=torch.int32),
        "total_tokens": width,
        "loss_tokens": loss_tokens,
        "visual_inputs": VisualInputs.concat([seg.visual for seg in segments]),
        "__keys__": [seg.key for seg in segments],
        "__subflavors__": [seg.subflavors for seg in segments],
        "segment_source": torch.tensor([seg.source for seg in segments], dtype=torch.int32),
        # Qwen-Omni rows only (rows without sound have no such key): sounds without padding.
        **({"audio_inputs": audio} if (audio := AudioInputs.concat([seg.audio for seg in segments])) else {}),
    }


def build_layout_row(
    segments: Sequence[PackedSegment], layout: RowLayout, *, pad_token_id: int, min_width: int = 0
) -> dict[str, Any]:
    """:func:`build_thd_row` with the width (:func:`row_width`, at least ``min_width``: a plan row
    keeps its planned width when a member fails), alignment, cu_seqlens padding and loss
    reduction of ``layout``."""
    return build_thd_row(
        segments,
        seq_length=max(min_width, row_width([segment.length for segment in segments], layout)),
        pad_multiple=layout.pad_multiple,
        pad_token_id=pad_token_id,
        pad_cu_seqlens=layout.pad_cu_seqlens,
        max_segments=layout.max_segments,
        loss_reduction=layout.loss_reduction,
    )


def collate_rows(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Micro-batch collation for packed rows: exactly one row passes through unchanged.

    A packed row already holds several samples, so packing needs micro-batch size 1.
    Example: collate_rows([row]) -> row; collate_rows([row, row]) -> ValueError.
    """
    if len(rows) != 1:
        raise ValueError(
            f"got {len(rows)} packed rows for one micro-batch: packing needs micro-batch size 1 "
            "(each row already holds several samples); fix: set micro_batch_size=1 / batch_size=1 and raise "
            "seq_length or the global batch size instead"
        )
    return dict(rows[0])


def _check_row_args(
    segments: Sequence[PackedSegment],
    seq_length: int,
    pad_multiple: int,
    pad_cu_seqlens: bool,
    max_segments: int | None,
) -> None:
    if not segments:
        raise ValueError("segments is empty: a row needs at least one sample; fix: skip building empty rows")
    if seq_length <= 0 or pad_multiple <= 0 or seq_length % pad_multiple != 0:
        raise ValueError(
            f"seq_length={seq_length}, pad_multiple={pad_multiple}: both must be positive and seq_length "
            "divisible by pad_multiple so every segment, the last included, stays aligned; "
            "fix: use the values validated by PackingConfig"
        )
    if pad_cu_seqlens and max_segments is None:
        raise ValueError(
            "pad_cu_seqlens=True needs max_segments (the fixed cu_seqlens length is max_segments + 1); "
            "fix: pass max_segments"
        )
    if max_segments is not None and len(segments) > max_segments:
        raise ValueError(
            f"{len(segments)} segments exceed max_segments={max_segments}; "
            "fix: select at most max_segments samples per row or raise max_segments"
        )


def _cumulative(lengths: Sequence[int]) -> torch.Tensor:
    """[a, b, c] -> int32 [0, a, a+b, a+b+c]."""
    return torch.tensor([0, *lengths], dtype=torch.int64).cumsum(0).to(torch.int32)


def _repeat_last(values: torch.Tensor, size: int) -> torch.Tensor:
    """[0, 5, 9], size 5 -> [0, 5, 9, 9, 9]."""
    return torch.cat([values, values[-1:].expand(size - values.numel())])
