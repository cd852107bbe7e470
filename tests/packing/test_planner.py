"""The round planner's state: items as tuples, ``audio`` left out when 0, older states restore."""

from __future__ import annotations

from energon_pack.packing.algorithms import PackItem, RoundSize, RowBudget
from energon_pack.packing.planner import RoundPlanner, item_state, plan_state_problems


def _planner() -> RoundPlanner:
    return RoundPlanner(budget=RowBudget(tokens=100), round_size=RoundSize(samples=4), min_fill=0.9, max_wait_rounds=2)


def test_an_item_without_sound_is_stored_as_before_audio_was_counted() -> None:
    assert item_state(PackItem(7, 512, 2, 64, 1)) == (7, 512, 2, 64, 1)
    assert item_state(PackItem(7, 512, 2, 64, 1, 300)) == (7, 512, 2, 64, 1, 300)


def test_a_state_with_and_without_sound_round_trips() -> None:
    planner = _planner()
    planner.admit(40)
    planner.admit(30, audio=250)
    state = planner.state()
    assert state["new"] == [(0, 40, 0, 0, 0), (1, 30, 0, 0, 0, 250)]
    assert plan_state_problems(state) == []
    restored = _planner()
    restored.restore(state)
    assert restored.new == planner.new and restored.new[1].audio == 250


def test_items_of_other_lengths_are_refused_naming_the_fields() -> None:
    state = {**_planner().state(), "next_index": 2, "new": [(0, 40, 0, 0), (1, 30, 0, 0, 0, 0, 0)]}
    (problem,) = plan_state_problems(state)
    assert "(0, 40, 0, 0)" in problem and "(1, 30, 0, 0, 0, 0, 0)" in problem
    assert "(index, length, arrival_round, vision, media, audio)" in problem
