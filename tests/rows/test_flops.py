"""The row cost model (energon_pack.rows.flops): formulas, config parsing, and the FlopCounterMode oracle."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from energon_pack.rows.flops import (
    PRESETS,
    CostModel,
    grid_rows,
    media_flops,
    model_spec,
    row_constant,
    row_flops,
    sample_flops,
    segment_attention_flops,
    token_flops,
    window_groups,
)
from tests.support.flop_oracle import Segment, counted_row_flops, tiny_config, tiny_model


def test_docstring_examples() -> None:
    spec = model_spec("qwen2.5-vl-7b")
    assert spec.text.num_layers == 28
    assert token_flops(spec, training=False) == 14_140_571_648
    assert segment_attention_flops(spec, 1000, training=False, causal_fraction=1) == 401_408_000_000
    assert window_groups(20, 20, spec.vision) == [64, 64, 32, 64, 64, 32, 32, 32, 16]
    assert media_flops(spec, (1, 32, 32)).total == pytest.approx(4.04e12, rel=0.01)
    row = row_flops(spec, [1000], training=False, causal_fraction=1)
    assert row.text_linear + row.lm_head == 1000 * 14_140_571_648
    assert sample_flops(spec, 1000) == 602_112_000_000
    assert row_constant(spec, 2) == 84_843_429_888
    assert CostModel.of("qwen2.5-vl-7b").sample(1000, []) == 602_112_000_000
    assert grid_rows(np.array([[1, 4, 6]]), None, torch.tensor([[2, 8, 8]])) == [(1, 4, 6), (2, 8, 8)]


def test_fixed_width_row_is_constant_plus_its_samples() -> None:
    spec = model_spec("qwen3-vl-8b")
    grids = [(1, 16, 20), (4, 8, 8)]
    row = row_flops(spec, [300, 200], grids, width=1024)
    assert row.total == row_constant(spec, 1024) + sample_flops(spec, 300, grids) + sample_flops(spec, 200)


def test_presets_active_parameters() -> None:
    """Forward FLOPs per token / 2 ~= active parameters (embedding excluded, LM head included)."""
    billions = {name: token_flops(model_spec(name), training=False) / 2e9 for name in PRESETS}
    assert billions["qwen2.5-vl-7b"] == pytest.approx(7.07, abs=0.05)
    assert billions["qwen2.5-vl-72b"] == pytest.approx(71.5, abs=0.5)
    assert billions["qwen3-vl-30b-a3b"] == pytest.approx(3.0, abs=0.1)  # "A3B": ~3B active
    assert billions["qwen2.5-vl-3b"] < billions["qwen3-vl-8b"]


@settings(max_examples=40, deadline=None)
@given(h=st.integers(1, 40).map(lambda x: 2 * x), w=st.integers(1, 40).map(lambda x: 2 * x))
def test_window_groups_match_hf(h: int, w: int) -> None:
    from transformers.vision_utils import get_vision_window_index

    spec = model_spec("qwen2.5-vl-7b").vision
    _, cu = get_vision_window_index(torch.tensor([[1, h, w]]), spatial_merge_size=2, window_size=112, patch_size=14)
    assert (cu[1:] - cu[:-1]).tolist() == window_groups(h, w, spec)


def test_frozen_vision_is_forward_only_and_text_rows_unaffected() -> None:
    spec = model_spec("qwen3-vl-8b")
    assert media_flops(spec, (2, 16, 16), frozen_vision=True).total * 3 > media_flops(spec, (2, 16, 16)).total
    assert media_flops(spec, (2, 16, 16), frozen_vision=True) == media_flops(spec, (2, 16, 16), training=False)
    assert row_flops(spec, [500], frozen_vision=True) == row_flops(spec, [500])


def test_fixed_width_rows_pay_linears_for_gap_slots() -> None:
    spec = model_spec("qwen2-vl-7b")
    packed, fixed = row_flops(spec, [300, 200]), row_flops(spec, [300, 200], width=1024)
    assert fixed.text_attention == packed.text_attention
    assert fixed.text_linear == packed.text_linear * 1024 // 500
    with pytest.raises(ValueError, match="width=256"):
        row_flops(spec, [300], width=256)


def test_config_object_dict_and_preset_agree() -> None:
    from transformers import Qwen2_5_VLConfig

    preset = PRESETS["qwen2.5-vl-7b"]
    config = Qwen2_5_VLConfig(text_config=preset["text_config"], vision_config=preset["vision_config"])
    assert model_spec(config) == model_spec("qwen2.5-vl-7b") == model_spec(config.to_dict())


def test_unknown_model_names_the_presets() -> None:
    with pytest.raises(ValueError, match="qwen2.5-vl-7b"):
        model_spec("llama-7b")


# ------------------------------------------------------------------------ FlopCounterMode oracle

ROWS = {
    "text_only": [Segment(260), Segment(90), Segment(31)],
    "many_small_images": [Segment(40, images=[(1, 4, 4)] * 4), Segment(12, images=[(1, 6, 8), (1, 4, 6)])],
    "one_large_image": [Segment(30, images=[(1, 36, 28)]), Segment(50)],
    "video": [Segment(25, videos=[(3, 12, 16)]), Segment(20, images=[(1, 8, 8)])],
}


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl"], ids=["qwen2.5-vl", "qwen3-vl"])
def tiny(request):
    config = tiny_config(request.param)
    return request.param, model_spec(config), tiny_model(config)


def _assert_counted(family: str, model, config, row, **kwargs) -> None:
    counted = counted_row_flops(model, row)["total"]
    modelled = row_flops(
        model_spec(config), [s.length(family) for s in row], [g for s in row for g in s.grids], causal_fraction=1, **kwargs
    )
    assert modelled.total == pytest.approx(counted, rel=0.05), (modelled, counted)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ROWS))
def test_row_flops_match_flop_counter(tiny, name: str) -> None:
    """Modelled fwd+bwd FLOPs (counter convention: full attention squares) within 5% of the
    counted FLOPs of the row's segments run alone (what a varlen kernel does)."""
    family, spec, model = tiny
    _assert_counted(family, model, model.config, ROWS[name])


def test_an_moe_layer_costs_router_active_and_shared_experts_and_a_dense_model_has_none() -> None:
    from energon_pack.rows.flops import MoESpec, model_spec

    moe = MoESpec(num_experts=8, experts_per_token=2, intermediate_size=32, shared_intermediate_size=16)
    assert moe.mlp_flops(64) == 2 * 64 * 8 + 2 * 6 * 64 * 32 + 6 * 64 * 16
    assert model_spec("qwen2.5-vl-7b").text.moe is None
    assert model_spec("qwen3-vl-30b-a3b").text.moe.layers == tuple(range(48))


@pytest.mark.slow
def test_moe_row_matches_flop_counter() -> None:
    """Qwen3-VL-MoE: router plus the k active experts per token (a row with text, an image and a video)."""
    config = tiny_config("qwen3_vl", moe=True)
    _assert_counted("qwen3_vl", tiny_model(config), config, ROWS["video"])


@pytest.mark.slow
def test_frozen_vision_matches_flop_counter() -> None:
    config = tiny_config("qwen2_5_vl")
    _assert_counted("qwen2_5_vl", tiny_model(config, frozen_vision=True), config, ROWS["one_large_image"], frozen_vision=True)
