"""What the model sees, as trainer log figures: loss per source, mixture shares, fill, skips, loader wait.

``RowMetrics.metrics(row, token_loss)`` turns one packed row (docs/batch_contract.md, on any device)
and the per-token losses of its tokens into ``{key: float32 [2] tensor (numerator, denominator)}``
with the same keys on every micro-batch and rank: the form Megatron-Bridge's ``train_step`` sums
over the micro-batches of a step, all-reduces over the data-parallel (and context-parallel) group and
divides before ``training_log`` writes it. ``RowMetrics.reduce`` does the same on the host for other
trainers. Every key, what it means, how it is reduced and what it costs: docs/metrics.md.

No host-device synchronisation: per-token figures are ``index_add_`` sums over segment ids found with
``searchsorted`` in the row's ``cu_seqlens_q_padded`` (shapes known on the host); per-row figures
(segments, vision patches, audio frames, skips, loader wait) come from host values (tensor shapes,
``__stats__``) and reach the device in one non-blocking copy.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

#: The row's tensors the per-token figures read (where the losses are, they must be too).
TOKEN_KEYS = ("padding_mask", "loss_mask", "cu_seqlens_q_padded", "segment_source")

__all__ = [
    "DEFAULT_SKIP_REASONS", "TOKEN_KEYS", "RowMetrics", "SourceInfo", "SourceNameError", "source_infos", "source_name",
]

#: Skip reasons reported one by one by default (``data/skipped/<reason>``): the packing budgets a user
#: tunes. Every reason, these included, is in ``data/skipped/all``.
DEFAULT_SKIP_REASONS: tuple[str, ...] = ("overlong", "over_vision_budget", "over_media_budget")
#: The subflavor that names a metadataset entry in metric keys (Energon's metadataset has no ``name:``).
SOURCE_SUBFLAVOR = "source"


class SourceNameError(ValueError):
    """Two datasets of a blend would log under the same metric name."""


@dataclass(frozen=True, kw_only=True)
class SourceInfo:
    """One source of a loader's rows: ``row["segment_source"] == index`` marks its segments.

    ``name``: stable and safe for metric keys (:func:`source_name`); ``path``: the dataset (folder,
    URL or metadataset leaf) as the loader reads it; ``subflavors``: its Energon subflavors;
    ``weight``: its blend weight (None outside a weighted blend).
    """

    index: int
    name: str
    path: str
    subflavors: dict[str, Any] = field(default_factory=dict)
    weight: float | None = None


def source_name(path: Any, subflavors: Mapping[str, Any] | None = None) -> str:
    """A dataset's metric name: its subflavor ``source`` when set, else its folder's name (a
    metadataset file's name without ``.yaml``), with every character outside ``[A-Za-z0-9_.-]``
    turned into ``_`` (TensorBoard groups tags at ``/``).

    Examples: ``("/d/ocr_v2", {})`` -> ``"ocr_v2"``; ``("/d/x", {"source": "chat en/zh"})`` ->
    ``"chat_en_zh"``; ``("msc://bucket/sets/vqa/", None)`` -> ``"vqa"``; ``("/d/blend.yaml", None)`` -> ``"blend"``.
    """
    given = (subflavors or {}).get(SOURCE_SUBFLAVOR)
    if given is None:
        given = os.fspath(path).rstrip("/").rsplit("/", 1)[-1]
        given = re.sub(r"\.ya?ml$", "", given, flags=re.IGNORECASE)
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", str(given)).strip("_")
    return safe or "source"


def source_infos(entries: Sequence[Mapping[str, Any]], dataset: Any) -> list[SourceInfo]:
    """The sources of a loader's rows from its dataset entries (``index``, ``path``, ``subflavors``,
    ``weight``, as ``runtime.task_encoder.blend_entry`` gives them), or, with no entries, the one
    dataset ``dataset``. Raises ``SourceNameError`` naming both entries when two get the same name.

    Example: entries ``[{"index": 0, "path": "/d/short", "subflavors": {}, "weight": 1.0}, {"index": 1,
    "path": "/d/long", "subflavors": {"source": "ocr"}, "weight": 3.0}]`` -> names ``short`` and ``ocr``.
    """
    if not entries:
        entries = [{"index": 0, "path": os.fspath(dataset), "subflavors": {}, "weight": None}]
    infos = [
        SourceInfo(
            index=int(entry["index"]), name=source_name(entry["path"], entry.get("subflavors")),
            path=str(entry["path"]), subflavors=dict(entry.get("subflavors") or {}),
            weight=None if entry.get("weight") is None else float(entry["weight"]),
        )
        for entry in entries
    ]
    check_source_names(infos)
    return infos


def check_source_names(sources: Sequence[SourceInfo]) -> None:
    """Raise ``SourceNameError`` naming both entries when two sources share a metric name."""
    seen: dict[str, SourceInfo] = {}
    for source in sources:
        other = seen.setdefault(source.name, source)
        if other is not source:
            raise SourceNameError(
                f"blend entries {other.index} ({other.path}) and {source.index} ({source.path}) both get the metric "
                f"name {source.name!r} (names must be unique to log loss per source); fix: give each a unique "
                f"`subflavors: {{{SOURCE_SUBFLAVOR}: NAME}}` in the metadataset"
            )


class RowMetrics:
    """Per-source loss and data figures of packed rows, as ``(numerator, denominator)`` tensors.

    ``sources``: the loader's ``sources()`` (row ``segment_source`` indexes them); ``skip_reasons``:
    the skip reasons reported one by one; ``audio``: add ``data/audio frames per row`` (Qwen-Omni).
    Keys (docs/metrics.md): ``lm loss/<source>`` (when ``token_loss`` is passed), ``data/tokens/<source>``,
    ``data/supervised/<source>``, ``data/fill``, ``data/segments per row``, ``data/vision patches per row``,
    ``data/audio frames per row``, ``data/skipped/all``, ``data/skipped/<reason>``, ``data/loader wait s``.

    Skip rates are the skips since the previous row of the same worker over the samples it read
    since then, so one ``RowMetrics`` per loader (and rank) is kept for the whole run.
    """

    def __init__(
        self,
        sources: Sequence[SourceInfo],
        *,
        skip_reasons: Sequence[str] = DEFAULT_SKIP_REASONS,
        audio: bool = False,
    ) -> None:
        if not sources:
            raise ValueError("sources is empty: RowMetrics needs the loader's sources; fix: RowMetrics.from_loader(loader)")
        check_source_names(sources)
        misplaced = [source.index for position, source in enumerate(sources) if source.index != position]
        if misplaced:
            raise ValueError(
                f"sources with index {misplaced} are not at that position: row segment_source values index the list; "
                "fix: pass every source of the loader, in order (loader.sources())"
            )
        self.sources = list(sources)
        self.skip_reasons = tuple(skip_reasons)
        self.audio = audio
        #: Per worker id, (samples read, skips by reason) at its previous row.
        self._last_counts: dict[int, tuple[int, dict[str, int]]] = {}
        names = [source.name for source in self.sources]
        self._token_keys = (
            [f"lm loss/{name}" for name in names],
            [f"data/tokens/{name}" for name in names],
            [f"data/supervised/{name}" for name in names],
            ["data/fill"],
        )
        self._row_keys = [
            "data/segments per row", "data/vision patches per row", *(["data/audio frames per row"] if audio else []),
            "data/skipped/all", *(f"data/skipped/{reason}" for reason in self.skip_reasons), "data/loader wait s",
        ]

    @classmethod
    def from_loader(cls, loader: Any, **kwargs: Any) -> RowMetrics:
        """``RowMetrics`` of ``loader``'s sources (``PackingDataLoader`` or ``PlanDataLoader``), with
        ``data/audio frames per row`` when its rows are for a Qwen-Omni model."""
        from energon_pack.qwen.family import OMNI_FAMILIES

        kwargs.setdefault("audio", loader.family() in OMNI_FAMILIES)
        return cls(loader.sources(), **kwargs)

    def keys(self, *, with_loss: bool = True) -> list[str]:
        """Every key :meth:`metrics` returns, in order (``with_loss``: a ``token_loss`` is passed)."""
        loss, *token = self._token_keys
        return [*(loss if with_loss else []), *(key for group in token for key in group), *self._row_keys]

    def metrics(
        self, row: Mapping[str, Any], token_loss: torch.Tensor | None = None, *, cp_size: int = 1, cp_rank: int = 0
    ) -> dict[str, torch.Tensor]:
        """``{key: float32 [2] (numerator, denominator)}`` of ``row`` on its device; see the class doc.

        ``token_loss``: per-token loss of the row's token positions (``token_loss[t]`` is the loss of
        predicting ``labels[t]``), [W] or [1, W]; with ``cp_size`` > 1, CP rank ``cp_rank``'s shard
        [W / cp_size] in Transformer Engine's order (``rows.step.thd_partition_indices``; the row itself
        whole, or already split by ``to_device_batch(..., split_for_cp=True)``): token figures
        are then this shard's, and per-row figures are counted on CP rank 0 (zeros elsewhere), so
        sums over the CP group are the whole row's.
        """
        if "segment_source" not in row:
            raise ValueError(
                "the row has no 'segment_source' (rows from an energon_pack loader older than RowMetrics, or a "
                "batch dict that dropped it); fix: build rows with this energon_pack's get_packing_loader and move "
                "them with to_device_batch (which keeps segment_source)"
            )
        with_loss = token_loss is not None
        token_table = self._token_table(row, token_loss, cp_size=cp_size, cp_rank=cp_rank)
        row_table = self._row_table(row, counted=cp_rank == 0).to(token_table.device, non_blocking=True)
        table = torch.cat([token_table, row_table])
        return dict(zip(self.keys(with_loss=with_loss), table.unbind(0)))

    def _token_table(
        self, row: Mapping[str, Any], token_loss: torch.Tensor | None, *, cp_size: int, cp_rank: int
    ) -> torch.Tensor:
        """float32 [(3 or 2) * S + 1, 2]: (lm loss,) tokens and supervised per source, then fill."""
        from energon_pack.rows.step import partition_positions

        padding = row["padding_mask"].reshape(-1)  # TOKEN_KEYS: the row tensors read here
        loss_mask = row["loss_mask"].reshape(-1)
        boundaries = row["cu_seqlens_q_padded"].to(torch.int64)
        width = int(row.get("total_tokens", padding.numel()))
        if padding.numel() not in (width, width // cp_size):
            raise ValueError(
                f"the row's padding_mask has {padding.numel()} slots, neither its width W={width} nor a CP shard of "
                f"W/{cp_size}; fix: pass the row as the loader gives it (or as to_device_batch returns it)"
            )
        if cp_size > 1:
            positions = partition_positions(boundaries, width, cp_size, cp_rank)
            if padding.numel() == width:  # a whole row: this rank's shard of it (else already split_for_cp)
                padding, loss_mask = padding.index_select(0, positions), loss_mask.index_select(0, positions)
        else:
            positions = torch.arange(width, device=padding.device)
        shard = positions.numel()
        segment = torch.searchsorted(boundaries, positions, right=True) - 1
        source = row["segment_source"].to(device=padding.device, dtype=torch.int64).index_select(0, segment)
        real = (~padding).to(torch.float32)
        supervised = loss_mask != 0
        columns = [real, supervised.to(torch.float32)]
        if token_loss is not None:
            if token_loss.numel() != shard:
                raise ValueError(
                    f"token_loss has shape {tuple(token_loss.shape)} but the row's {'CP shard' if cp_size > 1 else 'width'} "
                    f"is {shard} tokens; fix: pass the per-token loss of this row's tokens ([W] or [1, W]; with "
                    "cp_size > 1 this CP rank's shard [W / cp_size])"
                )
            loss = token_loss.detach().reshape(-1).to(torch.float32)
            columns.append(torch.where(supervised, loss, torch.zeros_like(loss)))
        sums = torch.zeros(len(self.sources), len(columns), dtype=torch.float32, device=padding.device)
        sums.index_add_(0, source, torch.stack(columns, dim=1))
        totals = sums.sum(dim=0)
        count = len(self.sources)
        blocks = []
        if token_loss is not None:
            blocks.append(torch.stack([sums[:, 2], sums[:, 1]], dim=1))
        blocks.append(torch.stack([sums[:, 0], totals[0].expand(count)], dim=1))
        blocks.append(torch.stack([sums[:, 1], totals[1].expand(count)], dim=1))
        blocks.append(torch.stack([totals[0], torch.full_like(totals[0], shard)]).unsqueeze(0))
        return torch.cat(blocks)

    def _row_table(self, row: Mapping[str, Any], *, counted: bool) -> torch.Tensor:
        """float32 [R, 2] on the host: segments, vision patches, (audio frames,) skips, loader wait."""
        if not counted:
            return torch.zeros(len(self._row_keys), 2, dtype=torch.float32)
        pairs: list[tuple[float, float]] = [(row["segment_source"].numel(), 1), (_vision_patches(row), 1)]
        if self.audio:
            audio = row.get("audio_inputs")
            pairs.append((0 if audio is None else audio.input_features.shape[-1], 1))
        samples, skipped = self._skips_since_last_row(row.get("__stats__"))
        pairs.append((sum(skipped.values()), samples))
        pairs.extend((skipped.get(reason, 0), samples) for reason in self.skip_reasons)
        wait = row.get("__loader_wait_s__")
        pairs.append((0.0, 0.0) if wait is None else (float(wait), 1.0))
        return torch.tensor(pairs, dtype=torch.float32)

    def _skips_since_last_row(self, stats: Mapping[str, Any] | None) -> tuple[int, dict[str, int]]:
        """(samples read, skips by reason) that ``stats`` adds: per-row counts as they are (in-batch and
        plan rows), a worker's cumulative snapshot less that worker's previous one. The first row seen
        of a worker that emitted rows before (a resumed run) only sets the baseline: (0, {})."""
        if not stats:
            return 0, {}
        samples, skipped = int(stats.get("samples_in", 0)), dict(stats.get("skipped") or {})
        if stats.get("kind") == "row_counts":
            return samples, skipped
        worker = int(stats.get("worker_id", 0))
        if worker not in self._last_counts and int(stats.get("rows", 1)) > 1:
            self._last_counts[worker] = (samples, skipped)
            return 0, {}
        last_samples, last_skipped = self._last_counts.get(worker, (0, {}))
        self._last_counts[worker] = (samples, skipped)
        return samples - last_samples, {reason: n - last_skipped.get(reason, 0) for reason, n in skipped.items()}

    @staticmethod
    def reduce(metrics: Sequence[Mapping[str, torch.Tensor]], group: Any = None) -> dict[str, float]:
        """The step's figures from the ``metrics`` of its micro-batches: per key, the sums of numerators
        and of denominators (all-reduced over ``group``, the data-parallel x context-parallel process
        group, when given; None: this process alone), divided; NaN where the denominator is 0 (nothing
        to average: e.g. a source absent from the whole step). One device-to-host copy.

        Example: micro-batches ``{"lm loss/a": [6., 3.]}`` and ``{"lm loss/a": [2., 1.]}`` -> ``{"lm loss/a": 2.0}``.
        """
        if not metrics:
            raise ValueError("metrics is empty: reduce needs the metrics of at least one micro-batch")
        keys = list(metrics[0])
        for index, item in enumerate(metrics):
            if list(item) != keys:
                raise ValueError(
                    f"micro-batch {index} has keys {sorted(set(item) ^ set(keys))} that micro-batch 0 has not (or lacks "
                    "them): every micro-batch needs the same keys; fix: use one RowMetrics and pass token_loss on "
                    "every micro-batch or on none"
                )
        summed = torch.stack([torch.stack([item[key] for key in keys]) for item in metrics]).sum(dim=0)
        if group is not None:
            import torch.distributed as dist

            dist.all_reduce(summed, group=group)
        pairs = summed.double().cpu().tolist()
        return {key: (num / den if den else math.nan) for key, (num, den) in zip(keys, pairs)}


def _vision_patches(row: Mapping[str, Any]) -> int:
    """ViT input patches of the row: the rows of its image and video pixel tensors (one per t*h*w patch)."""
    visual = row.get("visual_inputs")
    pixels = (getattr(visual, name, None) for name in ("pixel_values", "pixel_values_videos"))
    return sum(int(p.shape[0]) for p in pixels if p is not None)
