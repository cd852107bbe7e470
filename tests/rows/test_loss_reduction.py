"""Loss reduction through packed rows: the weights in ``loss_mask`` against the unpacked means.

Megatron's per-token loss path is simulated: every micro-batch (one packed row, or its CP
shard) yields ``sum(loss * loss_mask)`` and ``sum(loss_mask)``; both are summed over
micro-batches and data-parallel ranks, then divided.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from energon_pack.core.alignment import aligned_length
from energon_pack.config import PackingConfig
from energon_pack.rows.encoded import PackedSegment
from energon_pack.loader import get_packing_loader
from energon_pack.rows.loss_reduction import loss_weight
from energon_pack.qwen.template import IGNORE_INDEX
from energon_pack.rows.step import thd_partition_indices
from energon_pack.rows.thd import build_thd_row
from energon_pack.core.visual import VisualInputs

WIDTH = 64
DP_RANKS = 2


def segment(key: str, mask: list[float]) -> PackedSegment:
    """A text segment whose targets are the positions where ``mask`` is 1 (labels -100 elsewhere)."""
    n = len(mask)
    ids = torch.arange(100, 100 + n)
    loss_mask = torch.tensor(mask, dtype=torch.float32)
    labels = torch.where(loss_mask > 0, ids + 1, torch.full_like(ids, IGNORE_INDEX))
    return PackedSegment(
        key=key,
        input_ids=ids,
        labels=labels,
        loss_mask=loss_mask,
        mrope_position_ids=torch.arange(n).expand(3, n).clone(),
        visual=VisualInputs(),
    )


# --------------------------------------------------------------------------- weights


def test_loss_weight_golden():
    assert [loss_weight(16, r, 1024) for r in ("token", "sample", "square")] == [1.0, 64.0, 8.0]
    assert [loss_weight(0, r, 1024) for r in ("token", "sample", "square")] == [0.0, 0.0, 0.0]
    assert loss_weight(3, "sample", 12) == 4.0 and loss_weight(3, "square", 12) == 2.0
    with pytest.raises(ValueError, match="loss_reduction='mean'.*'token' or 'sample' or 'square'"):
        loss_weight(4, "mean", 1024)


def test_row_weights_golden():
    segments = [segment("a", [0, 1, 1, 1, 1]), segment("b", [0, 0, 0]), segment("c", [1, 1, 1, 1])]
    rows = {
        reduction: build_thd_row(segments, seq_length=12, pad_multiple=1, pad_token_id=0, loss_reduction=reduction)
        for reduction in ("token", "sample", "square")
    }
    # a: targets at 1..3 (its last token never has one), b: none, c: targets at 0..2; tail 12 is padding.
    assert rows["token"]["loss_mask"].tolist() == [[0, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0]]
    assert rows["sample"]["loss_mask"].tolist() == [[0, 4, 4, 4, 0, 0, 0, 0, 4, 4, 4, 0]]
    assert rows["square"]["loss_mask"].tolist() == [[0, 2, 2, 2, 0, 0, 0, 0, 2, 2, 2, 0]]
    for row in rows.values():
        assert row["loss_tokens"].dtype == torch.int32 and row["loss_tokens"].tolist() == [3, 0, 3]
        assert torch.equal(row["labels"] == IGNORE_INDEX, row["loss_mask"] == 0)
        for key in ("input_ids", "labels", "position_ids", "cu_seqlens_q_padded"):
            assert torch.equal(row[key], rows["token"][key]), key


def test_unknown_reduction_rejected_by_row_builder():
    with pytest.raises(ValueError, match="loss_reduction='mean'"):
        build_thd_row([segment("a", [1, 0])], seq_length=4, pad_multiple=1, pad_token_id=0, loss_reduction="mean")


# --------------------------------------------------------------------------- Megatron aggregation


def unpacked_mean(losses: list[np.ndarray], masks: list[np.ndarray], reduction: str) -> float:
    """The intended mean over the samples, each on its own (float64, no weights involved).

    token: all supervised tokens alike; sample: mean of per-sample means;
    square (InternVL): sum_s sum_t l_t / sqrt(n_s) / sum_s sqrt(n_s).
    """
    picked = [loss[mask > 0].astype(np.float64) for loss, mask in zip(losses, masks)]
    picked = [p for p in picked if p.size]
    if reduction == "token":
        return float(np.concatenate(picked).mean())
    if reduction == "sample":
        return float(np.mean([p.mean() for p in picked]))
    return sum(p.sum() / math.sqrt(p.size) for p in picked) / sum(math.sqrt(p.size) for p in picked)


def pack_in_order(lengths: list[int], multiple: int) -> list[list[int]]:
    """Sample indices per row, filling rows of WIDTH in arrival order (aligned lengths)."""
    rows: list[list[int]] = [[]]
    used = 0
    for index, n in enumerate(lengths):
        slots = aligned_length(n, multiple)
        if used + slots > WIDTH:
            rows.append([])
            used = 0
        rows[-1].append(index)
        used += slots
    return rows


def packed_micro_batches(losses, masks, reduction, multiple):
    """(row, per-token loss [W]) for every packed row; gap tokens get a large finite loss."""
    batches = []
    for indices in pack_in_order([len(m) for m in masks], multiple):
        segments = [segment(f"s{i}", masks[i].tolist()) for i in indices]
        row = build_thd_row(segments, seq_length=WIDTH, pad_multiple=multiple, pad_token_id=0, loss_reduction=reduction)
        row_loss = torch.full((WIDTH,), 1e4, dtype=torch.float32)
        for i, start in zip(indices, row["cu_seqlens_q_padded"].tolist()):
            row_loss[start : start + len(masks[i])] = torch.from_numpy(losses[i])
        batches.append((row, row_loss))
    return batches


def megatron_mean(batches, *, cp: int, integer_counts: bool) -> tuple[float, float, int]:
    """Megatron's per-token aggregation over DP_RANKS ranks (rows dealt round-robin), each row a
    micro-batch, each split over ``cp`` CP ranks.

    With ``integer_counts`` each (micro-batch, CP rank) sums in float32 and reports
    ``int(sum(loss_mask))``, as Megatron-Bridge's loss function and Megatron-Core's int32
    token counter do; otherwise everything is summed in float64.
    Returns (mean, float64 sum of loss_mask, number of (micro-batch, CP rank) terms).
    """
    numerator, denominator, exact_weight, terms = 0.0, 0.0, 0.0, 0
    for dp_rank in range(DP_RANKS):
        for row, row_loss in batches[dp_rank::DP_RANKS]:
            for cp_rank in range(cp):
                keep = thd_partition_indices(row["cu_seqlens_q_padded"], WIDTH, cp, cp_rank)
                mask, loss = row["loss_mask"][0, keep], row_loss[keep]
                exact_weight += float(mask.double().sum())
                terms += 1
                if integer_counts:
                    numerator += float(torch.sum(loss * mask))
                    count = int(mask.sum())
                    assert count >= 1 or not bool(mask.any()), "a micro-batch with loss tokens counted as 0"
                    denominator += count
                else:
                    numerator += float(torch.sum(loss.double() * mask.double()))
                    denominator += float(mask.double().sum())
    return numerator / denominator, exact_weight, terms


samples_strategy = st.lists(
    st.tuples(st.integers(2, 40), st.floats(0.0, 1.0), st.integers(0, 2**32 - 1)), min_size=1, max_size=30
)


def draw_samples(specs) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per-sample float32 losses in [0, 10) and 0/1 masks (target density p, none on the last token)."""
    losses, masks = [], []
    for n, density, seed in specs:
        rng = np.random.default_rng(seed)
        mask = (rng.random(n) < density).astype(np.float32)
        mask[-1] = 0.0
        losses.append(rng.uniform(0.0, 10.0, n).astype(np.float32))
        masks.append(mask)
    return losses, masks


@settings(max_examples=50, deadline=None)
@given(samples_strategy, st.sampled_from(["token", "sample", "square"]), st.sampled_from([1, 4]))
def test_megatron_aggregation_gives_the_unpacked_mean(specs, reduction, multiple):
    """Summed over micro-batches, DP ranks (and CP ranks when rows are aligned for cp=2), the
    weighted per-token losses divided by the summed weights equal the unpacked mean to 1e-6.

    Megatron casts each micro-batch's sum(loss_mask) to int: at most one unit is lost per
    (micro-batch, CP rank), so that mean is off by at most terms / sum(loss_mask), and is exact
    for token.
    """
    losses, masks = draw_samples(specs)
    if not any(m.any() for m in masks):
        masks[0][0] = 1.0
    batches = packed_micro_batches(losses, masks, reduction, multiple)
    expected = unpacked_mean(losses, masks, reduction)
    for cp in (1, 2) if multiple == 4 else (1,):
        got, _, _ = megatron_mean(batches, cp=cp, integer_counts=False)
        assert got == pytest.approx(expected, rel=1e-6, abs=1e-9), (reduction, cp)
        got, weight, terms = megatron_mean(batches, cp=cp, integer_counts=True)
        bound = 0.0 if reduction == "token" else terms / (weight - terms)
        assert abs(got / expected - 1) <= bound + 1e-5, (reduction, cp, bound)


def test_token_reduction_keeps_the_input_loss_mask():
    masks = [[0, 1, 1, 0, 1, 0], [1, 1, 1, 1, 1, 1, 1, 0], [0, 0]]
    row = build_thd_row([segment(f"s{i}", m) for i, m in enumerate(masks)], seq_length=24, pad_multiple=4,
                        pad_token_id=0)
    expected = torch.zeros(1, 24)
    for mask, start in zip(masks, row["cu_seqlens_q_padded"].tolist()):
        expected[0, start : start + len(mask)] = torch.tensor(mask, dtype=torch.float32)
    assert torch.equal(row["loss_mask"], expected)
    assert row["loss_tokens"].tolist() == [3, 7, 0]


# --------------------------------------------------------------------------- real loader


@pytest.mark.slow
def test_loader_rows_carry_the_weights(synthetic_dataset, processor):
    """Same rows under every reduction; loss_mask differs by exactly the per-segment weight."""
    base = dict(seq_length=4096, buffer_size=4, num_workers=0, repeat=False)
    runs = {
        reduction: list(get_packing_loader(synthetic_dataset.out_dir, PackingConfig(**base, loss_reduction=reduction),
                                           processor))
        for reduction in ("token", "sample", "square")
    }
    assert len(runs["token"]) >= 3
    for reduction in ("sample", "square"):
        assert len(runs[reduction]) == len(runs["token"])
        for token_row, row in zip(runs["token"], runs[reduction]):
            assert row["__keys__"] == token_row["__keys__"]
            assert torch.equal(row["labels"], token_row["labels"])
            assert torch.equal(row["loss_tokens"], token_row["loss_tokens"])
            weights = torch.zeros(4096)
            for n, start, end in zip(row["loss_tokens"].tolist(), row["cu_seqlens_q"][:-1].tolist(),
                                     row["cu_seqlens_q"][1:].tolist()):
                assert int(torch.count_nonzero(token_row["loss_mask"][0, start:end])) == n
                weights[start:end] = loss_weight(n, reduction, 4096)
            assert torch.equal(row["loss_mask"][0], token_row["loss_mask"][0] * weights)
            assert bool((row["loss_mask"][row["loss_mask"] > 0] >= 1).all())
