"""``energon-pack demo``: synthetic image+video chats -> packing loader with workers -> report.

Works offline on a fresh install: builds the default Qwen2.5-VL processor, generates a small
dataset, packs one epoch with worker processes, checks that a state saved midway restores to
the same continuation, and prints a report (rows, fill, samples/s, worker RSS, skips).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from energon_pack.core.cache import cache_dir
from energon_pack.core.tables import format_table


def ensure_synthetic_dataset(out_dir: Path, num_samples: int, seed: int = 0) -> Path:
    """Generate (once) the synthetic dataset for ``(num_samples, seed)``; return its path."""
    from energon_pack.data.synthetic import SyntheticSpec, make_synthetic_dataset

    # "media2": the mix with real-world media (a folder cached by an earlier release holds the old mix).
    dataset = out_dir / f"synthetic-media2-{num_samples}-{seed}"
    if not (dataset / "dataset" / ".nv-meta" / "dataset.yaml").exists():
        spec = SyntheticSpec(corrupt_fraction=0.03, real_world_fraction=0.25)
        make_synthetic_dataset(dataset, num_samples, seed=seed, spec=spec, progress=True)
    return dataset / "dataset"


def rows_equal(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Same keys and identical token tensors (``__stats__`` telemetry is not compared)."""
    names = ("input_ids", "labels", "loss_mask", "mrope_position_ids", "cu_seqlens_q_padded")
    return a["__keys__"] == b["__keys__"] and all(torch.equal(a[n], b[n]) for n in names)


def _ratio(value: float | None) -> str:
    """``0.98765`` -> ``"0.9877"``; None (not applicable) -> ``"n/a"``."""
    return "n/a" if value is None else f"{value:.4f}"


def run_demo(*, out_dir: Path | None, num_samples: int, seq_length: int, num_workers: int) -> int:
    """Run the demo and print its report; returns a process exit code."""
    from tqdm import tqdm

    from energon_pack.config import PackingConfig
    from energon_pack.loader import get_packing_loader
    from energon_pack.qwen.processor import load_processor

    work = out_dir or cache_dir("demo")
    print(f"energon-pack demo: data in {work}", flush=True)
    dataset = ensure_synthetic_dataset(work, num_samples)
    processor = load_processor()
    config = PackingConfig(seq_length=seq_length, buffer_size=16, num_workers=num_workers, repeat=False)
    checkpointing = dict(checkpoint_every_sec=0, checkpoint_every_min_n_samples=1)

    rows: list[dict[str, Any]] = []
    saved_state, saved_at = None, None
    start = time.perf_counter()
    with get_packing_loader(dataset, config, processor, **checkpointing) as loader:
        for row in tqdm(loader, desc="packing", unit="row"):
            rows.append(row)
            if saved_state is None and len(rows) >= 3:
                saved_state, saved_at = loader.save_state_rank(), len(rows)
        elapsed = time.perf_counter() - start
        stats = loader.stats()

    print(
        f"resume check: a fresh loader restores the state saved after row {saved_at} and re-reads the rest of "
        "the epoch (skip warnings below come from this re-read)",
        flush=True,
    )
    with get_packing_loader(dataset, config, processor, **checkpointing) as resumed:
        resumed.restore_state_rank(saved_state)
        continuation = list(tqdm(resumed, desc="resume check", unit="row"))
    expected = rows[saved_at:] if saved_at is not None else []
    resume_ok = len(continuation) == len(expected) and all(map(rows_equal, continuation, expected))

    report = [
        {"metric": "rows (W=%d)" % seq_length, "value": len(rows)},
        {"metric": "samples packed", "value": stats["samples_packed"]},
        {"metric": "samples read", "value": stats["samples_in"]},
        {"metric": "fill (real tokens / row slots)", "value": f"{stats['fill']:.4f}"},
        {"metric": "fill before the end-of-epoch flush", "value": _ratio(stats["fill_before_flush"])},
        {"metric": "rows from the end-of-epoch flush", "value": stats["flush_rows"]},
        {
            "metric": "ViT patches per row: mean / max",
            "value": f"{stats['row_cost_mean'].get('vision_patches', 0):.0f} / {stats['row_cost_max'].get('vision_patches', 0)}",
        },
        {"metric": "samples/s (whole loader)", "value": f"{stats['samples_packed'] / elapsed:.1f}"},
        {"metric": "worker peak RSS (MiB)", "value": f"{stats['worker_peak_rss_bytes'] / 2**20:.0f}"},
        {"metric": "skipped (total)", "value": stats["skipped_total"]},
        *({"metric": f"  skipped: {reason}", "value": count} for reason, count in stats["skipped"].items()),
        {"metric": f"resume after row {saved_at}: identical continuation", "value": "yes" if resume_ok else "NO"},
    ]
    print(format_table(report), flush=True)
    return 0 if resume_ok else 1
