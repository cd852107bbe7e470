"""Test helpers: a tiny random-weight Hugging Face Qwen2.5-Omni thinker on CPU.

Text: 2 layers of width 64 (4 query / 2 key-value heads of dim 16, M-RoPE sections [2, 3, 3]),
the real Qwen vocabulary size so the offline processor's ids are valid. Vision: 2 blocks of width
32, patch 14, temporal patch 2, merge 2. Audio: 2 encoder layers of width 32, 128 mel bins,
``n_window`` 100 (as released). Weights drawn with ``initializer_range=0.1`` (see tiny_qwen).
"""

from __future__ import annotations

from typing import Any

from transformers import Qwen2_5OmniThinkerConfig, Qwen2_5OmniThinkerForConditionalGeneration

from tests.support.tiny_qwen import random_model, tiny_text_config


def tiny_qwen25_omni_config(*, initializer_range: float = 0.1) -> Any:
    """The tiny thinker's ``Qwen2_5OmniThinkerConfig`` (released token ids and rope constants)."""
    config = Qwen2_5OmniThinkerConfig(
        text_config=tiny_text_config(initializer_range),
        vision_config=dict(
            depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=14,
            temporal_patch_size=2, spatial_merge_size=2, window_size=56, fullatt_block_indexes=[1],
            initializer_range=initializer_range,
        ),
        audio_config=dict(
            num_mel_bins=128, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64, d_model=32,
            output_dim=64, n_window=100, max_source_positions=1500, initializer_range=initializer_range,
        ),
        initializer_range=initializer_range,
    )
    # transformers 5.24's thinker config has no field for it, get_rope_index reads it (the
    # released config.json sets it in thinker_config).
    config.vision_start_token_id = 151652
    return config


def tiny_qwen25_omni_thinker(*, seed: int = 0) -> Qwen2_5OmniThinkerForConditionalGeneration:
    """A random-weight Qwen2.5-Omni thinker: float32, eval mode, eager attention, fixed ``seed``."""
    return random_model(Qwen2_5OmniThinkerForConditionalGeneration, tiny_qwen25_omni_config(), seed=seed)
