"""Loss reduction as per-token weights in ``loss_mask``: token, sample and square averaging.

Megatron's per-token loss path (``calculate_per_token_loss=True``) returns, per micro-batch,
``sum(loss * loss_mask)`` and ``int(sum(loss_mask))``, sums both over micro-batches and
data-parallel (and context-parallel) ranks, and divides. Weighting the supervised tokens of a
segment with n supervised tokens by ``(W / n) ** p`` (W = row width) makes that quotient the
token mean (p = 0), the mean over samples of each sample's mean (p = 1) or InternVL's square
average (p = 1/2), with no change to the training step.

The factor W (instead of plain ``1 / n ** p``) keeps every weight >= 1, so Megatron's integer
cast of ``sum(loss_mask)`` drops less than one unit per micro-batch and CP rank out of a total
of at least the supervised token count (sample: W per sample): a relative error below
``micro_batches * cp / sum(loss_mask)``, never a micro-batch rounded down to zero.
"""

from __future__ import annotations

import math

from energon_pack.config import LOSS_REDUCTIONS

__all__ = ["LOSS_REDUCTIONS", "loss_weight"]

_EXPONENT = {"token": 0.0, "sample": 1.0, "square": 0.5}


def loss_weight(loss_tokens: int, reduction: str, width: int) -> float:
    """Weight of each supervised token of a segment with ``loss_tokens`` supervised tokens.

    ``(width / loss_tokens) ** p`` with p = 0 (token), 1 (sample), 1/2 (square); 0.0 for a
    segment without supervised tokens. A segment's weights sum to
    ``width ** p * loss_tokens ** (1 - p)``, between ``loss_tokens`` and ``width``.
    Examples (width 1024, 16 supervised tokens): token -> 1.0, sample -> 64.0, square -> 8.0.
    """
    if reduction not in _EXPONENT:
        options = " or ".join(repr(r) for r in LOSS_REDUCTIONS)
        raise ValueError(
            f"loss_reduction={reduction!r}: must be one of {options}; fix: set loss_reduction to one of them"
        )
    if loss_tokens <= 0:
        return 0.0
    if reduction == "token":
        return 1.0
    ratio = width / loss_tokens
    return ratio if reduction == "sample" else math.sqrt(ratio)
