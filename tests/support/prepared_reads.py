"""Reading a prepared dataset back with Energon (one process): its samples by key, a split's keys."""

from __future__ import annotations

from pathlib import Path

from megatron.energon import WorkerConfig, get_loader, get_train_dataset, get_val_dataset

from energon_pack.core.samples import QwenVLChatSample
from energon_pack.runtime.pinning import pin_only_with_accelerator


def load_all(path: Path, num_workers: int) -> dict[str, QwenVLChatSample]:
    """Every sample of the prepared dataset at ``path`` (train split, one pass) by key."""
    dataset = get_train_dataset(
        path,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=num_workers),
        batch_size=None,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        repeat=False,
    )
    samples = {}
    for sample in pin_only_with_accelerator(get_loader(dataset)):
        assert isinstance(sample, QwenVLChatSample)
        assert sample.__key__ not in samples
        samples[sample.__key__] = sample
    return samples


def split_keys(path: Path, split: str) -> list[str]:
    """The sample keys of ``split`` of the prepared dataset at ``path``, in read order."""
    dataset = get_val_dataset(
        path, split_part=split, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0), batch_size=None
    )
    return [sample.__key__ for sample in pin_only_with_accelerator(get_loader(dataset))]
