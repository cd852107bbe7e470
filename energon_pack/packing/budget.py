"""What one packed row may hold, and which samples fit no row on their own.

Used by the packing stage (a misfit is skipped, or raises with ``on_overlong="error"``), by
``on_overlong="shrink"`` in preencode and by the global pack plan.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from energon_pack.core.alignment import aligned_length
from energon_pack.config import PackingPolicy, RowLayout
from energon_pack.errors import BadSampleError
from energon_pack.packing.algorithms import RoundSize, RowBudget

__all__ = ["fits_one_row", "round_size", "row_budget", "sample_misfit"]


def round_size(row: RowLayout, policy: PackingPolicy, *, token_blend: bool = False) -> RoundSize:
    """When a selection round runs: ``policy.resolved_round`` at the row width (``token_blend``: the
    samples come from a share blend of tokens or supervised tokens).

    Example: ``round_size(RowLayout(seq_length=8192), PackingPolicy())`` -> ``RoundSize(samples=None, tokens=16384)``.
    """
    resolved = policy.resolved_round(row.seq_length, token_blend=token_blend)
    return RoundSize(samples=resolved["buffer_size"], tokens=resolved["buffer_tokens"])


def row_budget(row: RowLayout, policy: PackingPolicy) -> RowBudget:
    """What one row may hold: width, segments, vision patches, media, audio frames.

    Example: ``row_budget(RowLayout(seq_length=8192), PackingPolicy(max_row_media=4))`` ->
    ``RowBudget(tokens=8192, segments=None, vision_patches=None, media=4, audio_frames=None)``.
    """
    return RowBudget(
        tokens=row.seq_length,
        segments=row.max_segments,
        vision_patches=policy.max_row_vision_patches,
        media=policy.max_row_media,
        audio_frames=policy.max_row_audio_frames,
    )


def fits_one_row(num_tokens: int, vision_patches: int, row: RowLayout, policy: PackingPolicy) -> bool:
    """Whether a sample of ``num_tokens`` tokens and ``vision_patches`` ViT patches fits one row:
    its aligned length within ``seq_length`` and its patches within ``max_row_vision_patches``
    (the media count limit is the packing stage's to check); what ``on_overlong="shrink"`` aims at.

    Example: 8190 tokens, pad_multiple 8, W=8192 -> True (8192 slots); 8193 tokens -> False.
    """
    budget = policy.max_row_vision_patches
    return aligned_length(num_tokens, row.pad_multiple) <= row.seq_length and (budget is None or vision_patches <= budget)


def sample_misfit(sample: Any, budget: RowBudget, row: RowLayout, policy: PackingPolicy) -> BadSampleError | None:
    """The skip for a prepared ``sample`` that alone exceeds the row width, a vision budget or the
    audio budget (``sample.audio_frames``, read only when ``max_row_audio_frames`` is set), else None.

    With ``policy.on_overlong == "error"`` a misfit raises ValueError (value, rule, fix) instead.
    Example: 9000 tokens, W=8192 -> ``BadSampleError("overlong", "sample 'a' has 9000 tokens
    (9000 slots aligned to 1) but seq_length is 8192")``.
    """
    for reason, detail, fix in _misfits(sample, budget, row):
        if policy.on_overlong == "error":
            raise ValueError(f"{detail}; rule: every sample must fit one row; fix: {fix}")
        return BadSampleError(reason, detail)
    return None


def _misfits(sample: Any, budget: RowBudget, row: RowLayout) -> Iterator[tuple[str, str, str]]:
    """(skip reason, detail, fix) for every limit of ``budget`` that ``sample`` alone exceeds."""
    key = sample.__key__
    slots = aligned_length(sample.num_tokens, row.pad_multiple)
    if slots > budget.tokens:
        yield (
            "overlong",
            f"sample {key!r} has {sample.num_tokens} tokens ({slots} slots aligned to {row.pad_multiple}) "
            f"but seq_length is {budget.tokens}",
            "raise seq_length, lower the processor's max_pixels / max_frames, or set on_overlong='skip' "
            "(or 'shrink': lower them for that sample only)",
        )
    shrink = " (or 'shrink': lower the sample's pixels and frames until it fits)"
    for reason, value, limit, name, what, fix in (
        ("over_vision_budget", sample.vision_patches, budget.vision_patches, "max_row_vision_patches",
         "vision patches", f"raise max_row_vision_patches, or set on_overlong='skip'{shrink}"),
        ("over_media_budget", sample.num_media, budget.media, "max_row_media",
         "images + videos", "raise max_row_media, or set on_overlong='skip'"),
        *([] if budget.audio_frames is None else [
            ("over_audio_budget", sample.audio_frames, budget.audio_frames, "max_row_audio_frames",
             "audio feature frames", "raise max_row_audio_frames, or lower max_audio_seconds (with on_overlong_audio="
             "'trim') to cut long clips; on_overlong='shrink' never cuts audio"),
        ]),
    ):
        if limit is not None and value > limit:
            yield reason, f"sample {key!r} has {value} {what} but {name} is {limit}", fix
