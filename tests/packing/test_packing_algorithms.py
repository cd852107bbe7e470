"""Tests for the pure bin selection (energon_pack.packing.algorithms), with and without vision budgets."""

from __future__ import annotations

import hashlib
import itertools
import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from energon_pack.core.alignment import aligned_length
from energon_pack.packing.algorithms import (
    PackItem,
    RoundSize,
    RowBudget,
    _best_subset,
    _best_subset_budgeted,
    first_fit_decreasing,
    select_bins,
)
from energon_pack.packing.simulate import MixSample, PackingRound, iter_rounds, reference_length_mix
from tests.support.subset_reference import brute_force_best


def _lengths(bins: list[list[PackItem]]) -> list[list[int]]:
    return [[it.length for it in b] for b in bins]


def _indices(bins: list[list[PackItem]]) -> list[list[int]]:
    return [[it.index for it in b] for b in bins]


# ---------------------------------------------------------------- FFD baseline


def test_ffd_golden() -> None:
    # Longest first: 7 -> bin0 (room 3), 6 -> bin1 (room 4), 5 -> bin2 (room 5),
    # 4 -> bin1 (room 0), 3 -> bin0 (room 0), 2 -> bin2 (room 3).
    assert first_fit_decreasing([5, 7, 3, 2, 4, 6], RowBudget(tokens=10)) == [[1, 2], [5, 4], [0, 3]]


def test_ffd_equal_lengths_keep_position_order_and_respect_max_segments() -> None:
    assert first_fit_decreasing([1, 1, 1, 1, 1], RowBudget(tokens=10, segments=2)) == [[0, 1], [2, 3], [4]]
    assert first_fit_decreasing([5, 7, 3], RowBudget(tokens=10, segments=1)) == [[1], [0], [2]]


def test_ffd_rejects_overlong_naming_the_sample() -> None:
    with pytest.raises(ValueError, match=r"sample 1 has aligned length 11 > capacity 10"):
        first_fit_decreasing([3, 11], RowBudget(tokens=10))


def test_ffd_with_vision_budget_golden() -> None:
    # Docstring example: 5 (4 patches) and 2 (4 patches) would carry 8 > 6 patches.
    assert first_fit_decreasing([3, 5, 2, 4], RowBudget(tokens=7, vision_patches=6), vision=[0, 4, 4, 0]) == [[1], [3, 0], [2]]
    # Media: at most 2 per row; the three one-media samples cannot share one row.
    assert first_fit_decreasing([1, 1, 1, 1], RowBudget(tokens=10, media=2), media=[1, 1, 1, 0]) == [[0, 1, 3], [2]]


def test_ffd_rejects_a_sample_over_a_vision_limit() -> None:
    with pytest.raises(ValueError, match=r"sample 1 has 9 vision patches > max_row_vision_patches 8.*'shrink'"):
        first_fit_decreasing([3, 4], RowBudget(tokens=10, vision_patches=8), vision=[1, 9])
    with pytest.raises(ValueError, match=r"sample 0 has 3 media > max_row_media 2"):
        first_fit_decreasing([3], RowBudget(tokens=10, media=2), media=[3])


# ---------------------------------------------------------------- select_bins golden cases


def test_select_bins_docstring_example() -> None:
    items = [PackItem(0, 6, 0), PackItem(1, 4, 0), PackItem(2, 3, 0)]
    result = select_bins(items, RowBudget(tokens=10), round_index=0, min_fill=0.9, max_wait_rounds=2)
    assert _indices(result.emitted) == [[0, 1]]
    assert _indices(result.pending) == [[2]]


def test_select_bins_holds_back_underfilled_bins_until_forced() -> None:
    # Round 0: nothing is forced; 7 cannot be completed (room 3), so the best
    # bin is 5+5 (exact); 7 and 4 do not fit together and stay pending.
    items = [PackItem(0, 7, 0), PackItem(1, 5, 0), PackItem(2, 5, 0), PackItem(3, 4, 0)]
    result = select_bins(items, RowBudget(tokens=10), round_index=0, min_fill=0.9, max_wait_rounds=1)
    assert _indices(result.emitted) == [[1, 2]]
    assert _indices(result.pending) == [[0], [3]]

    # Round 1: sample 0 (arrived in round 0) is forced and leaves alone at
    # fill 0.7; the new 5+5 fill exactly; the new 4 stays pending.
    items = [PackItem(0, 7, 0), PackItem(1, 5, 1), PackItem(2, 5, 1), PackItem(3, 4, 1)]
    result = select_bins(items, RowBudget(tokens=10), round_index=1, min_fill=0.9, max_wait_rounds=1)
    assert _indices(result.emitted) == [[0], [1, 2]]
    assert _indices(result.pending) == [[3]]


def test_select_bins_prefers_exact_fill_over_first_fit() -> None:
    # FFD would pair 6+3 (fill 0.9) and 5+4 (0.9); the exact search finds 6+4 and 5+3+2.
    items = [PackItem(i, n, 0) for i, n in enumerate([6, 5, 4, 3, 2])]
    result = select_bins(items, RowBudget(tokens=10), round_index=0, min_fill=1.0, max_wait_rounds=3)
    assert sorted(_lengths(result.emitted)) == [[5, 3, 2], [6, 4]]
    assert result.pending == []


def test_select_bins_max_segments_golden() -> None:
    items = [PackItem(i, 1, 0) for i in range(6)]
    result = select_bins(items, RowBudget(tokens=10, segments=2), round_index=0, min_fill=0.5, max_wait_rounds=3, flush=True)
    assert _indices(result.emitted) == [[0, 1], [2, 3], [4, 5]]


def test_select_bins_vision_budget_golden() -> None:
    # Docstring example: without a budget #0 + #1 fill the row; with 8 patches per row they cannot.
    items = [PackItem(0, 6, 0, vision=6), PackItem(1, 4, 0, vision=5), PackItem(2, 4, 0)]
    args = {"round_index": 0, "min_fill": 0.9, "max_wait_rounds": 2}
    assert _indices(select_bins(items, RowBudget(tokens=10), **args).emitted) == [[0, 1]]
    result = select_bins(items, RowBudget(tokens=10, vision_patches=8), **args)
    assert _indices(result.emitted) == [[0, 2]]
    assert _indices(result.pending) == [[1]]


def test_select_bins_media_budget_golden() -> None:
    # Four one-image samples of 5 slots, at most 1 image per row: no two can share a row.
    items = [PackItem(i, 5, 0, media=1) for i in range(4)]
    result = select_bins(items, RowBudget(tokens=10, media=1), round_index=0, min_fill=0.5, max_wait_rounds=2, flush=True)
    assert _indices(result.emitted) == [[0], [1], [2], [3]]


def test_row_budget_after_and_fits() -> None:
    budget = RowBudget(tokens=10, media=2)
    assert budget.after([PackItem(0, 6, 0, media=1)]) == RowBudget(tokens=4, media=1)
    assert not RowBudget(tokens=10, vision_patches=8).fits([PackItem(0, 6, 0, vision=5), PackItem(1, 4, 0, vision=4)])
    assert RowBudget(tokens=10).tokens_only and not budget.tokens_only


def test_budgeted_subset_docstring_example() -> None:
    items = [PackItem(0, 5, 0, vision=6), PackItem(1, 5, 0), PackItem(2, 4, 0, vision=3)]
    assert _indices([_best_subset_budgeted(items, RowBudget(tokens=10, vision_patches=5))]) == [[1, 2]]


def test_select_bins_flush_emits_everything() -> None:
    items = [PackItem(i, n, 0) for i, n in enumerate([3, 3, 3, 9])]
    result = select_bins(items, RowBudget(tokens=10), round_index=0, min_fill=1.0, max_wait_rounds=5, flush=True)
    assert result.pending == []
    assert sorted(it.index for b in result.emitted for it in b) == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"capacity": 0}, r"capacity=0 must be >= 1"),
        ({"min_fill": 0.0}, r"min_fill=0.0 must be in \(0, 1\]"),
        ({"min_fill": 1.5}, r"min_fill=1.5 must be in \(0, 1\]"),
        ({"max_wait_rounds": -1}, r"max_wait_rounds=-1 must be >= 0"),
        ({"max_segments": 0}, r"max_segments=0 must be >= 1 or None"),
        ({"max_vision_patches": 0}, r"max_row_vision_patches=0 must be >= 1 or None"),
        ({"max_media": 0}, r"max_row_media=0 must be >= 1 or None"),
    ],
)
def test_select_bins_rejects_bad_arguments(kwargs: dict, message: str) -> None:
    args = {"capacity": 10, "round_index": 0, "min_fill": 0.9, "max_wait_rounds": 2} | kwargs
    limits = {"capacity": "tokens", "max_segments": "segments", "max_vision_patches": "vision_patches", "max_media": "media"}
    budget = RowBudget(**{limits[key]: args.pop(key) for key in list(args) if key in limits})
    with pytest.raises(ValueError, match=message):
        select_bins([PackItem(0, 1, 0)], budget, **args)


@pytest.mark.parametrize(
    ("items", "message"),
    [
        ([PackItem(7, 11, 0)], r"sample 7 has aligned length 11 > capacity 10.*filter overlong"),
        ([PackItem(7, 0, 0)], r"sample 7 has length 0"),
        ([PackItem(1, 2, 0), PackItem(1, 3, 0)], r"sample index 1 appears twice"),
        ([PackItem(4, 2, 3)], r"sample 4 has arrival_round 3 > round_index 0"),
        ([PackItem(5, 2, 0, vision=21)], r"sample 5 has 21 vision patches > max_row_vision_patches 20"),
        ([PackItem(6, 2, 0, media=4)], r"sample 6 has 4 media > max_row_media 3"),
        ([PackItem(8, 2, 0, vision=-1)], r"sample 8 has -1 vision patches; counts must be >= 0"),
    ],
)
def test_select_bins_rejects_bad_candidates(items: list[PackItem], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        select_bins(items, RowBudget(tokens=10, vision_patches=20, media=3), round_index=0, min_fill=0.9, max_wait_rounds=2)


# ---------------------------------------------------------------- subset search vs brute force


@settings(max_examples=300, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 30), min_size=0, max_size=9),
    room=st.integers(0, 60),
    max_count=st.one_of(st.none(), st.integers(0, 5)),
)
def test_best_subset_is_optimal(lengths: list[int], room: int, max_count: int | None) -> None:
    items = [PackItem(i, n, 0) for i, n in enumerate(lengths)]
    chosen = _best_subset(items, room, max_count)
    limit = len(items) if max_count is None else max_count
    best = max(
        sum(c)
        for k in range(min(limit, len(lengths)) + 1)
        for c in itertools.combinations(lengths, k)
        if sum(c) <= room
    )
    assert len({it.index for it in chosen}) == len(chosen)
    assert set(chosen) <= set(items)
    assert sum(it.length for it in chosen) == best
    assert len(chosen) <= limit


budgeted_items = st.lists(
    st.tuples(st.integers(1, 30), st.integers(0, 20), st.integers(0, 3)), min_size=0, max_size=9
).map(lambda rows: [PackItem(i, n, 0, vision=v, media=m) for i, (n, v, m) in enumerate(rows)])


@settings(max_examples=300, deadline=None)
@given(
    items=budgeted_items,
    tokens=st.integers(0, 60),
    limit=st.sampled_from(["vision_patches", "media", "segments"]),
    value=st.integers(0, 40),
)
def test_budgeted_subset_is_optimal_with_one_limit(items: list[PackItem], tokens: int, limit: str, value: int) -> None:
    room = RowBudget(tokens=tokens, **{limit: value})
    chosen = _best_subset_budgeted(items, room)
    assert len({it.index for it in chosen}) == len(chosen) and set(chosen) <= set(items)
    assert [it.index for it in chosen] == sorted(it.index for it in chosen)
    assert room.fits(chosen)
    assert sum(it.length for it in chosen) == brute_force_best(items, room)


@settings(max_examples=300, deadline=None)
@given(
    items=budgeted_items,
    tokens=st.integers(0, 60),
    vision=st.one_of(st.none(), st.integers(0, 40)),
    media=st.one_of(st.none(), st.integers(0, 6)),
    segments=st.one_of(st.none(), st.integers(0, 5)),
)
def test_budgeted_subset_respects_every_limit(
    items: list[PackItem], tokens: int, vision: int | None, media: int | None, segments: int | None
) -> None:
    room = RowBudget(tokens=tokens, segments=segments, vision_patches=vision, media=media)
    chosen = _best_subset_budgeted(items, room)
    assert room.fits(chosen) and set(chosen) <= set(items)
    assert sum(it.length for it in chosen) <= brute_force_best(items, room)
    # Items never matter beyond their counts: the same search without limits matches _best_subset.
    unlimited = _best_subset_budgeted(items, RowBudget(tokens=tokens, segments=segments))
    assert sum(it.length for it in unlimited) == sum(it.length for it in _best_subset(items, tokens, segments))


# ---------------------------------------------------------------- multi-round properties

stream_params = st.fixed_dictionaries(
    {
        "samples": st.lists(
            st.tuples(st.integers(1, 40), st.integers(0, 30), st.integers(0, 3)), min_size=0, max_size=60
        ),
        "capacity": st.integers(40, 64),
        "buffer_size": st.integers(1, 9),
        "min_fill": st.sampled_from([0.5, 0.8, 0.9, 0.97, 1.0]),
        "max_wait_rounds": st.integers(0, 4),
        "max_segments": st.one_of(st.none(), st.integers(1, 5)),
        "max_vision_patches": st.one_of(st.none(), st.integers(30, 90)),
        "max_media": st.one_of(st.none(), st.integers(3, 8)),
    }
)


def _rounds(samples: list, params: dict) -> list[PackingRound]:
    """``iter_rounds`` with flat keyword parameters (capacity, limits, buffer_size, ...)."""
    budget = RowBudget(
        tokens=params["capacity"],
        segments=params.get("max_segments"),
        vision_patches=params.get("max_vision_patches"),
        media=params.get("max_media"),
    )
    round_size = RoundSize(samples=params.get("buffer_size"), tokens=params.get("buffer_tokens"))
    return list(
        iter_rounds(samples, budget, round_size=round_size, min_fill=params["min_fill"], max_wait_rounds=params["max_wait_rounds"])
    )


def _run(params: dict) -> list[PackingRound]:
    return _rounds([MixSample(tokens=n, vision_patches=v, images=m) for n, v, m in params["samples"]], params)


@settings(max_examples=150, deadline=None)
@given(params=stream_params)
def test_stream_invariants(params: dict) -> None:
    budget = RowBudget(
        tokens=params["capacity"],
        segments=params["max_segments"],
        vision_patches=params["max_vision_patches"],
        media=params["max_media"],
    )
    capacity = params["capacity"]
    max_wait = params["max_wait_rounds"]
    rounds = _run(params)
    emitted_indices: list[int] = []
    for rnd in rounds:
        groups = rnd.result.emitted + rnd.result.pending
        # Each round partitions its candidates.
        assert sorted(it.index for g in groups for it in g) == sorted(it.index for it in rnd.candidates)
        assert {it for g in groups for it in g} == set(rnd.candidates)
        for group in groups:
            assert group, "empty bin"
            assert budget.fits(group), f"{group} exceeds {budget}"
            assert [it.index for it in group] == sorted(it.index for it in group)
        for it in (it for g in rnd.result.pending for it in g):
            assert rnd.index - it.arrival_round < max_wait, "a forced sample was held back"
        for group in rnd.result.emitted:
            waits = [rnd.index - it.arrival_round for it in group]
            assert max(waits) <= max_wait
            full = sum(it.length for it in group) >= params["min_fill"] * capacity
            assert full or rnd.flush or max(waits) >= max_wait, "under-filled bin emitted early"
            emitted_indices.extend(it.index for it in group)
        if max_wait == 0 or rnd.flush:
            assert rnd.result.pending == []
    # Every input sample ends in exactly one emitted bin.
    assert sorted(emitted_indices) == list(range(len(params["samples"])))
    assert [r.flush for r in rounds[:-1]] == [False] * (len(rounds) - 1)


@settings(max_examples=60, deadline=None)
@given(params=stream_params, seed=st.integers(0, 2**16))
def test_select_bins_is_deterministic_and_order_independent(params: dict, seed: int) -> None:
    first = _run(params)
    assert first == _run(params)
    rng = random.Random(seed)
    for rnd in first:
        shuffled = list(rnd.candidates)
        rng.shuffle(shuffled)
        again = select_bins(shuffled, RowBudget(tokens=params['capacity'], segments=params['max_segments'], vision_patches=params['max_vision_patches'], media=params['max_media']), round_index=rnd.index, min_fill=params['min_fill'], max_wait_rounds=params['max_wait_rounds'], flush=rnd.flush)
        assert again == rnd.result


@settings(max_examples=60, deadline=None)
@given(params=stream_params)
def test_max_wait_zero_emits_everything_every_round(params: dict) -> None:
    rounds = _run(params | {"max_wait_rounds": 0})
    for rnd in rounds:
        assert rnd.result.pending == []
        assert all(it.arrival_round == rnd.index for it in rnd.candidates)


# ---------------------------------------------------------------- no budget: rows as before


@settings(max_examples=60, deadline=None)
@given(params=stream_params)
def test_without_a_budget_vision_and_media_do_not_change_rows(params: dict) -> None:
    unbudgeted = params | {"max_vision_patches": None, "max_media": None}
    text_only = unbudgeted | {"samples": [(n, 0, 0) for n, _, _ in params["samples"]]}

    def bins(rounds: list[PackingRound]) -> list[tuple[list[list[int]], list[list[int]]]]:
        return [(_indices(r.result.emitted), _indices(r.result.pending)) for r in rounds]

    assert bins(_run(unbudgeted)) == bins(_run(text_only))


def _rounds_digest(rounds: list[PackingRound]) -> str:
    digest = hashlib.sha256()
    for rnd in rounds:
        record = [rnd.index, _indices(rnd.result.emitted), _indices(rnd.result.pending)]
        digest.update(json.dumps(record).encode())
    return digest.hexdigest()


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        (
            {"capacity": 8192, "buffer_size": 16, "min_fill": 0.99, "max_wait_rounds": 4},
            "c2ae857761b58e313fb54b7e45348dadad41bc79747ae9c56179e1d4b78724fa",
        ),
        (
            {"capacity": 4096, "buffer_size": 8, "min_fill": 0.97, "max_wait_rounds": 2, "max_segments": 6, "pad": 4},
            "b2865bbbe814c7a8372d40a76ab4e008e0f8d8f4e4e5d10c407e69b1eb17a7cb",
        ),
    ],
)
def test_rows_without_a_budget_equal_those_before_vision_budgets(kwargs: dict, expected: str) -> None:
    """Every round of 3000 reference-mix samples, digested; ``expected`` was computed with the
    selection as it was before vision budgets existed (commit 599e9cc)."""
    pad = kwargs.pop("pad", 1)
    lengths = [aligned_length(n, pad) for n in reference_length_mix(3000, seed=0)]
    kept = [n for n in lengths if n <= kwargs["capacity"]]
    assert _rounds_digest(_rounds(kept, kwargs)) == expected


def test_round_size_counts_samples_or_tokens() -> None:
    assert RoundSize(samples=2).is_full(2, 1) and not RoundSize(samples=2).is_full(1, 10**6)
    assert RoundSize(tokens=100).is_full(1, 100) and not RoundSize(tokens=100).is_full(50, 99)
    with pytest.raises(ValueError, match="buffer_tokens=0 must be >= 1"):
        RoundSize(tokens=0)
