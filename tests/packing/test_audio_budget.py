"""The per-row audio budget (``max_row_audio_frames``, Qwen-Omni): bin selection keeps every row and
pending group within it, the search stays optimal under it, and a sample alone over it is the
counted skip ``over_audio_budget``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from energon_pack.config import PackingConfig
from energon_pack.errors import UsageError
from energon_pack.packing.algorithms import PackItem, RoundSize, RowBudget, _best_subset_budgeted, first_fit_decreasing
from energon_pack.packing.budget import row_budget, sample_misfit
from energon_pack.packing.planner import RoundPlanner
from energon_pack.plan.build import check_plan_budgets
from tests.support.subset_reference import brute_force_best

audio_items = st.lists(
    st.tuples(st.integers(1, 30), st.integers(0, 20), st.integers(0, 400)), min_size=0, max_size=8
).map(lambda rows: [PackItem(i, n, 0, vision=v, audio=a) for i, (n, v, a) in enumerate(rows)])


@settings(max_examples=200, deadline=None)
@given(items=audio_items, tokens=st.integers(0, 60), audio=st.integers(0, 600))
def test_budgeted_subset_is_optimal_under_an_audio_budget(items: list[PackItem], tokens: int, audio: int) -> None:
    room = RowBudget(tokens=tokens, audio_frames=audio)
    chosen = _best_subset_budgeted(items, room)
    assert room.fits(chosen) and set(chosen) <= set(items)
    assert sum(it.length for it in chosen) == brute_force_best(items, room)


@settings(max_examples=200, deadline=None)
@given(
    items=audio_items,
    tokens=st.integers(0, 60),
    audio=st.integers(0, 600),
    vision=st.one_of(st.none(), st.integers(0, 40)),
    segments=st.one_of(st.none(), st.integers(0, 5)),
)
def test_budgeted_subset_keeps_audio_with_other_limits(
    items: list[PackItem], tokens: int, audio: int, vision: int | None, segments: int | None
) -> None:
    room = RowBudget(tokens=tokens, segments=segments, vision_patches=vision, audio_frames=audio)
    chosen = _best_subset_budgeted(items, room)
    assert room.fits(chosen) and sum(it.audio for it in chosen) <= audio


stream = st.fixed_dictionaries(
    {
        "samples": st.lists(st.tuples(st.integers(1, 40), st.integers(0, 500)), max_size=50),
        "capacity": st.integers(40, 64),
        "audio_frames": st.integers(500, 1500),
        "buffer_size": st.integers(1, 8),
        "min_fill": st.sampled_from([0.5, 0.9, 1.0]),
        "max_wait_rounds": st.integers(0, 3),
    }
)


@settings(max_examples=150, deadline=None)
@given(params=stream)
def test_no_row_exceeds_the_audio_budget(params: dict) -> None:
    """Through the round planner (the packing stage's decisions): every emitted row and every
    pending group stays within the audio budget, and every sample is emitted exactly once."""
    budget = RowBudget(tokens=params["capacity"], audio_frames=params["audio_frames"])
    planner = RoundPlanner(
        budget=budget, round_size=RoundSize(samples=params["buffer_size"]),
        min_fill=params["min_fill"], max_wait_rounds=params["max_wait_rounds"],
    )
    emitted: list[list[PackItem]] = []

    def drain() -> None:
        while (row := planner.take_bin()) is not None:
            emitted.append(row)

    for length, audio in params["samples"]:
        planner.admit(length, audio=audio)
        if not planner.wants_samples():
            planned = planner.run_round()
            assert all(budget.fits(group) for group in planned.result.pending)
            drain()
    planner.end_of_source()
    while not planner.is_empty():
        planner.run_round()
        drain()
    assert all(sum(it.audio for it in row) <= params["audio_frames"] for row in emitted)
    assert all(budget.fits(row) for row in emitted)
    assert sorted(it.index for row in emitted for it in row) == list(range(len(params["samples"])))


def test_ffd_with_audio_budget_golden() -> None:
    # 5 + 2 tokens would fit, but carry 300 + 250 frames > 400.
    assert first_fit_decreasing([3, 5, 2, 4], RowBudget(tokens=7, audio_frames=400), audio=[0, 300, 250, 100]) == [
        [1], [3, 0], [2]
    ]
    with pytest.raises(ValueError, match=r"sample 1 has 401 audio frames > max_row_audio_frames 400"):
        first_fit_decreasing([3, 4], RowBudget(tokens=10, audio_frames=400), audio=[1, 401])


def test_a_sample_over_the_audio_budget_is_a_counted_skip() -> None:
    config = PackingConfig(seq_length=1024, max_row_audio_frames=3000)
    budget = row_budget(config.row, config.policy)
    assert budget.audio_frames == 3000
    sample = SimpleNamespace(__key__="talk", num_tokens=900, vision_patches=0, num_media=0, audio_frames=3001)
    misfit = sample_misfit(sample, budget, config.row, config.policy)
    assert misfit.reason == "over_audio_budget"
    assert "sample 'talk' has 3001 audio feature frames but max_row_audio_frames is 3000" in misfit.detail
    assert sample_misfit(SimpleNamespace(**{**vars(sample), "audio_frames": 3000}), budget, config.row, config.policy) is None
    strict = PackingConfig(seq_length=1024, max_row_audio_frames=3000, on_overlong="error")
    with pytest.raises(ValueError, match="rule: every sample must fit one row; fix: raise max_row_audio_frames"):
        sample_misfit(sample, budget, strict.row, strict.policy)
    # Without the knob the audio frames are not even read (a vision-only sample has none).
    plain = PackingConfig(seq_length=1024)
    vision_only = SimpleNamespace(__key__="img", num_tokens=900, vision_patches=4, num_media=1)
    assert sample_misfit(vision_only, row_budget(plain.row, plain.policy), plain.row, plain.policy) is None


def test_a_pack_plan_refuses_the_audio_budget() -> None:
    check_plan_budgets(PackingConfig(seq_length=1024))
    with pytest.raises(UsageError, match="max_row_audio_frames=3000: a pack plan does not measure audio frames"):
        check_plan_budgets(PackingConfig(seq_length=1024, max_row_audio_frames=3000))
