"""Test helpers: tiny random-weight Hugging Face Qwen-Omni thinkers on CPU.

Qwen2.5-Omni:

Text: 2 layers of width 64 (4 query / 2 key-value heads of dim 16, M-RoPE sections [2, 3, 3]),
the real Qwen vocabulary size so the offline processor's ids are valid. Vision: 2 blocks of width
32, patch 14, temporal patch 2, merge 2. Audio: 2 encoder layers of width 32, 128 mel bins,
``n_window`` 100 (as released). Weights drawn with ``initializer_range=0.1`` (see tiny_qwen).
"""

from __future__ import annotations

from typing import Any

from transformers import (
    Qwen2_5OmniThinkerConfig,
    Qwen2_5OmniThinkerForConditionalGeneration,
    Qwen3OmniMoeThinkerConfig,
    Qwen3OmniMoeThinkerForConditionalGeneration,
)

from tests.support.tiny_qwen import TINY_VOCAB_SIZE, random_model, tiny_text_config


def _tiny_vision(initializer_range: float, **family: Any) -> dict[str, Any]:
    """The tiny vision tower both thinkers share (2 blocks of width 32, temporal patch 2, merge 2)
    with the family's own options (patch size, windows or deepstack)."""
    return dict(
        depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, temporal_patch_size=2,
        spatial_merge_size=2, initializer_range=initializer_range, **family,
    )


def _tiny_audio(initializer_range: float, **family: Any) -> dict[str, Any]:
    """The tiny audio tower both thinkers share (2 layers of width 32, 128 mel bins) with the
    family's own options (``n_window``, Qwen3-Omni's convolution width)."""
    return dict(
        num_mel_bins=128, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64, d_model=32, output_dim=64,
        max_source_positions=1500, initializer_range=initializer_range, **family,
    )


def tiny_qwen25_omni_config(*, initializer_range: float = 0.1) -> Any:
    """The tiny thinker's ``Qwen2_5OmniThinkerConfig`` (released token ids and rope constants)."""
    config = Qwen2_5OmniThinkerConfig(
        text_config=tiny_text_config(initializer_range),
        vision_config=_tiny_vision(initializer_range, patch_size=14, window_size=56, fullatt_block_indexes=[1]),
        audio_config=_tiny_audio(initializer_range, n_window=100),
        initializer_range=initializer_range,
    )
    # transformers 5.24's thinker config has no field for it, get_rope_index reads it (the
    # released config.json sets it in thinker_config).
    config.vision_start_token_id = 151652
    return config


def tiny_qwen25_omni_thinker(*, seed: int = 0) -> Qwen2_5OmniThinkerForConditionalGeneration:
    """A random-weight Qwen2.5-Omni thinker: float32, eval mode, eager attention, fixed ``seed``."""
    return random_model(Qwen2_5OmniThinkerForConditionalGeneration, tiny_qwen25_omni_config(), seed=seed)


def tiny_qwen3_omni_config(*, initializer_range: float = 0.1) -> Any:
    """A tiny ``Qwen3OmniMoeThinkerConfig`` with the released token ids and rope constants
    (``position_id_per_seconds`` 13, ``<|audio_pad|>`` 151675, ``<|audio_start|>`` 151669, audio
    ``n_window`` 50). Text: a MoE of 2 layers of width 64 (4 query / 2 key-value heads of dim 16,
    4 experts, 2 per token, interleaved M-RoPE sections [2, 3, 3]); vision: 2 blocks of width 32,
    patch 16, temporal patch 2, merge 2, deepstack from block 0; audio: 2 layers of width 32."""
    config = Qwen3OmniMoeThinkerConfig(
        text_config=dict(
            vocab_size=TINY_VOCAB_SIZE, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=4,
            num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[],
            rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[2, 3, 3], mrope_interleaved=True),
            initializer_range=initializer_range,
        ),
        vision_config=_tiny_vision(initializer_range, patch_size=16, num_position_embeddings=64, deepstack_visual_indexes=[0]),
        audio_config=_tiny_audio(initializer_range, n_window=50, n_window_infer=800, downsample_hidden_size=16),
        position_id_per_seconds=13,
        audio_token_id=151675,
        audio_start_token_id=151669,
        initializer_range=initializer_range,
    )
    config.vision_start_token_id = 151652  # as for Qwen2.5-Omni: read by get_rope_index, no config field
    return config


def tiny_qwen3_omni_thinker(*, seed: int = 0) -> Qwen3OmniMoeThinkerForConditionalGeneration:
    """A random-weight Qwen3-Omni (MoE) thinker: float32, eval mode, eager attention, fixed ``seed``."""
    return random_model(Qwen3OmniMoeThinkerForConditionalGeneration, tiny_qwen3_omni_config(), seed=seed)
