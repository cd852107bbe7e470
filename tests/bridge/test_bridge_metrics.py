"""Per-source metrics through Megatron-Bridge's own training step and logging (compatibility run).

Two ranks (gloo, CPU) run Bridge's ``train_step`` with ``energon_pack.bridge.forward_step`` in place
of ``vlm_step.forward_step`` over 3 micro-batches, then Bridge's ``training_log`` writes through the
``SummaryWriter`` Bridge opens (``tests/support/bridge_train_step.py``: what runs and the CPU
harness): once as a data-parallel group (each rank its own rows), once as a context-parallel group
(both ranks the same rows, each its shard). The event file, read back with TensorBoard's
``EventAccumulator``, must hold every ``lm loss/<source>`` and ``data/...`` key equal to the
per-sample truth (each packed sample's tokens grouped by its source, from the rows' ``__subflavors__``
and the stand-in model's per-token losses) and to ``RowMetrics`` reduced on the host over the same
rows; Bridge's ``lm loss`` stays the plain token mean over the global batch.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from energon_pack.config import PackingConfig, ParallelTopology
from energon_pack.data.blend_mix import BlendSource, make_blend
from energon_pack.loader import get_packing_loader
from energon_pack.metrics import RowMetrics
from energon_pack.qwen.processor import load_processor
from tests.support import bridge_train_step
from tests.support.bridge_train_step import WORLD_SIZE, token_losses

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("megatron.bridge") is None, reason="needs Megatron-Bridge (make test-compat)"
    ),
]

W = 384
MICRO_BATCHES = 3
#: chat and ocr fit a row; docs samples (280-520 tokens) are often over W: skipped as overlong.
SOURCES = (
    BlendSource(name="chat", samples=16, mean_tokens=60),
    BlendSource(name="docs", samples=8, mean_tokens=400, answer_fraction=0.2),
    BlendSource(name="ocr", samples=8, mean_tokens=150, answer_fraction=0.7),
)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict[str, Any]:
    """Rows of a 3-source token blend (dealt to the ranks; and aligned for CP=2), both ranks' results
    and the event files of the two steps."""
    work = tmp_path_factory.mktemp("bridge_metrics")
    blend, processor = make_blend(work / "data", SOURCES, weights=[1, 1, 1]), load_processor()

    def rows_of(count: int, **overrides: Any) -> tuple[list[dict[str, Any]], list[Any], str]:
        config = PackingConfig(seq_length=W, num_workers=0, repeat=True, blend_unit="tokens", **overrides)
        with get_packing_loader(str(blend), config, processor) as loader:
            return list(itertools.islice(loader, count)), loader.sources(), loader.family()

    rows, sources, family = rows_of(MICRO_BATCHES * WORLD_SIZE)
    cp_rows, _, _ = rows_of(MICRO_BATCHES, topology=ParallelTopology(cp=WORLD_SIZE))
    dp_rows = [rows[rank::WORLD_SIZE] for rank in range(WORLD_SIZE)]
    out = work / "out"
    torch.multiprocessing.start_processes(
        bridge_train_step.run_rank, nprocs=WORLD_SIZE, start_method="spawn",
        args=(bridge_train_step.free_port(), dp_rows, cp_rows, sources, family, str(out)),
    )
    results = [json.loads((out / f"rank{rank}.json").read_text(encoding="utf-8")) for rank in range(WORLD_SIZE)]
    return {"dp_rows": dp_rows, "cp_rows": cp_rows, "sources": sources, "family": family, "results": results,
            "out": out}


def logged_scalars(board: Path) -> dict[str, float]:
    """Every scalar of the run's event file at step 1, by tag (the ``... vs samples`` copies left out)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = board.glob("events.out.tfevents.*")  # written by the last rank only
    accumulator = EventAccumulator(str(events), size_guidance={"scalars": 0})
    accumulator.Reload()
    points = {tag: accumulator.Scalars(tag) for tag in accumulator.Tags()["scalars"] if not tag.endswith(" vs samples")}
    assert all([point.step for point in series] == [1] for series in points.values())
    return {tag: series[0].value for tag, series in points.items()}


def per_sample_truth(rows: list[dict[str, Any]], names: list[str]) -> dict[str, float]:
    """Loss per source, token and supervised shares, fill and segments per row, from each packed
    sample's own tokens (its slots ``cu_seqlens_q_padded[i]`` + real length) and its subflavor ``source``."""
    loss, supervised, tokens = dict.fromkeys(names, 0.0), dict.fromkeys(names, 0), dict.fromkeys(names, 0)
    segments = 0
    for row in rows:
        real, starts = row["cu_seqlens_q"].tolist(), row["cu_seqlens_q_padded"].tolist()
        losses, mask = token_losses(row["labels"][0]).double(), row["loss_mask"][0] != 0
        for i, flavors in enumerate(row["__subflavors__"]):
            name, sample = flavors["source"], slice(starts[i], starts[i] + real[i + 1] - real[i])
            loss[name] += float(losses[sample][mask[sample]].sum())
            supervised[name] += int(mask[sample].sum())
            tokens[name] += real[i + 1] - real[i]
            segments += 1
    truth = {f"lm loss/{n}": loss[n] / supervised[n] for n in names}
    truth |= {f"data/tokens/{n}": tokens[n] / sum(tokens.values()) for n in names}
    truth |= {f"data/supervised/{n}": supervised[n] / sum(supervised.values()) for n in names}
    truth |= {"data/fill": sum(tokens.values()) / (len(rows) * W), "data/segments per row": segments / len(rows)}
    return truth


@pytest.mark.parametrize("step", ["dp", "cp"])
def test_bridge_logs_per_source_metrics_equal_to_the_truth(run, step):
    """``dp``: two data-parallel ranks, 3 rows each; ``cp``: one context-parallel group of two ranks
    on 3 rows, each rank reporting its shard. Either way the logged figures are the global batch's."""
    names = [source.name for source in run["sources"]]
    results = [result[step] for result in run["results"]]
    # What each rank read, and the rows whose metrics count (CP: per-row figures on CP rank 0 only).
    if step == "dp":
        rank_rows, counted = run["dp_rows"], [0, 1]
    else:
        rank_rows, counted = [run["cp_rows"]] * WORLD_SIZE, [0]
    rows = [row for rank in counted for row in rank_rows[rank]]
    assert names == ["chat", "docs", "ocr"] and all(result["skipped"] == 0 for result in results)
    assert results[0]["loss_reduced"] == results[1]["loss_reduced"]  # reduced over both ranks
    logged = logged_scalars(run["out"] / step)

    # Bridge's own "lm loss": the token mean of the per-token losses over the global batch, unchanged.
    losses = [float((token_losses(r["labels"]) * r["loss_mask"]).sum()) for r in rows]
    assert logged["lm loss"] == pytest.approx(sum(losses) / sum(float(r["loss_mask"].sum()) for r in rows), rel=1e-5)

    truth = per_sample_truth(rows, names)
    assert {key: logged[key] for key in truth} == pytest.approx(truth, rel=1e-5)

    # Every key RowMetrics gives, as one RowMetrics per rank computes it from that rank's rows (the
    # loader wait the rank measured included), on whole rows, reduced on the host: logged as it is.
    reference = []
    for rank in counted:
        metrics = RowMetrics(run["sources"], audio="omni" in run["family"])
        for row, wait in zip(rank_rows[rank], results[rank]["loader_wait_s"]):
            reference.append(metrics.metrics({**row, "__loader_wait_s__": wait}, token_losses(row["labels"])))
    expected = RowMetrics.reduce(reference)
    assert set(expected) <= set(logged) and "data/skipped/overlong" in expected and "data/loader wait s" in expected
    assert {key: logged[key] for key in expected} == pytest.approx(expected, rel=1e-5)
    assert expected["data/skipped/overlong"] > 0, "the docs source is meant to lose samples as overlong"


def test_forward_step_refuses_rows_without_segment_source(run):
    """A row of an older loader (no ``segment_source``) stops the step with the fix."""
    for result in run["results"]:
        error = result["row_without_segment_source"]
        assert error.startswith("ValueError: energon_pack.bridge.forward_step got a row without 'segment_source'")
        assert "fix: build the rows with this energon_pack" in error
