"""``energon-pack plan`` under torchrun (2 ranks, gloo, CPU): each rank measures its slice of the
split with every worker process, and rank 0 writes the plan a single process writes."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from energon_pack.config import PackingConfig
from energon_pack.plan.build import MeasuredSlice, build_plan, merge_slices
from energon_pack.plan.file import open_plan
from tests.support.paths import REPO
from tests.support.torchrun import torchrun_env

WIDTH = 2048


def _slice(indices, tokens, skipped=None, worker="0:0"):
    indices = np.array(indices, dtype=np.int64)
    return MeasuredSlice(
        indices=indices, times=np.ones(len(indices), dtype=np.int8), tokens=np.array(tokens, dtype=np.int64),
        vision=np.zeros(len(indices), dtype=np.int64), media=np.zeros(len(indices), dtype=np.int64),
        flops=100 * indices + 1, skipped=skipped or {}, per_worker={worker: len(indices)},
    )


def test_merge_slices_is_the_whole_measurement_and_refuses_gaps_and_overlaps():
    merged = merge_slices([_slice([0, 2], [5, -1], {"overlong": 1}), _slice([1], [7], worker="1:0")], 3)
    assert merged.tokens.tolist() == [5, 7, -1] and merged.skipped == {"overlong": 1}
    assert merged.flops.tolist() == [1, 101, 201], "each sample's FLOPs from the slice that read it"
    assert merged.per_worker == {"0:0": 2, "1:0": 1} and merged.samples_in == 3
    with pytest.raises(RuntimeError, match="1 of 3 samples never and 0 more than once"):
        merge_slices([_slice([0, 2], [5, 6])], 3)
    with pytest.raises(RuntimeError, match="0 of 3 samples never and 1 more than once"):
        merge_slices([_slice([0, 1], [5, 6]), _slice([1, 2], [6, 7])], 3)


@pytest.mark.slow
def test_torchrun_plan_equals_the_single_process_plan(synthetic_dataset, processor, tmp_path):
    dataset = synthetic_dataset.out_dir
    config = PackingConfig(seq_length=WIDTH, num_workers=0)
    single = build_plan(dataset, config, processor, num_workers=0, progress=False)
    (tmp_path / "packing.yaml").write_text(config.to_yaml())
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
        str(REPO / ".venv" / "bin" / "energon-pack"), "plan", str(dataset), "--config", str(tmp_path / "packing.yaml"),
        "--workers", "2", "--out", str(tmp_path / "train.plan"),
    ]
    done = subprocess.run(command, cwd=REPO, env=torchrun_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-6000:]
    assert open_plan(tmp_path / "train.plan").digest == single.digest
    assert done.stdout.count("plan written to") == 1, "only rank 0 writes and reports"
    shares = next(line for line in done.stdout.splitlines() if "per process" in line)
    assert all(f"{rank}:{worker}=" in shares for rank in (0, 1) for worker in (0, 1)), shares
    assert sorted(p.name for p in tmp_path.iterdir()) == ["packing.yaml", "train.plan"]
