"""A planned row member that fails to decode: a counted skip under the online loader's reason, the
row keeps its planned width (the member's slots become padding with no loss), and a resumed plan
loader yields the same rows."""

from __future__ import annotations

import pickle

import pytest

from energon_pack.loader import get_packing_loader
from energon_pack.plan.build import build_plan
from energon_pack.rows.thd import row_width
from tests.support.plan_runs import make_config, row_digest

#: Variable-width rows: a row that lost a member would be narrower if it did not keep its width.
CONFIG = dict(fixed_width=False, width_multiple=64)


@pytest.fixture(scope="module")
def dataset(corrupt_dataset):
    return corrupt_dataset.out_dir


@pytest.fixture(scope="module")
def plan(dataset, processor):
    return build_plan(dataset, make_config(**CONFIG), processor, num_workers=0, progress=False)


@pytest.mark.slow
def test_a_failing_member_is_counted_and_its_slots_become_padding(dataset, processor, plan):
    config = make_config(**CONFIG)
    loader = get_packing_loader(dataset, config, processor, plan=plan)
    rows = list(loader)
    holed = [row for row in rows if row["__stats__"]["skipped"]]
    assert holed, "the corrupt dataset must put a failing member into some planned row"
    for row in holed:
        planned = row_width(plan.row_tokens(row["__plan__"]["row"]), config.row)
        real = int(row["cu_seqlens_q"][-1])
        assert row["input_ids"].shape == (1, planned) and real < planned - config.width_multiple
        assert float(row["loss_mask"][0, real:].sum()) == 0.0  # the hole carries no loss
    online = get_packing_loader(dataset, config, processor)
    list(online)
    assert set(loader.stats()["skipped"]) == {"corrupt_image"} <= set(online.stats()["skipped"])


@pytest.mark.slow
def test_a_resumed_plan_loader_yields_the_same_rows_past_a_failing_member(dataset, processor, plan):
    config = make_config(num_workers=2, **CONFIG)
    reference, holed = [], []
    for row in get_packing_loader(dataset, config, processor, plan=plan):
        reference.append((row["__plan__"]["position"], row_digest(row)))
        if row["__stats__"]["skipped"]:
            holed.append(len(reference) - 1)
    save_after = holed[0]  # the resumed loader meets every failing member
    loader = get_packing_loader(dataset, config, processor, plan=plan)
    rows = iter(loader)
    for _ in range(save_after):
        next(rows)
    state = pickle.loads(pickle.dumps(loader.save_state_rank()))
    loader.close()
    resumed = get_packing_loader(dataset, config, processor, plan=plan)
    resumed.restore_state_rank(state)
    assert [(row["__plan__"]["position"], row_digest(row)) for row in resumed] == reference[save_after:]
    failed_after_save = resumed.stats()["skipped"]["corrupt_image"] - state.stats["skipped"].get("corrupt_image", 0)
    assert failed_after_save > 0
