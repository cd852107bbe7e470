"""Balanced steps end to end: a plan built with balance_steps, read by the plan loader at DP4 x 2 and
DP8 x 1, row costs recomputed independently from each row's own segments and media."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from energon_pack.config import PackingConfig
from energon_pack.identity import packing_fingerprint
from energon_pack.loader import get_packing_loader
from energon_pack.packing.balance import deal_step, step_imbalance
from energon_pack.plan.build import build_plan, plan_report
from energon_pack.rows.flops import grid_rows, model_spec, row_flops

W = 1024
MODEL = "qwen2.5-vl-7b"


def make_config(**overrides: Any) -> PackingConfig:
    values = {"seq_length": W, "num_workers": 0, "repeat": False, "balance_steps": True, "cost_model": MODEL}
    return PackingConfig(**{**values, **overrides})


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from energon_pack.data.synthetic import SyntheticSpec, make_synthetic_dataset

    spec = SyntheticSpec(max_image_side=640, max_video_seconds=3.0, max_video_side=128)
    return make_synthetic_dataset(tmp_path_factory.mktemp("balanced"), 96, seed=1, spec=spec, samples_per_shard=32).out_dir


@pytest.fixture(scope="module")
def plans(dataset, processor):
    plain = build_plan(dataset, make_config(balance_steps=False, cost_model=None), processor, num_workers=0, progress=False)
    balanced = build_plan(dataset, make_config(), processor, num_workers=0, progress=False)
    return plain, balanced


def independent_flops(row: dict[str, Any]) -> int:
    """Modelled FLOPs of a row from its own tensors: segment lengths from cu_seqlens, media grids
    from its visual inputs (the formula the FlopCounterMode oracle checks in test_flops.py)."""
    cu = row["cu_seqlens_q"].tolist()
    lengths = [b - a for a, b in zip(cu, cu[1:]) if b > a]
    visual = row["visual_inputs"]
    grids = grid_rows(visual.image_grid_thw, visual.video_grid_thw)
    return row_flops(model_spec(MODEL), lengths, grids, width=int(row["total_tokens"])).total


def read_steps(loaders: Sequence[Any], micro: int) -> list[dict[int, list[tuple[int, int]]]]:
    """Per step: rank -> [(position, independent FLOPs)] of the rows it read (ranks in lock step)."""
    iters = [iter(loader) for loader in loaders]
    steps = []
    while True:
        step = {}
        for rank, rows in enumerate(iters):
            got = []
            for _ in range(micro):
                row = next(rows, None)
                if row is None:
                    break
                assert row["row_cost"]["flops"] == independent_flops(row)
                got.append((row["__plan__"]["position"], independent_flops(row)))
            step[rank] = got
        if not any(step.values()):
            return steps
        steps.append(step)


def loaders(dataset, processor, plan, *, dp: int, micro: int, **overrides: Any) -> list[Any]:
    config = make_config(micro_batches_per_step=micro, **overrides)
    return [get_packing_loader(dataset, config, processor, plan=plan, rank=r, world_size=dp) for r in range(dp)]


@pytest.mark.slow  # more than ~3 s: make test runs it, make test-fast leaves it out
def test_balanced_plan_keeps_the_rows_and_old_digests(plans) -> None:
    plain, balanced = plans
    assert plain.row_flops is None and balanced.row_flops is not None
    assert balanced.num_rows == plain.num_rows  # balancing moves samples, never adds rows
    lower = -(-int(balanced.member_tokens.sum()) // W)
    assert balanced.num_rows <= 1.01 * lower + 1
    assert plain.fingerprint["packing"] == packing_fingerprint(make_config(balance_steps=False))
    assert balanced.fingerprint["packing"]["cost_model"] == MODEL
    assert balanced.row_flops.shape == (balanced.num_rows,) and balanced.row_flops.min() > 0
    report = {r["metric"]: r["value"] for r in plan_report(balanced, seq_length=W, seconds=0.0)}
    mean, cv, peak = (float(v) for v in report["row FLOPs: mean (TFLOP), CV, max/mean"].split(", "))
    assert mean == pytest.approx(balanced.row_flops.mean() / 1e12, abs=0.01) and 0 <= cv < peak
    assert "row FLOPs: mean (TFLOP), CV, max/mean" not in {r["metric"] for r in plan_report(plain, seq_length=W, seconds=0.0)}


@pytest.mark.slow
@pytest.mark.parametrize("dp, micro", [(4, 2), (8, 1)])
def test_loader_deals_steps_by_cost(dataset, processor, plans, dp: int, micro: int) -> None:
    _, plan = plans
    steps = read_steps(loaders(dataset, processor, plan, dp=dp, micro=micro), micro)
    positions = sorted(p for step in steps for rows in step.values() for p, _ in rows)
    assert positions == list(range(plan.num_rows))  # the epoch, each row once
    whole = [step for step in steps if sum(len(v) for v in step.values()) == dp * micro]
    assert len(whole) == plan.num_rows // (dp * micro)
    for k, step in enumerate(whole):
        assert {p for rows in step.values() for p, _ in rows} == set(range(k * dp * micro, (k + 1) * dp * micro))
        by_position = sorted((p, c, r) for r, rows in step.items() for p, c in rows)
        assert [r for _, _, r in by_position] == deal_step([c for _, c, _ in by_position], dp, micro)
    # independent costs: balanced dealing is never worse than rank = position % dp on the same rows
    ordered = [c for step in whole for _, c in sorted(p_c for rows in step.values() for p_c in rows)]
    balanced = step_imbalance(ordered, dp, micro, balanced=True)
    assert balanced.mean <= step_imbalance(ordered, dp, micro, balanced=False).mean + 1e-9
    stats = [loader.stats() for loader in loaders(dataset, processor, plan, dp=dp, micro=micro)]
    assert stats[0]["plan_row_flops"]["mean"] == pytest.approx(float(plan.row_flops.mean()))


@pytest.mark.slow
def test_rows_are_the_same_for_any_worker_count(dataset, processor, plans) -> None:
    _, plan = plans

    def rows(workers: int) -> list[list[int]]:
        config = make_config(micro_batches_per_step=2, num_workers=workers)
        return [
            [row["__plan__"]["position"] for row in get_packing_loader(dataset, config, processor, plan=plan, rank=r,
                                                                      world_size=4)]
            for r in range(4)
        ]

    assert rows(0) == rows(2)


@pytest.mark.slow
def test_state_saved_at_dp4x2_restores_at_dp2x4(dataset, processor, plans) -> None:
    """Saved after one whole step at DP4 x 2, restored at DP2 x 4 (same global batch): every later
    step reads the same rows; DP2 x 2 (another global batch) is refused with the fix."""
    _, plan = plans
    config = dict(repeat=True)
    reference = read_positions(loaders(dataset, processor, plan, dp=4, micro=2, **config), 2, steps=3)
    first = loaders(dataset, processor, plan, dp=4, micro=2, **config)
    read_positions(first, 2, steps=1)
    states = [loader.save_state_rank() for loader in first]
    assert {s.cursor for s in states} == {8} and {s.step_rows for s in states} == {8}
    second = loaders(dataset, processor, plan, dp=2, micro=4, **config)
    for loader in second:
        loader.restore_state_global(states)
    assert read_positions(second, 4, steps=2) == reference[1:]
    other = loaders(dataset, processor, plan, dp=2, micro=2, **config)[0]
    with pytest.raises(ValueError, match="keep dp \\* micro_batches_per_step = 8"):
        other.restore_state_global(states)


def read_positions(group: Sequence[Any], micro: int, *, steps: int) -> list[list[int]]:
    """The sorted positions of each of ``steps`` steps read by ``group`` (one loader per rank)."""
    iters = [iter(loader) for loader in group]
    out = []
    for _ in range(steps):
        out.append(sorted(next(rows)["__plan__"]["position"] for rows in iters for _ in range(micro)))
    for rows in iters:
        rows.close()
    return out



@pytest.mark.slow
def test_online_rows_report_modelled_flops(dataset, processor) -> None:
    """cost_model alone: online rows carry row_cost["flops"] (the row's own segments and media) and
    loader.stats() summarises it."""
    config = make_config(balance_steps=False, buffer_size=8)
    loader = get_packing_loader(dataset, config, processor)
    flops = []
    for row in loader:
        assert row["row_cost"]["flops"] == independent_flops(row)
        flops.append(row["row_cost"]["flops"])
    stats = loader.stats()
    assert stats["row_cost_max"]["flops"] == max(flops)
    assert stats["row_cost_mean"]["flops"] == pytest.approx(sum(flops) / len(flops))
