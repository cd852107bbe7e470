"""Megatron-Bridge's training config (``ConfigContainer``) against packed-row training.

Reads the config by attribute only, so it needs no Bridge import: any object shaped like
Bridge's ``cfg`` (``cfg.train``, ``cfg.model``, ``cfg.ddp``, ``cfg.validation``) can be checked.
That includes Bridge 0.6.2's hybrid Qwen3.5 / Qwen3.6 providers (``Qwen35VLModelProvider``,
``Qwen35VLMoEModelProvider``: Gated DeltaNet layers, ``experimental_attention_variant =
"gated_delta_net"``), whose extra rules are :func:`gdn_problems` (docs/qwen35.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from energon_pack.config import ConfigError, PackingConfig, check_training_compat
from energon_pack.config.cross_part import mtp_problem

__all__ = ["check_bridge_config", "gdn_problems", "with_step_size"]

_CUDA_GRAPHS_OFF = (None, "none")
#: ``cfg.model.experimental_attention_variant`` of models with Gated DeltaNet (linear-attention) layers.
GDN_VARIANT = "gated_delta_net"
#: AutoBridge copies a checkpoint's ``mtp_num_hidden_layers`` (1 in the released Qwen3.5 / Qwen3.6)
#: into ``mtp_num_layers``; Bridge's own "off" value is None.
_BRIDGE_MTP_FIX = (
    "set cfg.model.mtp_num_layers = None after bridge.to_megatron_provider() (AutoBridge copies the "
    "checkpoint's mtp_num_hidden_layers into it, 1 for converted Qwen3.5 / Qwen3.6; the MTP weights are "
    "then neither loaded nor trained)"
)


def check_bridge_config(cfg: Any, packing: PackingConfig | None = None) -> None:
    """Raise one :class:`~energon_pack.config.ConfigError` listing every setting of ``cfg`` that
    packed rows cannot train with, each with its fix; return None when all hold.

    ``packing`` defaults to ``cfg.dataset.packing`` (a :class:`PackingDatasetProvider`). Rules:
    micro-batch size 1 (train and eval: a micro-batch is one packed row); per-token loss
    (``cfg.model.calculate_per_token_loss=True``, ``cfg.ddp.average_in_collective=False``: rows
    hold different numbers of loss tokens, and only summing losses and token counts over
    micro-batches and ranks before dividing weighs every token equally); no CUDA graphs (the
    vision inputs and the number of sequences change from row to row); no pipeline parallel;
    the model's tp / cp / sp / ep equal to ``packing.topology`` (it sets the alignment of every
    sequence in a row); ``cfg.model.seq_length`` at least the row width; no multi-token
    prediction (``cfg.model.mtp_num_layers`` None or 0); the Gated DeltaNet rules of
    :func:`gdn_problems`; plus the rules of :func:`~energon_pack.config.check_training_compat`
    (global batch and data-parallel size).

    Example: ``cfg.model.calculate_per_token_loss=False`` -> ConfigError naming it and the fix
    ``cfg.model.calculate_per_token_loss = True``.
    """
    if packing is None:
        packing = getattr(getattr(cfg, "dataset", None), "packing", None)
        if not isinstance(packing, PackingConfig):
            raise ValueError(
                f"cfg.dataset is {type(getattr(cfg, 'dataset', None)).__name__}, not an energon_pack "
                "PackingDatasetProvider, so there is no packing config to check against; fix: pass "
                "check_bridge_config(cfg, packing=<the PackingConfig of your loaders>)"
            )
    problems = list(filter(None, _bridge_problems(cfg, packing)))
    provider_batch = getattr(getattr(cfg, "dataset", None), "global_batch_size", None)
    if provider_batch is not None and provider_batch != cfg.train.global_batch_size:
        problems.append(
            f"cfg.dataset.global_batch_size={provider_batch} but cfg.train.global_batch_size="
            f"{cfg.train.global_batch_size}: balanced steps would be dealt in steps of the wrong size; fix: "
            f"cfg.dataset.global_batch_size = cfg.train.global_batch_size"
        )
    try:
        check_training_compat(
            packing,
            calculate_per_token_loss=True,  # checked above, with Bridge's names
            average_in_collective=False,
            micro_batch_size=1,
            cuda_graphs=False,
            global_batch_size=cfg.train.global_batch_size,
            data_parallel_size=getattr(cfg, "data_parallel_size", None),
            pipeline_model_parallel_size=1,
            mtp_num_layers=0,  # checked above, with Bridge's name and fix
        )
    except ConfigError as err:
        problems += err.problems
    if problems:
        raise ConfigError("Megatron-Bridge config for packed rows", problems)


def _bridge_problems(cfg: Any, packing: PackingConfig) -> Iterator[str | None]:
    """One line per violated Bridge-side rule, named by its path in ``cfg`` (None where it holds)."""
    model, topology = cfg.model, packing.topology
    validation = getattr(cfg, "validation", None)
    eval_micro_batch = getattr(validation, "eval_micro_batch_size", None)
    for name, value in (
        ("cfg.train.micro_batch_size", cfg.train.micro_batch_size),
        ("cfg.validation.eval_micro_batch_size", 1 if eval_micro_batch is None else eval_micro_batch),
    ):
        if value != 1:
            yield f"{name}={value!r}: a micro-batch is one packed row; fix: set {name} = 1"
    yield _expect(
        "cfg.model.calculate_per_token_loss", getattr(model, "calculate_per_token_loss", None), True,
        "rows hold different numbers of loss tokens; only summing losses and token counts over micro-batches "
        "and ranks before dividing weighs every token equally",
    )
    yield _expect(
        "cfg.ddp.average_in_collective", getattr(cfg.ddp, "average_in_collective", None), False,
        "per-token loss is divided by the token count after the gradient all-reduce; averaging inside "
        "the collective would divide by the data-parallel size as well",
    )
    graphs = _cuda_graph_settings(model)
    if graphs:
        yield (
            f"{', '.join(graphs)}: CUDA graphs replay fixed shapes, but each packed row brings different "
            "vision inputs and a different number of sequences; fix: set cfg.model.cuda_graph_impl = 'none'"
        )
    yield _expect(
        "cfg.model.pipeline_model_parallel_size", getattr(model, "pipeline_model_parallel_size", 1), 1,
        "packed THD rows and Bridge's VLM step are not supported with pipeline parallel; shard the model "
        "with tp / cp / ep instead",
    )
    for name, ours, key in (
        ("tensor_model_parallel_size", topology.tp, "tp"),
        ("context_parallel_size", topology.cp, "cp"),
        ("sequence_parallel", topology.sp, "sp"),
        ("expert_model_parallel_size", topology.ep, "ep"),
    ):
        theirs = getattr(model, name, None)
        if theirs is not None and theirs != ours:
            yield (
                f"cfg.model.{name}={theirs!r} but the packing config has topology.{key}={ours!r}: rows are "
                f"aligned for the packing topology; fix: set topology.{key}: {theirs!r} in the packing config"
            )
    seq_length = getattr(model, "seq_length", None)
    if seq_length is not None and seq_length < packing.seq_length:
        yield (
            f"cfg.model.seq_length={seq_length} is shorter than the packed row width seq_length="
            f"{packing.seq_length}; fix: set cfg.model.seq_length = {packing.seq_length} (or pack narrower rows)"
        )
    yield mtp_problem("cfg.model.mtp_num_layers", getattr(model, "mtp_num_layers", None) or 0, fix=_BRIDGE_MTP_FIX)
    yield from gdn_problems(model)


def gdn_problems(model: Any) -> Iterator[str]:
    """One line per setting of a Gated DeltaNet ``cfg.model`` that packed THD rows cannot train with.

    Megatron-Core's ``GatedDeltaNet`` with ``packed_seq_params.qkv_format == "thd"`` has no
    deterministic path (its torch fallback takes no ``cu_seqlens``), so
    ``deterministic_mode=True`` is rejected. Models without GDN layers yield nothing.
    Example: ``Qwen35VLModelProvider(deterministic_mode=True)`` -> one line naming
    ``cfg.model.deterministic_mode = False``.
    """
    if getattr(model, "experimental_attention_variant", None) != GDN_VARIANT:
        return
    if getattr(model, "deterministic_mode", False):
        yield (
            "cfg.model.deterministic_mode=True: Megatron-Core's GatedDeltaNet has no deterministic path for "
            "packed THD rows (it asserts: its torch fallback takes no cu_seqlens, which keep a row's sequences "
            "apart); fix: set cfg.model.deterministic_mode = False"
        )


def _expect(name: str, value: Any, wanted: Any, why: str) -> str | None:
    if value is wanted or value == wanted and type(value) is type(wanted):
        return None
    return f"{name}={value!r}: {why}; fix: set {name} = {wanted!r}"


def _cuda_graph_settings(model: Any) -> list[str]:
    """The model settings that turn CUDA graphs on (Megatron-Core names), as ``name=value``."""
    impl = getattr(model, "cuda_graph_impl", None)
    settings = [f"cfg.model.cuda_graph_impl={impl!r}"] if impl not in _CUDA_GRAPHS_OFF else []
    settings += [
        f"cfg.model.{name}=True" for name in ("enable_cuda_graph", "external_cuda_graph") if getattr(model, name, False)
    ]
    return settings


def with_step_size(
    packing: PackingConfig, *, global_batch_size: int, micro_batch_size: int, data_parallel_size: int
) -> PackingConfig:
    """``packing`` with ``micro_batches_per_step = global_batch_size / (micro_batch_size * dp)``, the
    micro-batches each rank runs per optimizer step (what a balanced plan's loader deals by).

    Example: global batch 64, micro-batch 1, DP 8 -> ``micro_batches_per_step`` 8; global batch
    60 at DP 8 -> ValueError (not a whole number of micro-batches per rank).
    """
    per_step = micro_batch_size * data_parallel_size
    if per_step < 1 or global_batch_size % per_step:
        raise ValueError(
            f"global_batch_size={global_batch_size} is not a multiple of micro_batch_size x data-parallel size "
            f"= {micro_batch_size} x {data_parallel_size}: a step must give every rank the same number of "
            f"micro-batches; fix: set the global batch to a multiple of {max(per_step, 1)}"
        )
    trainer = dataclasses.replace(packing.trainer, micro_batches_per_step=global_batch_size // per_step)
    return PackingConfig(row=packing.row, policy=packing.policy, loader=packing.loader, trainer=trainer)
