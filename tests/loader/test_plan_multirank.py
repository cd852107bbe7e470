"""A pack plan read by torchrun ranks (gloo): the same rows for any world size and worker count,
and a state saved at world size 4 that continues exactly at world size 2.

``tests/support/plan_multirank_worker.py`` runs at world sizes 4, 2 and 1; each run reads one epoch with
0, 1 and 4 workers. The run at 4 also saves the ranks' states after ``SAVE_AFTER`` rows each;
the run at 2 restores them and reads to the end.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from energon_pack.config import PackingConfig
from energon_pack.plan.build import build_plan
from energon_pack.data.synthetic import SyntheticSpec, make_synthetic_dataset
from tests.support.plan_multirank_worker import SEQ_LENGTH
from tests.support.paths import REPO, SUPPORT
from tests.support.torchrun import torchrun_env

pytestmark = pytest.mark.slow

WORKER = SUPPORT / "plan_multirank_worker.py"
WORLD_SIZES = (4, 2, 1)  # 4 saves, 2 resumes
WORKERS = (0, 1, 4)
SAVE_AFTER = 1
#: Small images and short videos at W=512: about 14 rows, so each of 4 ranks reads 3 or more.
NUM_SAMPLES = 32
SPEC = SyntheticSpec(max_image_side=320, max_video_seconds=1.0, max_video_side=64, corrupt_fraction=0.05)
PHASE_TIMEOUT_S = 400


def _torchrun(world_size: int, dataset: Path, plan: Path, out: Path) -> None:
    command = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={world_size}", "--standalone",
        str(WORKER), "--dataset", str(dataset), "--plan", str(plan), "--out", str(out),
        "--workers", ",".join(map(str, WORKERS)),
    ]
    if world_size == 4:
        command += ["--save-after", str(SAVE_AFTER)]
    if world_size == 2:
        command += ["--resume"]
    done = subprocess.run(command, cwd=REPO, env=torchrun_env(), capture_output=True, text=True, timeout=PHASE_TIMEOUT_S)
    assert done.returncode == 0, f"torchrun at world size {world_size} failed ({done.returncode}):\n{done.stderr[-6000:]}"


def _load(out: Path, pattern: str) -> list[dict[str, Any]]:
    return [json.loads(path.read_text(encoding="utf-8")) for path in sorted(out.glob(pattern))]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, processor) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("plan_multirank")
    report = make_synthetic_dataset(root, NUM_SAMPLES, seed=5, spec=SPEC, samples_per_shard=10)
    plan = build_plan(report.out_dir, PackingConfig(seq_length=SEQ_LENGTH), processor, num_workers=0, progress=False)
    assert plan.num_rows >= 4 * (SAVE_AFTER + 1), f"only {plan.num_rows} rows: make the dataset larger"
    plan.save(root / "train.plan")
    out = root / "records"
    out.mkdir()
    for world_size in WORLD_SIZES:
        _torchrun(world_size, report.out_dir, root / "train.plan", out)
    return {"out": out, "plan": plan}


def _merged(records: list[dict[str, Any]]) -> dict[int, tuple[list[str], str]]:
    """Rows of all ranks by global position; each rank holds only positions ``== rank mod world size``."""
    merged = {}
    for record in records:
        for position, keys, digest in record["rows"]:
            assert position % record["world_size"] == record["rank"], "a row went to the wrong rank"
            assert position not in merged, f"position {position} was read twice"
            merged[position] = (keys, digest)
    return merged


def test_rows_by_global_index_are_identical_for_every_world_size_and_worker_count(runs):
    reference = _merged(_load(runs["out"], "epoch_ws1_nw0_rank*.json"))
    assert sorted(reference) == list(range(runs["plan"].num_rows))
    for world_size in WORLD_SIZES:
        for workers in WORKERS:
            records = _load(runs["out"], f"epoch_ws{world_size}_nw{workers}_rank*.json")
            assert len(records) == world_size
            assert _merged(records) == reference, f"world size {world_size}, {workers} workers"


def test_state_saved_at_world_size_4_continues_exactly_at_world_size_2(runs):
    reference = _merged(_load(runs["out"], "epoch_ws1_nw0_rank*.json"))
    resumed = _merged(_load(runs["out"], "resume_ws2_rank*.json"))
    cursor = 4 * SAVE_AFTER
    assert resumed == {position: row for position, row in reference.items() if position >= cursor}
