"""``cfg.dataset`` for Megatron-Bridge: this rank's train and validation iterators of packed rows.

Importing this module imports Megatron-Bridge (``pip install 'energon-pack[bridge]'``, Python 3.12).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

try:
    from megatron.bridge.data.base import DatasetBuildContext, DatasetProvider
except ImportError as err:  # pragma: no cover - exercised where Bridge is absent
    raise ImportError(
        f"energon_pack.bridge.PackingDatasetProvider needs Megatron-Bridge, which could not be imported "
        f"({err}); fix: pip install 'energon-pack[bridge]' (Megatron-Bridge needs Python 3.12)"
    ) from err

from energon_pack.bridge.checks import with_step_size
from energon_pack.bridge.iterator import PackingIterator
from energon_pack.config import PackingConfig
from energon_pack.loader import get_packing_loader
from energon_pack.qwen.family import Family
from energon_pack.qwen.processor import load_processor

__all__ = ["PackingDatasetProvider"]


@dataclass(kw_only=True)
class PackingDatasetProvider(DatasetProvider):
    """Bridge dataset config whose iterators yield energon_pack rows (one row per micro-batch).

    ``path``: Energon dataset or metadataset; ``packing``: the packing config; the processor is
    ``load_processor(processor_path, ...)`` with the pixel and frame limits given here (the
    offline default of ``processor_family`` when ``processor_path`` is None). Validation reads
    split ``"val"`` of ``valid_path`` (default ``path``) once per epoch, cycling.
    ``dataloader_type`` must stay ``"external"``: Bridge then takes our iterators as they are.
    ``plan``: a pack plan of ``path``'s train split (``energon-pack plan``); a balanced plan
    (``balance_steps``) is read in balanced steps of ``global_batch_size`` rows (set it to
    ``cfg.train.global_batch_size``; :func:`~energon_pack.bridge.check_bridge_config` checks it):
    ``micro_batches_per_step`` = global batch / (micro-batch 1 x the data-parallel size). Without a
    plan, ``balance_steps`` balances the online train rows in those steps the same way.
    ``num_workers`` mirrors ``packing.num_workers`` (the workers the loader really starts).
    Run :func:`~energon_pack.bridge.check_bridge_config` on the whole config before training.
    """

    path: str
    packing: PackingConfig
    processor_path: str | None = None
    processor_family: Family | None = None
    min_pixels: int | None = None
    max_pixels: int | None = None
    max_frames: int | None = None
    valid_path: str | None = None
    do_validation: bool = True
    plan: str | None = None
    global_batch_size: int | None = None
    dataloader_type: Literal["external"] | None = "external"

    def __post_init__(self) -> None:
        self.num_workers = self.packing.num_workers

    def finalize(self) -> None:
        """Bridge calls this from ``ConfigContainer.validate()``."""
        if self.dataloader_type != "external":
            raise ValueError(
                f"PackingDatasetProvider.dataloader_type={self.dataloader_type!r}: Bridge would wrap the "
                "packing iterators in its own sampler; fix: leave dataloader_type = 'external'"
            )
        self.num_workers = self.packing.num_workers
        super().finalize()

    def build_datasets(self, context: DatasetBuildContext) -> tuple[Any, Any, None]:
        """(train, validation, None) iterators of this rank's data-parallel group; Bridge asks for
        a split only when it will use it (sample count > 0)."""
        processor = load_processor(
            self.processor_path,
            family=self.processor_family if self.processor_path is None else None,
            min_pixels=self.min_pixels,
            max_pixels=self.max_pixels,
            max_frames=self.max_frames,
        )
        group = None if context.pg_collection is None else context.pg_collection.dp

        def rows(path: str, split: str, packing: PackingConfig = self.packing, plan: str | None = None) -> PackingIterator:
            loader = get_packing_loader(path, packing, processor, split=split, data_parallel_group=group, plan=plan)
            return PackingIterator(loader)

        train_packing = self.packing
        if (self.plan is not None or self.packing.policy.balance_steps) and self.global_batch_size is not None:
            import torch.distributed as dist

            dp = dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1
            train_packing = with_step_size(
                self.packing, global_batch_size=self.global_batch_size, micro_batch_size=1, data_parallel_size=dp
            )
        train = rows(self.path, "train", train_packing, self.plan) if context.train_samples > 0 else None
        valid = rows(self.valid_path or self.path, "val") if self.do_validation and context.valid_samples > 0 else None
        return train, valid, None
