"""Tests for energon_pack.config: validation, alignment multiple, YAML round-trip, fingerprints."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from energon_pack.config import (
    CONFIG_PARTS,
    LoaderOptions,
    PackingConfig,
    PackingPolicy,
    ParallelTopology,
    RowLayout,
    TrainerSettings,
    check_training_compat,
)
from energon_pack.identity import (
    ResumeMismatchError,
    check_resume_fingerprint,
    fingerprint_mismatches,
    packing_fingerprint,
)
from tests.support.paths import CONFIGS

CONFIG_DIR = CONFIGS
TP4_SP = ParallelTopology(tp=4, sp=True)


# --------------------------------------------------------------------------- invalid configs

INVALID_CONFIGS: list[tuple[dict[str, Any], str]] = [
    ({"seq_length": 0}, "seq_length"),
    ({"seq_length": -8192}, "seq_length"),
    ({"seq_length": "8192"}, "seq_length"),
    ({"seq_length": 8190, "topology": TP4_SP}, "seq_length"),
    ({"seq_length": 8196, "topology": ParallelTopology(tp=4, cp=2, sp=True)}, "seq_length"),
    ({"seq_length": 8192, "pad_to_multiple_of": 6, "topology": TP4_SP}, "pad_to_multiple_of"),
    ({"seq_length": 8192, "pad_to_multiple_of": 0}, "pad_to_multiple_of"),
    ({"seq_length": 8192, "pad_to_multiple_of": 24}, "seq_length"),
    ({"seq_length": 8192, "width_multiple": 3000}, "width_multiple"),
    ({"seq_length": 8192, "width_multiple": 0}, "width_multiple"),
    ({"seq_length": 8192, "pad_cu_seqlens": True}, "max_segments"),
    ({"seq_length": 8192, "pad_cu_seqlens": True, "max_segments": 8, "fixed_width": False}, "fixed_width"),
    ({"seq_length": 8192, "max_segments": 0}, "max_segments"),
    ({"seq_length": 8192, "fixed_width": "yes"}, "fixed_width"),
    ({"seq_length": 8192, "buffer_size": 0}, "buffer_size"),
    ({"seq_length": 8192, "buffer_size": 2.5}, "buffer_size"),
    ({"seq_length": 8192, "max_wait_rounds": -1}, "max_wait_rounds"),
    ({"seq_length": 8192, "min_fill": 0.0}, "min_fill"),
    ({"seq_length": 8192, "min_fill": 1.01}, "min_fill"),
    ({"seq_length": 8192, "min_fill": float("nan")}, "min_fill"),
    ({"seq_length": 8192, "min_fill": True}, "min_fill"),
    ({"seq_length": 8192, "on_overlong": "truncate"}, "on_overlong"),
    ({"seq_length": 8192, "max_row_vision_patches": 0}, "max_row_vision_patches"),
    ({"seq_length": 8192, "max_row_vision_patches": 1.5}, "max_row_vision_patches"),
    ({"seq_length": 8192, "max_row_media": 0}, "max_row_media"),
    ({"seq_length": 8192, "pixel_dtype": "bfloat16"}, "pixel_dtype"),
    ({"seq_length": 8192, "loss_reduction": "mean"}, "loss_reduction"),
    ({"seq_length": 8192, "num_workers": -1}, "num_workers"),
    ({"seq_length": 8192, "repeat": 1}, "repeat"),
    ({"seq_length": 8192, "shuffle_buffer_size": 0}, "shuffle_buffer_size"),
    ({"seq_length": 8192, "max_samples_per_sequence": 0}, "max_samples_per_sequence"),
    ({"seq_length": 8192, "seed": -1}, "seed"),
    ({"seq_length": 8192, "micro_batch_size": 2}, "micro_batch_size"),
    ({"seq_length": 8192, "mode": "offline"}, "mode"),
    ({"seq_length": 8192, "mode": "in_batch", "micro_batch_size": 1, "fixed_width": False}, "micro_batch_size"),
    ({"seq_length": 8192, "mode": "in_batch", "micro_batch_size": 4}, "fixed_width"),
    ({"seq_length": 8192, "mode": "in_batch", "micro_batch_size": 4, "fixed_width": False, "max_segments": 2},
     "max_segments"),
    ({"seq_length": 8192, "mode": "in_batch", "micro_batch_size": 4, "fixed_width": False,
      "max_row_vision_patches": 1000}, "max_row_vision_patches"),
    ({"seq_length": 8192, "global_batch_size": 6, "topology": ParallelTopology(dp=4)}, "global_batch_size"),
    ({"seq_length": 8192, "global_batch_size": 0}, "global_batch_size"),
    ({"seq_length": 8192, "mtp_num_layers": 1}, "mtp_num_layers"),
    ({"seq_length": 8192, "cuda_graphs": True}, "cuda_graphs"),
    ({"seq_length": 8192, "cuda_graphs": True, "fixed_width": False}, "cuda_graphs"),
    ({"seq_length": 8192, "allow_inexact_resume": "no"}, "allow_inexact_resume"),
    ({"seq_length": 8192, "topology": {"tp": 2}}, "topology"),
]


@pytest.mark.parametrize(("kwargs", "field_name"), INVALID_CONFIGS)
def test_invalid_config_names_field(kwargs: dict[str, Any], field_name: str) -> None:
    with pytest.raises(ValueError, match=field_name) as info:
        PackingConfig(**kwargs)
    assert "fix:" in str(info.value)


INVALID_TOPOLOGIES: list[tuple[dict[str, Any], str]] = [
    ({"tp": 0}, "tp"),
    ({"cp": -1}, "cp"),
    ({"ep": 1.5}, "ep"),
    ({"dp": 0}, "dp"),
    ({"sp": "true"}, "sp"),
    ({"tp": True}, "tp"),
    ({"pp": 2}, "pipeline parallel is not supported by packed THD rows"),
]


@pytest.mark.parametrize(("kwargs", "expected"), INVALID_TOPOLOGIES)
def test_invalid_topology_names_field(kwargs: dict[str, Any], expected: str) -> None:
    with pytest.raises(ValueError, match=expected) as info:
        ParallelTopology(**kwargs)
    assert "fix:" in str(info.value)


def test_error_gives_nearest_valid_seq_length() -> None:
    with pytest.raises(ValueError, match=r"seq_length=8190.*e\.g\. 8192"):
        PackingConfig(seq_length=8190, topology=TP4_SP)
    with pytest.raises(ValueError, match=r"seq_length to a multiple of 384, e\.g\. 8448"):
        PackingConfig(seq_length=8196, width_multiple=384, topology=TP4_SP)


def test_in_batch_mode_takes_k_samples_per_variable_width_row() -> None:
    config = PackingConfig(seq_length=8192, mode="in_batch", micro_batch_size=4, fixed_width=False, max_segments=4)
    assert config.micro_batch_size == 4 and config.fingerprint()["mode"] == "in_batch"
    with pytest.raises(ValueError, match="or set mode: in_batch"):
        PackingConfig(seq_length=8192, micro_batch_size=4)


def test_all_violations_are_listed_together() -> None:
    with pytest.raises(ValueError) as info:
        PackingConfig(seq_length=0, buffer_size=0, min_fill=2.0, on_overlong="cut")
    message = str(info.value)
    for name in ("seq_length=0", "buffer_size=0", "min_fill=2.0", "on_overlong='cut'"):
        assert name in message


# --------------------------------------------------------------------------- valid edge cases


def test_defaults_and_edge_values_are_accepted() -> None:
    config = PackingConfig(seq_length=8192)
    assert config.pad_multiple == 1
    assert config.buffer_size is None and config.max_wait_rounds == 4 and config.min_fill == 0.99
    assert PackingConfig(seq_length=8192, max_wait_rounds=0, num_workers=0).max_wait_rounds == 0
    assert PackingConfig(seq_length=8192, global_batch_size=4, topology=ParallelTopology(dp=4)).global_batch_size == 4
    assert ParallelTopology(sp=True).pad_multiple == 1  # sp with tp == 1: no effect


def test_integer_min_fill_becomes_float() -> None:
    config = PackingConfig(seq_length=8192, min_fill=1)
    assert config.min_fill == 1.0 and isinstance(config.min_fill, float)


def test_explicit_pad_to_multiple_of_overrides_topology() -> None:
    config = PackingConfig(seq_length=8192, pad_to_multiple_of=16, topology=TP4_SP)
    assert config.pad_multiple == 16


# --------------------------------------------------------------------------- alignment multiple


@pytest.mark.parametrize(
    ("topology", "expected"),
    [
        (ParallelTopology(), 1),
        (ParallelTopology(tp=4), 1),
        (ParallelTopology(tp=4, sp=True), 4),
        (ParallelTopology(cp=2), 4),
        (ParallelTopology(cp=2, tp=4, sp=True), 8),
        (ParallelTopology(cp=3, tp=2, sp=True), 6),
        (ParallelTopology(cp=4, tp=2, sp=True), 8),
        (ParallelTopology(cp=2, tp=3, sp=True), 12),
    ],
)
def test_pad_multiple_examples(topology: ParallelTopology, expected: int) -> None:
    assert topology.pad_multiple == expected
    assert PackingConfig(seq_length=expected * 1024, topology=topology).pad_multiple == expected


topologies = st.builds(
    ParallelTopology,
    tp=st.integers(1, 16),
    cp=st.integers(1, 16),
    sp=st.booleans(),
    ep=st.integers(1, 8),
    dp=st.integers(1, 8),
)


def _satisfies_alignment(multiple: int, topology: ParallelTopology) -> bool:
    cp_ok = topology.cp == 1 or multiple % (2 * topology.cp) == 0
    sp_ok = not (topology.sp and topology.tp > 1) or multiple % (topology.cp * topology.tp) == 0
    return cp_ok and sp_ok


@settings(max_examples=200, deadline=None)
@given(topologies)
def test_pad_multiple_is_least_common_alignment(topology: ParallelTopology) -> None:
    multiple = topology.pad_multiple
    assert _satisfies_alignment(multiple, topology)
    assert not any(_satisfies_alignment(m, topology) for m in range(1, multiple))


@settings(max_examples=100, deadline=None)
@given(topologies, st.integers(1, 4096))
def test_seq_length_valid_iff_divisible(topology: ParallelTopology, seq_length: int) -> None:
    if seq_length % topology.pad_multiple == 0:
        assert PackingConfig(seq_length=seq_length, topology=topology).seq_length == seq_length
    else:
        with pytest.raises(ValueError, match="seq_length"):
            PackingConfig(seq_length=seq_length, topology=topology)


# --------------------------------------------------------------------------- YAML / dict round-trip


ENERGON_CONFIG_FILES = {"blend_metadataset.yaml"}  # Energon metadatasets: loaded in test_metadataset.py
CONFIG_FILES = sorted(path for path in CONFIG_DIR.glob("*.yaml") if path.name not in ENERGON_CONFIG_FILES)


def test_every_yaml_is_a_packing_config_or_a_known_energon_config() -> None:
    for path in CONFIG_DIR.glob("*.yaml"):
        is_energon = "__class__" in yaml.safe_load(path.read_text(encoding="utf-8"))
        assert is_energon == (path.name in ENERGON_CONFIG_FILES), path.name


def test_shipped_configs_exist() -> None:
    names = {path.name for path in CONFIG_FILES}
    assert {"qwen25vl_8k.yaml", "qwen3vl_moe_16k_cp2.yaml", "qwen25vl_8k_cudagraph.yaml", "qwen35_moe_16k.yaml"} <= names


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: p.name)
def test_shipped_config_loads_and_round_trips(path: Path, tmp_path: Path) -> None:
    config = PackingConfig.from_yaml(path)
    assert config.seq_length % config.pad_multiple == 0
    # Every key written in the file reaches the config unchanged.
    raw = yaml.safe_load(path.read_text())
    as_dict = config.to_dict()
    for key, value in raw.items():
        assert as_dict[key] == value, key
    # Round trip through text and through a file.
    assert PackingConfig.from_dict(yaml.safe_load(config.to_yaml())) == config
    out = tmp_path / "copy.yaml"
    text = config.to_yaml(out)
    assert out.read_text() == text
    assert PackingConfig.from_yaml(out) == config
    assert PackingConfig.from_dict(config.to_dict()) == config


def test_shipped_config_specifics() -> None:
    moe = PackingConfig.from_yaml(CONFIG_DIR / "qwen3vl_moe_16k_cp2.yaml")
    assert moe.seq_length == 16384 and moe.width_multiple == 128
    assert (moe.topology.tp, moe.topology.cp, moe.topology.sp, moe.topology.ep) == (2, 2, True, 8)
    assert moe.pad_multiple == 4
    graphs = PackingConfig.from_yaml(CONFIG_DIR / "qwen25vl_8k_cudagraph.yaml")
    assert graphs.pad_cu_seqlens and graphs.max_segments == 64 and graphs.cuda_graphs
    dense = PackingConfig.from_yaml(CONFIG_DIR / "qwen25vl_8k.yaml")
    assert dense.seq_length == 8192 and dense.buffer_size == 16 and dense.pad_multiple == 1


valid_configs = topologies.flatmap(
    lambda topo: st.builds(
        PackingConfig,
        topology=st.just(topo),
        seq_length=st.integers(1, 64).map(lambda k: k * 128 * topo.pad_multiple),
        width_multiple=st.sampled_from([None, 128]),
        buffer_size=st.integers(1, 64),
        max_wait_rounds=st.integers(0, 8),
        prefetch_factor=st.integers(1, 4),
        min_fill=st.floats(0.01, 1.0),
        on_overlong=st.sampled_from(["skip", "error", "shrink"]),
        max_row_vision_patches=st.one_of(st.none(), st.integers(1, 10**6)),
        max_row_media=st.one_of(st.none(), st.integers(1, 64)),
        pixel_dtype=st.sampled_from(["float32", "uint8"]),
        loss_reduction=st.sampled_from(["token", "sample", "square"]),
        shuffle_buffer_size=st.one_of(st.none(), st.integers(1, 1000)),
        global_batch_size=st.integers(1, 8).map(lambda k: k * topo.dp),
        seed=st.integers(0, 2**31),
    )
)


@settings(max_examples=50, deadline=None)
@given(valid_configs)
def test_round_trip_property(config: PackingConfig) -> None:
    assert PackingConfig.from_dict(config.to_dict()) == config
    assert PackingConfig.from_dict(yaml.safe_load(config.to_yaml())) == config


def test_unknown_keys_are_all_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("seq_length: 8192\nbufer_size: 8\nzzz: 1\ntopology:\n  tpp: 2\n")
    with pytest.raises(ValueError) as info:
        PackingConfig.from_yaml(path)
    message = str(info.value)
    for expected in ("'bufer_size'", "did you mean 'buffer_size'", "'zzz'", "'tpp'", "valid keys", str(path)):
        assert expected in message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "empty"),
        ("- 1\n- 2\n", "mapping"),
        ("buffer_size: 8\n", "seq_length"),
        ("seq_length: 8192\ntopology: 2\n", "topology"),
        ("seq_length: [8192\n", "YAML"),
    ],
)
def test_malformed_yaml(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=expected):
        PackingConfig.from_yaml(path)


# --------------------------------------------------------------------------- fingerprint


FINGERPRINT_KEYS = {
    "seq_length", "pad_multiple", "width_multiple", "buffer_size", "max_wait_rounds", "min_fill",
    "max_segments", "pad_cu_seqlens", "fixed_width", "num_workers", "shuffle_buffer_size",
    "max_samples_per_sequence", "seed", "pixel_dtype", "loss_reduction", "on_overlong", "repeat",
    "max_row_vision_patches", "max_row_media", "mode", "micro_batch_size",
    "apply_exif_orientation", "max_image_pixels",
}


def test_fingerprint_is_plain_and_complete() -> None:
    config = PackingConfig(seq_length=8192, topology=TP4_SP, shuffle_buffer_size=100)
    fingerprint = config.fingerprint()
    assert set(fingerprint) == FINGERPRINT_KEYS | {"buffer_tokens"}  # the default round, resolved
    assert json.loads(json.dumps(fingerprint)) == fingerprint
    assert fingerprint["pad_multiple"] == 4 and fingerprint["shuffle_buffer_size"] == 100


def test_fingerprint_ignores_fields_resume_does_not_depend_on() -> None:
    base = PackingConfig(seq_length=8192)
    other = PackingConfig(seq_length=8192, allow_inexact_resume=True, global_batch_size=8)
    assert fingerprint_mismatches(base.fingerprint(), other.fingerprint()) == []
    check_resume_fingerprint(base.fingerprint(), other.fingerprint())


def test_fingerprint_mismatches_golden() -> None:
    assert fingerprint_mismatches({"a": 1, "b": 2, "d": None}, {"a": 1, "b": 3, "c": 0}) == ["b", "c", "d"]
    assert fingerprint_mismatches({}, {}) == []


def test_resume_mismatch_names_fields_and_values() -> None:
    saved = {**PackingConfig(seq_length=8192, buffer_size=16).fingerprint(), "world_size": 2}
    current = {**PackingConfig(seq_length=4096, buffer_size=32).fingerprint(), "world_size": 2}
    with pytest.raises(ResumeMismatchError) as info:
        check_resume_fingerprint(saved, current)
    assert isinstance(info.value, ValueError)
    assert info.value.fields == ["buffer_size", "seq_length"]
    message = str(info.value)
    assert "buffer_size: saved 16, current 32" in message
    assert "seq_length: saved 8192, current 4096" in message
    assert "world_size" not in message
    assert "allow_inexact_resume=True" in message


def test_resume_mismatch_on_extended_keys() -> None:
    saved = {"seq_length": 8192, "processor": "qwen2.5-vl", "world_size": 4}
    current = {"seq_length": 8192, "processor": "qwen3-vl"}
    with pytest.raises(ResumeMismatchError, match=r"processor: saved 'qwen2.5-vl', current 'qwen3-vl'") as info:
        check_resume_fingerprint(saved, current)
    assert "world_size: saved 4, current <absent>" in str(info.value)


def test_inexact_resume_allowed(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="energon_pack.config"):
        check_resume_fingerprint({"buffer_size": 16}, {"buffer_size": 32}, allow_inexact=True)
    assert "buffer_size" in caplog.text


# --------------------------------------------------------------------------- trainer compatibility

CP2 = PackingConfig(seq_length=8192, topology=ParallelTopology(cp=2, dp=4))
GRAPHS = PackingConfig(seq_length=8192, pad_cu_seqlens=True, max_segments=64, cuda_graphs=True)
SAMPLE = PackingConfig(seq_length=8192, loss_reduction="sample")
SQUARE = PackingConfig(seq_length=8192, loss_reduction="square")
PER_TOKEN = {"calculate_per_token_loss": True, "average_in_collective": False}


@pytest.mark.parametrize(
    ("config", "kwargs"),
    [
        (CP2, PER_TOKEN),
        (CP2, {"calculate_per_token_loss": False, "average_in_collective": True, "finetune": False}),
        (PackingConfig(seq_length=8192), {"calculate_per_token_loss": False, "average_in_collective": True}),
        (CP2, {**PER_TOKEN, "global_batch_size": 8}),
        (CP2, {**PER_TOKEN, "global_batch_size": 6, "data_parallel_size": 3}),
        (GRAPHS, {**PER_TOKEN, "cuda_graphs": True}),
        (SAMPLE, PER_TOKEN),
        (SQUARE, {**PER_TOKEN, "finetune": False}),
    ],
)
def test_training_compat_accepts(config: PackingConfig, kwargs: dict[str, Any]) -> None:
    check_training_compat(config, **kwargs)


@pytest.mark.parametrize(
    ("config", "kwargs", "field_name"),
    [
        (CP2, {"calculate_per_token_loss": False, "average_in_collective": False}, "calculate_per_token_loss"),
        (CP2, {"calculate_per_token_loss": True, "average_in_collective": True}, "average_in_collective"),
        (CP2, {**PER_TOKEN, "micro_batch_size": 2}, "micro_batch_size"),
        (CP2, {**PER_TOKEN, "global_batch_size": 6}, "global_batch_size"),
        (CP2, {**PER_TOKEN, "global_batch_size": 8, "data_parallel_size": 16}, "global_batch_size"),
        (CP2, {**PER_TOKEN, "data_parallel_size": 0}, "data_parallel_size"),
        (CP2, {**PER_TOKEN, "pipeline_model_parallel_size": 2}, "pipeline_model_parallel_size"),
        (CP2, {**PER_TOKEN, "mtp_num_layers": 2}, "mtp_num_layers"),
        (CP2, {**PER_TOKEN, "cuda_graphs": True}, "cuda_graphs"),
        (SAMPLE, {"calculate_per_token_loss": False, "average_in_collective": False}, "calculate_per_token_loss"),
        (SQUARE, {"calculate_per_token_loss": False, "average_in_collective": True, "finetune": False},
         "calculate_per_token_loss=False: loss_reduction='square'"),
        (SAMPLE, {"calculate_per_token_loss": True, "average_in_collective": True}, "average_in_collective"),
    ],
)
def test_training_compat_rejects(config: PackingConfig, kwargs: dict[str, Any], field_name: str) -> None:
    with pytest.raises(ValueError, match=field_name) as info:
        check_training_compat(config, **kwargs)
    assert "fix:" in str(info.value)


def test_training_compat_lists_every_violation() -> None:
    with pytest.raises(ValueError) as info:
        check_training_compat(
            CP2,
            calculate_per_token_loss=False,
            average_in_collective=True,
            micro_batch_size=4,
            global_batch_size=6,
            pipeline_model_parallel_size=2,
            mtp_num_layers=1,
            cuda_graphs=True,
        )
    message = str(info.value)
    names = ("calculate_per_token_loss", "average_in_collective", "micro_batch_size=4", "global_batch_size=6",
             "pipeline_model_parallel_size=2", "mtp_num_layers=1", "cuda_graphs=True")
    for name in names:
        assert name in message
    assert message.count("\n  - ") == len(names)


def test_in_batch_training_takes_micro_batches_of_k_samples() -> None:
    config = PackingConfig(seq_length=8192, mode="in_batch", micro_batch_size=4, fixed_width=False)
    check_training_compat(config, **PER_TOKEN, micro_batch_size=4)
    with pytest.raises(ValueError, match="micro_batch_size=1: in mode 'in_batch'.*fix: set micro_batch_size=4"):
        check_training_compat(config, **PER_TOKEN, micro_batch_size=1)


def test_config_gbs_used_when_trainer_gives_none() -> None:
    config = PackingConfig(seq_length=8192, global_batch_size=8, topology=ParallelTopology(dp=4))
    check_training_compat(config, **PER_TOKEN)
    with pytest.raises(ValueError, match="global_batch_size=8"):
        check_training_compat(config, **PER_TOKEN, data_parallel_size=16)


# --------------------------------------------------------------------------- parts


def test_flat_keys_reach_their_parts() -> None:
    config = PackingConfig(seq_length=8192, buffer_size=8, topology=TP4_SP, num_workers=0, repeat=False,
                           pixel_dtype="uint8", global_batch_size=4)
    assert config.row == RowLayout(seq_length=8192, topology=TP4_SP, pixel_dtype="uint8")
    assert config.policy == PackingPolicy(buffer_size=8)
    assert config.loader == LoaderOptions(num_workers=0, repeat=False)
    assert config.trainer == TrainerSettings(global_batch_size=4)
    assert (config.buffer_size, config.num_workers, config.pad_multiple) == (8, 0, 4)


def test_parts_given_whole_and_flat_overrides() -> None:
    row = RowLayout(seq_length=4096)
    config = PackingConfig(row=row, policy=PackingPolicy(buffer_size=32), max_segments=8, min_fill=0.9)
    assert config.row == RowLayout(seq_length=4096, max_segments=8)
    assert config.policy == PackingPolicy(buffer_size=32, min_fill=0.9)
    assert config == PackingConfig(seq_length=4096, max_segments=8, buffer_size=32, min_fill=0.9)
    assert dataclasses.replace(config, buffer_size=4).policy.buffer_size == 4


def test_every_flat_key_belongs_to_exactly_one_part() -> None:
    keys = [f.name for part in CONFIG_PARTS.values() for f in dataclasses.fields(part)]
    assert len(keys) == len(set(keys))
    assert list(PackingConfig(seq_length=8192).to_dict()) == keys


def test_a_part_validates_on_its_own() -> None:
    with pytest.raises(ValueError, match="invalid PackingPolicy:\n  - buffer_size=0"):
        PackingPolicy(buffer_size=0)
    with pytest.raises(ValueError, match="seq_length=10: must be divisible"):
        RowLayout(seq_length=10, pad_to_multiple_of=4)
    with pytest.raises(TypeError, match="did you mean 'buffer_size'"):
        PackingConfig(seq_length=8192, bufer_size=8)


def test_fingerprint_is_derived_from_the_parts() -> None:
    config = PackingConfig(seq_length=8192, topology=TP4_SP, buffer_size=16)
    assert config.fingerprint() == {**config.row.fingerprint(), **config.policy.fingerprint(),
                                    **config.loader.fingerprint()}
    # buffer_tokens enters only when set or by the default round (states saved before it existed still resume).
    # buffer_tokens and fast_jpeg_decode enter only when set (see test_optional_knobs_enter_the_fingerprint_when_set);
    # chat_template_kwargs only when set (tests/golden/test_tool_calls.py).
    unfingerprinted = {"topology", "pad_to_multiple_of", "allow_inexact_resume", "prefetch_factor", "buffer_tokens",
                       "fast_jpeg_decode", "max_consecutive_skips", "timeout", "decode_threads", "chat_template_kwargs",
                       # skipping named samples and retrying storage reads resume across changes (issue 35)
                       "exclude", "max_storage_retries", "storage_retry_delay",
                       # a balanced plan records them (packing_fingerprint); a balancing online loader adds them (balance_fingerprint)
                       "cost_model", "frozen_vision", "balance_steps", "balance_window_steps", "balance_window_rows",
                       # the loader adds the mapping it resolved, by name, when one is set
                       "sample_mapping",
                       # blends enter only when not at their defaults (tests/config/test_blend_config.py)
                       "blend_unit", "blend_schedule", "blend_schedule_mode",
                       # Qwen-Omni audio knobs enter (media_fingerprint) only away from their defaults
                       "max_audio_seconds", "on_overlong_audio",
                       # the per-row audio budget enters only when set (test_optional_knobs_enter_the_fingerprint_when_set)
                       "max_row_audio_frames"}
    part_keys = {f.name for name in ("row", "policy", "loader") for f in dataclasses.fields(CONFIG_PARTS[name])}
    assert set(config.fingerprint()) == part_keys - unfingerprinted | {"pad_multiple"}


# --------------------------------------------------------------------------- buffer in tokens, prefetch, payload


def test_round_defaults_to_two_rows_of_tokens_and_uint8_payload() -> None:
    config = PackingConfig(seq_length=8192)
    assert (config.buffer_size, config.buffer_tokens, config.pixel_dtype, config.prefetch_factor) == (None, None, "uint8", 2)
    # The fingerprint holds the resolved round: 2 * seq_length tokens, at this width.
    assert config.policy.resolved_round(8192) == {"buffer_size": None, "buffer_tokens": 16384}
    assert (config.fingerprint()["buffer_size"], config.fingerprint()["buffer_tokens"]) == (None, 16384)
    assert PackingConfig(seq_length=16384).fingerprint()["buffer_tokens"] == 32768
    # Under a share blend of tokens the default round is one row; an explicit round stays as set.
    assert config.fingerprint(token_blend=True)["buffer_tokens"] == 8192
    assert PackingConfig(seq_length=8192, buffer_tokens=32768).fingerprint(token_blend=True)["buffer_tokens"] == 32768
    # A token blend's state saved under the two-row default (an earlier release) is refused, naming the round.
    from energon_pack.identity import ResumeMismatchError, check_resume_fingerprint

    with pytest.raises(ResumeMismatchError, match="buffer_tokens"):
        check_resume_fingerprint(config.fingerprint(), config.fingerprint(token_blend=True))
    check_resume_fingerprint(config.fingerprint(), PackingConfig(seq_length=8192, buffer_tokens=16384).fingerprint(token_blend=True))
    # The default survives a YAML round trip unresolved (a new width gets its own default round).
    assert PackingConfig.from_dict(config.to_dict()).policy == config.policy
    # An explicit buffer_size fingerprints as before the default changed.
    explicit = PackingConfig(seq_length=8192, buffer_size=16).fingerprint()
    assert explicit["buffer_size"] == 16 and "buffer_tokens" not in explicit


def test_an_old_default_state_is_refused_naming_the_fix_and_resumes_with_buffer_size_16() -> None:
    old_default = {**PackingConfig(seq_length=8192, buffer_size=16).fingerprint(), "world_size": 1}
    with pytest.raises(ResumeMismatchError) as info:
        check_resume_fingerprint(old_default, {**PackingConfig(seq_length=8192).fingerprint(), "world_size": 1})
    assert info.value.fields == ["buffer_size", "buffer_tokens"]
    assert "default round changed from buffer_size=16" in str(info.value)
    assert "to resume it exactly, set buffer_size: 16" in str(info.value)
    check_resume_fingerprint(old_default, {**PackingConfig(seq_length=8192, buffer_size=16).fingerprint(), "world_size": 1})


def test_an_old_default_balanced_window_state_is_refused_naming_the_fix() -> None:
    from energon_pack.identity import online_balance_fingerprint

    def fingerprint(**policy: Any) -> dict[str, Any]:
        config = PackingConfig(seq_length=8192, balance_steps=True, cost_model="qwen2.5-vl-3b",
                               micro_batches_per_step=2, **policy)
        return {**config.fingerprint(), **online_balance_fingerprint(config)}

    old_default = fingerprint(balance_window_rows=256)
    with pytest.raises(ResumeMismatchError) as info:
        check_resume_fingerprint(old_default, fingerprint())
    assert info.value.fields == ["balance_window_rows"]
    assert "default balance_window_rows changed from 256 to 1024" in str(info.value)
    assert "to resume it exactly, set balance_window_rows: 256" in str(info.value)
    check_resume_fingerprint(old_default, fingerprint(balance_window_rows=256))
    # Any other window: the plain mismatch, no hint.
    with pytest.raises(ResumeMismatchError) as info:
        check_resume_fingerprint(fingerprint(balance_window_rows=512), fingerprint())
    assert "default balance_window_rows changed" not in str(info.value)


def test_a_default_state_does_not_resume_at_another_width() -> None:
    saved = PackingConfig(seq_length=8192).fingerprint()
    with pytest.raises(ResumeMismatchError) as info:
        check_resume_fingerprint(saved, PackingConfig(seq_length=16384).fingerprint())
    assert set(info.value.fields) == {"seq_length", "buffer_tokens"}
    assert "default round changed" not in str(info.value)


def test_buffer_tokens_replaces_buffer_size() -> None:
    config = PackingConfig(seq_length=8192, buffer_tokens=16384)
    assert (config.buffer_size, config.buffer_tokens) == (None, 16384)
    assert config.fingerprint()["buffer_tokens"] == 16384 and config.fingerprint()["buffer_size"] is None
    assert PackingConfig.from_dict(config.to_dict()) == config
    # Setting one unit over an existing policy unsets the other, both ways.
    switched = dataclasses.replace(PackingConfig(seq_length=8192, buffer_size=8), buffer_tokens=8192)
    assert (switched.buffer_size, switched.buffer_tokens) == (None, 8192)
    back = dataclasses.replace(switched, buffer_size=32)
    assert (back.buffer_size, back.buffer_tokens) == (32, None)


def test_buffer_tokens_from_yaml(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("seq_length: 4096\nbuffer_tokens: 8192\n", encoding="utf-8")
    assert PackingConfig.from_yaml(path).policy == PackingPolicy(buffer_tokens=8192)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"buffer_tokens": 12000}, "buffer_tokens=12000: must be a multiple of seq_length=8192"),
        ({"buffer_tokens": 12000}, "e.g. 16384"),
        ({"buffer_tokens": 8192, "buffer_size": 4}, "buffer_size=4, buffer_tokens=8192: a round runs after"),
        ({"buffer_tokens": 0}, "buffer_tokens=0: must be an integer >= 1"),
        ({"prefetch_factor": 0}, "prefetch_factor=0: must be an integer >= 1"),
        ({"decode_threads": 0}, "decode_threads=0: must be an integer >= 1 or null"),
        ({"decode_threads": "4"}, "decode_threads='4': must be an integer >= 1 or null"),
        ({"decode_threads": True}, "decode_threads=True: must be an integer >= 1 or null"),
    ],
)
def test_buffer_tokens_and_prefetch_rules(values: dict, expected: str) -> None:
    with pytest.raises(ValueError) as info:
        PackingConfig(seq_length=8192, **values)
    assert expected in str(info.value)


def test_every_equally_close_key_is_suggested(tmp_path: Path) -> None:
    from energon_pack.config import closest_keys

    assert closest_keys("cpp", ["tp", "cp", "sp", "ep", "pp", "dp"]) == ["cp", "pp"]
    assert closest_keys("zzz", ["tp", "cp"]) == []
    path = tmp_path / "typo.yaml"
    path.write_text("seq_length: 8192\ntopology:\n  cpp: 2\n")
    with pytest.raises(ValueError, match=r"'cpp' \(did you mean 'cp' or 'pp'\?\)"):
        PackingConfig.from_yaml(path)


def test_optional_knobs_enter_the_fingerprint_when_set() -> None:
    plain = PackingConfig(seq_length=8192, buffer_size=16).fingerprint()
    assert "fast_jpeg_decode" not in plain and "buffer_tokens" not in plain
    assert PackingConfig(seq_length=8192, fast_jpeg_decode=True).fingerprint()["fast_jpeg_decode"] is True
    with pytest.raises(ValueError, match="fast_jpeg_decode='yes': must be a boolean"):
        PackingConfig(seq_length=8192, fast_jpeg_decode="yes")
    assert "max_row_audio_frames" not in plain
    assert PackingConfig(seq_length=8192, max_row_audio_frames=3000).fingerprint()["max_row_audio_frames"] == 3000


def test_audio_budget_knob_is_checked() -> None:
    assert PackingConfig(seq_length=8192, max_row_audio_frames=3000).policy.max_row_audio_frames == 3000
    with pytest.raises(ValueError, match="max_row_audio_frames=0"):
        PackingConfig(seq_length=8192, max_row_audio_frames=0)
    with pytest.raises(ValueError, match="max_row_audio_frames=3000: mode 'in_batch'"):
        PackingConfig(seq_length=8192, mode="in_batch", micro_batch_size=2, fixed_width=False, max_row_audio_frames=3000)


def test_balanced_steps_knobs() -> None:
    from energon_pack.identity import packing_fingerprint

    plain = PackingConfig(seq_length=8192)
    costed = PackingConfig(seq_length=8192, cost_model="qwen2.5-vl-7b")
    assert packing_fingerprint(costed) == packing_fingerprint(plain)  # old plans keep their digest
    balanced = PackingConfig(seq_length=8192, cost_model="qwen2.5-vl-7b", balance_steps=True, frozen_vision=True)
    assert packing_fingerprint(balanced) == {
        **packing_fingerprint(plain), "balance_steps": True, "cost_model": "qwen2.5-vl-7b", "frozen_vision": True
    }
    assert PackingConfig(seq_length=8192, micro_batches_per_step=4).trainer.micro_batches_per_step == 4
    with pytest.raises(ValueError, match="balance_steps=True needs cost_model"):
        PackingConfig(seq_length=8192, balance_steps=True)
    with pytest.raises(ValueError, match="micro_batches_per_step=0: must be"):
        PackingConfig(seq_length=8192, micro_batches_per_step=0)
    with pytest.raises(ValueError, match="balance_window_steps=0"):
        PackingConfig(seq_length=8192, balance_window_steps=0)


def test_media_knobs_are_absent_from_the_fingerprint_only_at_the_old_behaviour() -> None:
    """A state or plan saved before the media knobs existed has neither key: rows were built from the
    stored pixels under PIL's 89,478,485-pixel limit. Absent keys therefore mean exactly that, so such a
    state is refused under the new defaults (images with an EXIF orientation change their token count)
    and resumes with apply_exif_orientation=False, max_image_pixels=89478485."""
    default = PackingConfig(seq_length=8192)
    assert (default.apply_exif_orientation, default.max_image_pixels) == (True, 178_956_970)
    assert default.fingerprint()["apply_exif_orientation"] is True
    assert default.fingerprint()["max_image_pixels"] == 178_956_970
    old = {k: v for k, v in default.fingerprint().items() if k not in ("apply_exif_orientation", "max_image_pixels")}
    assert fingerprint_mismatches(old, default.fingerprint()) == ["apply_exif_orientation", "max_image_pixels"]
    legacy = PackingConfig(seq_length=8192, apply_exif_orientation=False, max_image_pixels=89_478_485)
    assert legacy.fingerprint() == old
    assert fingerprint_mismatches(old, legacy.fingerprint()) == []
    assert packing_fingerprint(default)["apply_exif_orientation"] is True  # plans too
    assert "apply_exif_orientation" not in packing_fingerprint(legacy)
    with pytest.raises(ValueError, match="max_image_pixels=0: must be an integer >= 1"):
        PackingConfig(seq_length=8192, max_image_pixels=0)
    with pytest.raises(ValueError, match="apply_exif_orientation='no': must be a boolean"):
        PackingConfig(seq_length=8192, apply_exif_orientation="no")


def test_decode_threads_default_shares_the_cores_among_the_decoding_processes(monkeypatch) -> None:
    from energon_pack.config.loader_options import MAX_AUTO_DECODE_THREADS, auto_decode_threads

    assert auto_decode_threads(cores=96, num_workers=8, local_ranks=8) == 1
    assert auto_decode_threads(cores=16, num_workers=2) == 4 == MAX_AUTO_DECODE_THREADS
    assert auto_decode_threads(cores=12, num_workers=4) == 3
    assert auto_decode_threads(cores=8, num_workers=0) == 4
    assert auto_decode_threads(cores=2, num_workers=8) == 1
    assert PackingConfig(seq_length=8192, decode_threads=3).loader.resolved_decode_threads() == 3
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "64")
    assert PackingConfig(seq_length=8192).loader.resolved_decode_threads() == 1
