"""Oracle: a packed THD row through a real Hugging Face Qwen2.5-VL equals each sample run alone.

Rows are built exactly as the plugin builds them (``preencode_sample`` -> ``postencode_sample``
-> ``pack_selected_samples`` -> ``batch``). The packed run calls a tiny random-weight
``Qwen2_5_VLForConditionalGeneration`` once on the whole row with the row's pixels and grids,
``mrope_position_ids`` as explicit 3-D positions (transformers 5.24 then skips ``get_rope_index``)
and an attention mask built from ``cu_seqlens_q`` / ``cu_seqlens_q_padded``. The unpacked run
gives each sample, alone, to the HF processor (images as opened PIL images, video frames decoded
here with PyAV at hand-computed indices, ``do_sample_frames=False``) and to the same model with
its default positions (the model computes M-RoPE itself from ``mm_token_type_ids``). The logits
of every segment's real tokens must agree within 1e-4.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from energon_pack.config import PackingConfig
from energon_pack.qwen.processor import load_processor
from energon_pack.runtime.task_encoder import QwenVLPackingTaskEncoder
from tests.support.model_oracle import (
    MAX_PIXELS, MIN_PIXELS, MULTIMODAL_CASES, TEXT_CASES, PackedCase, oracle_encoder, pack_cases, packed_logits,
    packed_row, split_logits, unpacked_logits,
)
from tests.support.tiny_qwen import real_token_positions, thd_attention_bias, tiny_qwen25_vl

# Slow: the model oracle: a tiny random-weight Qwen2.5-VL forward per case.
pytestmark = pytest.mark.slow


ATOL = 1e-4
#: Row width of the multimodal case: its 5 samples take 257 real tokens, 232 aligned slots.
MULTIMODAL_WIDTH = 320


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return tiny_qwen25_vl(seed=0)


@pytest.fixture(scope="module")
def small_processor() -> Any:
    return load_processor(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)


@pytest.fixture(scope="module")
def multimodal(small_processor, model) -> tuple[PackedCase, list[torch.Tensor]]:
    """The multimodal row (W=320, segments aligned to 8) and each sample's unpacked logits."""
    packed = pack_cases(small_processor, MULTIMODAL_CASES, seq_length=MULTIMODAL_WIDTH, pad_to_multiple_of=8)
    return packed, [unpacked_logits(model, ref) for ref in packed.references]


def test_attention_bias_golden():
    """The oracle's mask: causal inside each segment's real tokens, gap tokens see only themselves."""
    cu_real, cu_padded = torch.tensor([0, 2, 3]), torch.tensor([0, 2, 4])
    allowed = thd_attention_bias(cu_real, cu_padded, 4)[0, 0] == 0
    expected = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]], dtype=torch.bool)
    assert torch.equal(allowed, expected)
    assert real_token_positions(torch.tensor([0, 2, 3]), torch.tensor([0, 4, 8])).tolist() == [0, 1, 4]


def test_row_matches_the_unpacked_processor_outputs(multimodal):
    """Tokens, gaps and the vision tower's inputs of the packed row are the per-sample HF ones, concatenated."""
    packed, _ = multimodal
    row, refs = packed.row, packed.references
    assert row["__keys__"] == [case.key for case in MULTIMODAL_CASES]
    keep = real_token_positions(row["cu_seqlens_q"], row["cu_seqlens_q_padded"])
    assert torch.equal(row["input_ids"][0, keep], torch.cat([ref["input_ids"][0] for ref in refs]))
    gaps = torch.ones(row["input_ids"].shape[1], dtype=torch.bool)
    gaps[keep] = False
    assert torch.equal(row["padding_mask"][0], gaps)
    assert gaps[: row["cu_seqlens_q_padded"][-2]].any() and gaps[-1]  # alignment gaps and the tail

    visual = row["visual_inputs"].normalized_for_model()
    for name in ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts"):
        expected = torch.cat([ref[name] for ref in refs if name in ref])
        assert visual[name].dtype == expected.dtype, name
        assert torch.equal(visual[name], expected), name


@pytest.mark.parametrize("pixel_dtype", ["float32", "uint8"])
def test_packed_row_logits_equal_unpacked_logits(multimodal, model, small_processor, pixel_dtype):
    """One forward over the THD row (explicit M-RoPE + cu_seqlens mask) = each sample alone.

    With ``pixel_dtype="uint8"`` the row carries resized uint8 patches that
    ``normalized_for_model`` rescales and normalises: the logits must not change.
    """
    packed, unpacked = multimodal
    row = packed.row
    if pixel_dtype == "uint8":
        row = packed_row(oracle_encoder(small_processor, MULTIMODAL_WIDTH, 8, pixel_dtype), packed.prepared)
        assert row["visual_inputs"].pixel_values.dtype == torch.uint8
    segments = split_logits(packed_logits(model, row), row)
    for case, got, expected in zip(MULTIMODAL_CASES, segments, unpacked):
        torch.testing.assert_close(got, expected, atol=ATOL, rtol=0, msg=lambda m, k=case.key: f"{k}: {m}")


def test_hf_native_packing_path_agrees(multimodal, model):
    """The row also drops into HF's own packed path: [4, 1, W] positions (text row first), no mask.

    transformers builds the block-diagonal mask from restarts of the text row (``position_ids``);
    gap tokens continue their segment's count, so they only follow that segment's real tokens.
    """
    packed, unpacked = multimodal
    row = packed.row
    positions = torch.cat([row["position_ids"][None], row["mrope_position_ids"]])
    segments = split_logits(packed_logits(model, row, position_ids=positions, attention_mask=None), row)
    for case, got, expected in zip(MULTIMODAL_CASES, segments, unpacked):
        torch.testing.assert_close(got, expected, atol=ATOL, rtol=0, msg=lambda m, k=case.key: f"{k}: {m}")


def test_oracle_sees_wrong_vision_positions(multimodal, model):
    """Control: 1-D text positions instead of M-RoPE leave text-only segments equal but break vision ones."""
    packed, unpacked = multimodal
    row = packed.row
    segments = split_logits(packed_logits(model, row, position_ids=row["position_ids"]), row)
    for case, got, expected in zip(MULTIMODAL_CASES, segments, unpacked):
        error = (got - expected).abs().max().item()
        if case.images or case.videos:
            assert error > 100 * ATOL, case.key
        else:
            assert error <= ATOL, case.key


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["online", "in_batch"])
def test_variable_width_rows_equal_unpacked_logits(multimodal, model, small_processor, mode):
    """``fixed_width=False`` rows (online / planned) and in-batch rows: as wide as their aligned
    samples rounded up to ``width_multiple``, same tokens, labels, loss and logits as the
    fixed-width row, which in turn equal each sample run alone."""
    packed, unpacked = multimodal
    k = len(packed.prepared)
    config = PackingConfig(
        seq_length=MULTIMODAL_WIDTH, pad_to_multiple_of=8, fixed_width=False, width_multiple=16, mode=mode,
        micro_batch_size=k if mode == "in_batch" else 1,
    )
    encoder = QwenVLPackingTaskEncoder(config, small_processor)
    row = encoder.encode_row(packed.prepared) if mode == "in_batch" else packed_row(encoder, packed.prepared)
    width = row["input_ids"].shape[1]
    cu_real, cu_padded = packed.row["cu_seqlens_q"].tolist(), packed.row["cu_seqlens_q_padded"].tolist()
    used = cu_padded[-2] + -(-(cu_real[-1] - cu_real[-2]) // 8) * 8  # aligned slots of all segments
    assert width == -(-used // 16) * 16 < MULTIMODAL_WIDTH and row["total_tokens"] == width
    for key in ("input_ids", "labels", "loss_mask", "position_ids", "padding_mask"):
        assert torch.equal(row[key], packed.row[key][..., :width]), key
    assert torch.equal(row["cu_seqlens_q"], packed.row["cu_seqlens_q"])
    segments = split_logits(packed_logits(model, row), row)
    for case, got, expected in zip(MULTIMODAL_CASES, segments, unpacked):
        torch.testing.assert_close(got, expected, atol=ATOL, rtol=0, msg=lambda m, k=case.key: f"{k}: {m}")


@pytest.mark.parametrize(("seq_length", "pad_to_multiple_of"), [(160, 16), (112, 4)])
def test_text_rows_with_gaps_equal_unpacked_logits(small_processor, model, seq_length, pad_to_multiple_of):
    """Text-only rows of three segments with alignment gaps and a tail; a plain causal mask must fail."""
    packed = pack_cases(small_processor, TEXT_CASES, seq_length=seq_length, pad_to_multiple_of=pad_to_multiple_of)
    row = packed.row
    lengths = (row["cu_seqlens_q"][1:] - row["cu_seqlens_q"][:-1]).tolist()
    physical = (row["cu_seqlens_q_padded"][1:] - row["cu_seqlens_q_padded"][:-1]).tolist()
    assert sum(p > n for n, p in zip(lengths, physical)) >= 2, (lengths, physical)  # gaps and the tail

    unpacked = [unpacked_logits(model, ref) for ref in packed.references]
    for case, got, expected in zip(TEXT_CASES, split_logits(packed_logits(model, row), row), unpacked):
        torch.testing.assert_close(got, expected, atol=ATOL, rtol=0, msg=lambda m, k=case.key: f"{k}: {m}")

    causal = torch.full((seq_length, seq_length), torch.finfo(torch.float32).min).triu(1)[None, None]
    leaky = split_logits(packed_logits(model, row, attention_mask=causal), row)
    for got, expected in zip(leaky[1:], unpacked[1:]):
        assert (got - expected).abs().max().item() > 100 * ATOL
