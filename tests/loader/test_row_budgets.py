"""Vision budgets and fit-to-budget through real Energon loaders.

On the synthetic image/video dataset: with ``max_row_vision_patches`` / ``max_row_media`` set, no
emitted row exceeds either budget (nor the width), and every sample is packed exactly once or
counted as a skip under the reason of the budget it breaks on its own; with
``on_overlong="shrink"`` such samples are shrunk instead (counted in ``shrunk``) and packed.
``row_cost`` of every row matches its tensors, and ``loader.stats()`` aggregates it.
"""

from __future__ import annotations

from typing import Any

import pytest

from energon_pack.core.alignment import aligned_length
from energon_pack.config import PackingConfig
from energon_pack.data.inspect_dataset import iter_prepared
from energon_pack.loader import get_packing_loader

W = 4096


@pytest.fixture(scope="module")
def prepared(synthetic_dataset, processor) -> dict[str, Any]:
    """Key -> prepared sample (preencode at the processor's own limits) of the synthetic dataset."""
    return {
        raw.__key__: sample
        for raw, sample in iter_prepared(synthetic_dataset.out_dir, processor=processor)
        if sample.skip_reason is None
    }


def _run(path, processor, **config: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    loader = get_packing_loader(
        path, PackingConfig(seq_length=W, buffer_size=4, max_wait_rounds=3, repeat=False, **config), processor
    )
    rows = list(loader)
    return rows, loader.stats()


def _row_vision(row: dict[str, Any]) -> tuple[int, int]:
    """(ViT patches, images + videos) of a row, from its grids."""
    visual = row["visual_inputs"]
    grids = [g for g in (visual.image_grid_thw, visual.video_grid_thw) if g is not None]
    return sum(int(g.prod(dim=-1).sum()) for g in grids), sum(int(g.shape[0]) for g in grids)


def _check_row_costs(rows: list[dict[str, Any]], stats: dict[str, Any]) -> None:
    for row in rows:
        cost = row["row_cost"]
        patches, media = _row_vision(row)
        assert (cost["vision_patches"], cost["images"] + cost["videos"]) == (patches, media)
        assert cost["real_tokens"] == int(row["cu_seqlens_q"][-1])
        assert cost["segments"] == len(row["__keys__"])
        assert cost["supervised_tokens"] == int((row["loss_mask"] != 0).sum())
    for key in ("vision_patches", "real_tokens", "sum_squared_lengths"):
        values = [row["row_cost"][key] for row in rows]
        assert stats["row_cost_max"][key] == max(values)
        assert stats["row_cost_mean"][key] == pytest.approx(sum(values) / len(values))


@pytest.mark.slow
@pytest.mark.parametrize("num_workers", [0, 2])
def test_rows_stay_within_both_budgets_and_over_budget_samples_are_skips(
    synthetic_dataset, processor, prepared, num_workers
) -> None:
    patches = sorted(sample.vision_patches for sample in prepared.values())
    budget = patches[len(patches) * 3 // 4]  # a quarter of the samples are over it on their own
    media_budget = 2
    rows, stats = _run(
        synthetic_dataset.out_dir, processor, num_workers=num_workers,
        max_row_vision_patches=budget, max_row_media=media_budget,
    )
    for row in rows:
        patches_in_row, media_in_row = _row_vision(row)
        assert patches_in_row <= budget and media_in_row <= media_budget, row["__keys__"]
    keys = [key for row in rows for key in row["__keys__"]]
    assert len(keys) == len(set(keys)), "a sample was packed twice"
    over_vision = {k for k, s in prepared.items() if s.vision_patches > budget}
    over_media = {k for k, s in prepared.items() if s.vision_patches <= budget and s.num_media > media_budget}
    overlong = {k for k, s in prepared.items() if aligned_length(s.num_tokens, 1) > W} - over_vision - over_media
    assert over_vision and over_media, "the budgets must bind on their own for some samples"
    assert set(keys) == set(prepared) - over_vision - over_media - overlong
    assert stats["skipped"].get("over_vision_budget", 0) == len(over_vision - overlong)
    assert stats["skipped"].get("over_media_budget", 0) == len(over_media - overlong)
    assert stats["samples_in"] == synthetic_dataset.written
    assert stats["samples_packed"] + stats["skipped_total"] == stats["samples_in"]
    _check_row_costs(rows, stats)


@pytest.mark.slow
def test_shrink_packs_samples_over_the_vision_budget(synthetic_dataset, processor, prepared) -> None:
    patches = sorted(sample.vision_patches for sample in prepared.values())
    budget = patches[len(patches) * 3 // 4]
    over = {k for k, s in prepared.items() if s.vision_patches > budget}
    rows, stats = _run(
        synthetic_dataset.out_dir, processor, num_workers=0, max_row_vision_patches=budget, on_overlong="shrink"
    )
    assert all(_row_vision(row)[0] <= budget for row in rows)
    keys = [key for row in rows for key in row["__keys__"]]
    assert len(keys) == len(set(keys))
    assert stats["shrunk"] == len(over) > 0
    assert set(keys) == set(prepared), "every sample over the budget fits once shrunk"
    assert stats["shrunk_tokens_after"] < stats["shrunk_tokens_before"]
    assert stats["samples_packed"] + stats["skipped_total"] == stats["samples_in"]
    _check_row_costs(rows, stats)


def test_error_policy_names_the_budget(synthetic_dataset, processor, prepared) -> None:
    budget = min(s.vision_patches for s in prepared.values() if s.vision_patches) - 1
    with pytest.raises(ValueError, match=r"vision patches but max_row_vision_patches is .*fix: raise max_row_vision"):
        _run(synthetic_dataset.out_dir, processor, num_workers=0, max_row_vision_patches=budget, on_overlong="error")
