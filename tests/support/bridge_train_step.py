"""One data-parallel rank of Megatron-Bridge's ``train_step`` and ``training_log`` on CPU, for
``tests/bridge/test_bridge_metrics.py`` (compatibility run; started by ``torch.multiprocessing``).

Bridge's and Megatron-Core's own code runs: ``training.train.train_step`` (the rerun loop,
Megatron-Core's ``forward_backward_no_pipelining`` over the step's micro-batches, the loop over
``losses_reduced`` with its all-reduce over the data-parallel x context-parallel group), our
``energon_pack.bridge.forward_step`` around ``training.vlm_step.forward_step``, and
``training.utils.train_utils.training_log`` writing through the ``SummaryWriter`` that Bridge's
``GlobalState`` opens on the last rank. Two steps: with the two ranks as a data-parallel group
(each its own rows), then as a context-parallel group (both the same rows, each its shard).

CPU harness (the minimum, nothing else replaced): the gloo process group; ``Tensor.cuda`` returns
the tensor; the tensor factories that Bridge and Megatron-Core call with ``device="cuda"`` (or
``torch.cuda.current_device()``) make CPU tensors; the optimizer and the learning-rate scheduler are
stand-ins that report a successful step (no parameters to update matter here); the model is a
stand-in with the forward signature of Bridge's ``Qwen25VLModel`` whose per-token losses are a fixed
function of the labels times one trainable scale (``token_losses``), so the reference can compute
them on the host; under context parallelism it returns, as Bridge's VLM models do, its CP rank's
shard of the losses and of ``loss_mask`` (Transformer Engine's THD split, ``thd_partition_indices``).
Rows are replayed from a real loader through :class:`PackingIterator` (``ReplayLoader``: the rows
this rank would read, and that loader's ``sources()``).
"""

from __future__ import annotations

import inspect
import json
import socket
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

#: Data-parallel ranks (gloo processes).
WORLD_SIZE = 2


def token_losses(labels: torch.Tensor) -> torch.Tensor:
    """The stand-in model's per-token loss of predicting ``labels`` (float32, same shape): a fixed
    function of the label id in [0, 10), so a reference computes the same numbers on the host."""
    return (labels.clamp(min=0) * 7919 % 1000).to(torch.float32) / 100.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ReplayLoader:
    """A loader's recorded rows, replayed, with that loader's ``sources()`` and ``family()``."""

    def __init__(self, rows: list[dict[str, Any]], sources: list[Any], family: str) -> None:
        self.rows, self._sources, self._family = rows, sources, family

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.rows)

    def sources(self) -> list[Any]:
        return self._sources

    def family(self) -> str:
        return self._family


def _on_cpu(device: Any) -> Any:
    """``device`` with every CUDA device (``"cuda"``, ``"cuda:0"``, an index) replaced by the CPU."""
    if device is None:
        return None
    if isinstance(device, int) or torch.device(device).type == "cuda":
        return torch.device("cpu")
    return device


@contextmanager
def cuda_on_cpu() -> Iterator[None]:
    """Within: ``Tensor.cuda`` is the identity, ``torch.cuda.current_device()`` is 0 and the tensor
    factories put what they would put on a CUDA device on the CPU."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.Tensor, "cuda", lambda self, *args, **kwargs: self)
        patch.setattr(torch.cuda, "current_device", lambda: 0)
        for name in ("tensor", "zeros", "ones", "empty", "full"):
            factory = getattr(torch, name)

            def on_cpu(*args: Any, _factory: Any = factory, device: Any = None, **kwargs: Any) -> torch.Tensor:
                return _factory(*args, device=_on_cpu(device), **kwargs)

            patch.setattr(torch, name, on_cpu)
        yield


class QwenVLLossStandIn(torch.nn.Module):
    """Stands in for Bridge's Qwen25VLModel: per-token losses ``scale * token_losses(labels)`` [1, W];
    under context parallelism ``(losses, loss_mask)`` of this CP rank's shard [1, W / cp]."""

    def __init__(self, forward_signature: inspect.Signature) -> None:
        super().__init__()
        from megatron.core.enums import ModelType
        from megatron.core.transformer import TransformerConfig

        self.config = TransformerConfig(
            num_layers=1, hidden_size=8, num_attention_heads=1, calculate_per_token_loss=True
        )
        self.model_type = ModelType.encoder_or_decoder
        self.scale = torch.nn.Parameter(torch.ones(()))
        type(self).forward.__signature__ = forward_signature

    def forward(self, **kwargs: Any) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        from megatron.core import parallel_state

        from energon_pack import thd_partition_indices

        losses = self.scale * token_losses(kwargs["labels"])
        cp = parallel_state.get_context_parallel_world_size()
        if cp == 1:
            return losses
        starts = kwargs["packed_seq_params"].cu_seqlens_q_padded
        keep = thd_partition_indices(starts, losses.shape[-1], cp, parallel_state.get_context_parallel_rank())
        return losses[:, keep], kwargs["loss_mask"][:, keep]

    def zero_grad_buffer(self) -> None:
        self.scale.grad = None

    def set_input_tensor(self, input_tensor: Any) -> None:
        """Megatron-Core's schedule hands the previous pipeline stage's output here (none: one stage)."""


class StepStandIn:
    """The optimizer and the scheduler: every step succeeds (grad norm and zeros not computed)."""

    def zero_grad(self) -> None:
        pass

    def step(self, increment: int | None = None) -> tuple[bool, None, None]:
        return True, None, None


def bridge_config(tensorboard_dir: str, micro_batches: int, width: int, data_parallel: int) -> types.SimpleNamespace:
    """The config sections ``train_step`` and ``training_log`` read: Bridge's own section classes
    at their defaults where Bridge has them, logging every step to TensorBoard only."""
    from megatron.bridge.training.config import LoggerConfig, RerunStateMachineConfig, TrainingConfig
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig

    return types.SimpleNamespace(
        train=TrainingConfig(micro_batch_size=1, global_batch_size=micro_batches * data_parallel, train_iters=1),
        logger=LoggerConfig(tensorboard_dir=tensorboard_dir, tensorboard_log_interval=1, log_interval=1000,
                            timing_log_level=0),
        optimizer=OptimizerConfig(),
        ddp=DistributedDataParallelConfig(),
        dist=types.SimpleNamespace(use_decentralized_pg=True),
        model=types.SimpleNamespace(seq_length=width),
        dataset=types.SimpleNamespace(dataloader_type="external", seq_length=width),
        rerun_state_machine=RerunStateMachineConfig(check_for_nan_in_loss=True, check_for_spiky_loss=False),
        profiling=None,
        data_parallel_size=data_parallel,
    )


def run_rank(rank: int, port: int, dp_rows: list[list[dict[str, Any]]], cp_rows: list[dict[str, Any]],
             sources: list[Any], family: str, out_dir: str) -> None:
    """Rank ``rank`` of ``WORLD_SIZE``. Step ``dp``: the ranks are a data-parallel group, this rank
    trains on ``dp_rows[rank]``; then ``forward_step`` on a row without ``segment_source``. Step
    ``cp``: the ranks are one context-parallel group, both train on ``cp_rows`` (rows aligned for
    CP=2). Each step is one ``train_step`` (its micro-batches: the rows) and ``training_log`` into
    ``out_dir/<step>/``. Writes ``out_dir/rank{rank}.json``: per step, ``train_step``'s reduced dict and
    the loader waits ``PackingIterator`` measured per row; the error of the call without
    ``segment_source``."""
    from tests.support.bridge_imports import import_bridge_modules

    with cuda_on_cpu():
        modules = import_bridge_modules()
        from megatron.bridge.training import train as bridge_train
        from megatron.bridge.training.utils import train_utils
        from megatron.core import parallel_state
        from megatron.core.num_microbatches_calculator import (
            destroy_num_microbatches_calculator,
            init_num_microbatches_calculator,
        )
        from megatron.core.pipeline_parallel.schedules import forward_backward_no_pipelining
        from megatron.core.process_groups_config import ProcessGroupCollection
        from megatron.core.rerun_state_machine import RerunDataIterator

        from energon_pack.bridge import PackingIterator, forward_step

        torch.distributed.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE
        )
        model = QwenVLLossStandIn(inspect.signature(modules.qwen25_vl.Qwen25VLModel.forward))
        stand_in = StepStandIn()
        result: dict[str, Any] = {}
        for step, rows, cp in (("dp", dp_rows[rank], 1), ("cp", cp_rows, WORLD_SIZE)):
            data_parallel = WORLD_SIZE // cp
            parallel_state.initialize_model_parallel(1, 1, context_parallel_size=cp)
            init_num_microbatches_calculator(rank, None, len(rows) * data_parallel, 1, data_parallel)
            state = modules.state.GlobalState()
            width = int(rows[0]["input_ids"].shape[-1])
            state._cfg = bridge_config(str(Path(out_dir, step)), len(rows), width, data_parallel)
            groups = ProcessGroupCollection.use_mpu_process_groups()
            data = RerunDataIterator(PackingIterator(ReplayLoader(rows, sources, family)))
            loss_reduced, skipped, *_ = bridge_train.train_step(
                train_utils.prepare_forward_step_func(forward_step, state), data, [model], stand_in, stand_in,
                state, groups, forward_backward_no_pipelining, None,
            )
            state.train_state.step = 1
            train_utils.training_log(
                loss_reduced, {}, None, None, 1.0, False, skipped, None, None, None, state.cfg, state, [], [model],
                pg_collection=groups,
            )
            if state.tensorboard_logger is not None:
                state.tensorboard_logger.close()
            result[step] = {
                "skipped": skipped,
                "loss_reduced": {key: float(value) for key, value in loss_reduced.items()},
                "loader_wait_s": [row["__loader_wait_s__"] for row in rows],
            }
            if step == "dp":
                old_row = {key: value for key, value in rows[0].items() if key != "segment_source"}
                try:
                    old_rows = RerunDataIterator(PackingIterator(ReplayLoader([old_row], sources, family)))
                    forward_step(state, old_rows, model)
                    result["row_without_segment_source"] = "nothing raised"
                except Exception as err:  # noqa: BLE001 - the test reads which error it was
                    result["row_without_segment_source"] = f"{type(err).__name__}: {err}"
            destroy_num_microbatches_calculator()
            parallel_state.destroy_model_parallel()
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result), encoding="utf-8")
        torch.distributed.destroy_process_group()
