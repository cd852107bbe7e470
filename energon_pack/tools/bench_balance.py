"""``energon-pack bench --stage balance``: balanced steps without a plan, on real online loaders.

``--balance-dp`` ranks, each a real loader with ``--workers`` processes, read ``--rows`` rows of
``--seq-length`` (``repeat``), today's order and with ``balance_steps: true`` (a pool of
``--window-rows`` rows per worker, ``micro_batches_per_step`` = ``--balance-micro``); a step is each
rank's next ``--balance-micro`` rows, costed with the rows' own ``row_cost["flops"]`` (cost model
``--cost-model``). The table shows the step imbalance (mean over steps of the slowest rank's cost
over the mean rank's), its p99, the same summed over steps (the slowest ranks' total over the mean
ranks' total: step time against perfectly balanced steps), the rank floor (the costliest rank's
total over the mean rank's total: no order of the same rows goes below it), the row cost CV and
fill, today against balanced. Without
``--dataset`` the bench reads the synthetic image + video mix of ``--samples`` samples (made once).

A second table puts what balancing costs a worker side by side, plain against balanced, on rank 0
of ``--balance-dp``: worker peak USS (every worker process, sampled every 50 ms), seconds from
building the loader to its first row and to its ``--rows``-th (a balanced worker plans rows ahead of
what it emits while its pool fills: ``POOL_RAMP`` rows per row, docs/balanced_steps.md), seconds
from building a loader restored from a state saved after ``--rows`` rows (a step boundary) to its
first row, the samples that restore read again by
key (``loader.stats()["restore_reads"]``) and the samples read again per row because their row
waited in the pool (``parked_reads``). With ``--media realistic`` only this table runs, on the
realistic mix (12 MP photos, web-encoded clips: ``--photos``, ``--clips``, ``--mix-scale``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from energon_pack.tools.common import BenchRows
from energon_pack.tools.realistic_mix import RealisticMix, clip_durations, realistic_dataset

COLUMNS = ["order", "step imbalance (mean)", "p99", "summed", "rank floor", "row cost CV", "fill", "rows per rank"]
COST_COLUMNS = ["loader", "worker peak USS MiB", "s to first row", "s to last row", "s restore to first row",
                "reads per restore", "parked reads per row"]


@dataclass(frozen=True, kw_only=True)
class BalanceBenchOptions:
    """The balance bench's knobs: dataset (None: the synthetic mix), row width, ranks, micro-batches
    per step, worker processes per rank, rows per rank, window rows per worker, cost model. No
    defaults here: the command line's (``energon-pack bench --help``) are the only ones."""

    dataset: str | None
    seq_length: int
    dp: int
    micro: int
    workers: int
    rows: int
    window_rows: int
    cost_model: str
    #: The realistic mix to read instead (``--media realistic``: the cost table only), else None.
    realistic: RealisticMix | None = None


def balance_options(args: Any) -> BalanceBenchOptions:
    """The knobs from the command line."""
    realistic = None
    if getattr(args, "media", "synthetic") == "realistic":
        realistic = RealisticMix(photos=args.photos, clip_seconds=clip_durations(args.clips)).scaled(args.mix_scale)
    return BalanceBenchOptions(
        dataset=getattr(args, "dataset", None), seq_length=args.seq_length or (1024 if realistic is None else 32768),
        dp=args.balance_dp,
        micro=args.balance_micro, workers=args.workers, rows=args.rows, window_rows=args.window_rows,
        cost_model=args.cost_model, realistic=realistic,
    )


def step_costs(flops: np.ndarray, micro: int) -> np.ndarray:
    """Per rank and step, the summed cost of the rank's ``micro`` rows of that step: [dp, rows // micro].

    Example: ``step_costs(np.array([[1, 2, 3, 4]]), 2)`` -> ``[[3, 7]]``.
    """
    steps = flops.shape[1] // micro
    return flops[:, : steps * micro].reshape(flops.shape[0], steps, micro).sum(axis=2)


def step_imbalance(flops: np.ndarray, micro: int) -> np.ndarray:
    """Per step, the slowest rank's cost over the mean rank's (``flops``: [dp, rows] in reading order).

    Example: ranks [[1, 1], [3, 3]], one row a step -> ``[1.5, 1.5]``.
    """
    steps = step_costs(flops, micro)
    return steps.max(axis=0) / steps.mean(axis=0)


def rank_row_flops(path: Any, config: Any, processor: Any, *, dp: int, rows: int) -> tuple[np.ndarray, list[dict]]:
    """Each rank's first ``rows`` rows' modelled FLOPs [dp, rows], in the order the rank reads them,
    and each rank's loader stats."""
    from energon_pack.loader import get_packing_loader

    flops, stats = [], []
    for rank in range(dp):
        with get_packing_loader(path, config, processor, rank=rank, world_size=dp) as loader:
            iterator = iter(loader)
            flops.append([next(iterator)["row_cost"]["flops"] for _ in range(rows)])
            stats.append(loader.stats())
    return np.array(flops, dtype=np.float64), stats


def loader_costs(path: Any, config: Any, processor: Any, *, dp: int, rows: int) -> dict[str, float]:
    """What one loader (rank 0 of ``dp``) costs: worker peak USS (bytes), seconds to its first row
    and to its ``rows``-th, and, for a loader restored from the state saved after ``rows`` rows,
    seconds to its first row, samples read again by key at the restore and parked samples read
    again per row."""
    from energon_pack.loader import get_packing_loader
    from energon_pack.tools.bench_loader import WorkerMemorySampler

    sampler = WorkerMemorySampler()
    sampler.start()
    try:
        start = time.perf_counter()
        with get_packing_loader(path, config, processor, rank=0, world_size=dp) as loader:
            iterator = iter(loader)
            next(iterator)
            first = time.perf_counter() - start
            for _ in range(rows - 1):
                next(iterator)
            last = time.perf_counter() - start
            state = loader.save_state_rank()
            parked = loader.stats()["parked_reads"]
        start = time.perf_counter()
        with get_packing_loader(path, config, processor, rank=0, world_size=dp) as resumed:
            resumed.restore_state_rank(state)
            iterator = iter(resumed)
            next(iterator)
            restored = time.perf_counter() - start
            for _ in range(2 * max(1, config.num_workers) - 1):  # a row from every worker: each one's snapshot
                next(iterator)
            reads = resumed.stats()["restore_reads"]
    finally:
        sampler.stop()
    return {"uss": sampler.peak_uss, "first": first, "last": last, "restored": restored, "reads": reads,
            "parked": parked / rows}


def cost_table(path: Any, processor: Any, options: BalanceBenchOptions) -> BenchRows:
    """Plain against balanced loaders' costs (:func:`loader_costs`), and balanced / plain."""
    from energon_pack.config import PackingConfig

    rows = max(options.micro, options.rows - options.rows % options.micro)  # saved at a step boundary
    figures = {}
    for balance in (False, True):
        config = PackingConfig(
            seq_length=options.seq_length, num_workers=options.workers, repeat=True, cost_model=options.cost_model,
            balance_steps=balance, micro_batches_per_step=options.micro, balance_window_rows=options.window_rows,
        )
        figures[balance] = loader_costs(path, config, processor, dp=options.dp, rows=rows)
    table: BenchRows = [{
        "loader": f"balanced (pool of {options.window_rows} rows)" if balance else "plain",
        "worker peak USS MiB": f"{f['uss'] / 2**20:.0f}", "s to first row": f"{f['first']:.2f}",
        "s to last row": f"{f['last']:.2f}",
        "s restore to first row": f"{f['restored']:.2f}", "reads per restore": f"{f['reads']}",
        "parked reads per row": f"{f['parked']:.2f}",
    } for balance, f in figures.items()]
    plain, balanced = figures[False], figures[True]
    table.append({
        "loader": "balanced / plain", "worker peak USS MiB": f"{balanced['uss'] / plain['uss']:.2f}x",
        "s to first row": f"{balanced['first'] / plain['first']:.2f}x",
        "s to last row": f"{balanced['last'] / plain['last']:.2f}x",
        "s restore to first row": f"{balanced['restored'] / plain['restored']:.2f}x",
        "reads per restore": f"{balanced['reads'] / max(1, plain['reads']):.2f}x", "parked reads per row": "",
    })
    return table


def bench_balance(num_samples: int, work_dir: Path, options: BalanceBenchOptions) -> list[tuple[str, BenchRows, list[str]]]:
    """Today's order against balanced rows, from real loaders' rows; then what balancing costs a
    worker (:func:`cost_table`). With ``options.realistic``: the cost table on the realistic mix."""
    from energon_pack.config import PackingConfig
    from energon_pack.data.synthetic import SyntheticSpec, make_synthetic_dataset
    from energon_pack.packing.simulate import rank_floor, summed_step_imbalance
    from energon_pack.qwen.processor import load_processor

    processor = load_processor()
    cost_title = (f"what balancing costs a worker (rank 0 of DP{options.dp}, {options.workers} workers, "
                  f"W={options.seq_length}, state saved after the last of {options.rows} rows)")
    if options.realistic is not None:
        path = str(realistic_dataset(work_dir, options.realistic))
        return [(f"{cost_title}, realistic mix {path}", cost_table(path, processor, options), COST_COLUMNS)]
    path = options.dataset
    if path is None:
        folder = work_dir / f"balance-{num_samples}"
        if not (folder / "dataset" / ".nv-meta").is_dir():
            spec = SyntheticSpec(max_image_side=768, max_video_seconds=2.0, max_video_side=96)
            make_synthetic_dataset(folder, num_samples, seed=5, spec=spec, samples_per_shard=20)
        path = str(folder / "dataset")
    table: BenchRows = []
    for balance in (False, True):
        config = PackingConfig(
            seq_length=options.seq_length, num_workers=options.workers, repeat=True, cost_model=options.cost_model,
            balance_steps=balance, micro_batches_per_step=options.micro, balance_window_rows=options.window_rows,
        )
        flops, stats = rank_row_flops(path, config, processor, dp=options.dp, rows=options.rows)
        ratios = step_imbalance(flops, options.micro)
        fill = sum(s["real_tokens"] for s in stats) / max(1, sum(s["row_slots"] for s in stats))
        table.append({
            "order": f"balanced (pool of {options.window_rows} rows)" if balance else "today",
            "step imbalance (mean)": f"{ratios.mean():.4f}", "p99": f"{np.percentile(ratios, 99):.4f}",
            "summed": f"{summed_step_imbalance(flops, options.micro):.4f}",
            "rank floor": f"{rank_floor(flops, options.micro):.4f}",
            "row cost CV": f"{flops.std() / flops.mean():.3f}", "fill": f"{fill:.4f}", "rows per rank": options.rows,
        })
    title = (f"balanced steps without a plan, real loaders ({path}; DP{options.dp} x {options.micro} micro-batches, "
             f"{options.workers} workers per rank, W={options.seq_length}, cost model {options.cost_model})")
    return [(title, table, COLUMNS), (f"{cost_title}, {path}", cost_table(path, processor, options), COST_COLUMNS)]
