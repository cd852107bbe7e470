"""Oracle: ``lm loss/<source>`` of packed rows equals the per-sample truth, grouped by source.

Two rows of a three-source blend (the model oracle's multimodal and text cases, each sample tagged
with its blend entry through Energon's restore key, as a metadataset blend tags it) are built by the
plugin's task encoder and run once each, packed, through a tiny random-weight Qwen2.5-VL (float32,
CPU); every sample is also run alone through the Hugging Face processor and the same model. The
figure RowMetrics reports over the two rows (``RowMetrics.reduce``) must equal the plain token mean
of the unpacked per-token losses of each source within 1e-5: under ``loss_reduction`` token and
sample (the loss_mask weights must not leak into it), and with each row split for CP=2 (each rank's
shard reported alone; the two shards sum to the whole row).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from energon_pack import RowMetrics, SourceInfo
from energon_pack.qwen.processor import load_processor
from energon_pack.qwen.template import IGNORE_INDEX
from energon_pack.rows.step import thd_partition_indices
from tests.support.model_oracle import (
    MAX_PIXELS, MIN_PIXELS, MULTIMODAL_CASES, TEXT_CASES, pack_cases, packed_logits, unpacked_logits,
)
from tests.support.tiny_qwen import real_token_positions, tiny_qwen25_vl

# Slow: a tiny random-weight Qwen2.5-VL forward per row and per sample.
pytestmark = pytest.mark.slow

SOURCES = [SourceInfo(index=i, name=name, path=f"/d/{name}") for i, name in enumerate(("ocr", "chat", "video"))]
#: (cases, each case's source, row width, alignment): segments aligned to multiples of 2 * cp = 4.
ROWS = [(MULTIMODAL_CASES, [0, 1, 2, 0, 1], 320, 8), (TEXT_CASES, [2, 0, 2], 160, 16)]
TOL = 1e-5


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return tiny_qwen25_vl(seed=0)


@pytest.fixture(scope="module")
def packed(model) -> dict[str, Any]:
    """Per loss reduction the two packed rows; the packed per-token losses of each row ([W], one
    forward: the rows of both reductions hold the same tokens); per source the unpacked truth."""
    processor = load_processor(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    rows = {
        reduction: [
            pack_cases(processor, cases, seq_length=width, pad_to_multiple_of=multiple, sources=sources,
                       loss_reduction=reduction)
            for cases, sources, width, multiple in ROWS
        ]
        for reduction in ("token", "sample")
    }
    losses = [packed_token_loss(model, case.row) for case in rows["token"]]
    truth = {source.name: [0.0, 0] for source in SOURCES}
    for case, (_, sources, _, _) in zip(rows["token"], ROWS):
        for prepared, reference, source in zip(case.prepared, case.references, sources):
            supervised = prepared.labels != IGNORE_INDEX
            loss = F.cross_entropy(unpacked_logits(model, reference)[supervised], prepared.labels[supervised], reduction="sum")
            truth[SOURCES[source].name][0] += float(loss)
            truth[SOURCES[source].name][1] += int(supervised.sum())
    return {"rows": rows, "losses": losses, "truth": {name: total / count for name, (total, count) in truth.items()}}


def packed_token_loss(model: torch.nn.Module, row: dict[str, Any]) -> torch.Tensor:
    """float32 [W]: the per-token loss a trainer computes from one forward over the packed row
    (cross entropy of each real token's logits against ``labels``; 0 where there is no target)."""
    keep = real_token_positions(row["cu_seqlens_q"], row["cu_seqlens_q_padded"])
    loss = torch.zeros(row["input_ids"].shape[1])
    loss[keep] = F.cross_entropy(packed_logits(model, row), row["labels"][0, keep], ignore_index=IGNORE_INDEX, reduction="none")
    return loss


@pytest.mark.parametrize("reduction", ["token", "sample"])
def test_lm_loss_per_source_equals_the_unpacked_per_sample_truth(packed, reduction):
    cases = packed["rows"][reduction]
    for case, token_case, (_, sources, _, _) in zip(cases, packed["rows"]["token"], ROWS):
        assert case.row["segment_source"].tolist() == sources  # the blend entry reached the row
        assert torch.equal(case.row["input_ids"], token_case.row["input_ids"])  # so the same per-token losses
    metrics = RowMetrics(SOURCES)
    reduced = metrics.reduce([metrics.metrics(case.row, loss) for case, loss in zip(cases, packed["losses"])])
    for name, expected in packed["truth"].items():
        assert reduced[f"lm loss/{name}"] == pytest.approx(expected, abs=TOL), name
    if reduction == "sample":  # the loss_mask-weighted mean differs: a figure that used the weights would fail
        ocr = [source_of_tokens(case.row) == 0 for case in cases]
        weighted = sum(float((loss * case.row["loss_mask"][0])[m].sum()) for case, loss, m in zip(cases, packed["losses"], ocr))
        weights = sum(float(case.row["loss_mask"][0][m].sum()) for case, m in zip(cases, ocr))
        assert abs(weighted / weights - packed["truth"]["ocr"]) > 1e-3


@pytest.mark.parametrize("reduction", ["token", "sample"])
def test_cp2_shards_reported_alone_sum_to_the_whole_rows(packed, reduction):
    metrics = RowMetrics(SOURCES)
    whole, shards = [], []
    for case, loss in zip(packed["rows"][reduction], packed["losses"]):
        row, width = case.row, case.row["total_tokens"]
        whole.append(metrics.metrics(row, loss))
        pair = [
            metrics.metrics(row, loss[thd_partition_indices(row["cu_seqlens_q_padded"], width, 2, rank)], cp_size=2, cp_rank=rank)
            for rank in (0, 1)
        ]
        for key, value in whole[-1].items():
            assert torch.allclose(pair[0][key] + pair[1][key], value, rtol=1e-6, atol=1e-4), key
        shards += pair
    reduced = metrics.reduce(shards)
    for name, expected in packed["truth"].items():
        assert reduced[f"lm loss/{name}"] == pytest.approx(expected, abs=TOL), name
    assert reduced == pytest.approx(metrics.reduce(whole), abs=TOL, nan_ok=True)


def source_of_tokens(row: dict[str, Any]) -> torch.Tensor:
    """int64 [W]: the source of every slot's segment (the reference loop of the test above)."""
    cu = row["cu_seqlens_q_padded"].tolist()
    return torch.cat([torch.full((cu[i + 1] - cu[i],), int(s)) for i, s in enumerate(row["segment_source"])])
