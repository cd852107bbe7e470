"""Two data-parallel ranks (torchrun, gloo on CPU) x 2 workers over one finite epoch, saved and resumed.

``tests/support/multirank_worker.py`` runs twice under torchrun: ``full`` iterates each rank's whole
stream and saves its state after row ``SAVE_AFTER``; ``resume`` restores that state into fresh
processes and iterates to the end. Checks: the ranks' shares are disjoint, together they cover
the dataset (minus counted skips), and each resumed stream equals the rest of its full stream.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from energon_pack.data.synthetic import SyntheticSpec, make_synthetic_dataset
from tests.support.paths import REPO, SUPPORT
from tests.support.torchrun import torchrun_env

pytestmark = pytest.mark.slow

WORKER = SUPPORT / "multirank_worker.py"
WORLD_SIZE = 2
#: 48 samples with images up to 768 px give each rank 3 rows at W=4096, so saving after row 2
#: also covers the save after the last-but-one row (a finished worker must stay finished).
NUM_SAMPLES = 48
SAVE_AFTER = 2
SPEC = SyntheticSpec(max_image_side=768, max_video_seconds=2.0, max_video_side=64, corrupt_fraction=0.05)
PHASE_TIMEOUT_S = 300


def _torchrun(dataset: Path, out: Path, phase: str) -> None:
    env = torchrun_env()
    command = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={WORLD_SIZE}", "--standalone",
        str(WORKER), "--dataset", str(dataset), "--out", str(out), "--phase", phase, "--save-after", str(SAVE_AFTER),
    ]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=PHASE_TIMEOUT_S)
    assert done.returncode == 0, f"torchrun phase {phase} failed ({done.returncode}):\n{done.stderr[-6000:]}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Any]:
    """Prepared dataset keys and, per phase, the JSON record of each rank (index = rank)."""
    root = tmp_path_factory.mktemp("multirank")
    report = make_synthetic_dataset(root, NUM_SAMPLES, seed=3, spec=SPEC, samples_per_shard=10)
    records = (root / "raw" / "records.jsonl").read_text(encoding="utf-8").splitlines()
    rejected = {problem.record_id for problem in report.problems}
    keys = {json.loads(line)["id"] for line in records} - rejected
    assert len(keys) == report.written
    out = root / "records"
    out.mkdir()
    result: dict[str, Any] = {"keys": keys}
    for phase in ("full", "resume"):
        _torchrun(report.out_dir, out, phase)
        paths = [out / f"{phase}_rank{rank}.json" for rank in range(WORLD_SIZE)]
        result[phase] = [json.loads(path.read_text(encoding="utf-8")) for path in paths]
    return result


def _keys(record: dict[str, Any]) -> list[str]:
    return [key for row in record["rows"] for key in row["keys"]]


def test_each_rank_reports_its_own_rank_and_world_size(runs):
    for phase in ("full", "resume"):
        assert [(r["rank"], r["world_size"]) for r in runs[phase]] == [(i, WORLD_SIZE) for i in range(WORLD_SIZE)]


def test_ranks_read_disjoint_shares_that_cover_the_dataset_minus_counted_skips(runs):
    full = runs["full"]
    shares = [_keys(record) for record in full]
    for rank, share in enumerate(shares):
        assert len(share) == len(set(share)), f"rank {rank} yielded a sample twice in one epoch"
        assert share, f"rank {rank} yielded nothing"
    assert not set(shares[0]) & set(shares[1])
    union = set(shares[0]) | set(shares[1])
    assert union <= runs["keys"]
    skipped = sum(record["stats"]["skipped_total"] for record in full)
    read = sum(record["stats"]["samples_in"] for record in full)
    assert read == len(runs["keys"]), "every prepared sample is read by exactly one rank"
    assert len(union) + skipped == len(runs["keys"])


def test_resumed_rank_continues_its_stream_row_for_row(runs):
    for rank, (full, resumed) in enumerate(zip(runs["full"], runs["resume"])):
        assert len(full["rows"]) > SAVE_AFTER, f"rank {rank} has too few rows to test a resume"
        assert resumed["rows"] == full["rows"][SAVE_AFTER:], f"rank {rank} resumed differently"
