"""Per-row cost (``PackedRow.row_cost``) and its aggregation in the loader statistics."""

from __future__ import annotations

import torch

from energon_pack.rows.encoded import ROW_COST_KEYS, PackedRow, PackedSegment
from energon_pack.runtime.stats import PackingStats, aggregate_stats
from energon_pack.core.visual import VisualInputs


def _segment(key: str, length: int, supervised: int, *, images=(), videos=()) -> PackedSegment:
    loss_mask = torch.zeros(length)
    loss_mask[:supervised] = 1.0

    def visual_fields(kind: str, grids) -> dict:
        if not grids:
            return {}
        grid = torch.tensor(grids, dtype=torch.int64)
        pixels = torch.zeros(int(grid.prod(dim=-1).sum()), 8)
        return {f"{kind}_grid_thw": grid, "pixel_values" if kind == "image" else "pixel_values_videos": pixels}

    return PackedSegment(
        key=key,
        input_ids=torch.arange(length),
        labels=torch.arange(length),
        loss_mask=loss_mask,
        mrope_position_ids=torch.zeros(3, length, dtype=torch.int64),
        visual=VisualInputs(**visual_fields("image", images), **visual_fields("video", videos)),
    )


def _row(*segments: PackedSegment) -> PackedRow:
    return PackedRow(
        __key__="row", __restore_key__=(), __subflavors__=None, __sources__=None, segments=list(segments), stats={}
    )


def test_row_cost_docstring_example() -> None:
    row = _row(_segment("a", 3, 2), _segment("b", 5, 1, images=[(1, 4, 6)]))
    assert row.row_cost == {
        "real_tokens": 8,
        "supervised_tokens": 3,
        "segments": 2,
        "images": 1,
        "videos": 0,
        "vision_patches": 24,
        "sum_squared_lengths": 34,
    }
    assert tuple(row.row_cost) == ROW_COST_KEYS


def test_row_cost_counts_videos_and_weighted_loss_masks() -> None:
    segment = _segment("v", 10, 4, images=[(1, 2, 2), (1, 4, 4)], videos=[(3, 4, 6)])
    segment.loss_mask[:4] = 0.25  # a loss_reduction weight: still supervised
    cost = _row(segment).row_cost
    assert (cost["images"], cost["videos"], cost["vision_patches"]) == (2, 1, 4 + 16 + 72)
    assert (cost["supervised_tokens"], cost["sum_squared_lengths"]) == (4, 100)


def test_stats_aggregate_row_cost_mean_and_max_and_shrunk_samples() -> None:
    first, second = PackingStats(worker_id=0), PackingStats(worker_id=1)
    first.count_row(90, 100, 2, cost={"vision_patches": 400, "segments": 2})
    first.count_row(80, 100, 1, cost={"vision_patches": 100, "segments": 1})
    second.count_row(99, 100, 3, cost={"vision_patches": 1000, "segments": 3})
    first.count_shrunk(150, 96)
    second.count_shrunk(300, 100)
    assert first.row_cost_max == {"vision_patches": 400, "segments": 2}
    total = aggregate_stats([first.snapshot(), second.snapshot()])
    assert total["row_cost_mean"] == {"vision_patches": 500, "segments": 2}
    assert total["row_cost_max"] == {"vision_patches": 1000, "segments": 3}
    assert (total["shrunk"], total["shrunk_tokens_before"], total["shrunk_tokens_after"]) == (2, 450, 196)
    assert aggregate_stats([])["row_cost_mean"] == {}
