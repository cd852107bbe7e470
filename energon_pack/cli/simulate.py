"""``energon-pack simulate``: packing fill and vision patches per row of our selection vs
first-fit-decreasing per buffer, optionally under a vision budget per row.

Samples come from a prepared dataset (preencode only: exact token counts and patch grids, no
pixels) or from the built-in reference VLM mix (``energon_pack.packing.simulate.reference_mix``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from energon_pack.config import DEFAULT_ROUND_ROWS, PackingPolicy
from energon_pack.packing.simulate import MixSample


def dataset_samples(dataset: Path) -> list[MixSample]:
    """Exact token counts, vision patches and media counts of a prepared dataset's good
    samples, via preencode (no pixels)."""
    from energon_pack.data.inspect_dataset import iter_prepared

    return [
        MixSample(
            tokens=prepared.num_tokens,
            vision_patches=prepared.vision_patches,
            images=len(prepared.images),
            videos=len(prepared.videos),
        )
        for _, prepared in iter_prepared(dataset)
        if prepared.skip_reason is None
    ]


def run_simulate(args: argparse.Namespace) -> int:
    """Print the side-by-side table (and optionally save a plot). With
    ``--max-row-vision-patches N`` every (W, buffer) is simulated without and with the budget."""
    from energon_pack.packing.simulate import (
        format_table,
        plot_fill,
        reference_mix,
        simulation_table,
    )

    defaults = PackingPolicy()
    if args.dataset is not None:
        samples = dataset_samples(args.dataset)
        source = f"dataset {args.dataset} ({len(samples)} samples)"
    else:
        samples = reference_mix(args.samples, seed=0)
        source = f"reference VLM length mix ({len(samples)} samples, seed 0)"
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
