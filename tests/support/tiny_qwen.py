"""Test helpers: a tiny random-weight Hugging Face Qwen2.5-VL and THD-row attention helpers.

The model is small (2 text layers of width 64, a 2-block vision tower) but keeps the real
Qwen vocabulary size, so the offline processor's token ids (``<|video_pad|>`` = 151656) are valid.
Weights are drawn with ``initializer_range=0.1``: with the usual 0.02 the attention logits are
so flat that moving a token's rope position changes the output logits by only ~1e-4, which
would leave an ``atol=1e-4`` oracle unable to see a wrong position.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

#: Smallest vocabulary size (rounded up to 64) that holds every Qwen special token id (last: 151668).
TINY_VOCAB_SIZE = 151680


def tiny_qwen25_vl(*, seed: int = 0, initializer_range: float = 0.1) -> Qwen2_5_VLForConditionalGeneration:
    """A random-weight Qwen2.5-VL on CPU: float32, eval mode, eager attention, fixed ``seed``.

    Text: 2 layers, hidden 64, 4 query / 2 key-value heads of dim 16, M-RoPE sections [2, 3, 3]
    (every rope axis - temporal, height, width - rotates some channels). Vision: 2 blocks of
    width 32, patch 14, temporal patch 2, merge 2, window 56 px (block 0 windowed, block 1 full
    attention), ``tokens_per_second=2`` as in the released checkpoints. The global torch RNG
    is left untouched.
    """
    config = Qwen2_5_VLConfig(
        text_config=tiny_text_config(initializer_range),
        vision_config=dict(
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=64,
            patch_size=14,
            temporal_patch_size=2,
            spatial_merge_size=2,
            tokens_per_second=2,
            window_size=56,
            fullatt_block_indexes=[1],
            initializer_range=initializer_range,
        ),
        image_token_id=151655,
        video_token_id=151656,
        vision_start_token_id=151652,
        tie_word_embeddings=True,
        initializer_range=initializer_range,
    )
    return random_model(Qwen2_5_VLForConditionalGeneration, config, seed=seed)


def tiny_text_config(initializer_range: float) -> dict[str, Any]:
    """The tiny text model of the Qwen2.5 oracles (VL and Omni): 2 layers of width 64, 4 query /
    2 key-value heads of dim 16, M-RoPE sections [2, 3, 3], the real vocabulary size."""
    return dict(
        vocab_size=TINY_VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[2, 3, 3]),
        initializer_range=initializer_range,
    )


def random_model(model_class: Any, config: Any, *, seed: int) -> Any:
    """``model_class(config)`` with eager attention, weights drawn from ``seed`` (the global torch
    RNG left untouched), float32, in eval mode."""
    config._attn_implementation = "eager"
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = model_class(config)
    return model.to(torch.float32).eval()


def _segments(cu_seqlens: torch.Tensor, cu_seqlens_padded: torch.Tensor) -> list[tuple[int, int]]:
    """(physical start, real length) of each segment; zero-length padding entries are dropped.

    Example: cu_seqlens [0, 2, 3], cu_seqlens_padded [0, 4, 8] -> [(0, 2), (4, 1)].
    """
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    return [(start, n) for start, n in zip(cu_seqlens_padded[:-1].tolist(), lengths) if n > 0]


def real_token_positions(cu_seqlens: torch.Tensor, cu_seqlens_padded: torch.Tensor) -> torch.Tensor:
    """Row positions (int64 [sum of real lengths]) of every segment's real tokens, in row order.

    Example: cu_seqlens [0, 2, 3], cu_seqlens_padded [0, 4, 8] -> [0, 1, 4].
    """
    spans = [torch.arange(start, start + n) for start, n in _segments(cu_seqlens, cu_seqlens_padded)]
    return torch.cat(spans) if spans else torch.zeros(0, dtype=torch.int64)


def thd_attention_bias(cu_seqlens: torch.Tensor, cu_seqlens_padded: torch.Tensor, width: int) -> torch.Tensor:
    """Additive float32 attention mask [1, 1, W, W] equivalent to THD attention over one row.

    A real token attends causally to the real tokens of its own segment only (what Transformer
    Engine does with ``cu_seqlens_q`` / ``cu_seqlens_q_padded``); a gap token attends to itself
    only, so its softmax row stays finite. Allowed entries are 0, the rest float32 min.

    Example: cu_seqlens [0, 2, 3], cu_seqlens_padded [0, 2, 4], W=4 -> allowed (query, key)
    pairs (0, 0), (1, 0), (1, 1), (2, 2) and the gap's (3, 3).
    """
    allowed = torch.eye(width, dtype=torch.bool)
    for start, n in _segments(cu_seqlens, cu_seqlens_padded):
        allowed[start : start + n, start : start + n] = torch.ones(n, n, dtype=torch.bool).tril()
    bias = torch.zeros(width, width, dtype=torch.float32)
    bias.masked_fill_(~allowed, torch.finfo(torch.float32).min)
    return bias[None, None]
