"""Rules that span config parts (row layout x policy x trainer): in-batch mode, buffer_tokens vs
the width, the trainer-side rules for packed rows and the per-token-loss rules.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from energon_pack.config.policy import PackingPolicy, micro_batch_problem
from energon_pack.config.row_layout import RowLayout
from energon_pack.config.topology import pipeline_problem
from energon_pack.config.values import bool_problem, int_problem, next_multiple, unsupported_problem

def _in_batch_micro_batch_problem(name: str, value: Any, k: int) -> str | None:
    """In mode ``in_batch`` one row holds the trainer's micro-batch of ``k`` samples."""
    if value == k and not isinstance(value, bool):
        return None
    return (
        f"{name}={value!r}: in mode 'in_batch' each row holds one micro-batch of the config's "
        f"micro_batch_size={k} samples; fix: set {name}={k}"
    )


def in_batch_problems(row: RowLayout, micro_batch_size: int) -> Iterator[str | None]:
    """Rules of ``mode="in_batch"`` that involve the row layout (k = micro_batch_size samples per row)."""
    if row.fixed_width is not False:
        yield (
            f"fixed_width={row.fixed_width!r}: mode 'in_batch' builds one row of variable width from every "
            "micro_batch_size samples (sum of their aligned lengths, rounded up to width_multiple); "
            "fix: set fixed_width: false, or mode: online for fixed-width rows"
        )
    if row.max_segments is not None and micro_batch_size > row.max_segments:
        yield (
            f"micro_batch_size={micro_batch_size}: mode 'in_batch' puts micro_batch_size samples in one row, "
            f"more than max_segments={row.max_segments}; fix: raise max_segments to at least "
            f"{micro_batch_size} or lower micro_batch_size"
        )


def _global_batch_problem(name: str, value: Any, dp: int) -> str | None:
    """``value`` (when not None) must be a multiple of the data-parallel size ``dp`` and >= ``dp``.

    Example: ``_global_batch_problem("global_batch_size", 6, 4)`` -> error suggesting 8.
    """
    problem = int_problem(name, value, minimum=1, optional=True)
    if problem or value is None:
        return problem
    if value % dp == 0 and value >= dp:
        return None
    return (
        f"{name}={value}: must be divisible by and >= the data-parallel size dp={dp} "
        f"(every data-parallel rank takes whole micro-batches of one packed row); "
        f"fix: set {name} to a multiple of {dp}, e.g. {next_multiple(value, dp)}"
    )


def mtp_problem(name: str, value: Any, *, fix: str | None = None) -> str | None:
    """Multi-token prediction layers (> 0) are rejected by name; ``fix`` defaults to ``set {name}=0``.

    Example: ``mtp_problem("mtp_num_layers", 1)`` -> ``"mtp_num_layers=1: multi-token prediction (MTP)
    is not supported with packed THD rows in energon_pack; fix: set mtp_num_layers=0"``.
    """
    return unsupported_problem(
        name, value, supported=0,
        rule="multi-token prediction (MTP) is not supported with packed THD rows in energon_pack",
        fix=fix or f"set {name}=0",
    )


def _cuda_graph_problem(name: str, *, fixed_width: bool, pad_cu_seqlens: bool) -> str | None:
    """CUDA graphs replay fixed tensor shapes: they need fixed-width rows and padded cu_seqlens."""
    if fixed_width is True and pad_cu_seqlens is True:
        return None
    return (
        f"{name}=True: CUDA graphs need fixed tensor shapes, i.e. fixed_width=True and "
        f"pad_cu_seqlens=True with max_segments (got fixed_width={fixed_width!r}, "
        f"pad_cu_seqlens={pad_cu_seqlens!r}); fix: set fixed_width: true, pad_cu_seqlens: true "
        "and max_segments: N in the packing config, or disable CUDA graphs"
    )


def switched_buffer_unit(values: Mapping[str, Any]) -> dict[str, Any]:
    """Setting one of buffer_size / buffer_tokens over an existing policy unsets the other.

    Example: ``{"buffer_tokens": 16384}`` -> ``{"buffer_size": None}``; ``{"min_fill": 0.9}`` -> ``{}``.
    """
    pair = {"buffer_size": "buffer_tokens", "buffer_tokens": "buffer_size"}
    return {other: None for key, other in pair.items() if key in values and other not in values}


def buffer_tokens_problem(row: RowLayout | None, policy: PackingPolicy | None) -> str | None:
    """``buffer_tokens`` (when set) must be a multiple of the row width, so a round holds whole rows.

    Example: seq_length 8192, buffer_tokens 12000 -> an error suggesting 16384.
    """
    if row is None or policy is None or policy.buffer_tokens is None or policy.buffer_tokens % row.seq_length == 0:
        return None
    return (
        f"buffer_tokens={policy.buffer_tokens}: must be a multiple of seq_length={row.seq_length} (a round "
        f"buffers whole rows of tokens); fix: set buffer_tokens to e.g. "
        f"{next_multiple(policy.buffer_tokens, row.seq_length)}"
    )


def trainer_problems(
    row: RowLayout | None,
    *,
    micro_batch_size: Any,
    global_batch_size: Any,
    data_parallel_size: Any,
    mtp_num_layers: Any,
    cuda_graphs: Any,
    pipeline_model_parallel_size: Any = 1,
    in_batch: int = 0,
) -> Iterator[str | None]:
    """The trainer-side rules for packed rows: one line per violated rule (None for rules that hold).

    ``micro_batch_size`` None skips its rule (a config's own, checked by ``PackingPolicy``);
    ``in_batch`` is k in mode "in_batch" (the trainer's micro-batch is then k samples in one
    row), else 0. ``data_parallel_size`` None means ``row.topology.dp``. Rules that need the row layout are
    skipped when ``row`` is None (an invalid layout, reported on its own).
    """
    topology = None if row is None else row.topology
    dp = topology.dp if data_parallel_size is None and topology is not None else data_parallel_size
    dp_problem = None if dp is None else int_problem("data_parallel_size", dp, minimum=1)
    yield dp_problem
    if micro_batch_size is not None:
        yield (
            _in_batch_micro_batch_problem("micro_batch_size", micro_batch_size, in_batch)
            if in_batch
            else micro_batch_problem("micro_batch_size", micro_batch_size)
        )
    if dp is not None and not dp_problem:
        yield _global_batch_problem("global_batch_size", global_batch_size, dp)
    yield pipeline_problem("pipeline_model_parallel_size", pipeline_model_parallel_size)
    yield mtp_problem("mtp_num_layers", mtp_num_layers)
    yield bool_problem("cuda_graphs", cuda_graphs)
    if cuda_graphs is True and row is not None:
        yield _cuda_graph_problem("cuda_graphs", fixed_width=row.fixed_width, pad_cu_seqlens=row.pad_cu_seqlens)


def per_token_loss_problems(
    row: RowLayout, *, finetune: bool, calculate_per_token_loss: Any, average_in_collective: Any
) -> Iterator[str]:
    """Per-token loss (loss and weight sums added over micro-batches and ranks, then divided) is
    needed by packed finetuning with CP > 1 and by the "sample" / "square" loss reductions."""
    cp = row.topology.cp
    reasons = []
    if finetune and cp > 1:
        reasons.append(
            f"packed finetuning with context parallel cp={cp} (CP ranks hold different numbers of loss tokens)"
        )
    if row.loss_reduction != "token":
        reasons.append(
            f"loss_reduction={row.loss_reduction!r} (its loss_mask weights give the intended mean only "
            "when sum(loss * loss_mask) and sum(loss_mask) are added over micro-batches and ranks before dividing)"
        )
    if not reasons:
        return
    why = " and ".join(reasons)
    if calculate_per_token_loss is not True:
        yield (
            f"calculate_per_token_loss={calculate_per_token_loss!r}: {why} needs per-token loss; "
            "fix: pass calculate_per_token_loss=True"
        )
    if average_in_collective is not False:
        yield (
            f"average_in_collective={average_in_collective!r}: {why} uses per-token loss, which the gradient "
            "averaging inside the collective would rescale; fix: pass average_in_collective=False"
        )
