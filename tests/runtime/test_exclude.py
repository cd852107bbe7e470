"""The ``exclude`` list: matching, config validation, both loaders, ``energon-pack plan``, and
resuming a saved state with samples newly excluded (docs/state_contract.md)."""

from __future__ import annotations

import copy
import pickle
from collections import Counter
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from energon_pack.cli import main
from energon_pack.config import ConfigError, PackingConfig
from energon_pack.loader import get_packing_loader
from energon_pack.plan.build import build_plan
from energon_pack.plan.file import PackPlan
from energon_pack.runtime.exclude import ExcludeList, exclude_entry
from tests.support.loader_runs import make_config, packing_stages, row_digest

# --- matching ----------------------------------------------------------------------------------


def test_an_entry_matches_by_key_or_by_shard_and_key():
    exclude = ExcludeList(["k1", "shards/data-000001.tar#k2"])
    assert exclude.match("shards/data-000000.tar", "k1") == "k1"
    assert exclude.match(None, "k1") == "k1"
    assert exclude.match("shards/data-000001.tar", "k2") == "shards/data-000001.tar#k2"
    assert exclude.match("data-000001.tar", "k2") == "shards/data-000001.tar#k2"
    assert exclude.match("shards/data-000000.tar", "k2") is None
    assert exclude.match(None, "k2") is None
    assert not ExcludeList([]) and ExcludeList(["k"])


keys = st.text(alphabet="abc0123456789_-.", min_size=1, max_size=8)


@given(shard=st.sampled_from(["shards/a.tar", "b.tar", "x/y/c.tar"]), key=keys, others=st.lists(keys, max_size=4))
def test_the_entry_a_dead_worker_prints_excludes_exactly_that_sample(shard, key, others):
    exclude = ExcludeList([exclude_entry(shard, key)])
    assert exclude.match(shard, key) == exclude_entry(shard, key)
    assert all(exclude.match(shard, other) is None for other in others if other != key)
    assert exclude.match("elsewhere/other.tar", key) is None


# --- config ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "message"), [
    ("k1", "exclude='k1': must be a list"),
    ([1], "must be a list of sample keys"),
    ([""], r"exclude entries \[''\]"),
    (["a.tar#"], r"exclude entries \['a.tar#'\]"),
    (["#k"], r"exclude entries \['#k'\]"),
    (["a#b#c"], r"exclude entries \['a#b#c'\]"),
])
def test_a_bad_exclude_list_is_refused_naming_it(value, message):
    with pytest.raises(ConfigError, match=message):
        PackingConfig(seq_length=4096, exclude=value)


@pytest.mark.parametrize(("options", "message"), [
    ({"max_storage_retries": -1}, "max_storage_retries=-1"),
    ({"storage_retry_delay": -0.5}, "storage_retry_delay=-0.5"),
    ({"storage_retry_delay": "1s"}, "storage_retry_delay='1s'"),
])
def test_bad_retry_knobs_are_refused(options, message):
    with pytest.raises(ConfigError, match=message):
        PackingConfig(seq_length=4096, **options)


def test_exclude_round_trips_through_yaml_and_stays_out_of_the_fingerprint(tmp_path):
    config = PackingConfig(seq_length=4096, exclude=["shards/a.tar#k1", "k2"])
    path = tmp_path / "packing.yaml"
    config.to_yaml(path)
    assert "exclude:\n- shards/a.tar#k1\n- k2\n" in path.read_text()
    assert PackingConfig.from_yaml(path) == config
    assert config.fingerprint() == PackingConfig(seq_length=4096).fingerprint()


def test_exclude_must_be_a_list_in_get_packing_loader(synthetic_dataset, processor):
    with pytest.raises(TypeError, match=r"exclude='k1': pass a list.*exclude=\['k1'\]"):
        get_packing_loader(synthetic_dataset.out_dir, make_config(0), processor, exclude="k1")


# --- the online loader -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dataset(synthetic_dataset):
    return synthetic_dataset.out_dir


@pytest.fixture(scope="module")
def reference(dataset, processor) -> list:
    return [row_digest(row) for row in get_packing_loader(dataset, make_config(0), processor)]


def _ready_bins(state: Any) -> int:
    """Ready bins of the in-process packing stage in a saved loader state."""
    return sum(len(stage["_plan"]["ready"]) for stage in packing_stages(state))


@pytest.mark.slow
def test_an_excluded_sample_is_skipped_and_counted(dataset, processor, reference):
    excluded = reference[1][0][1]
    loader = get_packing_loader(dataset, make_config(0, exclude=[excluded]), processor)
    keys = [key for row in loader for key in row["__keys__"]]
    assert Counter(keys) == Counter(key for row_keys, _ in reference for key in row_keys) - Counter([excluded])
    assert loader.stats()["skipped"] == {"excluded": 1}


#: Narrow rows, rounds of 8 samples: some row boundaries have two or more rows already planned.
PLANNED_AHEAD = dict(seq_length=1024, buffer_size=8)


@pytest.mark.slow
def test_a_state_resumes_with_a_buffered_sample_newly_excluded(dataset, processor):
    """Saved where the next two rows are already planned, resumed excluding a sample of the second:
    the first row is the same, that sample is gone, every other sample comes once, and the
    continuation is the same each time."""
    config = make_config(0, **PLANNED_AHEAD)
    reference = [row_digest(row) for row in get_packing_loader(dataset, config, processor)]
    loader = get_packing_loader(dataset, config, processor)
    consumed = []
    for row in loader:
        consumed.append(row_digest(row))
        state = pickle.loads(pickle.dumps(loader.save_state_rank()))
        if _ready_bins(state) >= 2:
            break
    else:
        raise AssertionError("no row boundary with two planned rows: the case would not be exercised")
    done = len(consumed)
    assert consumed == reference[:done]
    excluded = reference[done + 1][0][0]

    def resume() -> tuple[list, dict]:
        resumed = get_packing_loader(dataset, config, processor, exclude=[excluded])
        resumed.restore_state_rank(copy.deepcopy(state))
        return [row_digest(row) for row in resumed], resumed.stats()

    rows, stats = resume()
    assert rows[0] == reference[done]  # identical up to the first row that held the excluded sample
    after = Counter(key for row_keys, _ in rows for key in row_keys)
    expected = Counter(key for row_keys, _ in reference[done:] for key in row_keys) - Counter([excluded])
    assert after == expected
    assert stats["skipped"] == {"excluded": 1}
    assert resume()[0] == rows  # deterministic after it


# --- the plan loader and energon-pack plan ------------------------------------------------------


@pytest.fixture(scope="module")
def plan(dataset, processor):
    return build_plan(dataset, make_config(0), processor, num_workers=0, progress=False)


@pytest.mark.slow
def test_the_plan_loader_drops_only_the_excluded_member(dataset, processor, plan):
    clean = {row["__plan__"]["position"]: row_digest(row) for row in get_packing_loader(dataset, make_config(0), processor, plan=plan)}
    victim = next(keys for keys, _ in clean.values() if len(keys) > 1)[1]
    loader = get_packing_loader(dataset, make_config(0), processor, plan=plan, exclude=[victim])
    rows = {row["__plan__"]["position"]: (row_digest(row), row) for row in loader}
    assert rows.keys() == clean.keys()
    for position, (digest, row) in rows.items():
        if victim in clean[position][0]:
            assert list(digest[0]) == [key for key in clean[position][0] if key != victim]
            assert row["input_ids"].shape == (1, make_config(0).seq_length)  # the row keeps its shape
        else:
            assert digest == clean[position]
    assert loader.stats()["skipped"] == {"excluded": 1}


@pytest.mark.slow
def test_the_plan_command_skips_excluded_samples(tmp_path, capsys, synthetic_dataset, plan):
    victim = "sample00003"
    make_config(0, exclude=[victim]).to_yaml(tmp_path / "packing.yaml")
    out = tmp_path / "train.plan"
    assert main(["plan", str(synthetic_dataset.out_dir), "--config", str(tmp_path / "packing.yaml"), "--out", str(out)]) == 0
    assert "exclude list" in capsys.readouterr().out
    excluded = PackPlan.load(out)
    assert excluded.skipped.get("excluded") == 1
    assert excluded.samples_in == plan.samples_in
    assert sum(excluded.skipped.values()) == sum(plan.skipped.values()) + 1
