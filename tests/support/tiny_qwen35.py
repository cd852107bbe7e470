"""Test helpers: a tiny random Hugging Face Qwen3.5 (hybrid Gated DeltaNet + gated attention) and a
segment-wise reference for its linear-attention layers.

transformers' CPU Gated DeltaNet (torch ``causal_conv1d`` and ``torch_chunk_gated_delta_rule``
fallbacks) cannot keep packed sequences apart: over a packed row its causal conv and its recurrent
state run straight through segment boundaries. :func:`segmented_linear_attention` reruns every
linear-attention layer segment by segment along a row's ``cu_seqlens_q_padded`` - fresh conv window
and zero recurrent state at every boundary - which is what a varlen kernel does (FLA's
``causal_conv1d`` and ``chunk_gated_delta_rule`` with ``cu_seqlens``, as Megatron-Core's
GatedDeltaNet calls them; docs/qwen35.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet

from tests.support.tiny_qwen import random_model

#: Smallest multiple of 64 holding every Qwen3.5 special token id (last: 248076).
TINY_QWEN35_VOCAB = 248128
#: Three linear-attention layers, then one full-attention layer (the released 3:1 pattern).
HYBRID_LAYERS = ("linear_attention", "linear_attention", "linear_attention", "full_attention")
FULL_LAYERS = ("full_attention",) * 4


def tiny_qwen35(
    layer_types: Sequence[str] = HYBRID_LAYERS, *, seed: int = 0, initializer_range: float = 0.1
) -> Qwen3_5ForConditionalGeneration:
    """A random-weight Qwen3.5 on CPU: float32, eval, eager attention, fixed ``seed``.

    Text: ``len(layer_types)`` layers of width 64; gated attention 4 query / 2 kv heads of dim 16,
    interleaved M-RoPE sections [2, 3, 3] over the full head (every axis rotates some channels);
    Gated DeltaNet 2 key / 4 value heads of dim 16, conv kernel 4. Vision: 1 block of width 32,
    patch 16, temporal patch 2, merge 2. The global torch RNG is left untouched.
    """
    config = Qwen3_5Config(
        text_config=dict(
            vocab_size=TINY_QWEN35_VOCAB,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=len(layer_types),
            layer_types=list(layer_types),
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            linear_conv_kernel_dim=4,
            rope_parameters=dict(
                rope_type="default", rope_theta=10000.0, mrope_section=[2, 3, 3], mrope_interleaved=True,
                partial_rotary_factor=1.0,
            ),
            initializer_range=initializer_range,
        ),
        vision_config=dict(
            depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=16,
            temporal_patch_size=2, spatial_merge_size=2, initializer_range=initializer_range,
        ),
        tie_word_embeddings=True,
    )
    return random_model(Qwen3_5ForConditionalGeneration, config, seed=seed)


def segment_bounds(cu_seqlens_padded: torch.Tensor) -> list[tuple[int, int]]:
    """(start, end) of each non-empty physical segment of a row.

    Example: ``[0, 8, 8, 12]`` -> ``[(0, 8), (8, 12)]`` (a repeated value is an empty segment).
    """
    cu = cu_seqlens_padded.tolist()
    return [(a, b) for a, b in zip(cu[:-1], cu[1:]) if b > a]


@contextlib.contextmanager
def segmented_linear_attention(cu_seqlens_padded: torch.Tensor, width: int) -> Iterator[None]:
    """Within the block, every ``Qwen3_5GatedDeltaNet`` runs once per physical segment of a
    [1, ``width``] row (``cu_seqlens_padded[-1]`` must be ``width``, as energon_pack rows have it),
    with no cache and no mask, so no conv window and no recurrent state crosses a boundary. Gap
    tokens ride with their segment; they come after its real tokens, so they cannot affect them.
    """
    bounds = segment_bounds(cu_seqlens_padded)
    if not bounds or bounds[0][0] != 0 or bounds[-1][1] != width:
        raise ValueError(
            f"cu_seqlens_padded={cu_seqlens_padded.tolist()} does not tile a row of width {width}; "
            "pass the row's cu_seqlens_q_padded (its last value is the row width)"
        )
    original = Qwen3_5GatedDeltaNet.forward

    def forward(self, hidden_states, cache=None, attention_mask=None, **kwargs):
        if hidden_states.shape[:2] != (1, width):
            raise ValueError(f"hidden_states {tuple(hidden_states.shape)} is not one row of width {width}")
        pieces = [original(self, hidden_states[:, a:b], cache=None, attention_mask=None, **kwargs) for a, b in bounds]
        return torch.cat(pieces, dim=1)

    Qwen3_5GatedDeltaNet.forward = forward
    try:
        yield
    finally:
        Qwen3_5GatedDeltaNet.forward = original
