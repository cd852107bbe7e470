"""Packing simulator: our round-based selector against first-fit-decreasing per buffer.

Runs the packing rounds exactly as the savable wrapper does (fill a buffer of
``buffer_size`` new samples, run a round, carry the pending groups, flush at
the end of the stream) on a list of token lengths, and measures fill
(real tokens / (rows * W)), rows and waiting time.  No Energon, no torch.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from energon_pack.packing.algorithms import (
    PackItem,
    RoundResult,
    aligned_length,
    first_fit_decreasing,
    select_bins,
)
from energon_pack.tables import format_table as format_text_table

__all__ = [
    "PackingRound",
    "SimulationResult",
    "format_table",
    "iter_rounds",
    "plot_fill",
    "reference_length_mix",
    "simulate_ffd_per_buffer",
    "simulate_stream",
    "simulation_table",
]


def reference_length_mix(n: int, seed: int = 0) -> list[int]:
    """``n`` token lengths drawn from a reference Qwen-VL SFT mix (deterministic in ``seed``).

    Components (share of samples -> tokens per sample, chat template included;
    "text" is log-normal, median 250, sigma 0.9, clipped to [30, 3000]):

    * 45 % text-only chats: log-normal, median 400, sigma 0.8, clipped to [60, 4000].
    * 38 % single image: one image of 300-1300 tokens (uniform; ~450x450 to
      ~1000x1000 px at 28 px per token side, Qwen2.5-VL) + text.
    * 7 % multi-image: 2-6 images of 300-1300 tokens each + text.
    * 6 % video: 1000-6000 visual tokens (uniform) + text.
    * 4 % long samples: 6000-8100 tokens (uniform): long documents, dense video.

    Mean ~1450 tokens, median ~900.  The mix is calibrated only against the
    baseline: first-fit-decreasing per buffer at W=8192 gives ~74 % / 84 % / 91 %
    fill with buffers of 8 / 16 / 32, in line with Megatron-Bridge's FFD on real
    VLM SFT data.  A few multi-image or video samples exceed 8192 tokens and are
    skipped as overlong at W=8192.  Example: ``len(reference_length_mix(5, seed=1)) == 5``.
    """
    rng = random.Random(seed)

    def lognormal(median: float, sigma: float, low: int, high: int) -> int:
        return int(min(max(rng.lognormvariate(math.log(median), sigma), low), high))

    def text() -> int:
        return lognormal(250, 0.9, 30, 3000)

    def image() -> int:
        return rng.randint(300, 1300)

    lengths = []
    for _ in range(n):
        u = rng.random()
        if u < 0.45:
            lengths.append(lognormal(400, 0.8, 60, 4000))
        elif u < 0.83:
            lengths.append(image() + text())
        elif u < 0.90:
            lengths.append(sum(image() for _ in range(rng.randint(2, 6))) + text())
        elif u < 0.96:
            lengths.append(rng.randint(1000, 6000) + text())
        else:
            lengths.append(rng.randint(6000, 8100))
    return lengths


@dataclass(frozen=True, kw_only=True)
class SimulationResult:
    """Figures of one simulated stream; fill = real (unaligned) tokens / (rows * W)."""

    samples: int  # packed samples
    skipped: int  # overlong samples (aligned length > W)
    rows: int
    fill: float
    rows_per_1000_samples: float
    mean_wait_rounds: float
    max_wait_rounds: int


@dataclass(frozen=True, kw_only=True)
class PackingRound:
    """One round of :func:`iter_rounds`: its index, candidates, flush flag and result."""

    index: int
    candidates: list[PackItem]
    flush: bool
    result: RoundResult


def iter_rounds(
    aligned_lengths: Sequence[int],
    *,
    capacity: int,
    buffer_size: int,
    min_fill: float,
    max_wait_rounds: int,
    max_segments: int | None = None,
) -> Iterator[PackingRound]:
    """Drive :func:`select_bins` over a stream as the wrapper does.

    Every ``buffer_size`` new samples a round runs on the new samples plus
    the pending groups; after the stream a flush round runs on the leftover
    partial buffer plus the pending groups (if any) and emits everything.
    Sample ``i`` gets index ``i``.

    Example: aligned lengths ``[6, 4, 3]``, capacity 10, buffer 2 -> round 0
    emits ``[#0, #1]``; flush round 1 emits ``[#2]``.
    """
    if buffer_size < 1:
        raise ValueError(f"buffer_size={buffer_size} must be >= 1 sample.")
    pending: list[PackItem] = []
    new: list[PackItem] = []
    round_index = 0

    def run(flush: bool) -> PackingRound:
        candidates = pending + new
        result = select_bins(
            candidates,
            capacity=capacity,
            round_index=round_index,
            min_fill=min_fill,
            max_wait_rounds=max_wait_rounds,
            max_segments=max_segments,
            flush=flush,
        )
        pending[:] = [it for group in result.pending for it in group]
        new.clear()
        return PackingRound(index=round_index, candidates=candidates, flush=flush, result=result)

    for i, length in enumerate(aligned_lengths):
        new.append(PackItem(index=i, length=length, arrival_round=round_index))
        if len(new) == buffer_size:
            yield run(flush=False)
            round_index += 1
    if pending or new:
        yield run(flush=True)


def simulate_stream(
    lengths: Sequence[int],
    *,
    seq_length: int,
    buffer_size: int,
    pad_multiple: int = 1,
    min_fill: float,
    max_wait_rounds: int,
    max_segments: int | None = None,
) -> SimulationResult:
    """Pack ``lengths`` (tokens per sample) with pending groups; overlong samples are skipped."""
    kept, skipped = _split_overlong(lengths, seq_length, pad_multiple)
    aligned = [aligned_length(n, pad_multiple) for n in kept]
    rows = 0
    waits: list[int] = []
    for packing_round in iter_rounds(
        aligned,
        capacity=seq_length,
        buffer_size=buffer_size,
        min_fill=min_fill,
        max_wait_rounds=max_wait_rounds,
        max_segments=max_segments,
    ):
        emitted = packing_round.result.emitted
        rows += len(emitted)
        waits.extend(packing_round.index - it.arrival_round for b in emitted for it in b)
    return _result(kept, skipped, rows, seq_length, waits)


def simulate_ffd_per_buffer(
    lengths: Sequence[int],
    *,
    seq_length: int,
    buffer_size: int,
    pad_multiple: int = 1,
    max_segments: int | None = None,
) -> SimulationResult:
    """Baseline: first-fit-decreasing on each buffer, every bin emitted, nothing carried."""
    kept, skipped = _split_overlong(lengths, seq_length, pad_multiple)
    aligned = [aligned_length(n, pad_multiple) for n in kept]
    rows = sum(
        len(first_fit_decreasing(aligned[start : start + buffer_size], seq_length, max_segments))
        for start in range(0, len(aligned), buffer_size)
    )
    return _result(kept, skipped, rows, seq_length, [0] * len(kept))


def simulation_table(
    lengths: Sequence[int],
    *,
    widths: Sequence[int],
    buffer_sizes: Sequence[int],
    pad_multiple: int = 1,
    min_fill: float,
    max_wait_rounds: int,
    max_segments: int | None = None,
) -> list[dict[str, float | int]]:
    """One row per (W, buffer): our selector and the FFD baseline on the same stream.

    Keys: ``W, buffer, fill, ffd_fill, ratio, rows_per_1000, ffd_rows_per_1000,
    mean_wait, max_wait, skipped``.
    """
    table = []
    for width in widths:
        for buffer_size in buffer_sizes:
            ours = simulate_stream(
                lengths,
                seq_length=width,
                buffer_size=buffer_size,
                pad_multiple=pad_multiple,
                min_fill=min_fill,
                max_wait_rounds=max_wait_rounds,
                max_segments=max_segments,
            )
            ffd = simulate_ffd_per_buffer(
                lengths,
                seq_length=width,
                buffer_size=buffer_size,
                pad_multiple=pad_multiple,
                max_segments=max_segments,
            )
            table.append(
                {
                    "W": width,
                    "buffer": buffer_size,
                    "fill": ours.fill,
                    "ffd_fill": ffd.fill,
                    "ratio": ours.fill / ffd.fill if ffd.fill else math.nan,
                    "rows_per_1000": ours.rows_per_1000_samples,
                    "ffd_rows_per_1000": ffd.rows_per_1000_samples,
                    "mean_wait": ours.mean_wait_rounds,
                    "max_wait": ours.max_wait_rounds,
                    "skipped": ours.skipped,
                }
            )
    return table


_COLUMNS = (
    ("W", "W", "{:d}"),
    ("buffer", "buffer", "{:d}"),
    ("fill", "fill", "{:.2%}"),
    ("ffd_fill", "FFD fill", "{:.2%}"),
    ("ratio", "ratio", "{:.3f}"),
    ("rows_per_1000", "rows/1k", "{:.1f}"),
    ("ffd_rows_per_1000", "FFD rows/1k", "{:.1f}"),
    ("mean_wait", "mean wait", "{:.2f}"),
    ("max_wait", "max wait", "{:d}"),
    ("skipped", "skipped", "{:d}"),
)


def format_table(rows: Sequence[dict[str, float | int]]) -> str:
    """Text table of :func:`simulation_table` rows: header, rule, one line per row."""
    formatted = [{title: fmt.format(row[key]) for key, title, fmt in _COLUMNS} for row in rows]
    return format_text_table(formatted, [title for _, title, _ in _COLUMNS])


def plot_fill(rows: Sequence[dict[str, float | int]], path: str | Path) -> None:
    """Save a fill-vs-buffer chart (one line per W, ours solid, FFD dashed) to ``path``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise ImportError(
            "plot_fill needs matplotlib; install the plot extra: pip install 'energon-pack[plot]'."
        ) from err
    fig, ax = plt.subplots(figsize=(6, 4))
    for width in sorted({row["W"] for row in rows}):
        sub = sorted((row for row in rows if row["W"] == width), key=lambda r: r["buffer"])
        buffers = [row["buffer"] for row in sub]
        (line,) = ax.plot(buffers, [row["fill"] for row in sub], marker="o", label=f"W={width}")
        ax.plot(
            buffers,
            [row["ffd_fill"] for row in sub],
            marker="x",
            linestyle="--",
            color=line.get_color(),
            label=f"W={width} FFD",
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("buffer size (samples)")
    ax.set_ylabel("fill (real tokens / row slots)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _split_overlong(
    lengths: Sequence[int], seq_length: int, pad_multiple: int
) -> tuple[list[int], int]:
    if pad_multiple < 1 or seq_length % pad_multiple:
        raise ValueError(
            f"seq_length={seq_length} must be a positive multiple of pad_multiple={pad_multiple}."
        )
    kept = [n for n in lengths if aligned_length(n, pad_multiple) <= seq_length]
    return kept, len(lengths) - len(kept)


def _result(
    kept: Sequence[int], skipped: int, rows: int, seq_length: int, waits: Sequence[int]
) -> SimulationResult:
    return SimulationResult(
        samples=len(kept),
        skipped=skipped,
        rows=rows,
        fill=sum(kept) / (rows * seq_length) if rows else 0.0,
        rows_per_1000_samples=1000 * rows / len(kept) if kept else 0.0,
        mean_wait_rounds=sum(waits) / len(waits) if waits else 0.0,
        max_wait_rounds=max(waits, default=0),
    )
