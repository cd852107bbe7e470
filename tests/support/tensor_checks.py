"""Comparisons of large pixel tensors that do not copy them to float64.

A float32 subtraction rounds the exact difference once (relative error 2**-24), so
``max |a - b|`` against a tolerance such as 1e-6 reads the same as in float64, without the two
float64 copies (8 bytes a value each) that a 16-megapixel image's patches would cost.
"""

from __future__ import annotations

import torch


def max_abs_difference(ours: torch.Tensor, reference: torch.Tensor) -> float:
    """``max |ours - reference|`` of two floating tensors of one shape (0.0 when equal or empty).

    Example: ``max_abs_difference(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5]))`` -> ``0.5``.
    """
    assert ours.shape == reference.shape, f"shape {tuple(ours.shape)} != reference {tuple(reference.shape)}"
    if ours.numel() == 0 or torch.equal(ours, reference):
        return 0.0
    dtype = torch.promote_types(ours.dtype, reference.dtype)
    return float(torch.sub(ours.to(dtype), reference.to(dtype)).abs_().max())
