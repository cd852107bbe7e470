"""One data-parallel rank reading a pack plan, for ``tests/loader/test_plan_multirank.py`` (run by torchrun).

    torchrun --nproc_per_node=N --standalone tests/support/plan_multirank_worker.py --dataset D --plan P \
        --out DIR --workers 0,1,4 [--save-after K] [--resume]

The process group is ``gloo`` (CPU); ``get_packing_loader(..., plan=P)`` reads rank and world
size from ``torch.distributed``. Each run writes JSON records ``{"rank", "world_size", "rows":
[[position, keys, digest], ...]}`` to DIR:

* ``epoch_ws{N}_nw{n}_rank{r}.json``: one whole epoch with ``n`` workers, for each ``--workers``;
* ``--save-after K``: one worker, K rows per rank, then ``save_state_global`` gathers every
  rank's state on rank 0, which writes ``DIR/states_ws{N}.pkl``;
* ``--resume``: restore the states a run at another world size saved (``states_ws*.pkl``, the
  only one in DIR) with ``restore_state_global`` and read to the end of the epoch:
  ``resume_ws{N}_rank{r}.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
from pathlib import Path
from typing import Any

import torch.distributed as dist

from tests.support.multirank_worker import row_digest

SEQ_LENGTH = 512


def _record(row: dict[str, Any]) -> list[Any]:
    return [row["__plan__"]["position"], list(row["__keys__"]), row_digest(row)]


def _write(path: Path, rows: list[list[Any]]) -> None:
    report = {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "rows": rows}
    path.write_text(json.dumps(report), encoding="utf-8")


def run(args: argparse.Namespace) -> None:
    """Run this rank's part (the process group must be initialized)."""
    from energon_pack import PackingConfig, get_packing_loader, load_processor

    processor = load_processor()
    rank, world_size = dist.get_rank(), dist.get_world_size()

    def loader(num_workers: int):
        config = PackingConfig(seq_length=SEQ_LENGTH, num_workers=num_workers, repeat=False)
        return get_packing_loader(args.dataset, config, processor, plan=args.plan)

    for num_workers in (int(n) for n in args.workers.split(",")):
        rows = [_record(row) for row in loader(num_workers)]
        _write(args.out / f"epoch_ws{world_size}_nw{num_workers}_rank{rank}.json", rows)
    if args.save_after:
        reader = loader(1)
        iterator = iter(reader)
        for _ in range(args.save_after):
            next(iterator)
        states = reader.save_state_global(global_dst_rank=0)
        del iterator
        if rank == 0:
            (args.out / f"states_ws{world_size}.pkl").write_bytes(pickle.dumps(states))
    if args.resume:
        (saved,) = args.out.glob("states_ws*.pkl")
        resumed = loader(1)
        resumed.restore_state_global(pickle.loads(saved.read_bytes()))
        _write(args.out / f"resume_ws{world_size}_rank{rank}.json", [_record(row) for row in resumed])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--dataset", type=Path, required=True)
    parser.add_argument("--plan", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--workers", default="0,1,4", help="worker counts to read one epoch with")
    parser.add_argument("--save-after", type=int, default=0, help="save the state after this many rows per rank")
    parser.add_argument("--resume", action="store_true", help="restore the saved states and read to the end")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    dist.init_process_group("gloo")
    try:
        run(args)
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
