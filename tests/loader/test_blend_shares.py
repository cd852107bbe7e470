"""Blends whose weights are shares of tokens (``blend_unit``), schedules and exact resume, on real
Energon loaders with two worker processes, measured from the rows alone.

Two sources of about 200 and about 2000 real tokens a sample, blended 1:1 at W = 8192: by samples
(Energon's meaning) the short one gets about 10 % of the tokens; by tokens 50 %. Answers vary
widely in length (5-95 % of a short sample, 2-50 % of a long one), so samples' supervised tokens
per real token differ widely too (docs/configuration.md, "Windows of rows").
"""

from __future__ import annotations

import pickle
import warnings

import pytest

from energon_pack import PackingConfig, RowMetrics, get_packing_loader
from energon_pack.identity import ResumeMismatchError
from energon_pack.loader import BlendShareWarning
from tests.support.blend_runs import fill, make_blends, share, take_rows, write_blend
from tests.support.loader_runs import EAGER, row_digest

# Slow: real Energon loaders with worker processes.
pytestmark = pytest.mark.slow

W = 8192
ROWS = 200


def config(**overrides) -> PackingConfig:
    return PackingConfig(**{"seq_length": W, "num_workers": 2, "repeat": True, **overrides})


@pytest.fixture(scope="module")
def blends(tmp_path_factory):
    return make_blends(tmp_path_factory.mktemp("blends"))


@pytest.fixture(scope="module")
def runs(blends, processor):
    """Rows (and loader stats) per unit of the 1:1 blend, read once for the module."""
    out = {}
    for unit, count in (("samples", 64), ("tokens", ROWS), ("supervised_tokens", ROWS)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with get_packing_loader(str(blends["two"]), config(blend_unit=unit), processor) as loader:
                rows = take_rows(loader, count, RowMetrics.from_loader(loader))
                stats = loader.stats()
        out[unit] = rows, stats, [w for w in caught if issubclass(w.category, BlendShareWarning)]
    return out


def test_a_sample_blend_reports_the_short_sources_token_share_and_warns_once(runs):
    rows, stats, warned = runs["samples"]
    assert 0.05 < share(rows, "short") < 0.15  # about 10 %: 1:1 by samples is 1:10 by tokens
    by_index = {source["subflavors"]["source"]: source for source in stats["sources"]}
    assert 0.05 < by_index["short"]["real_tokens_share"] < 0.15
    assert 0.4 < by_index["short"]["samples_share"] < 0.6
    assert stats["blend_unit"] == "samples"
    assert len(warned) == 1 and "blend_unit: tokens" in str(warned[0].message)


@pytest.mark.parametrize("unit, supervised", [("tokens", False), ("supervised_tokens", True)])
def test_a_token_blend_meets_its_shares_over_the_run_and_every_window(runs, unit, supervised):
    rows, stats, warned = runs[unit]
    assert abs(share(rows, "short", supervised=supervised) - 0.5) <= 0.02
    windows = [share(rows[start:start + 25], "short", supervised=supervised) for start in range(20, ROWS - 24)]
    assert max(abs(w - 0.5) for w in windows) <= 0.04, windows  # the goal is 5 points: one of margin
    assert not warned
    counted = {source["subflavors"]["source"]: source for source in stats["sources"]}
    column = "supervised_tokens_share" if supervised else "real_tokens_share"
    assert abs(counted["short"][column] - 0.5) <= 0.03  # the workers' own counters agree


@pytest.mark.parametrize("unit, low, high", [("tokens", 0.48, 0.52), ("samples", 0.05, 0.15)])
def test_the_logged_token_share_shows_the_mixture_step_by_step(runs, unit, low, high):
    rows = runs[unit][0]  # one row a step: the figure RowMetrics logs for each step
    logged = [row["logged"]["data/tokens/short"] for row in rows]
    assert low <= sum(logged) / len(logged) <= high
    for row in rows:  # each step's figure is that step's share of real tokens, the long source's the rest
        short, long = row["sources"].get("short", (0, 0))[0], row["sources"].get("long", (0, 0))[0]
        assert row["logged"]["data/tokens/short"] == pytest.approx(short / (short + long))
        assert row["logged"]["data/tokens/long"] == pytest.approx(long / (short + long))
        assert row["logged"]["data/fill"] == pytest.approx(row["real"] / row["width"])


def test_a_token_blend_fills_rows_as_well_as_a_sample_blend(runs):
    assert abs(fill(runs["tokens"][0]) - fill(runs["samples"][0])) <= 0.01


def test_three_sources_meet_their_token_shares(blends, processor):
    with get_packing_loader(str(blends["three"]), config(blend_unit="tokens"), processor) as loader:
        rows = take_rows(loader, 80)
    for source, target in (("short", 0.6), ("medium", 0.3), ("long", 0.1)):
        assert abs(share(rows, source) - target) <= 0.02, (source, share(rows, source))


SCHEDULE = [{"step": 0, "weights": [0.9, 0.1]}, {"step": 100, "weights": [0.1, 0.9]}]


def test_a_step_schedule_shifts_the_mix_at_its_step(blends, processor):
    with get_packing_loader(str(blends["two"]), config(blend_unit="tokens", blend_schedule=SCHEDULE), processor) as loader:
        rows = take_rows(loader, ROWS)  # one row per rank per step (micro_batches_per_step 1)
    assert abs(share(rows[20:100], "short") - 0.9) <= 0.03
    assert abs(share(rows[120:200], "short") - 0.1) <= 0.03


def test_a_linear_schedule_interpolates(blends, processor):
    cfg = config(blend_unit="tokens", blend_schedule=SCHEDULE, blend_schedule_mode="linear", micro_batches_per_step=2)
    with get_packing_loader(str(blends["two"]), cfg, processor) as loader:
        rows = take_rows(loader, 80)  # steps 0-39 of 2 rows
    # Steps 20-39 (rows 40-79): shares 0.74 .. 0.59, mean about 0.66 (in mode step: 0.9 throughout).
    assert abs(share(rows[40:80], "short") - 0.66) <= 0.04
    assert share(rows[0:20], "short") > share(rows[40:80], "short") + 0.1


@pytest.mark.parametrize("rank", [0, 1])
def test_a_scheduled_token_blend_resumes_exactly(blends, processor, rank):
    cfg = config(blend_unit="tokens", blend_schedule=[{"step": 0, "weights": [0.9, 0.1]}, {"step": 40, "weights": [0.2, 0.8]}])
    kwargs = dict(rank=rank, world_size=2, **EAGER)
    loader = get_packing_loader(str(blends["two"]), cfg, processor, **kwargs)
    iterator = iter(loader)
    first = [row_digest(next(iterator)) for _ in range(37)]
    state = pickle.loads(pickle.dumps(loader.save_state_rank()))
    expected = [row_digest(next(iterator)) for _ in range(60)]
    loader.close()
    resumed = get_packing_loader(str(blends["two"]), cfg, processor, **kwargs)
    resumed.restore_state_rank(state)
    rows = []
    for row in resumed:
        rows.append(row_digest(row))
        if len(rows) == 60:
            break
    resumed.close()
    assert first and rows == expected


def test_a_state_saved_under_one_unit_or_schedule_is_refused_under_another(blends, processor):
    loader = get_packing_loader(str(blends["two"]), config(blend_unit="tokens"), processor, **EAGER)
    next(iter(loader))
    state = loader.save_state_rank()
    loader.close()
    for other in (config(), config(blend_unit="supervised_tokens"), config(blend_unit="tokens", blend_schedule=SCHEDULE)):
        with pytest.raises(ResumeMismatchError) as err:
            get_packing_loader(str(blends["two"]), other, processor).restore_state_rank(state)
        assert "blend_" in str(err.value)


@pytest.mark.parametrize("weights, words", [
    ([1, -1], "negative"), ([0, 0], "all weights are 0"), ([1, float("inf")], "not a finite number"),
])
def test_bad_metadataset_weights_are_refused(blends, processor, weights, words):
    path = write_blend(blends["two"].parent, "bad", ["short", "long"], weights=weights)
    with pytest.raises(ValueError, match=words):
        get_packing_loader(str(path), config(blend_unit="tokens"), processor)


def test_a_schedule_of_the_wrong_size_is_refused(blends, processor):
    cfg = config(blend_unit="tokens", blend_schedule=[{"step": 0, "weights": [1, 1, 1]}])
    with pytest.raises(ValueError, match="blends 2 datasets"):
        get_packing_loader(str(blends["two"]), cfg, processor)


def test_blend_unit_on_a_plain_dataset_changes_nothing(blends, processor):
    plain = str(blends["two"].parent / "short")
    with get_packing_loader(plain, config(), processor) as loader:
        expected = [row_digest(row) for _, row in zip(range(6), loader)]
    with get_packing_loader(plain, config(blend_unit="tokens"), processor) as loader:
        assert [row_digest(row) for _, row in zip(range(6), loader)] == expected
        assert loader.stats()["sources"] == []
        assert [(source.index, source.name, source.weight) for source in loader.sources()] == [(0, "short", None)]


def test_an_epochized_token_blend_spends_every_source_evenly(blends, processor):
    path = write_blend(blends["two"].parent, "epochized", ["short", "long"], repetitions=[2, 1])
    keys, rows = [], []
    with get_packing_loader(str(path), config(blend_unit="tokens", repeat=False), processor) as loader:
        for row in loader:
            keys += [key.rsplit("/", 1)[-1] for key in row["__keys__"]]
            rows += take_rows([row], 1)
    short = sum(1 for key in keys if key.startswith("short-"))
    assert short == 2 * 400 and len(keys) - short == 100  # every sample, repetitions included
    whole = share(rows, "short")
    half = len(rows) // 2
    # The epoch's token shares hold in both halves: neither source is spent first.
    assert abs(share(rows[:half], "short") - whole) <= 0.05 and abs(share(rows[half:], "short") - whole) <= 0.05
