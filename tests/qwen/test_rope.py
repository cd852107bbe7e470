"""energon_pack.qwen.rope against the Hugging Face models' own get_rope_index (the installed transformers).

Qwen2.5-VL video time differs between supported releases (whole seconds before 5.18): both rules
are pinned by golden values here, and the installed release's rule is compared with its model.
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import (
    Qwen2_5_VLConfig,
    Qwen2VLConfig,
    Qwen3_5Config,
    Qwen3_5MoeConfig,
    Qwen3VLConfig,
    Qwen3VLMoeConfig,
)
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5Model
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel
from transformers.processing_utils import ProcessorMixin

from energon_pack.qwen.hf_release import INSTALLED_TRANSFORMERS, qwen25_rope_whole_seconds
from energon_pack.qwen.rope import RopeSpec, mrope_position_ids

IMAGE, VIDEO, VISION_START, VISION_END = 151655, 151656, 151652, 151653
MERGE = 2

_TINY_TEXT = dict(
    vocab_size=64,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=8,
    bos_token_id=None,
    eos_token_id=None,
)
_TINY_VISION = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=16)


def _hf_model(family: str, tokens_per_second: int | None = None) -> torch.nn.Module:
    """A tiny randomly initialised HF VL model; only its get_rope_index is used."""
    if family == "qwen2-vl":
        vision = dict(depth=1, embed_dim=16, num_heads=2, hidden_size=16)
        return Qwen2VLModel(Qwen2VLConfig(text_config=_TINY_TEXT, vision_config=vision))
    if family == "qwen2.5-vl":
        vision = dict(_TINY_VISION, tokens_per_second=tokens_per_second)
        return Qwen2_5_VLModel(Qwen2_5_VLConfig(text_config=_TINY_TEXT, vision_config=vision))
    if family == "qwen3.5":
        return Qwen3_5Model(Qwen3_5Config(text_config=_TINY_TEXT, vision_config=_TINY_VISION))
    vision = dict(_TINY_VISION, deepstack_visual_indexes=[])
    return Qwen3VLModel(Qwen3VLConfig(text_config=_TINY_TEXT, vision_config=vision))


@pytest.fixture(scope="module")
def hf_models() -> dict[tuple[str, int | None], torch.nn.Module]:
    return {
        ("qwen2-vl", None): _hf_model("qwen2-vl"),
        ("qwen2.5-vl", 2): _hf_model("qwen2.5-vl", 2),
        ("qwen2.5-vl", 4): _hf_model("qwen2.5-vl", 4),
        ("qwen3-vl", None): _hf_model("qwen3-vl"),
        ("qwen3.5", None): _hf_model("qwen3.5"),
    }


def _hf_mm_token_type_ids(input_ids: torch.Tensor) -> torch.Tensor:
    """mm_token_type_ids exactly as the Qwen-VL processors build them (HF's own function)."""
    processor_ids = types.SimpleNamespace(
        image_token_ids=[IMAGE], video_token_ids=[VIDEO], audio_token_ids=[None]
    )
    return torch.tensor(ProcessorMixin.create_mm_token_type_ids(processor_ids, [input_ids.tolist()]))


@dataclass
class Sample:
    input_ids: torch.Tensor
    image_grid_thw: torch.Tensor | None
    video_grid_thw: torch.Tensor | None
    second_per_grid_ts: list[float] | None = None


def _hf_positions(model: torch.nn.Module, sample: Sample) -> torch.Tensor:
    """HF get_rope_index for one unbatched sample, inputs shaped as the processor returns them."""
    seconds = None if sample.second_per_grid_ts is None else torch.tensor(sample.second_per_grid_ts)
    positions, _ = model.get_rope_index(
        sample.input_ids[None],
        mm_token_type_ids=_hf_mm_token_type_ids(sample.input_ids),
        image_grid_thw=None if sample.image_grid_thw is None else sample.image_grid_thw.clone(),
        video_grid_thw=None if sample.video_grid_thw is None else sample.video_grid_thw.clone(),
        second_per_grid_ts=seconds,
    )
    return positions[:, 0]


def _ours(sample: Sample, spec: RopeSpec) -> torch.Tensor:
    return mrope_position_ids(
        sample.input_ids,
        spec=spec,
        image_grid_thw=sample.image_grid_thw,
        video_grid_thw=sample.video_grid_thw,
        second_per_grid_ts=sample.second_per_grid_ts,
    )


@st.composite
def samples(draw: st.DrawFn, family: str) -> Sample:
    """Chat-like token sequences: text runs, images and videos wrapped in vision_start/end, any order.

    Qwen3-VL videos are one vision_start..vision_end block per temporal grid step, each after
    a short timestamp text, as its processor expands them.
    """
    text = st.lists(st.integers(0, 151000), max_size=5)
    side = st.integers(1, 6).map(lambda k: k * MERGE)
    media = draw(
        st.lists(
            st.one_of(
                st.tuples(st.just("image"), st.just(1), side, side),
                st.tuples(st.just("video"), st.integers(1, 4), side, side),
            ),
            max_size=5,
        )
    )
    ids: list[int] = draw(st.lists(st.integers(0, 151000), min_size=1, max_size=5))  # HF needs L >= 1
    images, videos = [], []
    for kind, t, h, w in media:
        tokens_per_step = (h // MERGE) * (w // MERGE)
        if kind == "image":
            images.append((t, h, w))
            ids += [VISION_START, *[IMAGE] * t * tokens_per_step, VISION_END]
        elif family == "qwen3-vl":
            videos.append((t, h, w))
            for _ in range(t):
                ids += draw(st.lists(st.integers(0, 151000), min_size=1, max_size=3))  # timestamp
                ids += [VISION_START, *[VIDEO] * tokens_per_step, VISION_END]
        else:
            videos.append((t, h, w))
            ids += [VISION_START, *[VIDEO] * t * tokens_per_step, VISION_END]
        ids += draw(text)
    seconds = None
    if videos and draw(st.booleans()):
        fps = st.floats(0.1, 10.0) | st.sampled_from([2.0, 3.0, 4.0, 30000 / 1001, 1 / 3])
        seconds = [2.0 / draw(fps) for _ in videos]
    return Sample(
        input_ids=torch.tensor(ids, dtype=torch.long),
        image_grid_thw=torch.tensor(images, dtype=torch.long).reshape(-1, 3) if images else None,
        video_grid_thw=torch.tensor(videos, dtype=torch.long).reshape(-1, 3) if videos else None,
        second_per_grid_ts=seconds,
    )


_HF_SETTINGS = settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@_HF_SETTINGS
@given(sample=samples("qwen2-vl"))
def test_matches_hf_qwen2_vl(hf_models, sample: Sample) -> None:
    expected = _hf_positions(hf_models["qwen2-vl", None], sample)
    assert torch.equal(_ours(sample, RopeSpec(family="qwen2-vl")), expected)


@_HF_SETTINGS
@given(sample=samples("qwen2.5-vl"), tokens_per_second=st.sampled_from([2, 4]))
def test_matches_hf_qwen2_5_vl(hf_models, sample: Sample, tokens_per_second: int) -> None:
    expected = _hf_positions(hf_models["qwen2.5-vl", tokens_per_second], sample)
    spec = RopeSpec(family="qwen2.5-vl", tokens_per_second=tokens_per_second)
    assert torch.equal(_ours(sample, spec), expected)


@pytest.mark.parametrize("family", ["qwen3-vl", "qwen3.5"])
@_HF_SETTINGS
@given(sample=samples("qwen3-vl"))
def test_matches_hf_qwen3_vl(hf_models, family: str, sample: Sample) -> None:
    """Qwen3.5's get_rope_index (transformers' Qwen3_5Model) follows Qwen3-VL's rule: one block per frame."""
    expected = _hf_positions(hf_models[family, None], sample)
    assert torch.equal(_ours(sample, RopeSpec(family=family)), expected)


def test_second_per_grid_ts_as_tensor_or_list_is_the_same(hf_models) -> None:
    ids = torch.tensor([7, VISION_START, *[VIDEO] * 4, VISION_END, 8])
    sample = Sample(ids, None, torch.tensor([[4, 2, 2]]), [0.7])
    spec = RopeSpec(family="qwen2.5-vl", tokens_per_second=2)
    as_tensor = mrope_position_ids(
        ids, spec=spec, video_grid_thw=sample.video_grid_thw, second_per_grid_ts=torch.tensor([0.7])
    )
    assert torch.equal(as_tensor, _ours(sample, spec))
    assert torch.equal(as_tensor, _hf_positions(hf_models["qwen2.5-vl", 2], sample))


def test_docstring_example() -> None:
    ids = torch.tensor([5, 6, IMAGE, IMAGE, IMAGE, IMAGE, 7])
    spec = RopeSpec(family="qwen2-vl")
    positions = mrope_position_ids(ids, spec=spec, image_grid_thw=torch.tensor([[1, 4, 4]]))
    assert positions.dtype == torch.long
    assert positions.tolist() == [[0, 1, 2, 2, 2, 2, 4], [0, 1, 2, 2, 3, 3, 4], [0, 1, 2, 3, 2, 3, 4]]


def test_text_only_is_arange_on_all_rows() -> None:
    ids = torch.arange(100, 109)
    for spec in (RopeSpec(family="qwen2-vl"), RopeSpec(family="qwen2.5-vl", tokens_per_second=2)):
        assert torch.equal(mrope_position_ids(ids, spec=spec), torch.arange(9).expand(3, 9))


def test_qwen2_5_video_time_scaling_golden(hf_models) -> None:
    """Grid (3, 2, 2): 3 tokens; 1 s per grid step at 2 tokens/s -> temporal steps of 2.

    The text after the video continues at start + max(gh, gw) = 2 + 1 (as transformers does),
    below the video's last temporal position 6.
    """
    ids = torch.tensor([10, VISION_START, VIDEO, VIDEO, VIDEO, VISION_END, 11])
    sample = Sample(ids, None, torch.tensor([[3, 2, 2]]), [1.0])
    expected = [[0, 1, 2, 4, 6, 3, 4], [0, 1, 2, 2, 2, 3, 4], [0, 1, 2, 2, 2, 3, 4]]
    assert _ours(sample, RopeSpec(family="qwen2.5-vl", tokens_per_second=2)).tolist() == expected
    assert _hf_positions(hf_models["qwen2.5-vl", 2], sample).tolist() == expected


def test_tokens_per_second_changes_video_time_as_hf(hf_models) -> None:
    ids = torch.tensor([10, VISION_START, *[VIDEO] * 16, VISION_END, IMAGE, IMAGE])
    sample = Sample(ids, torch.tensor([[1, 2, 4]]), torch.tensor([[4, 4, 4]]), [1.5])
    by_rate = {}
    for rate in (2, 4):
        by_rate[rate] = _ours(sample, RopeSpec(family="qwen2.5-vl", tokens_per_second=rate))
        assert torch.equal(by_rate[rate], _hf_positions(hf_models["qwen2.5-vl", rate], sample))
    video = slice(2, 18)
    whole = qwen25_rope_whole_seconds()
    assert by_rate[2][0, video].unique().tolist() == ([2, 4, 6, 8] if whole else [2, 5, 8, 11])
    assert by_rate[4][0, video].unique().tolist() == ([2, 6, 10, 14] if whole else [2, 8, 14, 20])
    assert torch.equal(by_rate[2][1:], by_rate[4][1:])  # height/width rows do not depend on time
    assert torch.equal(by_rate[2][:, 18:], by_rate[4][:, 18:])


@pytest.mark.parametrize(("whole_seconds", "expected"), [(True, [2, 2, 2]), (False, [2, 3, 4])])
def test_qwen2_5_half_second_steps_under_both_rules(whole_seconds: bool, expected: list[int]) -> None:
    """0.5 s per grid step at 2 tokens/s: transformers < 5.18 truncates to 0 s, later releases keep it."""
    ids = torch.tensor([10, VISION_START, VIDEO, VIDEO, VIDEO])
    sample = Sample(ids, None, torch.tensor([[3, 2, 2]]), [0.5])
    spec = RopeSpec(family="qwen2.5-vl", tokens_per_second=2, whole_seconds=whole_seconds)
    assert _ours(sample, spec)[0, 2:].tolist() == expected


def test_qwen2_5_rule_follows_the_installed_transformers(hf_models) -> None:
    spec = RopeSpec(family="qwen2.5-vl", tokens_per_second=2)
    assert spec.whole_seconds is (INSTALLED_TRANSFORMERS.release < (5, 18))
    assert RopeSpec.from_model_config(Qwen2_5_VLConfig(vision_config={"tokens_per_second": 2})) == spec
    sample = Sample(torch.tensor([VIDEO] * 3), None, torch.tensor([[3, 2, 2]]), [0.5])
    assert torch.equal(_ours(sample, spec), _hf_positions(hf_models["qwen2.5-vl", 2], sample))


def test_qwen2_5_time_truncation_uses_float32_like_the_processor_output(hf_models) -> None:
    """0.4999999999 s is 0.5 in float32: steps 0, 1, 2 (exact float64 math would give 0, 0, 1)."""
    ids = torch.tensor([VIDEO] * 3)
    sample = Sample(ids, None, torch.tensor([[3, 2, 2]]), [0.4999999999])
    fractional = _ours(sample, RopeSpec(family="qwen2.5-vl", tokens_per_second=2, whole_seconds=False))
    assert fractional[0].tolist() == [0, 1, 2]
    positions = _ours(sample, RopeSpec(family="qwen2.5-vl", tokens_per_second=2))
    assert torch.equal(positions, _hf_positions(hf_models["qwen2.5-vl", 2], sample))


def test_qwen3_video_frames_are_separate_blocks_golden(hf_models) -> None:
    """Video grid (2, 4, 4): two frames of 2x2 tokens, each after a timestamp token."""
    frame = [VISION_START, VIDEO, VIDEO, VIDEO, VIDEO, VISION_END]
    sample = Sample(torch.tensor([9, *frame, 9, *frame]), None, torch.tensor([[2, 4, 4]]))
    expected = [
        [0, 1, 2, 2, 2, 2, 4, 5, 6, 7, 7, 7, 7, 9],
        [0, 1, 2, 2, 3, 3, 4, 5, 6, 7, 7, 8, 8, 9],
        [0, 1, 2, 3, 2, 3, 4, 5, 6, 7, 8, 7, 8, 9],
    ]
    for family in ("qwen3-vl", "qwen3.5"):
        assert _ours(sample, RopeSpec(family=family)).tolist() == expected
        assert _hf_positions(hf_models[family, None], sample).tolist() == expected


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (Qwen2VLConfig(), RopeSpec(family="qwen2-vl")),
        (
            Qwen2_5_VLConfig(vision_config={"tokens_per_second": 2}),
            RopeSpec(family="qwen2.5-vl", tokens_per_second=2),
        ),
        (
            Qwen3VLConfig(vision_config={"spatial_merge_size": 1}),
            RopeSpec(family="qwen3-vl", spatial_merge_size=1),
        ),
        (Qwen3VLMoeConfig(), RopeSpec(family="qwen3-vl")),
        (Qwen3_5Config(), RopeSpec(family="qwen3.5", image_token_id=248056, video_token_id=248057)),
        (Qwen3_5MoeConfig(), RopeSpec(family="qwen3.5", image_token_id=248056, video_token_id=248057)),
    ],
)
def test_from_model_config(config, expected: RopeSpec) -> None:
    assert RopeSpec.from_model_config(config) == expected


def test_from_model_config_rejects_other_models() -> None:
    with pytest.raises(ValueError, match="model_type='qwen2'"):
        RopeSpec.from_model_config(types.SimpleNamespace(model_type="qwen2"))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"family": "qwen2.5-vl"}, "tokens_per_second=None"),
        ({"family": "qwen3-vl", "tokens_per_second": 2}, "no effect"),
        ({"family": "qwen3.5", "whole_seconds": False}, "no effect"),
        ({"family": "qwen2-vl", "whole_seconds": True}, "whole_seconds=True has no effect"),
        ({"family": "qwen2-vl", "spatial_merge_size": 0}, "spatial_merge_size=0"),
        ({"family": "llava"}, "family='llava'"),
        ({"family": "qwen2-vl", "video_token_id": IMAGE}, "must differ"),
    ],
)
def test_spec_validation(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RopeSpec(**kwargs)


_Q2 = RopeSpec(family="qwen2-vl")


def _grids(*rows: tuple[int, int, int]) -> torch.Tensor:
    return torch.tensor(rows).reshape(-1, 3)


@pytest.mark.parametrize(
    ("spec", "ids", "call", "message"),
    [
        (_Q2, [[1, 2]], {}, r"shape \(1, 2\)"),
        (_Q2, [1, IMAGE, 2], {}, "no grid left"),
        (_Q2, [1, IMAGE, 2, IMAGE], {"image_grid_thw": _grids((1, 2, 2))}, "no grid left"),
        (_Q2, [1, 2], {"image_grid_thw": _grids((1, 2, 2))}, "1 image blocks"),
        (_Q2, [IMAGE] * 3, {"image_grid_thw": _grids((1, 2, 4))}, "has 3 tokens"),
        (_Q2, [IMAGE], {"image_grid_thw": _grids((1, 2, 3))}, r"\(1, 2, 3\)"),
        (_Q2, [IMAGE], {"image_grid_thw": torch.tensor([1, 2, 2])}, r"shape \(3,\)"),
        (
            RopeSpec(family="qwen2.5-vl", tokens_per_second=2),
            [VIDEO],
            {"video_grid_thw": _grids((1, 2, 2)), "second_per_grid_ts": [1.0, 2.0]},
            "2 values",
        ),
        (RopeSpec(family="qwen3-vl"), [VIDEO, VIDEO], {"video_grid_thw": _grids((2, 2, 2))}, "has 2 tokens"),
    ],
)
def test_mismatched_inputs_are_rejected(spec: RopeSpec, ids: list, call: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        mrope_position_ids(torch.tensor(ids), spec=spec, **call)
