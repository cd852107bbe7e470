"""``energon-pack inspect``: what a prepared dataset holds, measured with preencode (no pixels)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from energon_pack.config import PackingConfig
from energon_pack.core.dataset_path import check_dataset_path
from energon_pack.runtime.pinning import pin_only_with_accelerator
from energon_pack.core.tables import format_table


def iter_prepared(dataset: Path, *, split: str = "train", processor: Any = None, limit: int | None = None) -> Iterator[Any]:
    """Yield ``(raw sample, prepared sample)`` for one pass over ``dataset`` (main process, no workers)."""
    from megatron.energon import WorkerConfig, get_loader, get_val_dataset
    from tqdm import tqdm

    from energon_pack.runtime.task_encoder import QwenVLPackingTaskEncoder

    check_dataset_path(dataset, split=split)
    encoder = QwenVLPackingTaskEncoder(PackingConfig(seq_length=1 << 20), processor)
    samples = get_val_dataset(
        dataset, split_part=split, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0), batch_size=None
    )
    for index, sample in enumerate(tqdm(pin_only_with_accelerator(get_loader(samples)), desc="preencode", unit="sample")):
        if limit is not None and index >= limit:
            return
        yield sample, encoder.preencode_sample(sample)


def summarize(dataset: Path, *, split: str = "train", processor: Any = None, limit: int | None = None) -> list[dict[str, Any]]:
    """Report rows: sample and media counts, compressed bytes, token length percentiles, skips."""
    lengths: list[int] = []
    images = videos = media_bytes = samples = 0
    skipped: Counter[str] = Counter()
    for raw, prepared in iter_prepared(dataset, split=split, processor=processor, limit=limit):
        samples += 1
        images += len(raw.images)
        videos += len(raw.videos)
        media_bytes += sum(map(len, raw.images)) + sum(map(len, raw.videos))
        if prepared.skip_reason is not None:
            skipped[prepared.skip_reason] += 1
        else:
            lengths.append(prepared.num_tokens)
    rows: list[dict[str, Any]] = [
        {"metric": "samples", "value": samples},
        {"metric": "images", "value": images},
        {"metric": "videos", "value": videos},
        {"metric": "compressed media (MiB)", "value": f"{media_bytes / 2**20:.1f}"},
    ]
    if lengths:
        p50, p90, p99 = np.percentile(lengths, [50, 90, 99])
        rows += [
            {"metric": "tokens: mean", "value": f"{np.mean(lengths):.0f}"},
            {"metric": "tokens: p50 / p90 / p99", "value": f"{p50:.0f} / {p90:.0f} / {p99:.0f}"},
            {"metric": "tokens: max", "value": max(lengths)},
        ]
    rows.append({"metric": "bad samples (skipped)", "value": sum(skipped.values())})
    rows += [{"metric": f"  skipped: {reason}", "value": count} for reason, count in sorted(skipped.items())]
    return rows


def run_inspect(dataset: Path, *, split: str = "train", limit: int | None = None) -> int:
    """Print the dataset summary table."""
    print(format_table(summarize(dataset, split=split, limit=limit)))
    return 0
