"""Pack plans on a real prepared dataset: building, reading by restore key, elastic state, mismatches."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest

from energon_pack.core.token_rules import TOKEN_RULES_VERSION, TokenRulesError
from energon_pack.identity import ResumeMismatchError
from energon_pack.loader import get_packing_loader
from energon_pack.plan.build import build_plan
from energon_pack.plan.loader import PlanDataLoader
from tests.support.plan_runs import W, make_config, row_digest

@pytest.fixture(scope="module")
def dataset(synthetic_dataset):
    return synthetic_dataset.out_dir


@pytest.fixture(scope="module")
def plan(dataset, processor):
    return build_plan(dataset, make_config(), processor, num_workers=0, progress=False)


def read(loader, limit: int | None = None) -> dict[int, tuple[list[str], str]]:
    """``position -> (keys, digest)`` of the rows a loader yields (at most ``limit``)."""
    rows = {}
    for row in loader:
        rows[row["__plan__"]["position"]] = (row["__keys__"], row_digest(row))
        if limit is not None and len(rows) == limit:
            break
    return rows


@pytest.fixture(scope="module")
def reference(dataset, processor, plan):
    """The rows of one uninterrupted epoch at world size 1 without workers."""
    return read(get_packing_loader(dataset, make_config(), processor, plan=plan))


def test_plan_holds_every_good_sample_once(plan, synthetic_dataset):
    indices = [i for r in range(plan.num_rows) for i in plan.global_indices(r)]
    assert len(indices) == len(set(indices))
    assert plan.samples_in == synthetic_dataset.written
    assert len(indices) + sum(plan.skipped.values()) == synthetic_dataset.written
    assert [count for _, count, _ in plan.shards] == [16, 16, 8]
    assert all(sum(plan.row_tokens(r)) <= W for r in range(plan.num_rows))
    assert plan.fingerprint["packing"]["seq_length"] == W


@pytest.mark.slow
def test_an_epoch_reads_every_plan_row_once_in_the_seeded_order(reference, plan, all_keys):
    assert sorted(reference) == list(range(plan.num_rows))
    keys = [key for row_keys, _ in reference.values() for key in row_keys]
    assert len(keys) == len(set(keys)) == plan.num_samples and set(keys) <= set(all_keys)


@pytest.fixture(scope="module")
def all_keys(synthetic_dataset):
    return {f"sample{i:05d}" for i in range(synthetic_dataset.written)}


@pytest.mark.slow
def test_rows_are_the_online_row_builder_s_rows(dataset, processor, plan):
    """A plan row is what the task encoder's online path builds for the same members."""
    loader = get_packing_loader(dataset, make_config(), processor, plan=plan)
    row = next(iter(loader))
    source = loader.source
    prepared = [source.encoder.preencode_sample(source.fetch(i)) for i in plan.global_indices(row["__plan__"]["row"])]
    encoder = source.encoder
    online = encoder.batch([encoder.pack_selected_samples([encoder.postencode_sample(p) for p in prepared])])
    assert row_digest(online) == row_digest(row) and online["__keys__"] == row["__keys__"]


@pytest.mark.slow
@pytest.mark.parametrize(("num_workers", "world_size"), [(2, 1), (2, 3), (0, 3)])
def test_rows_do_not_depend_on_workers_or_ranks(dataset, processor, plan, reference, num_workers, world_size):
    merged = {}
    for rank in range(world_size):
        loader = get_packing_loader(
            dataset, make_config(num_workers), processor, plan=plan, rank=rank, world_size=world_size
        )
        rows = read(loader)
        assert all(position % world_size == rank for position in rows)
        merged.update(rows)
    assert merged == reference


@pytest.mark.slow
def test_state_saved_at_four_ranks_restores_at_two(dataset, processor, plan, reference):
    steps = 1
    states = []
    for rank in range(4):
        loader = get_packing_loader(dataset, make_config(), processor, plan=plan, rank=rank, world_size=4)
        iterator = iter(loader)
        for _ in range(steps):
            next(iterator)
        states.append(pickle.loads(pickle.dumps(loader.save_state_rank())))
        del iterator
    assert {state.cursor for state in states} == {4 * steps}
    merged = {}
    for rank in range(2):
        resumed = get_packing_loader(dataset, make_config(), processor, plan=plan, rank=rank, world_size=2)
        resumed.restore_state_global(states)
        merged.update(read(resumed))
    assert merged == {p: row for p, row in reference.items() if p >= 4 * steps}


@pytest.mark.slow
def test_ranks_out_of_lock_step_are_refused_and_one_rank_s_state_is_enough(dataset, processor, plan, reference):
    loader = get_packing_loader(dataset, make_config(), processor, plan=plan, rank=0, world_size=2)
    iterator = iter(loader)
    first = loader.save_state_rank()
    next(iterator)
    second = loader.save_state_rank()
    del iterator
    resumed = get_packing_loader(dataset, make_config(), processor, plan=plan)
    with pytest.raises(ValueError, match="disagree"):
        resumed.restore_state_global([first, second])
    resumed.restore_state_rank(second)
    assert read(resumed) == {p: row for p, row in reference.items() if p >= 2}


@pytest.mark.slow
def test_members_are_fetched_by_restore_key_without_scanning(dataset, processor, plan, reference, monkeypatch):
    from megatron.energon.flavors.webdataset.sample_loader import WebdatasetSampleLoaderDataset

    def no_scan(self):
        raise AssertionError("the plan loader iterated the dataset instead of reading by index")

    monkeypatch.setattr(WebdatasetSampleLoaderDataset, "__iter__", no_scan)
    assert read(get_packing_loader(dataset, make_config(), processor, plan=plan), limit=2) == {
        p: reference[p] for p in (0, 1)
    }


@pytest.mark.slow
def test_a_row_is_rebuilt_from_its_restore_key(dataset, processor, plan):
    loader = get_packing_loader(dataset, make_config(), processor, plan=plan)
    rows = list(loader)
    for row in (rows[0], rows[-1]):
        assert row_digest(loader.restore_sample(row["__restore_key__"])) == row_digest(row)


@pytest.mark.slow
def test_a_finite_loader_reads_the_next_epoch_when_iterated_again(dataset, processor, plan, reference):
    loader = get_packing_loader(dataset, make_config(), processor, plan=plan)
    assert len(loader) == plan.num_rows
    first = read(loader)
    state = loader.save_state_rank()
    second = read(loader)
    assert first == reference
    assert sorted(p - plan.num_rows for p in second) == sorted(first)
    assert [second[p + plan.num_rows][0] for p in sorted(first)] != [first[p][0] for p in sorted(first)]
    finished = get_packing_loader(dataset, make_config(), processor, plan=plan)
    finished.restore_state_rank(state)  # saved after the last row of epoch 0
    assert read(finished) == second  # epoch 0 is done: the next iteration is epoch 1


@pytest.mark.slow
def test_repeat_runs_on_into_later_epochs(dataset, processor, plan):
    rows = plan.num_rows
    loader = get_packing_loader(dataset, make_config(repeat=True), processor, plan=plan)
    got = read(loader, limit=2 * rows)
    epochs = [sorted(keys for p, (keys, _) in got.items() if p // rows == e) for e in range(2)]
    assert epochs[0] == epochs[1]  # the same rows each epoch, in a different order
    assert [got[p][0] for p in range(rows)] != [got[p + rows][0] for p in range(rows)]
    with pytest.raises(TypeError, match="no length"):
        len(loader)


def test_a_plan_for_another_config_or_processor_is_refused_by_field(dataset, processor, plan):
    with pytest.raises(ResumeMismatchError, match="packing.seq_length") as err:
        get_packing_loader(dataset, make_config(seq_length=4096), processor, plan=plan)
    assert err.value.fields == ["packing.seq_length"]
    from energon_pack.qwen.processor import load_processor

    smaller = load_processor(max_pixels=256 * 28 * 28)
    with pytest.raises(ResumeMismatchError, match="encoder.vision.image_max_pixels"):
        get_packing_loader(dataset, make_config(), smaller, plan=plan)
    inexact = get_packing_loader(dataset, make_config(seq_length=4096, allow_inexact_resume=True), processor, plan=plan)
    assert isinstance(inexact, PlanDataLoader)


def test_a_state_of_another_plan_is_refused(dataset, processor, plan):
    other = build_plan(dataset, make_config(seq_length=4096), processor, num_workers=0, progress=False)
    state = get_packing_loader(dataset, make_config(seq_length=4096), processor, plan=other).save_state_rank()
    loader = get_packing_loader(dataset, make_config(), processor, plan=plan)
    with pytest.raises(ResumeMismatchError, match="plan"):
        loader.restore_state_rank(state)
    with pytest.raises(ValueError, match="mode='in_batch'"):
        get_packing_loader(
            dataset, make_config(mode="in_batch", micro_batch_size=2, fixed_width=False), processor, plan=plan
        )
    with pytest.raises(ValueError, match="checkpoint_every_sec"):
        get_packing_loader(dataset, make_config(), processor, plan=plan, checkpoint_every_sec=0)


def test_a_plan_or_plan_state_of_other_token_rules_is_refused_in_one_line(dataset, processor, plan, tmp_path):
    """A plan and a plan-loader state of the release before token rules (no version recorded)
    are refused, allow_inexact_resume or not, with one line naming both versions and the fix."""
    fingerprint = copy.deepcopy(plan.fingerprint)
    assert fingerprint["encoder"].pop("token_rules") == TOKEN_RULES_VERSION
    previous = dataclasses.replace(plan, fingerprint=fingerprint)
    previous.save(tmp_path / "previous.plan")
    unversioned = f"counted tokens under token rules unversioned, this energon_pack counts with v{TOKEN_RULES_VERSION}"
    for given, where in ((previous, r"pack plan \(digest [0-9a-f]{16}\)"), (tmp_path / "previous.plan", "pack plan .*previous.plan")):
        for inexact in (False, True):
            with pytest.raises(TokenRulesError, match=rf"^{where} {unversioned}; fix: rebuild the plan with this "
                                                       r"energon_pack's `energon-pack plan [^\n]*$"):
                get_packing_loader(dataset, make_config(allow_inexact_resume=inexact), processor, plan=given)
    state = get_packing_loader(dataset, make_config(), processor, plan=plan).save_state_rank()
    assert state.fingerprint.pop("token_rules") == TOKEN_RULES_VERSION
    with pytest.raises(TokenRulesError, match=rf"^the PlanDataLoader state {unversioned}; fix: [^\n]*$"):
        get_packing_loader(dataset, make_config(), processor, plan=plan).restore_state_rank(state)


@pytest.mark.slow
def test_decode_failures_are_counted_and_the_rest_of_the_row_kept(corrupt_dataset, processor):
    config = make_config()
    plan = build_plan(corrupt_dataset.out_dir, config, processor, num_workers=0, progress=False)
    loader = get_packing_loader(corrupt_dataset.out_dir, config, processor, plan=plan)
    rows = list(loader)
    stats = loader.stats()
    keys = [key for row in rows for key in row["__keys__"]]
    assert stats["skipped"].get("corrupt_image", 0) >= 1
    assert len(keys) + stats["skipped_total"] == plan.num_samples == stats["samples_in"]
    assert stats["plan_rows"] == plan.num_rows and stats["rows"] == len(rows)
    assert stats["family"] == "qwen2.5-vl"


@pytest.mark.slow
def test_variable_width_plan_rows_have_no_tail(dataset, processor):
    config = make_config(fixed_width=False, width_multiple=64)
    plan = build_plan(dataset, config, processor, num_workers=0, progress=False)
    for row in get_packing_loader(dataset, config, processor, plan=plan):
        width = row["input_ids"].shape[1]
        assert width % 64 == 0 and width <= W and row["total_tokens"] == width
        assert int(row["cu_seqlens_q_padded"][-1]) == width
        assert width - int(row["cu_seqlens_q"][-1]) < 64  # real tokens up to the last multiple of 64


@pytest.mark.slow
def test_close_stops_the_workers_and_keeps_the_position(dataset, processor, plan, reference):
    with get_packing_loader(dataset, make_config(num_workers=2), processor, plan=plan) as loader:
        iterator = iter(loader)
        first = next(iterator)
        workers = list(loader._rows._workers)
        assert workers and all(worker.is_alive() for worker in workers)
    assert not any(worker.is_alive() for worker in workers)
    del iterator
    assert read(loader) == {p: row for p, row in reference.items() if p > first["__plan__"]["position"]}
