"""One data-parallel rank of the packing loader, for ``tests/loader/test_multirank.py`` (run by torchrun).

    torchrun --nproc_per_node=2 --standalone tests/support/multirank_worker.py \
        --dataset D --out DIR --phase {full,resume} [--save-after K]

The process group is ``gloo`` (CPU); ``get_packing_loader`` reads rank and world size from
``torch.distributed``. Each rank reads a finite epoch (``repeat=False``) with 2 workers.

* ``full``: iterate this rank's whole stream; right after row ``K`` (1-based) save the loader
  state to ``DIR/state_rank{r}.pkl``; write every row's keys and digest to ``DIR/full_rank{r}.json``.
* ``resume``: build a fresh loader, restore ``DIR/state_rank{r}.pkl``, iterate to the end and
  write ``DIR/resume_rank{r}.json``.

Each JSON holds ``rank``, ``world_size``, ``save_after``, ``rows`` (``{"keys", "digest"}`` per
row) and ``stats`` (``loader.stats()``: skip counts by reason and totals).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

#: Row tensors whose bytes make up a row digest (top-level keys, then ``visual_inputs`` fields).
ROW_TENSORS = ("input_ids", "labels", "loss_mask", "position_ids", "mrope_position_ids", "cu_seqlens_q_padded")
VISUAL_TENSORS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts")

PACKING = dict(seq_length=4096, buffer_size=4, num_workers=2, repeat=False)
CHECKPOINTING = dict(checkpoint_every_sec=0, checkpoint_every_min_n_samples=1)


def row_digest(row: dict[str, Any]) -> str:
    """SHA-256 (hex) over name, dtype, shape and bytes of a row's token, rope and pixel tensors.

    Absent visual fields (None) contribute their name only, so two rows digest equal exactly
    when all these tensors are identical. Example: two rows that differ in one pixel value ->
    two different digests.
    """
    digest = hashlib.sha256()
    visual = row["visual_inputs"]
    named = [(name, row[name]) for name in ROW_TENSORS] + [(f"visual.{n}", getattr(visual, n)) for n in VISUAL_TENSORS]
    for name, tensor in named:
        digest.update(name.encode())
        if tensor is None:
            continue
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def _record(row: dict[str, Any]) -> dict[str, Any]:
    return {"keys": list(row["__keys__"]), "digest": row_digest(row)}


def run(dataset: Path, out: Path, phase: str, save_after: int) -> None:
    """Run one phase on this rank (the process group must be initialized)."""
    from energon_pack import PackingConfig, get_packing_loader, load_processor

    rank, world_size = dist.get_rank(), dist.get_world_size()
    loader = get_packing_loader(dataset, PackingConfig(**PACKING), load_processor(), **CHECKPOINTING)
    state_path = out / f"state_rank{rank}.pkl"
    rows: list[dict[str, Any]] = []
    if phase == "full":
        for row in loader:
            rows.append(_record(row))
            if len(rows) == save_after:
                state_path.write_bytes(pickle.dumps(loader.save_state_rank()))
        if len(rows) <= save_after:
            raise RuntimeError(
                f"rank {rank} produced {len(rows)} rows, not more than --save-after={save_after}; "
                "use a larger dataset or a smaller --save-after"
            )
    else:
        loader.restore_state_rank(pickle.loads(state_path.read_bytes()))
        rows = [_record(row) for row in loader]
    report = {"rank": rank, "world_size": world_size, "save_after": save_after, "rows": rows, "stats": loader.stats()}
    (out / f"{phase}_rank{rank}.json").write_text(json.dumps(report, indent=1), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--dataset", type=Path, required=True, help="prepared energon_pack dataset")
    parser.add_argument("--out", type=Path, required=True, help="folder for states and JSON records")
    parser.add_argument("--phase", choices=("full", "resume"), required=True)
    parser.add_argument("--save-after", type=int, default=2, help="save the state after this many rows")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    dist.init_process_group("gloo")
    try:
        run(args.dataset, args.out, args.phase, args.save_after)
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
