"""Restoring a damaged or foreign loader state: an error naming what is wrong, never a silent fresh start.

Each case edits (a deep copy of) a real state saved mid-epoch, with pending groups buffered,
the way a truncated or hand-edited checkpoint would differ, and checks that
``restore_state_rank`` raises at once, naming the damaged part. Foreign states (another rank,
another dataset, another config, a plain Energon state) are refused too; a dataset copied to
another folder still resumes.
"""

from __future__ import annotations

import copy
import pickle
import shutil
from collections.abc import Callable
from typing import Any

import pytest
from megatron.energon.savable_loader import SavableDataLoaderState

from energon_pack.core.token_rules import TOKEN_RULES_VERSION, TokenRulesError
from energon_pack.identity import ResumeMismatchError
from energon_pack.loader import PackingLoaderState, get_packing_loader
from energon_pack.runtime.state_check import InvalidLoaderStateError
from energon_pack.data.synthetic import SyntheticSpec, make_synthetic_dataset
from tests.support.loader_runs import EAGER, make_config, packing_stages, row_digest


@pytest.fixture(scope="module")
def dataset(synthetic_dataset):
    return synthetic_dataset.out_dir


def _pending_stage(state: PackingLoaderState) -> dict[str, Any] | None:
    return next((stage for stage in packing_stages(state) if stage["_plan"]["pending"]), None)


@pytest.fixture(scope="module", params=[0, 2], ids=["no-workers", "2-workers"])
def saved(request, dataset, processor) -> tuple[int, PackingLoaderState]:
    """(num_workers, a state saved at the first row boundary where a worker holds pending groups)."""
    num_workers = request.param
    loader = get_packing_loader(dataset, make_config(num_workers), processor, **EAGER)
    for _ in loader:
        state = loader.save_state_rank()
        if _pending_stage(state) is not None:
            return num_workers, pickle.loads(pickle.dumps(state))
    raise AssertionError("no row boundary with pending groups: the damage cases would not exercise them")


def _drop_last_worker(state: PackingLoaderState) -> None:
    state.energon_state.worker_states.pop()


def _forget_a_worker_position(state: PackingLoaderState) -> None:
    worker_state = state.energon_state.worker_states[0]
    if isinstance(worker_state, dict):
        state.energon_state.worker_states[0] = None
    else:
        worker_state.state = None


def _drop_a_buffered_sample(state: PackingLoaderState) -> None:
    stage = _pending_stage(state)
    del stage["_samples"]["_restore_keys"][stage["_plan"]["pending"][0][0]]


def _delete_a_field(state: PackingLoaderState) -> None:
    del next(packing_stages(state))["_stats"]


def _negative_counter(state: PackingLoaderState) -> None:
    next(packing_stages(state))["_plan"]["next_index"] = -5


def _invent_a_ready_bin(state: PackingLoaderState) -> None:
    stage = next(packing_stages(state))
    stage["_plan"]["ready"].append([(stage["_plan"]["next_index"], 10, 0, 0, 0)])


def _duplicate_a_pending_item(state: PackingLoaderState) -> None:
    plan = _pending_stage(state)["_plan"]
    plan["new"].append(plan["pending"][0])


def _bad_next_worker(state: PackingLoaderState) -> None:
    state.energon_state.next_worker_id = 7


def _other_micro_batch(state: PackingLoaderState) -> None:
    state.energon_state.micro_batch_size = 3


def _fingerprint_not_a_mapping(state: PackingLoaderState) -> None:
    state.fingerprint = "seq_length=4096"


def _energon_state_as_dict(state: PackingLoaderState) -> None:
    state.energon_state = {"worker_states": []}


DAMAGE: dict[str, tuple[Callable[[PackingLoaderState], None], str]] = {
    "worker state removed": (_drop_last_worker, r"worker_states has \d entries, the loader has num_workers"),
    "worker position lost": (_forget_a_worker_position, r"worker_states\[0\].* (no saved position|no saved dataset position)"),
    "buffered sample removed": (_drop_a_buffered_sample, r"planned items \[\d+\] have no buffered sample"),
    "stage field deleted": (_delete_a_field, r"fields \['_stats'\] are missing"),
    "counter edited": (_negative_counter, r"_plan: next_index=-5 is not a non-negative integer"),
    "ready bin invented": (_invent_a_ready_bin, r"_plan: item \d+ has an arrival index at or above next_index"),
    "pending item duplicated": (_duplicate_a_pending_item, r"_plan: arrival indices appear twice"),
    "next worker edited": (_bad_next_worker, r"next_worker_id=7 is not a worker index"),
    "micro batch edited": (_other_micro_batch, r"micro_batch_size=3, this loader batches 1"),
    "fingerprint replaced": (_fingerprint_not_a_mapping, r"fingerprint is a str, not a mapping"),
    "energon state replaced": (_energon_state_as_dict, r"energon_state is a dict, not Energon's SavableDataLoaderState"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_state_is_refused_naming_the_damage(saved, dataset, processor, case):
    num_workers, state = saved
    damage, message = DAMAGE[case]
    damaged = copy.deepcopy(state)
    damage(damaged)
    loader = get_packing_loader(dataset, make_config(num_workers), processor, **EAGER)
    with pytest.raises(InvalidLoaderStateError, match=message):
        loader.restore_state_rank(damaged)


@pytest.mark.slow
def test_the_undamaged_copy_restores(saved, dataset, processor):
    """Control: the states the damage cases start from restore without complaint."""
    num_workers, state = saved
    loader = get_packing_loader(dataset, make_config(num_workers), processor, **EAGER)
    loader.restore_state_rank(copy.deepcopy(state))
    assert next(iter(loader))["__keys__"]


def test_a_truncated_state_file_fails_to_load(dataset, processor):
    """A checkpoint file cut short never reaches restore: unpickling it fails."""
    loader = get_packing_loader(dataset, make_config(0), processor)
    next(iter(loader))
    data = pickle.dumps(loader.save_state_rank())
    with pytest.raises((pickle.UnpicklingError, EOFError)):
        pickle.loads(data[: len(data) // 2])


def _state_after_one_row(dataset, processor, **kwargs) -> PackingLoaderState:
    loader = get_packing_loader(dataset, make_config(0), processor, **kwargs)
    next(iter(loader))
    return loader.save_state_rank()


def test_a_state_of_another_rank_is_refused(dataset, processor):
    state = _state_after_one_row(dataset, processor, rank=1, world_size=2)
    loader = get_packing_loader(dataset, make_config(0), processor, rank=0, world_size=2)
    with pytest.raises(ResumeMismatchError, match="rank: saved 1, current 0"):
        loader.restore_state_rank(state)


def test_a_state_of_another_dataset_is_refused(dataset, processor, other_dataset):
    state = _state_after_one_row(other_dataset.out_dir, processor)
    loader = get_packing_loader(dataset, make_config(0), processor)
    with pytest.raises(ResumeMismatchError, match=r"\(dataset differ\)"):
        loader.restore_state_rank(state)


@pytest.mark.parametrize("inexact", [False, True])
def test_a_state_of_the_release_before_token_rules_is_refused_in_one_line(dataset, processor, inexact):
    state = _state_after_one_row(dataset, processor)
    assert state.fingerprint.pop("token_rules") == TOKEN_RULES_VERSION  # as that release saved it
    loader = get_packing_loader(dataset, make_config(0, allow_inexact_resume=inexact), processor)
    with pytest.raises(TokenRulesError, match=r"^the PackingDataLoader state counted tokens under token rules "
                                              rf"unversioned, this energon_pack counts with v{TOKEN_RULES_VERSION}; "
                                              r"fix: [^\n]*start this loader afresh[^\n]*$"):
        loader.restore_state_rank(state)


def test_a_plain_energon_state_is_refused(dataset, processor):
    state = _state_after_one_row(dataset, processor)
    loader = get_packing_loader(dataset, make_config(0), processor)
    with pytest.raises(TypeError, match="PackingDataLoader.save_state_rank"):
        loader.restore_state_rank(state.energon_state)
    assert isinstance(state.energon_state, SavableDataLoaderState)


def test_a_dataset_copied_elsewhere_still_resumes_exactly(dataset, processor, tmp_path):
    copied = tmp_path / "copied"
    shutil.copytree(dataset, copied)
    reference = [row_digest(row) for row in get_packing_loader(dataset, make_config(0), processor)]
    state = _state_after_one_row(dataset, processor)
    loader = get_packing_loader(copied, make_config(0), processor)
    loader.restore_state_rank(state)
    assert [row_digest(row) for row in loader] == reference[1:]


@pytest.fixture(scope="module")
def other_dataset(tmp_path_factory):
    """Another dataset: its shards hold other sample counts (the identity a state is checked against)."""
    spec = SyntheticSpec(max_image_side=128, max_video_seconds=1.0, max_video_side=64)
    return make_synthetic_dataset(tmp_path_factory.mktemp("other"), 30, seed=7, spec=spec, samples_per_shard=16)
