"""``energon-pack simulate``: packing fill of our selection vs first-fit-decreasing per buffer.

Lengths come from a prepared dataset (preencode only: exact token counts, no pixels) or from
the built-in reference VLM length mix (``energon_pack.packing.simulate.reference_length_mix``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from energon_pack.config import PackingConfig


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def dataset_lengths(dataset: Path) -> list[int]:
    """Exact token lengths of a prepared dataset's good samples, via preencode (no pixels)."""
    from energon_pack.inspect_dataset import iter_prepared

    return [prepared.num_tokens for _, prepared in iter_prepared(dataset) if prepared.skip_reason is None]


def run_simulate(args: argparse.Namespace) -> int:
    """Print the side-by-side fill table (and optionally save a plot)."""
    from energon_pack.packing.simulate import (
        format_table,
        plot_fill,
        reference_length_mix,
        simulation_table,
    )

    defaults = PackingConfig(seq_length=8192)
    if args.dataset is not None:
        lengths = dataset_lengths(args.dataset)
        source = f"dataset {args.dataset} ({len(lengths)} samples)"
    else:
        lengths = reference_length_mix(args.samples, seed=0)
        source = f"reference VLM length mix ({len(lengths)} samples, seed 0)"
    rows = simulation_table(
        lengths,
        widths=_ints(args.widths),
        buffer_sizes=_ints(args.buffers),
        min_fill=defaults.min_fill,
        max_wait_rounds=defaults.max_wait_rounds,
    )
    print(f"lengths: {source}; min_fill={defaults.min_fill}, max_wait_rounds={defaults.max_wait_rounds}")
    print(format_table(rows))
    if args.plot is not None:
        plot_fill(rows, args.plot)
        print(f"plot written to {args.plot}")
    return 0
