"""Tests for the packing simulator (energon_pack.packing.simulate)."""

from __future__ import annotations

import sys

import pytest

from energon_pack.core.alignment import aligned_length
from energon_pack.packing.algorithms import RoundSize, RowBudget
from energon_pack.packing.simulate import (
    PATCHES_PER_VISUAL_TOKEN,
    MixSample,
    format_table,
    iter_rounds,
    percentile,
    plot_fill,
    reference_length_mix,
    reference_mix,
    simulate_ffd_per_buffer,
    simulate_stream,
    simulation_table,
)

# Recommended PackingConfig defaults (see the simulation table in the report).
MIN_FILL = 0.99
MAX_WAIT_ROUNDS = 4


@pytest.fixture(scope="module")
def mix() -> list[int]:
    return reference_length_mix(8000, seed=0)


def test_reference_mix_is_deterministic_and_plausible(mix: list[int]) -> None:
    assert mix == reference_length_mix(8000, seed=0)
    assert mix[:100] != reference_length_mix(100, seed=1)
    assert all(30 <= n <= 30 * 1300 for n in mix)
    mean = sum(mix) / len(mix)
    assert 1300 < mean < 1650
    share_long = sum(n >= 6000 for n in mix) / len(mix)
    assert 0.03 < share_long < 0.08


def test_reference_mix_matches_megatron_bridge_ffd_figures(mix: list[int]) -> None:
    # FFD per buffer at W=8192 on realistic VLM data: ~73 % / 84 % / 91 % for buffers 8 / 16 / 32.
    fills = [simulate_ffd_per_buffer(mix, seq_length=8192, buffer_size=b).fill for b in (8, 16, 32)]
    for fill, expected in zip(fills, (0.73, 0.84, 0.91)):
        assert abs(fill - expected) < 0.025, fills


def test_pending_groups_beat_ffd_on_reference_mix(mix: list[int]) -> None:
    ours = simulate_stream(
        mix, seq_length=8192, buffer_size=16, min_fill=MIN_FILL, max_wait_rounds=MAX_WAIT_ROUNDS
    )
    ffd = simulate_ffd_per_buffer(mix, seq_length=8192, buffer_size=16)
    assert ours.fill >= 0.985
    assert ffd.fill < ours.fill - 0.1
    assert ours.rows < ffd.rows
    assert ours.samples == ffd.samples == len(mix) - ours.skipped
    assert ours.max_wait_rounds <= MAX_WAIT_ROUNDS


def test_simulate_stream_hand_case() -> None:
    # 12 > W is skipped; round 0 packs 5+5 exactly.
    result = simulate_stream([5, 5, 12], seq_length=10, buffer_size=2, min_fill=1.0, max_wait_rounds=1)
    assert (result.samples, result.skipped, result.rows, result.fill) == (2, 1, 1, 1.0)
    assert result.rows_per_1000_samples == 500.0
    assert (result.mean_wait_rounds, result.max_wait_rounds) == (0.0, 0)


def test_simulate_stream_counts_waits_and_unaligned_tokens() -> None:
    # W=8, pad 4: 3 -> 4 slots, 7 -> 8 slots.  Buffer 1, min_fill 1.0, wait 2:
    # round 0: [#0 (4)] pending; round 1: #0 + #1 (4) = 8 -> emitted, #0 waited 1;
    # round 2: [#2 (8)] emitted.  Fill counts real tokens: (3 + 3 + 7) / (2 * 8).
    result = simulate_stream(
        [3, 3, 7], seq_length=8, buffer_size=1, pad_multiple=4, min_fill=1.0, max_wait_rounds=2
    )
    assert (result.rows, result.fill) == (2, 13 / 16)
    assert (result.mean_wait_rounds, result.max_wait_rounds) == (1 / 3, 1)


def test_iter_rounds_flushes_leftovers_after_full_buffers() -> None:
    rounds = list(iter_rounds([6, 4, 3], RowBudget(tokens=10), round_size=RoundSize(samples=2), min_fill=0.9, max_wait_rounds=3))
    assert [(r.index, r.flush) for r in rounds] == [(0, False), (1, True)]
    assert [[it.index for it in b] for b in rounds[0].result.emitted] == [[0, 1]]
    assert [[it.index for it in b] for b in rounds[1].result.emitted] == [[2]]
    assert list(iter_rounds([], RowBudget(tokens=10), round_size=RoundSize(samples=2), min_fill=0.9, max_wait_rounds=3)) == []


def test_ffd_per_buffer_hand_case() -> None:
    # Buffers [6, 6] -> 2 rows, [4, 4] -> 1 row.
    result = simulate_ffd_per_buffer([6, 6, 4, 4], seq_length=10, buffer_size=2)
    assert (result.rows, result.fill, result.max_wait_rounds) == (3, 20 / 30, 0)


def test_align_and_bad_pad_multiple() -> None:
    assert [aligned_length(n, 4) for n in (1, 4, 5, 8)] == [4, 4, 8, 8]
    with pytest.raises(ValueError, match=r"seq_length=10 must be a positive multiple of pad_multiple=4"):
        simulate_ffd_per_buffer([1], seq_length=10, buffer_size=1, pad_multiple=4)


def test_simulation_table_and_format(mix: list[int]) -> None:
    rows = simulation_table(
        mix[:2000],
        widths=[4096, 8192],
        buffer_sizes=[8, 16],
        min_fill=MIN_FILL,
        max_wait_rounds=MAX_WAIT_ROUNDS,
    )
    assert [(r["W"], r["buffer"]) for r in rows] == [(4096, 8), (4096, 16), (8192, 8), (8192, 16)]
    for row in rows:
        assert row["ratio"] == pytest.approx(row["fill"] / row["ffd_fill"])
        assert row["fill"] > row["ffd_fill"]
    text = format_table(rows)
    lines = text.splitlines()
    assert len(lines) == 2 + len(rows)  # header, rule, one line per row
    header = lines[0].split()
    for title in ("fill", "FFD", "ratio", "rows/1k", "wait", "p99", "budget"):
        assert title in header
    assert f"{rows[2]['fill']:.2%}" in lines[4] and f"{rows[2]['ffd_fill']:.2%}" in lines[4]
    assert all(line.split()[5] == "none" for line in lines[2:])


# ---------------------------------------------------------------- vision patches per row


def test_percentile_nearest_rank() -> None:
    assert [percentile([5, 1, 3, 2], q) for q in (25, 50, 99, 100)] == [1, 2, 5, 5]
    assert percentile([], 99) == 0
    with pytest.raises(ValueError, match=r"q=0 must be in \(0, 100\]"):
        percentile([1], 0)


def test_reference_mix_carries_vision_patches_and_media() -> None:
    samples = reference_mix(4000, seed=0)
    assert [s.tokens for s in samples] == reference_length_mix(4000, seed=0)
    assert samples == reference_mix(4000, seed=0)
    for s in samples:
        assert s.vision_patches % PATCHES_PER_VISUAL_TOKEN == 0
        assert s.vision_patches < PATCHES_PER_VISUAL_TOKEN * s.tokens
        assert (s.vision_patches > 0) == (s.media > 0)
    text_only = sum(s.media == 0 for s in samples) / len(samples)
    videos = sum(s.videos for s in samples) / len(samples)
    assert 0.43 < text_only < 0.51 and 0.06 < videos < 0.10, (text_only, videos)


def test_vision_per_row_hand_case() -> None:
    # W=10, buffer 4: ours packs 6+4 (patches 5+3) and 5+5 (0+7); FFD the same on one buffer.
    samples = [MixSample(tokens=6, vision_patches=5), MixSample(tokens=5), MixSample(tokens=4, vision_patches=3),
               MixSample(tokens=5, vision_patches=7, images=1)]
    ours = simulate_stream(samples, seq_length=10, buffer_size=4, min_fill=1.0, max_wait_rounds=1)
    assert sorted(ours.vision_per_row) == [7, 8] and ours.vision_mean == 7.5
    capped = simulate_stream(samples, seq_length=10, buffer_size=4, min_fill=1.0, max_wait_rounds=1, max_vision_patches=7)
    assert max(capped.vision_per_row) <= 7 and capped.samples == 4 and capped.rows == 3
    ffd = simulate_ffd_per_buffer(samples, seq_length=10, buffer_size=4, max_vision_patches=6)
    assert ffd.skipped == 1 and max(ffd.vision_per_row) <= 6


def test_vision_budget_trade_off_on_reference_mix() -> None:
    samples = reference_mix(3000, seed=0)
    common = {"seq_length": 8192, "buffer_size": 16}
    free = simulate_stream(samples, min_fill=MIN_FILL, max_wait_rounds=MAX_WAIT_ROUNDS, **common)
    budget = free.vision_percentile(50)
    ours = simulate_stream(
        samples, min_fill=MIN_FILL, max_wait_rounds=MAX_WAIT_ROUNDS, max_vision_patches=budget, **common
    )
    ffd = simulate_ffd_per_buffer(samples, max_vision_patches=budget, **common)
    over = sum(s.vision_patches > budget or s.tokens > 8192 for s in samples)
    assert ours.skipped == ffd.skipped == over
    assert ours.samples + ours.skipped == len(samples)
    assert max(ours.vision_per_row) <= budget and max(ffd.vision_per_row) <= budget
    assert free.vision_percentile(99) > budget
    assert ours.fill > ffd.fill + 0.1 and ours.fill > 0.95


def test_simulation_table_with_vision_budgets() -> None:
    samples = reference_mix(1000, seed=0)
    rows = simulation_table(
        samples, widths=[8192], buffer_sizes=[16], min_fill=MIN_FILL, max_wait_rounds=MAX_WAIT_ROUNDS,
        vision_budgets=[None, 20000],
    )
    assert [row["budget"] for row in rows] == [None, 20000]
    assert rows[1]["vision_max"] <= 20000 and rows[1]["ffd_vision_max"] <= 20000
    assert rows[0]["vision_max"] > 20000
    lines = format_table(rows).splitlines()
    assert lines[2].split()[5] == "none" and lines[3].split()[5] == "20000"


def test_plot_fill_writes_png(tmp_path, mix: list[int]) -> None:
    pytest.importorskip("matplotlib")
    rows = simulation_table(
        reference_mix(500, seed=0), widths=[8192], buffer_sizes=[8, 16], min_fill=0.99, max_wait_rounds=4,
        vision_budgets=[None, 20000],
    )
    path = tmp_path / "fill.png"
    plot_fill(rows, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_fill_without_matplotlib_names_the_extra(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"plot extra"):
        plot_fill([], tmp_path / "x.png")


# --------------------------------------------------------------------------- buffer in tokens


def test_token_buffer_runs_a_round_once_the_new_samples_hold_buffer_tokens() -> None:
    lengths = reference_length_mix(600, seed=2)
    kept = [n for n in lengths if n <= 8192]
    rounds = list(iter_rounds(kept, RowBudget(tokens=8192), round_size=RoundSize(tokens=16384), min_fill=MIN_FILL, max_wait_rounds=4))
    previous_new: set[int] = set()
    for packing_round in rounds:
        new = [it for it in packing_round.candidates if it.arrival_round == packing_round.index]
        assert not {it.index for it in new} & previous_new
        previous_new = {it.index for it in new}
        tokens = sum(it.length for it in new)
        if not packing_round.flush:
            # Full with the last arrival, not full without it.
            assert tokens >= 16384 > tokens - max(new, key=lambda it: it.index).length
    assert rounds[-1].flush and sum(it.length for r in rounds for b in r.result.emitted for it in b) == sum(kept)


def test_token_buffer_keeps_fill_where_a_sample_buffer_holds_less_than_a_row() -> None:
    mix = reference_mix(3000, seed=0)
    common = dict(seq_length=16384, min_fill=MIN_FILL, max_wait_rounds=MAX_WAIT_ROUNDS)
    by_samples = simulate_stream(mix, buffer_size=8, **common)
    by_tokens = simulate_stream(mix, buffer_tokens=2 * 16384, **common)
    # 8 samples of the mix hold ~11.6K tokens, less than one 16K row: the wait bound forces
    # partial rows; a round of two rows' worth of tokens does not.
    assert by_samples.fill < 0.98 and by_tokens.fill >= 0.99
    ffd = simulate_ffd_per_buffer(mix, seq_length=16384, buffer_tokens=2 * 16384)
    assert ffd.samples == by_tokens.samples and ffd.fill < by_tokens.fill


def test_simulation_table_lists_sample_and_token_buffers() -> None:
    rows = simulation_table(
        reference_mix(400, seed=1), widths=[4096], buffer_sizes=[8], buffer_rows=[1, 2],
        min_fill=MIN_FILL, max_wait_rounds=MAX_WAIT_ROUNDS,
    )
    assert [row["buffer"] for row in rows] == [8, "1W", "2W"]
    assert " 2W " in format_table(rows)


def test_round_needs_exactly_one_buffer_unit() -> None:
    for kwargs in ({}, {"buffer_size": 4, "buffer_tokens": 8192}):
        with pytest.raises(ValueError, match="set exactly one"):
            list(iter_rounds([5], RowBudget(tokens=10), round_size=RoundSize(samples=kwargs.get("buffer_size"), tokens=kwargs.get("buffer_tokens")), min_fill=0.9, max_wait_rounds=1))


@pytest.mark.parametrize("width", [16384, 32768])
def test_the_default_round_packs_the_text_mix_within_one_percent_of_the_lower_bound(width: int) -> None:
    """Only seq_length set: rows within 1 % + 1 of ceil(kept tokens / W) (16 samples per round, the
    old default, gave 73 rows against a bound of 71 at 32768)."""
    import math

    from energon_pack.config import PackingConfig

    config = PackingConfig(seq_length=width)
    lengths = reference_length_mix(1600, seed=0)
    result = simulate_stream(
        lengths, seq_length=width, **config.policy.resolved_round(width),
        min_fill=config.min_fill, max_wait_rounds=config.max_wait_rounds,
    )
    bound = math.ceil(sum(length for length in lengths if length <= width) / width)
    assert result.skipped == sum(length > width for length in lengths)
    assert result.rows <= bound + 1 + 0.01 * bound, (result.rows, bound)


def test_the_default_round_fills_every_width_of_the_reference_mix() -> None:
    """``energon-pack simulate``'s default mix (4000 samples), flush included: the default round
    (``DEFAULT_ROUND_ROWS`` * W tokens) fills >= 99 % at every width from 4096 to 32768."""
    from energon_pack.config import DEFAULT_ROUND_ROWS, PackingPolicy

    defaults = PackingPolicy()
    rows = simulation_table(
        reference_mix(4000, seed=0), widths=[4096, 8192, 16384, 32768], buffer_sizes=[],
        buffer_rows=[DEFAULT_ROUND_ROWS], min_fill=defaults.min_fill, max_wait_rounds=defaults.max_wait_rounds,
    )
    assert [row["W"] for row in rows] == [4096, 8192, 16384, 32768]
    assert all(row["fill"] >= 0.99 for row in rows), [(row["W"], row["fill"]) for row in rows]


def test_simulate_prints_the_step_imbalance_of_both_dealings(capsys):
    from energon_pack.cli import main

    assert main(["simulate", "--samples", "600", "--dp", "4,8", "--micro-batches", "1,2", "--window-rows", "16"]) == 0
    out = capsys.readouterr().out
    assert "today mean" in out and "balanced p99" in out and "cost model qwen2.5-vl-7b" in out
    lines = [line.split() for line in out.splitlines() if line.split()[:1] in (["4"], ["8"])]
    assert [(line[0], line[1]) for line in lines] == [("4", "1"), ("4", "2"), ("8", "1"), ("8", "2")]
    assert all(float(line[6]) < float(line[3]) for line in lines)  # balanced mean below today's
    assert "online balanced mean" in out
    assert all(float(line[9]) < float(line[8]) for line in lines)  # online balanced below online today
    assert "online floor" in out and all(float(line[11]) >= 1.0 for line in lines)
