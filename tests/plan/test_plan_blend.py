"""Pack plans over a metadataset's blend: selection by shares of tokens or samples, rows in an
order that keeps every stretch at the shares, the plan loader reading each leaf with its
subflavors, and exact resume at another data-parallel size."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from energon_pack import PackingConfig, get_packing_loader
from energon_pack.cli import main
from energon_pack.errors import UsageError
from energon_pack.config.topology import ParallelTopology
from energon_pack.plan.blend import (
    PlanSchedule,
    blend_plan_problem,
    blend_selection,
    interleave_rows,
    interleave_setup,
    reorder_rows,
    scheduled_rows,
    select_by_repetitions,
    select_by_weights,
)
from energon_pack.plan.build import measure_blend, plan_split
from energon_pack.data.blend_mix import metadataset_yaml
from tests.support.plan_blend_runs import SOURCES, WEIGHTS, make_plan_blend, plan_compositions, worst_window

W = 4096


def test_the_source_that_runs_out_first_defines_the_epoch():
    units = [np.full(10, 100), np.full(100, 10)]
    assert [len(s) for s in select_by_weights(units, [1, 1], seed=0)] == [10, 100]
    chosen = select_by_weights(units, [3, 1], seed=0)
    assert [len(s) for s in chosen] == [10, 33]  # 1000 tokens against 330, the closest to 333
    assert len(set(chosen[1].tolist())) == 33 and chosen[1].max() < 100
    assert [len(s) for s in select_by_weights(units, [1, 0], seed=0)] == [10, 0]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(1, 500), min_size=20, max_size=60), min_size=2, max_size=4),
       st.lists(st.floats(0.1, 5), min_size=4, max_size=4), st.integers(0, 9))
def test_selected_shares_are_exact_to_within_one_sample(units, weights, seed):
    units = [np.array(u) for u in units]
    weights = weights[: len(units)]
    chosen = select_by_weights(units, weights, seed=seed)
    got = [float(u[c].sum()) for u, c in zip(units, chosen)]
    defining = min(range(len(units)), key=lambda i: units[i].sum() / weights[i])
    epoch = units[defining].sum() / (weights[defining] / sum(weights))
    for u, c, g, w in zip(units, chosen, got, weights):
        assert len(set(c.tolist())) == len(c)  # no repeats under weights
        assert abs(g - epoch * w / sum(weights)) <= u.max() / 2 + 1e-6


def test_repetitions_repeat_every_sample_and_a_seeded_part_of_the_fraction():
    chosen = select_by_repetitions([4, 2], [1.5, 2], seed=3)
    assert chosen[0][:4].tolist() == [0, 1, 2, 3] and len(chosen[0]) == 6
    assert len(set(chosen[0][4:].tolist())) == 2 and set(chosen[0][4:].tolist()) <= {0, 1, 2, 3}
    assert chosen[0].tolist() == select_by_repetitions([4, 2], [1.5, 2], seed=3)[0].tolist()  # seeded
    assert sorted(chosen[1].tolist()) == [0, 0, 1, 1]


def test_rows_are_interleaved_so_that_no_source_is_front_loaded():
    rng = np.random.default_rng(0)
    # Homogeneous rows as best-fit-decreasing makes them: 60 rows of source 0, 30 of 1, 10 of 2.
    compositions = np.zeros((100, 3))
    for row, source in enumerate([0] * 60 + [1] * 30 + [2] * 10):
        compositions[row, source] = rng.integers(3900, 4096)
    order = interleave_rows(compositions, seed=1)
    assert sorted(order.tolist()) == list(range(100))
    assert worst_window(compositions[order], compositions.sum(0) / compositions.sum(), window=20) < 0.06
    assert worst_window(compositions, compositions.sum(0) / compositions.sum(), window=20) > 0.5  # as packed


def step_by_step_interleave(compositions, *, seed, targets=None):
    """The reference: ``interleave_rows`` as it was written before its numpy blocks, one position
    at a time (kept here to compare against; the buckets and targets are the package's)."""
    rows, sources = compositions.shape
    if rows == 0:
        return np.zeros(0, dtype=np.int64)
    targets, buckets = interleave_setup(compositions, seed=seed, targets=targets)
    buckets = [bucket.tolist() for bucket in buckets]
    units = compositions.tolist()
    row_totals = compositions.sum(axis=1).tolist()
    shares = np.asarray(targets).tolist()
    heads = [0] * sources
    drawn, due = [0.0] * sources, [0.0] * sources
    order = np.empty(rows, dtype=np.int64)
    for position in range(rows):
        best, best_error = -1, float("inf")
        here = shares[position]
        for source in range(sources):
            if heads[source] < len(buckets[source]):
                row = buckets[source][heads[source]]
                total = row_totals[row]
                error = sum((d + u - (o + p * total)) ** 2 for d, u, o, p in zip(drawn, units[row], due, here))
                if error < best_error:
                    best, best_error = source, error
        row = buckets[best][heads[best]]
        heads[best] += 1
        drawn = [d + u for d, u in zip(drawn, units[row])]
        due = [o + p * row_totals[row] for o, p in zip(due, here)]
        order[position] = row
    return order


@st.composite
def interleave_inputs(draw):
    """Row compositions of 1-4 sources (units: whole tokens; rows mostly of one source, some mixed,
    some empty) and, half the time, per-position target shares (a schedule's)."""
    rows, sources = draw(st.integers(0, 300)), draw(st.integers(1, 4))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    scale = draw(st.sampled_from([1, 10, 4096]))
    compositions = rng.integers(0, scale + 1, (rows, sources)).astype(np.float64)
    compositions[rng.random((rows, sources)) < draw(st.sampled_from([0.0, 0.5, 0.9]))] = 0
    if rows and sources:
        compositions[np.arange(rows), rng.integers(0, sources, rows)] += rng.integers(0, 8 * scale + 1, rows)
    targets = None
    if draw(st.booleans()):
        raw = rng.random((rows, sources)) + draw(st.sampled_from([0.0, 1e-3]))
        targets = raw / np.maximum(raw.sum(axis=1, keepdims=True), 1e-12)
    return compositions, targets, draw(st.integers(0, 3))


@settings(max_examples=300, deadline=None)
@given(interleave_inputs())
def test_the_numpy_interleave_equals_the_step_by_step_one(inputs):
    compositions, targets, seed = inputs
    expected = step_by_step_interleave(compositions, seed=seed, targets=targets)
    assert interleave_rows(compositions, seed=seed, targets=targets).tolist() == expected.tolist()


def test_reorder_rows_moves_members_and_row_arrays():
    offsets, members, arrays = reorder_rows(np.array([0, 2, 3]), np.array([5, 6, 7]), {"x": np.array([1, 2])}, np.array([1, 0]))
    assert offsets.tolist() == [0, 1, 3] and members.tolist() == [7, 5, 6] and arrays["x"].tolist() == [2, 1]


def leaves(*weights):
    return {"mode": "weights", "leaves": [
        {"path": f"d{i}", "split": "train", "weight": w, "repetitions": None, "samples": 2} for i, w in enumerate(weights)
    ]}


def test_blend_selection_numbers_samples_globally_and_names_bad_leaves():
    kept, source_of = blend_selection(np.array([10, 10, 5, 5]), leaves(1, 1), unit="tokens", seed=0)
    assert source_of.tolist() == [0, 0, 1, 1] and len(kept) == 3 and kept[1:].tolist() == [2, 3] and kept[0] in (0, 1)
    kept, _ = blend_selection(np.array([10, 10, 5, 5]), leaves(1, 1), unit="samples", seed=0)
    assert kept.tolist() == [0, 1, 2, 3]
    with pytest.raises(UsageError, match="'d1'.*none of its 2 samples.*fix"):
        blend_selection(np.array([10, 10, -1, -1]), leaves(1, 1), unit="tokens", seed=0)
    with pytest.raises(UsageError, match="negative"):
        blend_selection(np.array([10, 10, 5, 5]), leaves(1, -1), unit="tokens", seed=0)


def test_settings_a_plan_cannot_meet_are_named():
    assert "supervised" in blend_plan_problem(PackingConfig(seq_length=W, blend_unit="supervised_tokens"))
    assert "balance_steps" in blend_plan_problem(PackingConfig(seq_length=W, balance_steps=True, cost_model="qwen2.5-vl-7b"))
    assert blend_plan_problem(PackingConfig(seq_length=W, blend_unit="tokens")) is None


SHIFT = ({"step": 0, "weights": [0.9, 0.1]}, {"step": 10, "weights": [0.1, 0.9]})


def test_a_plan_schedule_counts_steps_of_dp_times_micro_batches_rows():
    config = PackingConfig(seq_length=W, blend_schedule=SHIFT, micro_batches_per_step=2, topology=ParallelTopology(dp=2))
    schedule = PlanSchedule.of(config, leaves(1, 1))
    assert schedule.step_rows == 4 and schedule.part_rows(20, 64) == 20 and schedule.part_rows(40, 64) == 64
    assert schedule.targets(3, start=39).tolist() == [[0.9, 0.1], [0.1, 0.9], [0.1, 0.9]]
    with pytest.raises(UsageError, match="3 datasets"):
        PlanSchedule.of(config, leaves(1, 1, 1))
    with pytest.raises(UsageError, match="blend_epochized"):
        PlanSchedule.of(config, {**leaves(1, 1), "mode": "repetitions"})


def test_scheduled_rows_follow_the_shares_of_each_step():
    # Samples of 10 units; a row packs 10 samples (100 units); 4 rows a step.
    units = np.full(4000, 10.0)
    streams = [np.arange(0, 2000), np.arange(2000, 4000)]
    schedule = PlanSchedule.of(PackingConfig(seq_length=W, blend_schedule=SHIFT, micro_batches_per_step=4), leaves(1, 1))

    def pack(kept):
        order = np.sort(kept)  # rows homogeneous by source, as best-fit-decreasing makes them
        return np.arange(0, len(order) + 9, 10)[: -(-len(order) // 10) + 1].clip(max=len(order)), order

    offsets, members = scheduled_rows(streams, units, schedule, seed=0, row_units=100.0, pack=pack)
    source = (members >= 2000).astype(int)
    rows = len(offsets) - 1
    share = np.array([source[offsets[r]:offsets[r + 1]].mean() for r in range(rows)])
    assert abs(share[:40].mean() - 0.1) < 0.01 and abs(share[40:].mean() - 0.9) < 0.01
    assert rows > 40 and sorted(members.tolist()) == sorted(set(members.tolist()))  # each sample once
    # the plan ends when source 1 (0.9 after step 10) is spent
    assert (source == 1).sum() > 1900


@pytest.fixture(scope="module")
def blend(tmp_path_factory, processor):
    return make_plan_blend(tmp_path_factory.mktemp("plan_blend"), processor)


def config_of(**overrides) -> PackingConfig:
    return PackingConfig(**{"seq_length": W, "num_workers": 0, "repeat": False, "blend_unit": "tokens", **overrides})


def plan_of(blend, processor, **overrides):
    from energon_pack.runtime.task_encoder import QwenVLPackingTaskEncoder

    config = config_of(**overrides)
    encoder = QwenVLPackingTaskEncoder(config, processor)
    measurement, _ = measure_blend(blend, encoder, split="train", num_workers=0, progress=False)
    return plan_split(measurement, blend, "train", encoder, config), config


@pytest.fixture(scope="module")
def planned(blend, processor):
    return plan_of(blend, processor)


@pytest.mark.slow
def test_a_token_plan_meets_the_shares_over_the_plan_and_every_64_rows(planned):
    plan, _ = planned
    compositions = plan_compositions(plan)
    shares = compositions.sum(0) / compositions.sum()
    assert np.abs(shares - WEIGHTS).max() < 0.005
    assert plan.num_rows > 64 and worst_window(compositions, np.array(WEIGHTS)) < 0.05
    assert plan.fingerprint["packing"]["blend_unit"] == "tokens"
    assert [leaf["path"] for leaf in plan.fingerprint["dataset"]["blend"]["leaves"]] == ["short", "medium", "long"]


@pytest.mark.slow
def test_a_sample_plan_meets_the_shares_of_samples(blend, processor):
    plan, _ = plan_of(blend, processor, blend_unit="samples")
    leaves = plan.fingerprint["dataset"]["blend"]["leaves"]
    starts = np.cumsum([0] + [leaf["samples"] for leaf in leaves])
    members = np.concatenate([plan.global_indices(r) for r in range(plan.num_rows)])
    counts = np.bincount(np.searchsorted(starts, members, side="right") - 1, minlength=3)
    assert np.abs(counts / counts.sum() - WEIGHTS).max() < 0.005


def loader(blend, processor, plan, config, *, rank=0, world_size=1):
    return get_packing_loader(str(blend), config, processor, plan=plan, rank=rank, world_size=world_size)


@pytest.mark.slow
def test_the_plan_loader_reads_each_leaf_with_its_subflavors_and_resumes_at_another_dp_size(blend, processor, planned):
    plan, config = planned
    with loader(blend, processor, plan, config) as one:
        reference = list(itertools.islice(one, 10))
    sources = [s["source"] for s in reference[0]["__subflavors__"]]
    leaf_of = {"short": 0, "medium": 1, "long": 2}
    starts = np.cumsum([0] + [leaf["samples"] for leaf in plan.fingerprint["dataset"]["blend"]["leaves"]])
    expected = np.searchsorted(starts, plan.global_indices(reference[0]["__plan__"]["row"]), side="right") - 1
    assert [leaf_of[s] for s in sources] == expected.tolist()
    assert [row["__plan__"]["row"] for row in reference] == list(range(10))  # the stored, interleaved order
    assert one.source.plan_row(plan.num_rows + 3) == (1, 3)  # every epoch in that order
    sources = one.stats()["plan_sources"]
    assert [s["subflavors"]["source"] for s in sources] == ["short", "medium", "long"]
    assert abs(sources[0]["real_tokens_share"] - 0.6) < 0.005 and sum(s["samples"] for s in sources) == plan.num_samples
    # Save at DP2 after 3 rows per rank, restore at DP1: rows 6.. continue exactly.
    ranks = [loader(blend, processor, plan, config, rank=r, world_size=2) for r in range(2)]
    for dp_loader in ranks:
        assert len(list(itertools.islice(dp_loader, 3))) == 3
    states = [dp_loader.save_state_rank() for dp_loader in ranks]
    for dp_loader in ranks:
        dp_loader.close()
    with loader(blend, processor, plan, config) as resumed:
        resumed.restore_state_global(states)
        rows = list(itertools.islice(resumed, 4))
    assert [row["__plan__"]["position"] for row in rows] == [6, 7, 8, 9]
    # ... and at DP4, each rank with a worker process: the union of their next rows is 6..9.
    with_workers = config_of(num_workers=1)
    dp4_rows = []
    for rank in range(4):
        with loader(blend, processor, plan, with_workers, rank=rank, world_size=4) as dp4:
            dp4.restore_state_global(states)
            dp4_rows.append(next(iter(dp4)))
    dp4_rows.sort(key=lambda row: row["__plan__"]["position"])
    assert [row["__plan__"]["position"] for row in dp4_rows] == [6, 7, 8, 9]
    for got, want in zip(rows + dp4_rows, reference[6:] * 2):
        assert got["input_ids"].tolist() == want["input_ids"].tolist()
        assert got["__subflavors__"] == want["__subflavors__"]


@pytest.mark.slow
def test_a_plan_is_refused_when_a_leaf_weight_or_the_unit_changes(blend, processor, planned):
    from energon_pack.identity import ResumeMismatchError

    plan, config = planned
    changed = blend.parent / "changed.yaml"
    changed.write_text(metadataset_yaml([s.name for s in SOURCES], weights=(0.5, 0.4, 0.1)), encoding="utf-8")
    with pytest.raises(ResumeMismatchError, match="dataset.blend"):
        loader(changed, processor, plan, config)
    with pytest.raises(ResumeMismatchError, match="blend_unit"):
        loader(blend, processor, plan, config_of(blend_unit="samples"))


@pytest.mark.slow
def test_an_epochized_plan_repeats_each_source_its_repetitions(blend, processor):
    epochized = blend.parent / "epochized.yaml"
    epochized.write_text(metadataset_yaml([s.name for s in SOURCES], repetitions=(1, 2, 0.5)), encoding="utf-8")
    plan, _ = plan_of(epochized, processor)
    assert plan.fingerprint["dataset"]["blend"]["mode"] == "repetitions"
    members = np.concatenate([plan.global_indices(r) for r in range(plan.num_rows)])
    starts = np.cumsum([0] + [s.samples for s in SOURCES])
    counts = np.bincount(np.searchsorted(starts, members, side="right") - 1, minlength=3)
    assert not plan.skipped
    assert counts.tolist() == [SOURCES[0].samples, 2 * SOURCES[1].samples, SOURCES[2].samples // 2]
    medium = members[(members >= starts[1]) & (members < starts[2])] - starts[1]
    assert np.bincount(medium, minlength=SOURCES[1].samples).tolist() == [2] * SOURCES[1].samples


@pytest.mark.slow
def test_cli_plans_a_metadataset_and_refuses_what_a_plan_cannot_meet(blend, tmp_path, capsys):
    config = tmp_path / "cfg.yaml"
    config.write_text(f"seq_length: {W}\nblend_unit: tokens\n")
    out = tmp_path / "x.plan"
    assert main(["plan", str(blend), "--config", str(config), "--out", str(out), "--workers", "0"]) == 0
    printed = capsys.readouterr().out
    assert out.exists() and printed.count("measured from facts") == 3
    assert "source 0 (short): samples, tokens, share (tokens) / target" in printed and "/ 0.6000" in printed
    for text, word in (("blend_unit: supervised_tokens", "supervised"),
                       ("blend_schedule: [{step: 0, weights: [1, 1]}]", "blend_schedule"),
                       ("blend_unit: tokens\nbalance_steps: true\ncost_model: qwen2.5-vl-7b", "reorder")):
        config.write_text(f"seq_length: {W}\n{text}\n")
        code = main(["plan", str(blend), "--config", str(config), "--out", str(tmp_path / "y.plan")])
        lines = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and word in lines[0] and "fix" in lines[0]
    assert not (tmp_path / "y.plan").exists()
    config.write_text(f"seq_length: {W}\nblend_unit: tokens\n")
    missing_leaf = tmp_path / "missing_leaf.yaml"
    missing_leaf.write_text(metadataset_yaml(["nope"], weights=[1]).replace("./nope", str(tmp_path / "nope")))
    for dataset, split, words in ((config, "train", ("splits", "fix")), (missing_leaf, "train", ("nope", "fix")),
                                  (blend, "val", ("'val'", "--split"))):
        code = main(["plan", str(dataset), "--split", split, "--config", str(config), "--out", str(tmp_path / "y.plan")])
        lines = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and all(word in lines[0] for word in words), lines
    assert not (tmp_path / "y.plan").exists()


@pytest.mark.slow
def test_a_scheduled_plan_shifts_its_shares_at_the_step(blend, processor):
    schedule = [{"step": 0, "weights": [0.9, 0.05, 0.05]}, {"step": 10, "weights": [0.1, 0.45, 0.45]}]
    plan, _ = plan_of(blend, processor, blend_schedule=schedule, micro_batches_per_step=4)
    assert plan.fingerprint["packing"]["blend_step_rows"] == 4
    compositions = plan_compositions(plan)
    before, after = compositions[4:40].sum(0), compositions[48:].sum(0)  # steps 1-9, steps 12 on
    assert np.abs(before / before.sum() - [0.9, 0.05, 0.05]).max() < 0.03
    assert plan.num_rows > 64 and np.abs(after / after.sum() - [0.1, 0.45, 0.45]).max() < 0.03
    # Read at DP2 x 2 (the same 4 rows a step): accepted; 2 rows a step: refused, naming the field.
    same = config_of(blend_schedule=schedule, micro_batches_per_step=2, topology=ParallelTopology(dp=2))
    loader(blend, processor, plan, same, rank=1, world_size=2).close()
    from energon_pack.identity import ResumeMismatchError

    with pytest.raises(ResumeMismatchError, match="blend_step_rows"):
        loader(blend, processor, plan, config_of(blend_schedule=schedule, micro_batches_per_step=2))


@pytest.mark.slow
def test_plan_rows_name_their_sources_as_online_rows_do_and_log_the_same_keys(blend, processor, planned):
    from energon_pack import RowMetrics

    plan, config = planned
    with loader(blend, processor, plan, config) as planned_rows:
        row = next(iter(planned_rows))
        sources = planned_rows.sources()
        plan_keys = list(RowMetrics.from_loader(planned_rows).metrics(row))
    assert [(s.index, s.name) for s in sources] == [(0, "short"), (1, "medium"), (2, "long")]
    assert [s.weight for s in sources] == pytest.approx(WEIGHTS)
    assert [sources[i].name for i in row["segment_source"].tolist()] == [s["source"] for s in row["__subflavors__"]]
    with get_packing_loader(str(blend), config_of(repeat=True), processor) as online:
        online_row = next(iter(online))
        assert [(s.index, s.name) for s in online.sources()] == [(s.index, s.name) for s in sources]
        assert [online.sources()[i].name for i in online_row["segment_source"].tolist()] == [
            s["source"] for s in online_row["__subflavors__"]
        ]
        assert list(RowMetrics.from_loader(online).metrics(online_row)) == plan_keys
