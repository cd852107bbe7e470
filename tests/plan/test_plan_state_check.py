"""Plan-loader states pass the same damaged / foreign-state checks as online states
(tests/loader/test_state_corruption.py): every problem is listed, and nothing is loaded."""

from __future__ import annotations

import copy
import re
import pickle
from collections.abc import Callable

import pytest

from energon_pack.identity import ResumeMismatchError
from energon_pack.loader import get_packing_loader
from energon_pack.plan.build import build_plan
from energon_pack.plan.loader import PlanLoaderState
from energon_pack.runtime.state_check import InvalidLoaderStateError
from energon_pack.data.synthetic import SyntheticSpec, make_synthetic_dataset
from tests.support.plan_runs import make_config


@pytest.fixture(scope="module")
def dataset(synthetic_dataset):
    return synthetic_dataset.out_dir


@pytest.fixture(scope="module")
def plan(dataset, processor):
    return build_plan(dataset, make_config(seq_length=1024), processor, num_workers=0, progress=False)


def _loader(dataset, processor, plan, **overrides):
    return get_packing_loader(dataset, make_config(seq_length=1024, **overrides), processor, plan=plan)


@pytest.fixture(scope="module")
def saved(dataset, processor, plan) -> PlanLoaderState:
    """A state saved after two rows of the epoch."""
    loader = _loader(dataset, processor, plan)
    rows = iter(loader)
    next(rows), next(rows)
    return pickle.loads(pickle.dumps(loader.save_state_rank()))


DAMAGE: dict[str, tuple[Callable[[PlanLoaderState], None], list[str]]] = {
    "cursor edited": (lambda s: setattr(s, "cursor", -3), [r"cursor=-3 is not a non-negative integer"]),
    "cursor beyond the epoch": (lambda s: setattr(s, "cursor", 10**6), [r"cursor=1000000 is outside epoch 0's positions"]),
    "epoch edited": (lambda s: setattr(s, "epoch", "one"), [r"epoch='one' is not a non-negative integer"]),
    "stats replaced": (lambda s: setattr(s, "stats", [1, 2]), [r"stats is not a saved statistics mapping"]),
    "stats field deleted": (lambda s: s.stats.pop("skipped"), [r"stats is not a saved statistics mapping"]),
    "rank edited": (lambda s: setattr(s, "rank", 5), [r"rank=5 is not below world_size=1"]),
    "step rows edited": (lambda s: setattr(s, "step_rows", 0), [r"step_rows=0 is neither None nor a positive integer"]),
    "fingerprint replaced": (lambda s: setattr(s, "fingerprint", "seq_length=1024"), [r"fingerprint is a str, not a mapping"]),
    "several at once": (
        lambda s: (setattr(s, "cursor", None), setattr(s, "stats", None), setattr(s, "world_size", -1)),
        [r"cursor=None is not", r"world_size=-1 is not", r"stats is not a saved statistics mapping"],
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_plan_state_is_refused_listing_every_problem_and_nothing_is_loaded(saved, dataset, processor, plan, case):
    damage, messages = DAMAGE[case]
    damaged = copy.deepcopy(saved)
    damage(damaged)
    loader = _loader(dataset, processor, plan)
    before = loader.save_state_rank()
    with pytest.raises(InvalidLoaderStateError, match="PlanDataLoader.save_state_rank") as refused:
        loader.restore_state_rank(damaged)
    for message in messages:
        assert re.search(message, str(refused.value)), (message, str(refused.value))
    assert loader.save_state_rank() == before  # nothing loaded


@pytest.mark.slow
def test_the_undamaged_copy_restores_and_continues(saved, dataset, processor, plan):
    reference = [row["__keys__"] for row in _loader(dataset, processor, plan)]
    loader = _loader(dataset, processor, plan)
    loader.restore_state_rank(copy.deepcopy(saved))
    assert [row["__keys__"] for row in loader] == reference[2:]


@pytest.mark.slow
def test_an_online_state_is_refused_by_a_plan_loader_and_the_reverse(saved, dataset, processor, plan):
    online = get_packing_loader(dataset, make_config(seq_length=1024), processor)
    next(iter(online))
    with pytest.raises(TypeError, match="PlanDataLoader.save_state_rank"):
        _loader(dataset, processor, plan).restore_state_rank(online.save_state_rank())
    with pytest.raises(TypeError, match="PackingDataLoader.save_state_rank"):
        get_packing_loader(dataset, make_config(seq_length=1024), processor).restore_state_rank(saved)


@pytest.mark.slow
def test_a_state_of_another_plan_is_refused_naming_it(saved, dataset, processor, plan):
    other = build_plan(dataset, make_config(seq_length=1024, min_fill=0.5), processor, num_workers=0, progress=False)
    loader = get_packing_loader(dataset, make_config(seq_length=1024, min_fill=0.5), processor, plan=other)
    with pytest.raises(ResumeMismatchError, match=r"\(plan differ\)"):
        loader.restore_state_rank(saved)


@pytest.fixture(scope="module")
def other_dataset(tmp_path_factory):
    spec = SyntheticSpec(max_image_side=128, max_video_seconds=1.0, max_video_side=64)
    return make_synthetic_dataset(tmp_path_factory.mktemp("other"), 30, seed=7, spec=spec, samples_per_shard=16).out_dir


@pytest.mark.slow
def test_a_state_of_a_plan_over_another_dataset_is_refused(saved, other_dataset, processor):
    other = build_plan(other_dataset, make_config(seq_length=1024), processor, num_workers=0, progress=False)
    loader = _loader(other_dataset, processor, other)
    with pytest.raises(ResumeMismatchError, match=r"plan: saved '[0-9a-f]+', current '[0-9a-f]+'"):
        loader.restore_state_rank(saved)
