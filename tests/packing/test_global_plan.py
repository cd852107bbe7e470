"""The pure global planner and the plan's reading order (energon_pack.packing.global_plan)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from energon_pack.packing.algorithms import RowBudget, first_fit_decreasing
from energon_pack.packing.global_plan import (
    best_fit_decreasing,
    best_fit_decreasing_bins,
    epoch_row_order,
    first_rank_position,
    plan_rows,
    plan_rows_flat,
    rank_positions,
    rows_to_lists,
)
from energon_pack.packing.simulate import reference_length_mix, reference_mix, simulate_ffd_per_buffer, simulate_stream
from tests.support import global_plan_reference as reference

# ---------------------------------------------------------------- planning: golden cases


def test_bfd_golden_puts_each_item_in_the_tightest_bin():
    assert best_fit_decreasing([3, 5, 2, 4], RowBudget(tokens=7)) == [[1, 2], [0, 3]]
    # First fit would put 2 next to 5 (first bin with room) and leave 3 for the 4.
    assert first_fit_decreasing([3, 5, 2, 4], RowBudget(tokens=7)) == [[1, 2], [3, 0]]


def test_bfd_respects_segment_and_vision_limits():
    assert best_fit_decreasing([1, 1, 1, 1, 1], RowBudget(tokens=10, segments=2)) == [[0, 1], [2, 3], [4]]
    assert best_fit_decreasing([3, 5, 2, 4], RowBudget(tokens=7, vision_patches=6), vision=[0, 4, 4, 0]) == [
        [1],
        [0, 3],
        [2],
    ]


def test_subset_sum_refinement_saves_a_row_over_best_fit_decreasing():
    lengths = [4, 8, 6, 11, 6, 19, 2, 17, 5, 11, 1, 6]
    assert len(best_fit_decreasing(lengths, RowBudget(tokens=20))) == 6
    assert plan_rows(lengths, RowBudget(tokens=20), min_fill=0.9) == [[0, 8, 9], [1, 3], [2, 4, 11], [5, 10], [6, 7]]


def test_overlong_and_empty_items_are_rejected_by_name():
    with pytest.raises(ValueError, match=r"sample 1 has aligned length 11 > capacity 10"):
        plan_rows([3, 11], RowBudget(tokens=10), min_fill=0.9)
    with pytest.raises(ValueError, match=r"sample 0 has length 0"):
        best_fit_decreasing([0, 3], RowBudget(tokens=10))
    with pytest.raises(ValueError, match=r"sample 1 has 9 vision patches > max_row_vision_patches 8"):
        plan_rows([3, 3], RowBudget(tokens=10, vision_patches=8), min_fill=0.9, vision=[1, 9])


# ---------------------------------------------------------------- planning: properties


@st.composite
def planning_cases(draw):
    capacity = draw(st.integers(min_value=1, max_value=64))
    n = draw(st.integers(min_value=0, max_value=40))
    lengths = draw(st.lists(st.integers(min_value=1, max_value=capacity), min_size=n, max_size=n))
    vision = draw(st.lists(st.integers(min_value=0, max_value=6), min_size=n, max_size=n))
    max_vision = draw(st.one_of(st.none(), st.integers(min_value=6, max_value=20)))
    max_segments = draw(st.one_of(st.none(), st.integers(min_value=1, max_value=6)))
    min_fill = draw(st.sampled_from([0.5, 0.9, 1.0]))
    return lengths, capacity, max_segments, vision, max_vision, min_fill


@settings(max_examples=300, deadline=None)
@given(planning_cases())
def test_plan_is_a_partition_within_every_budget_and_never_worse_than_bfd(case):
    lengths, capacity, max_segments, vision, max_vision, min_fill = case
    budget = RowBudget(tokens=capacity, segments=max_segments, vision_patches=max_vision)
    rows = plan_rows(lengths, budget, min_fill=min_fill, vision=vision)
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    for row in rows:
        assert row == sorted(row) and row
        assert sum(lengths[i] for i in row) <= capacity
        assert max_segments is None or len(row) <= max_segments
        assert max_vision is None or sum(vision[i] for i in row) <= max_vision
    assert [row[0] for row in rows] == sorted(row[0] for row in rows)
    assert len(rows) <= len(best_fit_decreasing(lengths, budget, vision=vision))
    assert rows == plan_rows(list(lengths), budget, min_fill=min_fill, vision=vision)


def test_global_plan_fill_beats_online_and_ffd_per_buffer_on_the_reference_mix():
    """The acceptance figure at W=8192: the global plan fills >= 99.5 % (4000 samples here)."""
    width = 8192
    lengths = [n for n in reference_length_mix(4000, seed=0) if n <= width]
    rows = plan_rows(lengths, RowBudget(tokens=width), min_fill=0.99)
    plan_fill = sum(lengths) / (len(rows) * width)
    online = simulate_stream(lengths, seq_length=width, buffer_size=16, min_fill=0.99, max_wait_rounds=4)
    ffd = simulate_ffd_per_buffer(lengths, seq_length=width, buffer_size=16)
    assert plan_fill >= 0.995
    assert plan_fill > online.fill > ffd.fill
    assert len(rows) <= online.rows


# ---------------------------------------------------------------- planning: the array planner = the reference


@st.composite
def reference_cases(draw, limits: bool):
    """Few distinct lengths (many ties and long equal-length runs), optional segment limit and,
    with ``limits``, vision / media counts and limits."""
    capacity = draw(st.integers(1, 64))
    n = draw(st.integers(0, 120))
    palette = draw(st.lists(st.integers(1, capacity), min_size=1, max_size=8))
    lengths = draw(st.lists(st.sampled_from(palette) | st.integers(1, capacity), min_size=n, max_size=n))
    segments = draw(st.none() | st.integers(1, 6))
    if not limits:
        return lengths, RowBudget(tokens=capacity, segments=segments), {}
    max_vision, max_media = draw(st.none() | st.integers(1, 20)), draw(st.none() | st.integers(1, 4))
    counts = {
        "vision": draw(st.lists(st.integers(0, max_vision or 20), min_size=n, max_size=n)),
        "media": draw(st.lists(st.integers(0, max_media or 4), min_size=n, max_size=n)),
    }
    return lengths, RowBudget(tokens=capacity, segments=segments, vision_patches=max_vision, media=max_media), counts


@settings(max_examples=400, deadline=None)
@given(st.booleans().flatmap(reference_cases))
def test_best_fit_decreasing_gives_the_reference_bins(case):
    lengths, budget, counts = case
    assert best_fit_decreasing(lengths, budget, **counts) == reference.best_fit_decreasing(lengths, budget, **counts)


@pytest.mark.slow  # more than ~3 s: make test runs it, make test-fast leaves it out
@settings(max_examples=400, deadline=None)
@given(reference_cases(limits=False), st.sampled_from([0.5, 0.9, 0.97, 1.0]))
def test_plan_rows_gives_the_reference_rows_token_only(case, min_fill):
    lengths, budget, _ = case
    assert plan_rows(lengths, budget, min_fill=min_fill) == reference.plan_rows(lengths, budget, min_fill=min_fill)


@pytest.mark.slow  # more than ~3 s: make test runs it, make test-fast leaves it out
@settings(max_examples=200, deadline=None)
@given(reference_cases(limits=True), st.sampled_from([0.5, 0.97]))
def test_plan_rows_gives_the_reference_rows_with_vision_and_media_limits(case, min_fill):
    lengths, budget, counts = case
    expected = reference.plan_rows(lengths, budget, min_fill=min_fill, **counts)
    assert plan_rows(lengths, budget, min_fill=min_fill, **counts) == expected
    arrays = {name: np.array(values, dtype=np.int64) for name, values in counts.items()}
    assert rows_to_lists(*plan_rows_flat(np.array(lengths, dtype=np.int64), budget, min_fill=min_fill, **arrays)) == expected


def test_flat_and_bin_id_forms_golden():
    assert best_fit_decreasing_bins([3, 5, 2, 4], RowBudget(tokens=7)).tolist() == [1, 0, 0, 1]
    offsets, members = plan_rows_flat([4, 8, 6, 11, 6, 19, 2, 17, 5, 11, 1, 6], RowBudget(tokens=20), min_fill=0.9)
    assert offsets.tolist() == [0, 3, 5, 8, 10, 12]
    assert members.tolist() == [0, 8, 9, 1, 3, 2, 4, 11, 5, 10, 6, 7]
    assert best_fit_decreasing([], RowBudget(tokens=7)) == [] and plan_rows([], RowBudget(tokens=7), min_fill=0.9) == []


@pytest.mark.parametrize(
    ("lengths", "budget", "counts"),
    [
        ([0, 3], RowBudget(tokens=10), {}),
        ([3, 11], RowBudget(tokens=10), {}),
        ([3, 3, 4], RowBudget(tokens=10, vision_patches=8), {"vision": [1, 9, 10]}),
        ([3, 3], RowBudget(tokens=10, media=2), {"media": [-1, 0]}),
        ([3], RowBudget(tokens=0), {}),
    ],
)
def test_bad_input_raises_the_reference_message(lengths, budget, counts):
    with pytest.raises(ValueError) as ours:
        plan_rows(lengths, budget, min_fill=0.9, **counts)
    with pytest.raises(ValueError) as theirs:
        reference.plan_rows(lengths, budget, min_fill=0.9, **counts)
    assert str(ours.value) == str(theirs.value)


def test_a_realistic_mix_gives_the_reference_rows_at_20k_samples():
    rng = np.random.default_rng(0)
    lengths = -(-np.minimum(8192, np.maximum(1, rng.lognormal(7.0, 1.0, 20_000).astype(np.int64))) // 64) * 64
    budget = RowBudget(tokens=8192)
    assert plan_rows(lengths, budget, min_fill=0.97) == reference.plan_rows(lengths.tolist(), budget, min_fill=0.97)


def test_a_vision_and_media_limited_mix_gives_the_reference_bins_and_rows():
    """The pruned scan (per-room bounds of vision and media room) on the reference mix."""
    mix = [s for s in reference_mix(5000, seed=3) if s.tokens <= 8192 and s.vision_patches <= 12000 and s.media <= 4]
    lengths = [-(-s.tokens // 64) * 64 for s in mix]
    counts = {"vision": [s.vision_patches for s in mix], "media": [s.media for s in mix]}
    budget = RowBudget(tokens=8192, vision_patches=12000, media=4)
    assert best_fit_decreasing(lengths, budget, **counts) == reference.best_fit_decreasing(lengths, budget, **counts)
    few = {name: values[:1500] for name, values in counts.items()}
    assert plan_rows(lengths[:1500], budget, min_fill=0.97, **few) == reference.plan_rows(lengths[:1500], budget, min_fill=0.97, **few)


def test_the_count_limited_refinement_gives_the_reference_rows(monkeypatch):
    """Short and mid-length items with 2-3 segments per row: the refinement's count-limited
    search (``_best_subset_counted``) runs, and the rows are still the reference's."""
    from energon_pack.packing import global_plan

    calls = []
    original = global_plan._best_subset_counted
    monkeypatch.setattr(global_plan, "_best_subset_counted", lambda *args: calls.append(1) or original(*args))
    for seed in range(6):
        rng = np.random.default_rng(seed)
        capacity = int(rng.integers(90, 130))
        lengths = np.concatenate([
            rng.integers(1, 6, 80), rng.integers(capacity // 4, capacity // 2 - 3, 40), rng.integers(capacity // 2, capacity - 20, 30),
        ]).tolist()
        for segments in (2, 3):
            budget = RowBudget(tokens=capacity, segments=segments)
            assert plan_rows(lengths, budget, min_fill=0.99) == reference.plan_rows(lengths, budget, min_fill=0.99)
    assert len(calls) > 10


# ---------------------------------------------------------------- reading order


def test_epoch_row_order_is_a_seeded_permutation_per_epoch():
    assert epoch_row_order(8, seed=42, epoch=0) == [3, 6, 2, 4, 1, 5, 7, 0]  # pinned: same on every platform
    orders = [epoch_row_order(50, seed=42, epoch=e) for e in range(3)]
    assert all(sorted(order) == list(range(50)) for order in orders)
    assert orders[0] != orders[1] != orders[2]
    assert epoch_row_order(50, seed=42, epoch=1) == orders[1]
    assert epoch_row_order(50, seed=7, epoch=0) != orders[0]


def test_rank_positions_golden():
    assert list(rank_positions(0, base=0, end=10, rank=1, world_size=2, worker=0, num_workers=2)) == [1, 5, 9]
    assert list(rank_positions(0, base=0, end=10, rank=1, world_size=2, worker=1, num_workers=2)) == [3, 7]
    assert first_rank_position(12, base=0, rank=1, world_size=8) == 17
    assert first_rank_position(12, base=0, rank=4, world_size=8) == 12
    assert list(rank_positions(20, base=20, end=25, rank=0, world_size=2)) == [20, 22, 24]  # epoch 2 of R=10


@settings(max_examples=200, deadline=None)
@given(
    st.integers(min_value=0, max_value=30),
    st.integers(min_value=0, max_value=30),
    st.integers(min_value=1, max_value=5),
    st.integers(min_value=1, max_value=4),
)
def test_ranks_and_workers_split_the_stream_exactly_and_in_order(base, offset, world_size, workers):
    cursor, end = base + offset, base + offset + 37
    seen = []
    for rank in range(world_size):
        shares = [
            list(rank_positions(cursor, base=base, end=end, rank=rank, world_size=world_size, worker=w, num_workers=workers))
            for w in range(workers)
        ]
        merged = [share[j] for j in range(max(map(len, shares))) for share in shares if j < len(share)]
        assert merged == sorted(merged), "round-robin over the workers yields the rank's rows in order"
        assert all((p - base) % world_size == rank for p in merged)
        seen += merged
    assert sorted(seen) == list(range(cursor, end))


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from([1, 2, 4, 8]),
    st.sampled_from([1, 2, 4, 8]),
    st.integers(min_value=0, max_value=12),
)
def test_a_cursor_saved_at_one_world_size_continues_exactly_at_another(before, after, steps):
    """Ranks in lock step consume ``steps`` rows each: the union below ``before * steps`` is read,
    and restoring that cursor at another world size reads exactly the rest."""
    end = 120
    consumed = {p for r in range(before) for p in list(rank_positions(0, base=0, end=end, rank=r, world_size=before))[:steps]}
    cursor = min(end, before * steps)
    assert consumed == set(range(cursor))
    rest = [p for r in range(after) for p in rank_positions(cursor, base=0, end=end, rank=r, world_size=after)]
    assert sorted(rest) == list(range(cursor, end))
