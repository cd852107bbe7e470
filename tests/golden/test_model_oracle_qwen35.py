"""Oracle for the hybrid Qwen3.5: a packed THD row (built by the plugin with the offline Qwen3.5
processor) through a tiny random ``Qwen3_5ForConditionalGeneration`` equals each sample run alone.

The row holds the Qwen2.5-VL oracle's five multimodal samples and a two-round text sample
(W=384, segments aligned to 8), built and compared as in tests/golden/test_model_oracle.py.

(a) Full-attention layers only: the row with explicit M-RoPE and the cu_seqlens block mask equals
    the unpacked runs, as for Qwen2.5-VL.
(b) Hybrid (3 Gated DeltaNet + 1 gated attention): with the linear-attention layers rerun segment by
    segment along ``cu_seqlens_q_padded`` (``segmented_linear_attention``, what varlen kernels do)
    the row equals the unpacked runs. Negative control: transformers' own CPU path leaks the conv
    window and the recurrent state across segments, so every segment after the first differs.
    Handed ``cu_seq_lens_q``, transformers 5.12.1 ignores it silently and 5.24 refuses it
    (``ValueError``: no flash-linear-attention); the test accepts either.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from energon_pack.qwen.processor import load_processor
from tests.support.model_oracle import MULTIMODAL_CASES, TEXT_CASES, pack_cases, packed_logits, split_logits, unpacked_logits
from tests.support.tiny_qwen35 import FULL_LAYERS, HYBRID_LAYERS, segmented_linear_attention, tiny_qwen35

# Slow: two tiny random-weight Qwen3.5 forwards per case.
pytestmark = pytest.mark.slow

ATOL = 1e-4
WIDTH, ALIGN = 384, 8
#: Few vision tokens: images and video clips within 32*32 .. 64*64*2 pixels.
MIN_PIXELS, MAX_PIXELS = 32 * 32, 64 * 64 * 2

#: The Qwen2.5-VL oracle's multimodal cases (one image, multi-turn text, a 4 fps video sampled at
#: 2 fps, two images, image and video) and a two-round text case.
CASES = [*MULTIMODAL_CASES, TEXT_CASES[2]]


@pytest.fixture(scope="module")
def packed() -> Any:
    processor = load_processor(family="qwen3.5", min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    packed = pack_cases(processor, CASES, seq_length=WIDTH, pad_to_multiple_of=ALIGN)
    cu_padded = packed.row["cu_seqlens_q_padded"]
    assert int(cu_padded[-1]) == WIDTH and torch.equal(packed.row["cu_seqlens_kv_padded"], cu_padded)
    return packed


def _errors(model: torch.nn.Module, packed: Any, alone: list[torch.Tensor], **overrides: Any) -> list[float]:
    """Max |packed - unpacked| logit error of each segment (``alone``: each sample's unpacked logits)."""
    rows = split_logits(packed_logits(model, packed.row, **overrides), packed.row)
    return [(got - expected).abs().max().item() for got, expected in zip(rows, alone)]


def _alone(model: torch.nn.Module, packed: Any) -> list[torch.Tensor]:
    return [unpacked_logits(model, reference) for reference in packed.references]


def test_full_attention_only_packed_equals_unpacked(packed):
    model = tiny_qwen35(FULL_LAYERS)
    errors = _errors(model, packed, _alone(model, packed))
    print(f"full attention: max |packed - unpacked| per segment {errors}")
    assert max(errors) <= ATOL, errors


def test_hybrid_segmented_reference_equals_unpacked_and_hf_cpu_path_does_not(packed):
    model = tiny_qwen35(HYBRID_LAYERS)
    alone = _alone(model, packed)
    with segmented_linear_attention(packed.row["cu_seqlens_q_padded"], WIDTH):
        segmented = _errors(model, packed, alone)
    print(f"hybrid, GDN per segment: max |packed - unpacked| per segment {segmented}")
    assert max(segmented) <= ATOL, segmented

    cu = packed.row["cu_seqlens_q_padded"]
    try:
        leaky = _errors(model, packed, alone, cu_seq_lens_q=cu, cu_seq_lens_k=cu)
    except ValueError as err:  # transformers 5.24: the torch fallback refuses packed sequences
        assert "packed sequences" in str(err), err
        leaky = _errors(model, packed, alone)
    print(f"hybrid, transformers' CPU path: max |packed - unpacked| per segment {leaky}")
    assert leaky[0] <= ATOL, leaky  # the first segment has nothing before it
    assert min(leaky[1:]) > 100 * ATOL, leaky
