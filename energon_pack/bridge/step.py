"""Megatron-Bridge's VLM ``forward_step`` with the packed rows' own metrics in its logs.

Importing this module imports Megatron-Bridge (``pip install 'energon-pack[bridge]'``, Python 3.12).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import torch

try:
    from megatron.bridge.training import vlm_step
    from megatron.bridge.training.utils.pg_utils import get_pg_collection
except ImportError as err:  # pragma: no cover - exercised where Bridge is absent
    raise ImportError(
        f"energon_pack.bridge.forward_step needs Megatron-Bridge, which could not be imported ({err}); "
        "fix: pip install 'energon-pack[bridge]' (Megatron-Bridge needs Python 3.12)"
    ) from err

from energon_pack.bridge.iterator import packing_iterator_of
from energon_pack.metrics import TOKEN_KEYS, RowMetrics

__all__ = ["forward_step"]

#: (loss, token count, reporting dict): what Bridge's loss function returns.
LossResult = tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]


class RowsSeen(Iterator[dict[str, Any]]):
    """Draws from Bridge's data iterator and keeps the row drawn (the row Bridge builds the batch from)."""

    def __init__(self, data_iterator: Iterator[dict[str, Any]]) -> None:
        self.data_iterator = data_iterator
        self.row: dict[str, Any] | None = None

    def __next__(self) -> dict[str, Any]:
        row = next(self.data_iterator)
        if "segment_source" not in row:
            raise ValueError(
                f"energon_pack.bridge.forward_step got a row without 'segment_source' (samples {row.get('__keys__')}): "
                "rows from an older energon_pack loader or another data pipeline carry no source per segment; "
                "fix: build the rows with this energon_pack (PackingDatasetProvider or PackingIterator over "
                "get_packing_loader), or train with megatron.bridge.training.vlm_step.forward_step"
            )
        self.row = row
        return row


def forward_step(
    state: Any, data_iterator: Iterator[dict[str, Any]], model: Any, return_schedule_plan: bool = False
) -> tuple[Any, Callable[..., LossResult]]:
    """``megatron.bridge.training.vlm_step.forward_step`` (the batch, the model call, ``"lm loss"``
    unchanged) whose loss function adds :class:`~energon_pack.RowMetrics` of the micro-batch's row
    to Bridge's reporting dict: ``lm loss/<source>``, ``data/...``, each a float32 [2]
    (numerator, denominator) that Bridge's ``train_step`` sums over micro-batches, all-reduces
    over the data-parallel and context-parallel group and divides, and ``training_log`` writes.

    ``data_iterator`` must yield through :class:`~energon_pack.bridge.PackingIterator` (it names
    the sources and times the loader wait; Megatron-Core's ``RerunDataIterator`` around it is
    fine). Under context parallelism the per-token losses are the CP rank's shard, reported as
    that shard's share.
    Use: ``pretrain(cfg, forward_step)`` with ``cfg.dataset`` a
    :class:`~energon_pack.bridge.PackingDatasetProvider`.
    """
    rows = RowsSeen(data_iterator)
    output, bridge_loss = vlm_step.forward_step(state, rows, model, return_schedule_plan)
    metrics = packing_iterator_of(data_iterator).row_metrics
    cp = get_pg_collection(model).cp
    cp_size, cp_rank = torch.distributed.get_world_size(cp), torch.distributed.get_rank(cp)
    return output, partial(loss_with_row_metrics, bridge_loss, metrics, rows.row, cp_size, cp_rank)


def loss_with_row_metrics(
    bridge_loss: Callable[..., LossResult],
    metrics: RowMetrics,
    row: dict[str, Any],
    cp_size: int,
    cp_rank: int,
    output_tensor: torch.Tensor | tuple[torch.Tensor, ...],
    **kwargs: Any,
) -> LossResult:
    """Bridge's loss on ``output_tensor`` (per-token losses [1, W], or with CP the model's
    ``(losses of the shard, its loss_mask)``), its reporting dict extended by the row's metrics."""
    loss, num_tokens, report = bridge_loss(output_tensor, **kwargs)
    token_loss = (output_tensor[0] if isinstance(output_tensor, tuple) else output_tensor).detach()
    extra = metrics.metrics(on_device(row, token_loss.device), token_loss, cp_size=cp_size, cp_rank=cp_rank)
    return loss, num_tokens, {**report, **extra}


def on_device(row: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """``row`` with the tensors RowMetrics reads per token (``TOKEN_KEYS``, a few [W] masks and the
    segment boundaries) on ``device`` (non-blocking copies: no synchronisation), so that its metrics
    are computed, and all-reduced by Bridge, where the losses are; the model's inputs (ids, labels,
    positions, pixels) are not copied again.

    Example: a host row and CUDA losses -> ``loss_mask``, ``padding_mask``, ``cu_seqlens_q_padded``,
    ``segment_source`` on CUDA; ``input_ids``, ``visual_inputs``, ``__stats__`` as they are.
    """
    return {key: row[key].to(device, non_blocking=True) if key in TOKEN_KEYS else value
            for key, value in row.items()}

