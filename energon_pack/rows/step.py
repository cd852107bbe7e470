"""GPU-side adapter: a packed THD row -> device tensors shaped for Megatron-Bridge's ``vlm_step``.

Also the context-parallel (CP) load-balanced split of a THD row, identical to Transformer
Engine's ``thd_get_partitioned_indices``.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import torch

from energon_pack.core.visual import VisualInputs

__all__ = ["PACKED_SEQ_FIELDS", "partition_positions", "thd_partition_indices", "to_device_batch"]

#: Token-aligned tensors of a row; a CP split indexes them along their last dim.
_TOKEN_KEYS = ("input_ids", "labels", "loss_mask", "position_ids", "padding_mask", "mrope_position_ids")
_CU_SEQLENS_KEYS = ("cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded")
_MAX_SEQLEN_KEYS = ("max_seqlen_q", "max_seqlen_kv")
#: Host values of a row that ``energon_pack.metrics.RowMetrics`` reads (not model input), passed through as they are.
_HOST_KEYS = ("__stats__", "__loader_wait_s__")
#: Fields of ``packed_seq_params`` (Megatron-Core ``PackedSeqParams`` keyword names).
PACKED_SEQ_FIELDS = ("qkv_format", *_CU_SEQLENS_KEYS, *_MAX_SEQLEN_KEYS)


def thd_partition_indices(
    cu_seqlens_padded: torch.Tensor, total_tokens: int, cp_size: int, cp_rank: int
) -> torch.Tensor:
    """Token indices (int64 [total_tokens / cp_size]) that CP rank ``cp_rank`` keeps.

    Transformer Engine's load-balanced THD split: every physical segment [start, end) is cut
    into 2*cp_size equal chunks and rank r takes chunks r and 2*cp_size-1-r of every segment,
    segments in order. Each padded segment length must be divisible by 2*cp_size (cp_size 1
    keeps every token, no constraint). Zero-length segments (repeated cu_seqlens padding)
    are allowed. The result lives on the device of ``cu_seqlens_padded``.

    Example: cu_seqlens_padded [0, 8, 12], cp 2 -> chunks of 2 and 1 tokens;
    rank 0 -> [0, 1, 6, 7, 8, 11], rank 1 -> [2, 3, 4, 5, 9, 10].
    """
    if cp_size < 1 or not 0 <= cp_rank < cp_size:
        raise ValueError(
            f"cp_size={cp_size}, cp_rank={cp_rank}: need cp_size >= 1 and 0 <= cp_rank < cp_size; "
            "fix: pass the context-parallel size and this rank's index in the CP group"
        )
    cu = cu_seqlens_padded.to(torch.int64)
    if cu.dim() != 1 or cu.numel() < 2 or int(cu[0]) != 0 or int(cu[-1]) != total_tokens:
        raise ValueError(
            f"cu_seqlens_padded={cu.tolist()} with total_tokens={total_tokens}: must be 1-D, start at 0 and end "
            "at total_tokens; fix: pass the row's cu_seqlens_q_padded and its total_tokens (W)"
        )
    lengths = cu[1:] - cu[:-1]
    if bool((lengths < 0).any()):
        raise ValueError(f"cu_seqlens_padded={cu.tolist()} decreases; fix: pass cumulative segment boundaries")
    chunks = 2 * cp_size
    if cp_size > 1 and bool((lengths % chunks != 0).any()):
        raise ValueError(
            f"padded segment lengths {lengths.tolist()} are not all divisible by 2*cp={chunks}: the CP "
            f"load-balanced split cuts every segment into {chunks} equal chunks; fix: build rows with "
            "pad_to_multiple_of from ParallelTopology(cp=...).pad_multiple (a multiple of 2*cp)"
        )
    return partition_positions(cu, total_tokens, cp_size, cp_rank)


def partition_positions(cu_seqlens_padded: torch.Tensor, total_tokens: int, cp_size: int, cp_rank: int) -> torch.Tensor:
    """:func:`thd_partition_indices` without its checks, and without a host-device synchronisation
    (every output size is known on the host): for boundaries already checked (a row of the loader,
    or one Megatron splits). Example: [0, 8, 12], W 12, cp 2, rank 1 -> [2, 3, 4, 5, 9, 10]."""
    cu = cu_seqlens_padded.to(torch.int64)
    if cp_size == 1:
        return torch.arange(total_tokens, device=cu.device)
    chunks = 2 * cp_size
    chunk = (cu[1:] - cu[:-1]) // chunks
    starts = torch.stack([cu[:-1] + cp_rank * chunk, cu[:-1] + (chunks - 1 - cp_rank) * chunk], dim=1).flatten()
    sizes = chunk.repeat_interleave(2)
    block_offsets = torch.cumsum(sizes, 0) - sizes
    shard = total_tokens // cp_size
    position = torch.arange(shard, device=cu.device)
    return (starts - block_offsets).repeat_interleave(sizes, output_size=shard) + position


def to_device_batch(
    batch: Mapping[str, Any],
    device: torch.device | str,
    *,
    cp_size: int = 1,
    cp_rank: int = 0,
    split_for_cp: bool = False,
) -> dict[str, Any]:
    """Move a packed row (docs/batch_contract.md) to ``device`` in the shape ``vlm_step`` consumes.

    Keys follow Megatron-Bridge ``vlm_step.get_batch_from_iterator`` / ``get_batch``, so the
    result can be yielded straight into its data iterator:

    * ``tokens`` and ``input_ids`` (the same tensor; ``get_batch`` reads ``tokens`` first),
      ``labels``, ``loss_mask``, ``position_ids``, ``attention_mask`` (None): forward args;
    * ``cu_seqlens_q``, ``cu_seqlens_kv``, ``cu_seqlens_q_padded``, ``cu_seqlens_kv_padded``
      on the device and ``max_seqlen_q``, ``max_seqlen_kv`` as host int32 0-dim tensors
      (Bridge keeps these on the host), plus ``total_tokens`` (W): the flat metadata Bridge
      turns into PackedSeqParams itself;
    * ``visual_inputs``: a :class:`VisualInputs` on the device with float32 pixels (a uint8
      payload is normalised there, once) and no normalisation constants;
    * ``audio_inputs`` (Qwen-Omni rows with sound only): the row's `AudioInputs` on the device
      (features [128, F] and ``audio_feature_lengths``; whole under CP, like the pixels);
    * ``packed_seq_params``: ready for custom loops - a Megatron-Core
      ``PackedSeqParams(qkv_format="thd", ...)`` with int max_seqlen when megatron.core is
      importable, else a dict with exactly the fields PACKED_SEQ_FIELDS;
    * ``padding_mask`` (MoE router), ``mrope_position_ids`` (Qwen-VL rope), ``__keys__``;
    * ``loss_tokens`` int32 [n_segments] on the device, supervised tokens per segment for a
      custom loss reduction (``vlm_step`` reads only its own keys and passes this one over);
    * ``segment_source`` int32 [n_segments] on the device (each segment's source), and the host
      values ``__stats__`` and ``__loader_wait_s__`` when the row has them: what
      ``energon_pack.metrics.RowMetrics`` reads.

    Host tensors are pinned and copied with ``non_blocking=True`` when ``device`` is CUDA,
    plainly otherwise. With ``split_for_cp=True`` every token-aligned tensor is cut to this
    CP rank's share (:func:`thd_partition_indices`, last dim) before the copy; cu_seqlens,
    max_seqlen and total_tokens stay global, as Transformer Engine's THD CP attention
    expects; loss_tokens, segment_source and visual inputs stay whole (per segment, not per token). Bridge's
    VLM models split the row themselves, so leave ``split_for_cp`` False there.
    """
    target = torch.device(device)
    if target.type == "cuda":

        def move(t: torch.Tensor) -> torch.Tensor:
            return t.pin_memory().to(target, non_blocking=True) if t.device.type == "cpu" else t.to(target)

        def move_visual(v: Any) -> Any:
            return v.pin_memory().to(target, non_blocking=True)

    else:

        def move(t: torch.Tensor) -> torch.Tensor:
            return t.to(target)

        def move_visual(v: Any) -> Any:
            return v.to(target)

    input_ids = batch["input_ids"]
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(
            f"input_ids has shape {tuple(input_ids.shape)}: a packed row is [1, W] (micro-batch size 1); "
            "fix: collate packed rows with energon_pack.rows.thd.collate_rows"
        )
    tokens = {key: batch[key] for key in _TOKEN_KEYS}
    if split_for_cp:
        keep = thd_partition_indices(batch["cu_seqlens_q_padded"], int(batch["total_tokens"]), cp_size, cp_rank)
        tokens = {key: value.index_select(-1, keep.to(value.device)) for key, value in tokens.items()}
    out: dict[str, Any] = {key: move(value) for key, value in tokens.items()}
    out["tokens"] = out["input_ids"]
    out["attention_mask"] = None
    out.update({key: move(batch[key]) for key in _CU_SEQLENS_KEYS})
    out.update({key: batch[key].cpu() for key in _MAX_SEQLEN_KEYS})
    out["total_tokens"] = int(batch["total_tokens"])
    out["loss_tokens"] = move(batch["loss_tokens"])
    out["visual_inputs"] = VisualInputs(**move_visual(batch["visual_inputs"]).normalized_for_model())
    if batch.get("audio_inputs") is not None:
        out["audio_inputs"] = move_visual(batch["audio_inputs"])
    out["packed_seq_params"] = _packed_seq_params(
        qkv_format="thd",
        **{key: out[key] for key in _CU_SEQLENS_KEYS},
        **{key: int(out[key]) for key in _MAX_SEQLEN_KEYS},
    )
    out["__keys__"] = list(batch.get("__keys__", []))
    if "segment_source" in batch:
        out["segment_source"] = move(batch["segment_source"])
    out.update({key: batch[key] for key in _HOST_KEYS if key in batch})
    return out


def _packed_seq_params(**fields: Any) -> Any:
    """Megatron-Core PackedSeqParams(**fields) when megatron.core is importable, else ``dict(fields)``."""
    try:
        module = importlib.import_module("megatron.core.packed_seq_params")
    except ImportError:
        return dict(fields)
    return module.PackedSeqParams(**fields)
