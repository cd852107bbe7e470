"""Packing simulator: our round-based selector against first-fit-decreasing per buffer.

Drives the packing stage's own round planner (``packing/planner.py``) with the stage's
loop (fill a buffer of ``buffer_size`` new samples, or of new samples holding
``buffer_tokens`` tokens, run a round, carry the pending groups, flush at the end of
the stream) on a list of samples (token lengths, or `MixSample`s
that also carry vision patches and media counts), and measures fill
(real tokens / (rows * W)), vision patches per row, rows and waiting time.
No Energon, no torch.
"""

from __future__ import annotations

import math
import random
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from energon_pack.core.alignment import aligned_length
from energon_pack.packing.algorithms import PackItem, RoundSize, RowBudget, first_fit_decreasing
from energon_pack.packing.balance import BalancedStream, StepStats, balance_rows, step_imbalance, synthetic_grids
from energon_pack.packing.global_plan import plan_rows
from energon_pack.packing.online_balance import balanced_window_rows, sliding_order
from energon_pack.packing.planner import PlannedRound, RoundPlanner
from energon_pack.core.tables import format_table as format_text_table
from energon_pack.rows.flops import CostModel

__all__ = [
    "MixSample",
    "PackingRound",
    "SimulationResult",
    "format_table",
    "iter_rounds",
    "plot_fill",
    "iter_reference_mix",
    "reference_length_mix",
    "reference_mix",
    "simulate_ffd_per_buffer",
    "simulate_stream",
    "simulation_table",
]


#: ViT input patches per merged visual token (2x2 spatial merge).
PATCHES_PER_VISUAL_TOKEN = 4


@dataclass(frozen=True, kw_only=True)
class MixSample:
    """One simulated sample: ``tokens`` (chat template included), its ViT input patches
    (``vision_patches``, before the 2x2 merge: 4 per visual token), media counts and, when known
    (a prepared dataset), the media's ``(t, h, w)`` patch grids."""

    tokens: int
    vision_patches: int = 0
    images: int = 0
    videos: int = 0
    grids: tuple[tuple[int, int, int], ...] = ()

    @property
    def media(self) -> int:
        """Images + videos."""
        return self.images + self.videos


def reference_length_mix(n: int, seed: int = 0) -> list[int]:
    """Token lengths of :func:`reference_mix` (``n`` samples, deterministic in ``seed``).

    Example: ``len(reference_length_mix(5, seed=1)) == 5``.
    """
    return [sample.tokens for sample in iter_reference_mix(n, seed)]


def reference_mix(n: int, seed: int = 0) -> list[MixSample]:
    """:func:`iter_reference_mix` as a list. Example: ``reference_mix(1, seed=0)[0].tokens > 0``."""
    return list(iter_reference_mix(n, seed))


def iter_reference_mix(n: int, seed: int = 0) -> Iterator[MixSample]:
    """``n`` samples drawn from a reference Qwen-VL SFT mix (deterministic in ``seed``).

    Components (share of samples -> tokens per sample, chat template included;
    "text" is log-normal, median 250, sigma 0.9, clipped to [30, 3000]):

    * 45 % text-only chats: log-normal, median 400, sigma 0.8, clipped to [60, 4000].
    * 38 % single image: one image of 300-1300 tokens (uniform; ~450x450 to
      ~1000x1000 px at 28 px per token side, Qwen2.5-VL) + text.
    * 7 % multi-image: 2-6 images of 300-1300 tokens each + text.
    * 6 % video: 1000-6000 visual tokens (uniform) + text.
    * 4 % long samples: 6000-8100 tokens (uniform): long documents, or (half of
      them, drawn from a second generator so that lengths do not depend on it)
      dense videos whose tokens are all visual but a text part.

    Vision patches are 4 per visual token (Qwen2.5-VL merges 2x2 patches into one token).

    Mean ~1450 tokens, median ~900.  The mix is calibrated only against the
    baseline: first-fit-decreasing per buffer at W=8192 gives ~74 % / 84 % / 91 %
    fill with buffers of 8 / 16 / 32, in line with Megatron-Bridge's FFD on real
    VLM SFT data.  A few multi-image or video samples exceed 8192 tokens and are
    skipped as overlong at W=8192.  Yields them one by one (ten million fit in a stream).
    Example: ``next(iter_reference_mix(1, seed=0)).tokens > 0``.
    """
    rng = random.Random(seed)
    media_rng = random.Random(f"{seed}-media")

    def lognormal(median: float, sigma: float, low: int, high: int) -> int:
        return int(min(max(rng.lognormvariate(math.log(median), sigma), low), high))

    def text() -> int:
        return lognormal(250, 0.9, 30, 3000)

    def image() -> int:
        return rng.randint(300, 1300)

    def visual(tokens: int, *, images: int = 0, videos: int = 0) -> tuple[int, int, int]:
        return PATCHES_PER_VISUAL_TOKEN * tokens, images, videos

    for _ in range(n):
        u = rng.random()
        if u < 0.45:
            tokens, vision = lognormal(400, 0.8, 60, 4000), visual(0)
        elif u < 0.83:
            image_tokens = image()
            tokens, vision = image_tokens + text(), visual(image_tokens, images=1)
        elif u < 0.90:
            image_tokens = [image() for _ in range(rng.randint(2, 6))]
            tokens, vision = sum(image_tokens) + text(), visual(sum(image_tokens), images=len(image_tokens))
        elif u < 0.96:
            video_tokens = rng.randint(1000, 6000)
            tokens, vision = video_tokens + text(), visual(video_tokens, videos=1)
        else:
            tokens = rng.randint(6000, 8100)
            dense_video = media_rng.random() < 0.5
            text_tokens = media_rng.randint(30, 300)
            vision = visual(tokens - text_tokens, videos=1) if dense_video else visual(0)
        patches, images, videos = vision
        yield MixSample(tokens=tokens, vision_patches=patches, images=images, videos=videos)


@dataclass(frozen=True, kw_only=True)
class SimulationResult:
    """Figures of one simulated stream; fill = real (unaligned) tokens / (rows * W).

    ``vision_per_row`` holds the ViT input patches of every row, in emission order.
    """

    samples: int  # packed samples
    skipped: int  # samples that fit no row (aligned length > W, or over a vision limit)
    rows: int
    fill: float
    rows_per_1000_samples: float
    mean_wait_rounds: float
    max_wait_rounds: int
    vision_per_row: tuple[int, ...] = ()

    def vision_percentile(self, q: float) -> int:
        """Nearest-rank ``q``-th percentile (0 < q <= 100) of vision patches per row; 0 without rows."""
        return percentile(self.vision_per_row, q)

    @property
    def vision_mean(self) -> float:
        """Mean vision patches per row."""
        return sum(self.vision_per_row) / len(self.vision_per_row) if self.vision_per_row else 0.0


def percentile(values: Sequence[int], q: float) -> int:
    """Nearest-rank percentile: the smallest value with at least ``q`` % of ``values`` <= it.

    Example: ``percentile([5, 1, 3, 2], 50)`` -> 2; ``percentile([5, 1, 3, 2], 99)`` -> 5; ``[]`` -> 0.
    """
    if not 0 < q <= 100:
        raise ValueError(f"q={q} must be in (0, 100].")
    if not values:
        return 0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


@dataclass(frozen=True, kw_only=True)
class PackingRound(PlannedRound):
    """One round of :func:`iter_rounds` and the rows emitted right after it (its ready bins,
    less samples that failed to decode; a bin that lost one may go back to pending instead)."""

    rows: list[list[PackItem]]


def iter_rounds(
    aligned_lengths: Sequence[int | MixSample],
    budget: RowBudget,
    *,
    round_size: RoundSize,
    min_fill: float,
    max_wait_rounds: int,
    decode_failures: Collection[int] = (),
) -> Iterator[PackingRound]:
    """Drive the packing stage's round planner (:class:`RoundPlanner`) over a stream, with the
    stage's loop: read until ``round_size`` is full (``samples`` new samples arrived, or the new
    samples hold at least ``tokens`` aligned slots), run a round on them plus the pending
    groups, emit the ready bins; after the stream a flush round emits everything left.

    Sample ``i`` gets arrival index ``i``; a sample is its aligned length in slots, or a
    `MixSample` whose ``tokens`` are that aligned length. Samples whose index is in
    ``decode_failures`` fail at decode time, as a corrupt image does in the stage.

    Example: aligned lengths ``[6, 4, 3]``, ``RowBudget(tokens=10)``, ``RoundSize(samples=2)``
    -> round 0 emits ``[#0, #1]``; flush round 1 emits ``[#2]``.
    """
    planner = RoundPlanner(
        budget=budget,
        round_size=round_size,
        min_fill=min_fill,
        max_wait_rounds=max_wait_rounds,
    )
    source = iter(_mix_samples(aligned_lengths))
    while True:
        if not planner.exhausted:
            while planner.wants_samples():
                sample = next(source, None)
                if sample is None:
                    planner.end_of_source()
                    break
                planner.admit(sample.tokens, vision=sample.vision_patches, media=sample.media)
        elif planner.is_empty():
            return
        planned = planner.run_round()
        rows = _emit(planner, decode_failures)
        if planned.candidates:
            yield PackingRound(**vars(planned), rows=rows)


def _emit(planner: RoundPlanner, decode_failures: Collection[int]) -> list[list[PackItem]]:
    """Take every ready bin, as the stage does: failed samples dropped, a bin that lost one
    back to pending while it may wait, otherwise emitted with the rest."""
    rows = []
    while (group := planner.take_bin()) is not None:
        kept = [item for item in group if item.index not in decode_failures]
        if kept and (len(kept) == len(group) or not planner.repend(kept)):
            rows.append(kept)
    return rows


def simulate_stream(
    lengths: Sequence[int | MixSample],
    *,
    seq_length: int, max_segments: int | None = None, max_vision_patches: int | None = None, max_media: int | None = None,
    buffer_size: int | None = None, buffer_tokens: int | None = None, min_fill: float, max_wait_rounds: int,
    pad_multiple: int = 1,
) -> SimulationResult:
    """Pack ``lengths`` (tokens per sample, or `MixSample`s) with pending groups; samples
    that fit no row (overlong, or over a vision limit) are skipped."""
    budget = RowBudget(tokens=seq_length, segments=max_segments, vision_patches=max_vision_patches, media=max_media)
    kept, skipped = _split_unfit(lengths, budget, pad_multiple)
    rows: list[list[PackItem]] = []
    waits: list[int] = []
    for packing_round in iter_rounds(
        _aligned(kept, pad_multiple),
        budget,
        round_size=RoundSize(samples=buffer_size, tokens=buffer_tokens),
        min_fill=min_fill,
        max_wait_rounds=max_wait_rounds,
    ):
        rows.extend(packing_round.rows)
        waits.extend(packing_round.index - it.arrival_round for b in packing_round.rows for it in b)
    vision = [sum(it.vision for it in row) for row in rows]
    return _result(kept, skipped, vision, seq_length, waits)


def simulate_ffd_per_buffer(
    lengths: Sequence[int | MixSample],
    *,
    seq_length: int, max_segments: int | None = None, max_vision_patches: int | None = None, max_media: int | None = None,
    buffer_size: int | None = None, buffer_tokens: int | None = None,
    pad_multiple: int = 1,
) -> SimulationResult:
    """Baseline: first-fit-decreasing on each buffer (``buffer_size`` samples, or samples
    holding ``buffer_tokens`` slots), every bin emitted, nothing carried (within the same
    vision limits when they are set)."""
    budget = RowBudget(tokens=seq_length, segments=max_segments, vision_patches=max_vision_patches, media=max_media)
    kept, skipped = _split_unfit(lengths, budget, pad_multiple)
    aligned = _aligned(kept, pad_multiple)
    vision: list[int] = []
    for buffer in _buffers(aligned, RoundSize(samples=buffer_size, tokens=buffer_tokens)):
        bins = first_fit_decreasing(
            [s.tokens for s in buffer], budget, vision=[s.vision_patches for s in buffer], media=[s.media for s in buffer]
        )
        vision.extend(sum(buffer[p].vision_patches for p in row) for row in bins)
    return _result(kept, skipped, vision, seq_length, [0] * len(kept))


def simulation_table(
    lengths: Sequence[int | MixSample],
    *,
    widths: Sequence[int],
    buffer_sizes: Sequence[int],
    buffer_rows: Sequence[int] = (),
    pad_multiple: int = 1,
    min_fill: float,
    max_wait_rounds: int,
    max_segments: int | None = None,
    vision_budgets: Sequence[int | None] = (None,),
) -> list[dict[str, float | int | None]]:
    """One row per (W, buffer, vision budget): our selector and the FFD baseline on the same
    stream, both under ``max_vision_patches`` = that budget (None: no budget). Buffers are
    ``buffer_sizes`` (samples; "buffer" is the number) then ``buffer_rows`` (tokens: a round
    runs once the new samples hold k * W aligned tokens; "buffer" reads e.g. "2W").

    Keys: ``W, buffer, budget, fill, ffd_fill, ratio, vision_mean, vision_p50, vision_p99,
    vision_max, ffd_vision_p99, ffd_vision_max, rows_per_1000, ffd_rows_per_1000, mean_wait,
    max_wait, skipped``; vision figures are ViT input patches per row.
    """
    table = []
    for width in widths:
        buffers = [({"buffer_size": size}, size) for size in buffer_sizes] + [
            ({"buffer_tokens": rows * width}, f"{rows}W") for rows in buffer_rows
        ]
        for buffer, label in buffers:
            for budget in vision_budgets:
                common = {
                    "seq_length": width,
                    **buffer,
                    "pad_multiple": pad_multiple,
                    "max_segments": max_segments,
                    "max_vision_patches": budget,
                }
                ours = simulate_stream(lengths, min_fill=min_fill, max_wait_rounds=max_wait_rounds, **common)
                ffd = simulate_ffd_per_buffer(lengths, **common)
                table.append(
                    {
                        "W": width,
                        "buffer": label,
                        "budget": budget,
                        "fill": ours.fill,
                        "ffd_fill": ffd.fill,
                        "ratio": ours.fill / ffd.fill if ffd.fill else math.nan,
                        "vision_mean": ours.vision_mean,
                        "vision_p50": ours.vision_percentile(50),
                        "vision_p99": ours.vision_percentile(99),
                        "vision_max": ours.vision_percentile(100),
                        "ffd_vision_p99": ffd.vision_percentile(99),
                        "ffd_vision_max": ffd.vision_percentile(100),
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
    ("buffer", "buffer", "{}"),
    ("fill", "fill", "{:.2%}"),
    ("ffd_fill", "FFD fill", "{:.2%}"),
    ("ratio", "ratio", "{:.3f}"),
    ("budget", "vision budget", "{}"),
    ("vision_mean", "vis/row mean", "{:.0f}"),
    ("vision_p50", "vis p50", "{:d}"),
    ("vision_p99", "vis p99", "{:d}"),
    ("vision_max", "vis max", "{:d}"),
    ("ffd_vision_p99", "FFD vis p99", "{:d}"),
    ("ffd_vision_max", "FFD vis max", "{:d}"),
    ("rows_per_1000", "rows/1k", "{:.1f}"),
    ("ffd_rows_per_1000", "FFD rows/1k", "{:.1f}"),
    ("mean_wait", "mean wait", "{:.2f}"),
    ("max_wait", "max wait", "{:d}"),
    ("skipped", "skipped", "{:d}"),
)


def format_table(rows: Sequence[dict[str, float | int | None]]) -> str:
    """Text table of :func:`simulation_table` rows: header, rule, one line per row
    (vision figures in ViT patches per row; budget "none" when unset)."""
    formatted = [
        {title: "none" if row[key] is None else fmt.format(row[key]) for key, title, fmt in _COLUMNS} for row in rows
    ]
    return format_text_table(formatted, [title for _, title, _ in _COLUMNS])


def plot_fill(rows: Sequence[dict[str, float | int | None]], path: str | Path) -> None:
    """Save a chart of fill and of p99 vision patches per row against buffer size (one line
    per W and vision budget, ours solid, FFD dashed) to ``path``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise ImportError(
            "plot_fill needs matplotlib; install the plot extra: pip install 'energon-pack[plot]'."
        ) from err
    fig, (fill_ax, vision_ax) = plt.subplots(1, 2, figsize=(11, 4))
    series = sorted({(row["W"], row["budget"]) for row in rows}, key=lambda key: (key[0], key[1] or 0))
    for width, budget in series:
        sub = sorted(
            (
                row for row in rows
                if (row["W"], row["budget"]) == (width, budget) and isinstance(row["buffer"], int)
            ),
            key=lambda r: r["buffer"],
        )
        buffers = [row["buffer"] for row in sub]
        label = f"W={width}" + ("" if budget is None else f", vision<={budget}")
        for ax, ours_key, ffd_key in ((fill_ax, "fill", "ffd_fill"), (vision_ax, "vision_p99", "ffd_vision_p99")):
            (line,) = ax.plot(buffers, [row[ours_key] for row in sub], marker="o", label=label)
            ax.plot(
                buffers,
                [row[ffd_key] for row in sub],
                marker="x",
                linestyle="--",
                color=line.get_color(),
                label=f"{label} FFD",
            )
    for ax, ylabel in ((fill_ax, "fill (real tokens / row slots)"), (vision_ax, "p99 vision patches per row")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("buffer size (samples)")
        ax.set_ylabel(ylabel)
    fill_ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _buffers(samples: Sequence[MixSample], round_size: RoundSize) -> Iterator[list[MixSample]]:
    """Consecutive buffers of ``samples``, each closed as soon as it fills ``round_size``.

    Example: tokens [3, 5, 2, 4] with ``RoundSize(tokens=6)`` -> [[3, 5], [2, 4]].
    """
    buffer: list[MixSample] = []
    for sample in samples:
        buffer.append(sample)
        if round_size.is_full(len(buffer), sum(s.tokens for s in buffer)):
            yield buffer
            buffer = []
    if buffer:
        yield buffer


def _mix_samples(samples: Sequence[int | MixSample]) -> list[MixSample]:
    return [s if isinstance(s, MixSample) else MixSample(tokens=s) for s in samples]


def _aligned(samples: Sequence[MixSample], pad_multiple: int) -> list[MixSample]:
    return [replace(s, tokens=aligned_length(s.tokens, pad_multiple)) for s in samples]


def _split_unfit(
    lengths: Sequence[int | MixSample], budget: RowBudget, pad_multiple: int
) -> tuple[list[MixSample], int]:
    """(samples that fit one row within ``budget`` once aligned, number of the others)."""
    if pad_multiple < 1 or budget.tokens % pad_multiple:
        raise ValueError(
            f"seq_length={budget.tokens} must be a positive multiple of pad_multiple={pad_multiple}."
        )
    samples = _mix_samples(lengths)
    kept = [
        s
        for s in samples
        if budget.fits(
            [PackItem(0, aligned_length(s.tokens, pad_multiple), 0, vision=s.vision_patches, media=s.media)]
        )
    ]
    return kept, len(samples) - len(kept)


def _result(
    kept: Sequence[MixSample], skipped: int, vision_per_row: Sequence[int], seq_length: int, waits: Sequence[int]
) -> SimulationResult:
    rows = len(vision_per_row)
    return SimulationResult(
        samples=len(kept),
        skipped=skipped,
        rows=rows,
        fill=sum(s.tokens for s in kept) / (rows * seq_length) if rows else 0.0,
        rows_per_1000_samples=1000 * rows / len(kept) if kept else 0.0,
        mean_wait_rounds=sum(waits) / len(waits) if waits else 0.0,
        max_wait_rounds=max(waits, default=0),
        vision_per_row=tuple(vision_per_row),
    )


def step_balance_table(
    samples: Sequence[MixSample],
    *,
    cost_model: CostModel,
    width: int,
    dps: Sequence[int],
    micro_batches: Sequence[int],
    pad_multiple: int = 64,
    min_fill: float,
    max_wait_rounds: int = 4,
    max_segments: int | None = 64,
    window_steps: int = 16,
    window_rows: int = 256,
    workers: int = 2,
    min_steps: int = 40,
    seed: int = 0,
) -> list[dict[str, float | int]]:
    """Step imbalance (slowest rank / mean rank cost, mean and p99 over whole steps) per (DP,
    micro-batches): today's dealing (plain plan rows, rank = position % dp) against the balanced
    plan (cost-balanced rows, cost windows of ``window_steps`` steps, LPT dealing), and the online
    loader's rows as they are today against online balanced rows (:func:`online_rank_costs`:
    ``workers`` per rank, windows of ``window_rows`` rows per worker). Row costs are
    ``cost_model`` FLOPs; samples without grids get :func:`synthetic_grids`. The plan stream
    repeats epochs until it holds ``min_steps`` steps. Keys: ``dp, micro, steps, today_mean,
    today_p99, balanced_mean, balanced_p99, online_steps, online_mean, online_p99,
    online_balanced_mean, online_balanced_p99, online_fill, online_floor`` (:func:`rank_floor` of the
    online balanced rows per window: no order within the windows sums below it; plus ``rows``, ``lower_bound``,
    ``cv_plain``, ``cv_balanced``, ``cv_online``).
    """
    kept = [s for s in samples if aligned_length(s.tokens, pad_multiple) <= width]
    lengths = [aligned_length(s.tokens, pad_multiple) for s in kept]
    costs = np.array([
        cost_model.sample(s.tokens, s.grids or synthetic_grids(s.vision_patches, s.images, s.videos)) for s in kept
    ], dtype=np.float64)
    budget = RowBudget(tokens=width, segments=max_segments)
    limits = dict(vision=[s.vision_patches for s in kept], media=[s.media for s in kept])
    plain = plan_rows(lengths, budget, min_fill=min_fill, **limits)
    balanced = balance_rows(plain, lengths, costs, budget, **limits)
    constant = cost_model.constant(width)
    plain_costs, balanced_costs = (np.array([constant + costs[r].sum() for r in rows]) for rows in (plain, balanced))
    online = OnlineRows(kept, costs, constant=constant, budget=budget, pad_multiple=pad_multiple,
                        min_fill=min_fill, max_wait_rounds=max_wait_rounds)
    table = []
    for dp in dps:
        for micro in micro_batches:
            g = dp * micro
            positions = range(max(1, -(-min_steps * g // len(plain))) * len(plain))
            today_stream = BalancedStream(plain_costs, seed=seed, step_rows=g, window_steps=1, repeat=True)
            stream = BalancedStream(balanced_costs, seed=seed, step_rows=g, window_steps=window_steps, repeat=True)
            today = step_imbalance(plain_costs[[today_stream.plain_row(p) for p in positions]], dp, micro, balanced=False)
            ours = step_imbalance(balanced_costs[[stream.plan_row(p) for p in positions]], dp, micro, balanced=True)
            rows = balanced_window_rows(window_rows, num_workers=workers, micro_batches=micro)
            steps = max(min_steps, 4 * rows * workers // micro)  # at least four windows
            online_today = online.rank_costs(dp=dp, workers=workers, micro_batches=micro, steps=steps, window_rows=None, seed=seed)
            online_ours = online.rank_costs(dp=dp, workers=workers, micro_batches=micro, steps=steps, window_rows=rows, seed=seed)
            online_today_stats, online_stats = (rank_step_imbalance(c, micro) for c in (online_today, online_ours))
            table.append({
                "dp": dp, "micro": micro, "steps": today.steps, "today_mean": today.mean, "today_p99": today.p99,
                "balanced_mean": ours.mean, "balanced_p99": ours.p99, "rows": len(balanced),
                "online_steps": online_stats.steps, "online_mean": online_today_stats.mean,
                "online_p99": online_today_stats.p99, "online_balanced_mean": online_stats.mean,
                "online_balanced_p99": online_stats.p99, "online_fill": online.fill(width),
                "online_floor": rank_floor(online_ours, micro, window_steps=rows * workers // micro),
                "lower_bound": -(-sum(lengths) // width),
                "cv_plain": float(plain_costs.std() / plain_costs.mean()),
                "cv_balanced": float(balanced_costs.std() / balanced_costs.mean()),
                "cv_online": float(np.std(online_today) / np.mean(online_today)),
            })
    return table


def rank_step_imbalance(rank_costs: np.ndarray, micro_batches: int) -> StepStats:
    """Imbalance of each whole step of ``rank_costs`` ([dp, rows]: each rank's row costs in the
    order it reads them; a step is each rank's next ``micro_batches`` rows).

    Example: [[3, 1], [2, 2]] with 1 micro-batch -> steps 3 vs 2 (1.2) and 1 vs 2 (1.333).
    """
    load = _step_loads(rank_costs, micro_batches)
    values = load.max(axis=0) / load.mean(axis=0)
    return StepStats(steps=load.shape[1], mean=float(values.mean()), p99=float(np.percentile(values, 99)),
                     max=float(values.max()))


def summed_step_imbalance(rank_costs: np.ndarray, micro_batches: int) -> float:
    """The slowest ranks' cost summed over whole steps over the mean ranks' (``rank_costs`` as for
    :func:`rank_step_imbalance`): step time against perfectly balanced steps.

    Example: [[1, 3], [3, 1]] with 1 micro-batch -> (3 + 3) / (2 + 2) = 1.5.
    """
    load = _step_loads(rank_costs, micro_batches)
    return float(load.max(axis=0).sum() / load.mean(axis=0).sum())


def rank_floor(rank_costs: np.ndarray, micro_batches: int, window_steps: int | None = None) -> float:
    """The least summed step imbalance (the slowest ranks' cost summed over steps over the mean
    ranks') that any order of each rank's rows within windows of ``window_steps`` steps can reach
    (None: one window of every whole step): per window the costliest rank's total, summed over
    the whole windows, over the mean rank's: :func:`summed_step_imbalance` of such an order is never
    lower, since a step waits for its slowest rank, so over a window the slowest ranks' sum is at
    least any one rank's sum. ``rank_costs`` as for
    :func:`rank_step_imbalance`.

    Example: [[1, 3], [3, 1]] with 1 micro-batch -> 4 / 4 = 1.0 (one window; the order [[1, 3],
    [1, 3]] reaches it); window_steps 1 -> (3 + 3) / (2 + 2) = 1.5.
    """
    load = _step_loads(rank_costs, micro_batches)
    window = load.shape[1] if window_steps is None else window_steps
    windows = load.shape[1] // window
    if windows == 0:
        raise ValueError(f"{load.shape[1]} steps hold no whole window of {window} steps")
    totals = load[:, : windows * window].reshape(load.shape[0], windows, window).sum(axis=2)
    return float(totals.max(axis=0).sum() / totals.mean(axis=0).sum())


def _step_loads(rank_costs: np.ndarray, micro_batches: int) -> np.ndarray:
    """Each rank's cost of each whole step, [dp, steps] (a ValueError when no step is whole)."""
    dp, rows = rank_costs.shape
    steps = rows // micro_batches
    if steps == 0:
        raise ValueError(f"{rows} rows per rank hold no whole step of {micro_batches} micro-batches")
    return rank_costs[:, : steps * micro_batches].reshape(dp, steps, micro_batches).sum(axis=2)


@dataclass(frozen=True, kw_only=True)
class _Shard:
    """One worker's rows (planning order) with their costs and sample counts, and the tokens they hold."""

    costs: np.ndarray
    samples: np.ndarray
    tokens: int


class OnlineRows:
    """The online loader's rows on ``dp`` ranks of ``workers`` DataLoader workers each, simulated.

    Worker ``w`` of rank ``r`` reads its own draw of the samples (with replacement, seeded by
    ``(seed, r * workers + w, dp * workers)``): a shard of a large dataset, whose samples come from
    the same mix on every worker; the packing stage's own round planner (:func:`iter_rounds`)
    packs them. A row costs ``constant`` + its samples' ``costs``.
    """

    def __init__(self, samples: Sequence[MixSample], costs: np.ndarray, *, constant: float, budget: RowBudget,
                 pad_multiple: int, min_fill: float, max_wait_rounds: int) -> None:
        self.samples = _aligned(list(samples), pad_multiple)
        self.real_tokens = [s.tokens for s in samples]
        self.costs = np.asarray(costs, dtype=np.float64)
        self.constant = constant
        self.budget = budget
        self.min_fill = min_fill
        self.max_wait_rounds = max_wait_rounds
        self._shards: dict[tuple[int, int, int], _Shard] = {}

    def shard_rows(self, shard: int, shards: int, rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """Costs and sample counts of the first ``rows`` rows of worker shard ``shard`` of ``shards``
        (planning order)."""
        key = (shard, shards, seed)
        cached = self._shards.get(key)
        if cached is None or len(cached.costs) < rows:
            per_row = max(1.0, len(self.samples) * self.budget.tokens / sum(s.tokens for s in self.samples))
            draw = random.Random(f"energon_pack.simulate:{seed}:{shard}:{shards}")
            order = draw.choices(range(len(self.samples)), k=math.ceil(1.3 * (rows + 1) * per_row) + 64)
            costs: list[float] = []
            samples: list[int] = []
            tokens = 0
            for packing_round in iter_rounds([self.samples[i] for i in order], self.budget,
                                             round_size=RoundSize(tokens=2 * self.budget.tokens),
                                             min_fill=self.min_fill, max_wait_rounds=self.max_wait_rounds):
                for row in packing_round.rows:
                    members_of_row = [order[item.index] for item in row]
                    costs.append(self.constant + float(self.costs[members_of_row].sum()))
                    samples.append(len(members_of_row))
                    tokens += sum(self.real_tokens[i] for i in members_of_row)
                if len(costs) > rows:
                    break
            if len(costs) < rows:
                raise ValueError(f"worker shard {shard} of {shards} packed {len(costs)} rows, fewer than {rows}")
            cached = self._shards[key] = _Shard(costs=np.array(costs), samples=np.array(samples), tokens=tokens)
        return cached.costs[:rows], cached.samples[:rows]

    def rank_costs(self, *, dp: int, workers: int, micro_batches: int, steps: int, window_rows: int | None,
                   seed: int) -> np.ndarray:
        """Row costs [dp, steps * micro_batches] in each rank's reading order: its workers' rows
        in turn; each worker's rows in planning order (``window_rows`` None: today) or laid out
        by :func:`sliding_order` over windows of ``window_rows`` with the pool's sample cap (online
        balanced rows)."""
        per_worker = -(-steps * micro_batches // workers)
        out = np.empty((dp, per_worker * workers))
        for rank in range(dp):
            for worker in range(workers):
                costs, samples = self.shard_rows(rank * workers + worker, dp * workers,
                                                 per_worker + (window_rows or 0), seed)
                if window_rows is not None:
                    costs = costs[sliding_order(costs.tolist(), window_rows=window_rows, worker=worker,
                                                num_workers=workers, micro_batches=micro_batches, seed=seed,
                                                samples=samples.tolist())]
                out[rank, worker::workers] = costs[:per_worker]
        return out[:, : steps * micro_batches]

    def fill(self, width: int) -> float:
        """Real tokens / (rows * ``width``) over every row simulated so far (nan before any)."""
        rows = sum(len(s.costs) for s in self._shards.values())
        return sum(s.tokens for s in self._shards.values()) / (rows * width) if rows else math.nan
