"""Our rows through Megatron-Bridge's own training-step code, on CPU (compatibility run).

Runs where Megatron-Bridge is installed (``make test-compat``: Python 3.12, Bridge 0.6.2,
Megatron-Core 0.19.2, transformers 5.12.1); skipped elsewhere. Bridge functions that run:
``training.vlm_step.forward_step`` (with ``get_batch``, ``get_batch_from_iterator``, the
model-signature filter of visual kwargs and the FLOPs bookkeeping inside),
``training.utils.packed_seq_utils.get_packed_seq_params``, ``training.losses.masked_next_token_loss``
(the loss function ``forward_step`` returns), ``unpack_mcore_thd_tensor_for_position_ids`` and
``repack_mcore_thd_position_ids`` (how Bridge's Qwen2.5-VL model feeds rope), ``data.utils.
get_dataset_provider`` (our provider), ``training.checkpointing.maybe_save_dataloader_state`` /
``maybe_load_dataloader_state`` (Bridge's checkpoint files and its restricted unpickler).

CPU set-up: ``torch.Tensor.cuda`` returns the tensor itself, a gloo process group of world size 1
with ``parallel_state.initialize_model_parallel(1, 1)``, and a stand-in module for the one
Transformer Engine import that ``megatron/bridge/peft/lora_layers.py`` makes unconditionally.
The model is a stand-in with the forward signature of Bridge's ``Qwen25VLModel``: it records
what it receives and computes rope positions the way that model does (HF ``get_rope_index`` of
the installed transformers on the rows Bridge unpacks from the THD row).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import socket
import types
from typing import Any

import pytest
import torch

from energon_pack.config import PackingConfig
from energon_pack.loader import get_packing_loader
from energon_pack.qwen.processor import load_processor
from tests.support.loader_runs import row_digest
from tests.support.bridge_imports import import_bridge_modules
from tests.support.tiny_qwen import real_token_positions

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("megatron.bridge") is None, reason="needs Megatron-Bridge (make test-compat)"
)

W = 4096
@pytest.fixture(scope="module")
def bridge():
    """Bridge modules on CPU: no-op ``.cuda()``, gloo world of size 1, model parallel 1 x 1."""
    from megatron.core import parallel_state

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.Tensor, "cuda", lambda self, *args, **kwargs: self)
        modules = import_bridge_modules()
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
        parallel_state.initialize_model_parallel(1, 1)
        try:
            yield modules
        finally:
            parallel_state.destroy_model_parallel()
            torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """24 mixed samples (images, videos, text-only chats) with a validation split."""
    from energon_pack.data.synthetic import SyntheticSpec, make_synthetic_dataset

    spec = SyntheticSpec(max_image_side=320, max_video_seconds=3.0, max_video_side=96)
    report = make_synthetic_dataset(
        tmp_path_factory.mktemp("bridge"), 24, seed=5, spec=spec, samples_per_shard=4, split_ratio="3,1,0"
    )
    return report.out_dir


@pytest.fixture(scope="module")
def processor():
    """Qwen2.5-VL, videos sampled at 4 fps: 0.5 s per temporal grid step, where transformers
    releases before 5.18 and after disagree on rope positions."""
    processor = load_processor()
    processor.video_processor.fps = 4
    return processor


def rows_of(dataset, processor, pixel_dtype: str) -> list[dict[str, Any]]:
    config = PackingConfig(seq_length=W, buffer_size=4, num_workers=0, repeat=False, pixel_dtype=pixel_dtype)
    return list(get_packing_loader(dataset, config, processor))


class QwenVLStandIn(torch.nn.Module):
    """Stands in for Bridge's Qwen25VLModel: records every forward call's kwargs, computes the rope
    positions that model would compute, returns per-token losses of 1."""

    def __init__(self, bridge: types.SimpleNamespace, hf_config: Any) -> None:
        super().__init__()
        self.config = types.SimpleNamespace(mtp_num_layers=None, is_hybrid_model=False)
        self.hf = types.SimpleNamespace(config=hf_config)
        hf_model = importlib.import_module("transformers.models.qwen2_5_vl.modeling_qwen2_5_vl").Qwen2_5_VLModel
        self.hf.get_rope_index = types.MethodType(hf_model.get_rope_index, self.hf)
        self.hf.get_vision_position_ids = types.MethodType(hf_model.get_vision_position_ids, self.hf)
        self.utils = bridge.packed_seq_utils
        self.calls: list[dict[str, Any]] = []

    def forward(self, **kwargs: Any) -> torch.Tensor:
        kwargs["bridge_rope"] = self.rope_positions(kwargs)
        self.calls.append(kwargs)
        return torch.ones_like(kwargs["labels"], dtype=torch.float32)

    def rope_positions(self, kwargs: dict[str, Any]) -> torch.Tensor:
        """int64 [3, 1, W] as Bridge's Qwen25VLModel.forward builds them (gaps stay 0)."""
        input_ids, params = kwargs["input_ids"], kwargs["packed_seq_params"]
        rows, mask, starts, lengths = self.utils.unpack_mcore_thd_tensor_for_position_ids(input_ids, params)
        types_ = torch.zeros_like(rows, dtype=torch.int)
        types_[rows == self.hf.config.image_token_id] = 1
        types_[rows == self.hf.config.video_token_id] = 2
        positions, _ = self.hf.get_rope_index(
            rows, types_, kwargs.get("image_grid_thw"), kwargs.get("video_grid_thw"),
            second_per_grid_ts=kwargs.get("second_per_grid_ts"), attention_mask=mask,
        )
        return self.utils.repack_mcore_thd_position_ids(
            positions, padded_starts=starts, lengths=lengths, total_length=input_ids.size(1)
        )


@pytest.fixture(scope="module")
def model_and_state(bridge):
    from transformers import Qwen2_5_VLConfig

    QwenVLStandIn.forward.__signature__ = inspect.signature(bridge.qwen25_vl.Qwen25VLModel.forward)
    hf_config = Qwen2_5_VLConfig(vision_config={"tokens_per_second": 2}, image_token_id=151655, video_token_id=151656)
    model = QwenVLStandIn(bridge, hf_config)
    state = bridge.state.GlobalState()
    state._cfg = types.SimpleNamespace(
        dataset=types.SimpleNamespace(),
        logger=types.SimpleNamespace(timing_log_level=0, timing_log_option="minmax"),
        rerun_state_machine=types.SimpleNamespace(check_for_nan_in_loss=True, check_for_spiky_loss=False),
    )
    return model, state


def through_bridge(bridge, model, state, row: dict[str, Any]) -> tuple[dict[str, Any], torch.Tensor]:
    """One forward_step on ``row``; the model's kwargs and the loss function's token count."""
    output, loss_function = bridge.vlm_step.forward_step(state, iter([row]), model)
    _, num_tokens, _ = loss_function(output)
    return model.calls[-1], num_tokens


def test_rows_through_forward_step_reach_the_model_intact(bridge, model_and_state, dataset, processor):
    """float32 and uint8 rows (images, videos, text) -> identical float32 pixels and THD metadata."""
    model, state = model_and_state
    floats, uint8s = rows_of(dataset, processor, "float32"), rows_of(dataset, processor, "uint8")
    assert [r["__keys__"] for r in floats] == [r["__keys__"] for r in uint8s]
    seen = {"image": 0, "video": 0, "text_only_row": 0, "fractional_seconds": 0}
    for float_row, uint8_row in zip(floats, uint8s):
        assert uint8_row["visual_inputs"].is_uint8 or uint8_row["visual_inputs"].pixel_values is None
        expected = float_row["visual_inputs"].normalized_for_model()
        got = {}
        for payload, row in (("float32", float_row), ("uint8", uint8_row)):
            call, num_tokens = through_bridge(bridge, model, state, row)
            got[payload] = call
            for key in ("input_ids", "labels", "loss_mask", "position_ids"):
                assert torch.equal(call[key], row[key]), key
            assert call["attention_mask"] is None
            params = call["packed_seq_params"]
            assert params.qkv_format == "thd"
            for key in ("cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded"):
                assert torch.equal(getattr(params, key), row[key]), key
            assert params.max_seqlen_q == params.max_seqlen_kv == int(row["max_seqlen_q"])
            assert int(num_tokens) == int(row["loss_mask"].sum())
            visual = {k: call[k] for k in expected}
            assert visual.keys() == expected.keys() and not (set(call) & {"padding_mask", "mrope_position_ids"})
            for key, value in expected.items():
                assert value.dtype == visual[key].dtype and torch.equal(visual[key], value), (payload, key)
            real = real_token_positions(params.cu_seqlens_q, params.cu_seqlens_q_padded)
            assert torch.equal(call["bridge_rope"][:, 0, real], row["mrope_position_ids"][:, 0, real])
        seen["image"] += "pixel_values" in expected
        seen["video"] += "pixel_values_videos" in expected
        seen["text_only_row"] += not expected
        seconds = expected.get("second_per_grid_ts")
        seen["fractional_seconds"] += seconds is not None and bool((seconds != seconds.floor()).any())
    assert seen["image"] and seen["video"] and seen["fractional_seconds"], seen


def test_get_batch_from_iterator_keeps_what_vlm_step_uses(bridge, dataset, processor):
    """Bridge moves the payload field by field and sets every key it does not use to None."""
    row = next(r for r in rows_of(dataset, processor, "uint8") if r["visual_inputs"].pixel_values is not None)
    batch = bridge.vlm_step.get_batch_from_iterator(iter([row]), is_first_pp_stage=True, is_last_pp_stage=True)
    assert batch["padding_mask"] is None and batch["mrope_position_ids"] is None and batch["total_tokens"] is None
    assert batch["visual_inputs"].pixel_values.dtype == torch.uint8
    for key in ("max_seqlen_q", "max_seqlen_kv"):
        assert isinstance(batch[key], torch.Tensor) and batch[key].device.type == "cpu"
    params = bridge.packed_seq_utils.get_packed_seq_params(
        {k: batch[k] for k in ("cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded",
                               "max_seqlen_q", "max_seqlen_kv")}
    )
    assert isinstance(params.max_seqlen_q, int) and params.max_seqlen_q == int(row["max_seqlen_q"])


def test_provider_and_bridge_checkpoints_resume_identically(bridge, dataset, processor, tmp_path):
    """Our provider through Bridge's dataset-provider lookup; our loader state through Bridge's
    checkpoint writer and its restricted reader; the resumed stream continues row for row."""
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.rerun_state_machine import RerunDataIterator

    from energon_pack.bridge import PackingDatasetProvider

    packing = PackingConfig(seq_length=W, buffer_size=4, num_workers=2, repeat=True)
    provider = PackingDatasetProvider(path=str(dataset), packing=packing)
    groups = ProcessGroupCollection.use_mpu_process_groups()

    def build() -> tuple[RerunDataIterator, Any]:
        build_datasets = bridge.data_utils.get_dataset_provider(provider)
        train, valid, test = build_datasets([16, 4, 0], provider, tokenizer=None, pg_collection=groups)
        assert test is None and valid is not None
        return RerunDataIterator(train), valid

    train, valid = build()
    assert next(valid)["__keys__"] and provider.num_workers == packing.num_workers
    for _ in range(5):
        next(train)
    bridge.checkpointing.maybe_save_dataloader_state(None, train, 5, str(tmp_path), pg_collection=groups)
    reference = [row_digest(next(train)) for _ in range(6)]
    resumed, _ = build()
    bridge.checkpointing.maybe_load_dataloader_state(resumed, 5, str(tmp_path), pg_collection=groups)
    assert [row_digest(next(resumed)) for _ in range(6)] == reference


def test_check_bridge_config_reads_bridge_field_names(bridge):
    """The config check on Bridge's and Megatron-Core's own config classes (their defaults)."""
    from megatron.bridge.models.gpt_provider import GPTModelProvider
    from megatron.bridge.training.config import TrainingConfig, ValidationConfig
    from megatron.core.distributed import DistributedDataParallelConfig

    from energon_pack.bridge import check_bridge_config
    from energon_pack.config import ConfigError

    def config(**model: Any) -> types.SimpleNamespace:
        return types.SimpleNamespace(
            train=TrainingConfig(micro_batch_size=1, global_batch_size=4),
            validation=ValidationConfig(),
            ddp=DistributedDataParallelConfig(),
            model=GPTModelProvider(num_layers=1, hidden_size=64, num_attention_heads=4, seq_length=W, **model),
        )

    packing = PackingConfig(seq_length=W)
    check_bridge_config(config(calculate_per_token_loss=True), packing)
    with pytest.raises(ConfigError) as caught:
        check_bridge_config(config(), packing)  # Megatron-Core's default: calculate_per_token_loss=False
    assert caught.value.problems == [p for p in caught.value.problems if "calculate_per_token_loss" in p]
    with pytest.raises(ConfigError, match="cuda_graph_impl='transformer_engine'"):
        check_bridge_config(config(calculate_per_token_loss=True, cuda_graph_impl="transformer_engine"), packing)
