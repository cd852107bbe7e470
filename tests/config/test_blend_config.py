"""Blend settings of the packing policy: YAML form, validation with the fix, fingerprint only when set."""

from __future__ import annotations

import pytest
import yaml

from energon_pack import PackingConfig
from energon_pack.config.blend import BlendPoint, schedule_size_problem, weights_problem

SCHEDULE = [{"step": 0, "weights": [0.9, 0.1]}, {"step": 100, "weights": [0.1, 0.9]}]


def test_a_schedule_round_trips_through_yaml():
    config = PackingConfig(seq_length=8192, blend_unit="tokens", blend_schedule=SCHEDULE, blend_schedule_mode="linear")
    assert config.policy.blend_schedule == (BlendPoint(step=0, weights=(0.9, 0.1)), BlendPoint(step=100, weights=(0.1, 0.9)))
    assert PackingConfig.from_dict(yaml.safe_load(config.to_yaml())) == config


def test_blend_settings_enter_the_fingerprint_only_when_set():
    plain = PackingConfig(seq_length=8192).fingerprint()
    assert not {"blend_unit", "blend_schedule", "blend_schedule_mode", "micro_batches_per_step"} & set(plain)
    tokens = PackingConfig(seq_length=8192, blend_unit="tokens").fingerprint()
    assert tokens == {**plain, "blend_unit": "tokens"}
    scheduled = PackingConfig(seq_length=8192, blend_schedule=SCHEDULE, micro_batches_per_step=4).fingerprint()
    assert scheduled["blend_schedule"] == SCHEDULE and scheduled["micro_batches_per_step"] == 4


@pytest.mark.parametrize("overrides, words", [
    ({"blend_unit": "tokenz"}, "blend_unit='tokenz': must be one of"),
    ({"blend_schedule_mode": "cosine"}, "blend_schedule_mode='cosine'"),
    ({"blend_schedule": []}, "must be a non-empty list"),
    ({"blend_schedule": [{"step": 10, "weights": [1, 1]}]}, "first point is at step 10"),
    ({"blend_schedule": [{"step": 0, "weights": [1, 1]}, {"step": 0, "weights": [1, 2]}]}, "steps must increase"),
    ({"blend_schedule": [{"step": 0, "weights": [1, 1]}, {"step": 5, "weights": [1]}]}, "every point needs one weight"),
    ({"blend_schedule": [{"step": 0, "weights": [1, -2]}]}, "is negative"),
    ({"blend_schedule": [{"step": 0, "weights": [0, 0]}]}, "all weights are 0"),
    ({"blend_schedule": [{"step": 0, "weights": [float("nan"), 1]}]}, "not a finite number"),
    ({"blend_schedule": [{"step": -1, "weights": [1]}]}, "must be an integer >= 0"),
    ({"blend_schedule": [{"weights": [1]}]}, "not a mapping of step and weights"),
])
def test_bad_blend_settings_name_the_value_the_rule_and_the_fix(overrides, words):
    with pytest.raises(ValueError, match="fix") as err:
        PackingConfig(seq_length=8192, **overrides)
    assert words in str(err.value)


def test_weight_and_size_rules():
    assert weights_problem("w", [0.6, 0.4]) is None
    assert "True" in weights_problem("w", [True, 1])
    points = (BlendPoint(step=0, weights=(1.0, 1.0)),)
    assert schedule_size_problem(points, 2) is None
    assert "blends 3 datasets" in schedule_size_problem(points, 3)
