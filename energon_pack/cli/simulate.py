"""``energon-pack simulate``: packing fill and vision patches per row of our selection vs
first-fit-decreasing per buffer, optionally under a vision budget per row; with ``--dp`` the
step imbalance of today's dealing vs a balanced plan (``docs/balanced_steps.md``).

Samples come from a prepared dataset (preencode only: exact token counts and patch grids, no
pixels) or from the built-in reference VLM mix (``energon_pack.packing.simulate.reference_mix``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from energon_pack.config import DEFAULT_ROUND_ROWS, PackingPolicy
from energon_pack.errors import UsageError
from energon_pack.packing.simulate import MixSample


def dataset_samples(dataset: str) -> list[MixSample]:
    """Exact token counts, vision patches, media counts and grids of a prepared dataset's good
    samples (:func:`dataset_mix` without its line)."""
    return dataset_mix(dataset)[0]


def dataset_mix(dataset: str, processor: Any = None) -> tuple[list[MixSample], str]:
    """Exact token counts, vision patches, media counts and grids of a prepared dataset's good
    samples: from prepare's facts when fresh for ``processor`` (None: the default one), else via
    preencode (no pixels); also the line saying which."""
    from energon_pack.data.inspect_dataset import prepared_samples
    from energon_pack.rows.flops import grid_rows

    samples, source = prepared_samples(dataset, processor=processor)
    return [
        MixSample(
            tokens=sample.tokens,
            vision_patches=sample.geometry.vision_patches,
            images=sample.images,
            videos=sample.videos,
            grids=tuple(grid_rows(sample.geometry.image_grid_thw, sample.geometry.video_grid_thw)),
        )
        for sample in samples
        if sample.reason is None
    ], source


def run_simulate(args: argparse.Namespace, processor: Any = None) -> int:
    """Print the side-by-side table (and optionally save a plot). With
    ``--max-row-vision-patches N`` every (W, buffer) is simulated without and with the budget;
    ``processor`` (``--family``) counts a dataset's tokens (None: the default one)."""
    from energon_pack.packing.simulate import (
        format_table,
        plot_fill,
        reference_mix,
        simulation_table,
    )

    defaults = PackingPolicy()
    if args.dataset is None and getattr(args, "family", None) is not None:
        raise UsageError(
            f"--family {args.family} counts a prepared dataset's tokens, but no --dataset is given (the reference mix "
            "has its token counts already); fix: pass --dataset, or drop --family"
        )
    if args.dataset is not None:
        samples, measured = dataset_mix(args.dataset, processor)
        source = f"dataset {args.dataset} ({len(samples)} samples, {measured})"
    else:
        samples = reference_mix(args.samples, seed=0)
        source = f"reference VLM length mix ({len(samples)} samples, seed 0)"
    if args.dp is not None:
        return print_step_table(samples, source, args)
    budgets = [None] if args.max_row_vision_patches is None else [None, args.max_row_vision_patches]
    rows = simulation_table(
        samples,
        widths=args.widths,
        buffer_sizes=args.buffers,
        buffer_rows=args.buffer_rows,
        min_fill=defaults.min_fill,
        max_wait_rounds=defaults.max_wait_rounds,
        vision_budgets=budgets,
    )
    print(f"lengths: {source}; min_fill={defaults.min_fill}, max_wait_rounds={defaults.max_wait_rounds}")
    print("buffer: new samples per round (buffer_size), or kW: a round once the new samples hold k * W tokens "
          f"(buffer_tokens); the default round (neither set) is {DEFAULT_ROUND_ROWS}W")
    print("vision figures: ViT input patches per row (t*h*w before the 2x2 merge); skipped: fits no row")
    print(format_table(rows))
    if args.global_plan:
        from energon_pack.plan.build import lengths_plan_table
        from energon_pack.core.tables import format_table as format_text_table

        print("global pack plan of the whole stream (energon-pack plan): rows, fill, plan time and file size")
        plans = lengths_plan_table([s.tokens for s in samples], widths=args.widths, min_fill=defaults.min_fill)
        print(format_text_table(plans))
    if args.plot is not None:
        plot_fill(rows, args.plot)
        print(f"plot written to {args.plot}")
    return 0


def print_step_table(samples: list[MixSample], source: str, args: argparse.Namespace) -> int:
    """The step-imbalance table of ``--dp`` x ``--micro-batches`` (a bad ``--cost-model`` or
    ``--seq-length`` is a UsageError)."""
    from energon_pack.core.tables import format_table
    from energon_pack.packing.simulate import step_balance_table
    from energon_pack.rows.flops import CostModel

    if args.seq_length < 1:
        raise UsageError(f"--seq-length {args.seq_length}: must be a positive row width; fix: e.g. --seq-length 8192")
    try:
        cost_model = CostModel.of(args.cost_model, frozen_vision=args.frozen_vision)
    except ValueError as err:
        raise UsageError(f"--cost-model {args.cost_model!r}: {err}") from None
    defaults = PackingPolicy()
    window_rows = defaults.balance_window_rows if args.window_rows is None else args.window_rows
    try:
        table = step_balance_table(
            samples, cost_model=cost_model, width=args.seq_length, dps=args.dp, micro_batches=args.micro_batches,
            min_fill=defaults.min_fill, max_wait_rounds=defaults.max_wait_rounds,
            window_steps=defaults.balance_window_steps, window_rows=window_rows, workers=args.workers,
        )
    except ValueError as err:  # too few samples for as many worker shards
        raise UsageError(f"--samples {len(samples)} with --dp {max(args.dp)} x --workers {args.workers}: {err}; "
                         "fix: more --samples, or fewer ranks or workers") from None
    first = table[0]
    print(f"lengths: {source}; W={args.seq_length} (samples aligned to 64), cost model {args.cost_model}"
          f"{' (frozen vision)' if args.frozen_vision else ''}, fwd+bwd FLOPs per row")
    print(f"plan rows {first['rows']} (lower bound {first['lower_bound']}); row cost CV: plain {first['cv_plain']:.3f}, "
          f"balanced {first['cv_balanced']:.3f}, online {first['cv_online']:.3f}")
    print("imbalance = slowest rank / mean rank cost of a step; today: plan rows, rank = position % dp; balanced: "
          f"balance_steps plan, cost windows of {defaults.balance_window_steps} steps, LPT dealing")
    print(f"online: each rank's own online rows, {args.workers} workers per rank read in turn, in planning order; "
          f"online balanced: a sliding pool of {window_rows} rows per worker (rounded to whole steps) read at shared cost quantiles "
          f"(balance_steps without a plan); online fill {first['online_fill']:.2%} either way (same rows); online floor: "
          "per window, the costliest rank's total over the mean rank's (no order within windows sums below it)")
    print(format_table([
        {"DP": r["dp"], "micro-batches": r["micro"], "steps": r["steps"],
         "today mean": f"{r['today_mean']:.3f}", "today p99": f"{r['today_p99']:.3f}",
         "balanced mean": f"{r['balanced_mean']:.3f}", "balanced p99": f"{r['balanced_p99']:.3f}",
         "online steps": r["online_steps"], "online mean": f"{r['online_mean']:.3f}",
         "online balanced mean": f"{r['online_balanced_mean']:.3f}",
         "online balanced p99": f"{r['online_balanced_p99']:.3f}", "online floor": f"{r['online_floor']:.3f}"}
        for r in table
    ]))
    return 0
