"""The ``energon-pack`` commands run end to end and print their tables."""

from __future__ import annotations

import dataclasses
import re

import pytest

from energon_pack.cli import main
from tests.support.paths import REPO


def table_values(out: str) -> dict[str, str]:
    """``metric -> value`` of a two-column report table (columns separated by 2+ spaces)."""
    values = {}
    for line in out.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) == 2:
            values[cells[0]] = cells[1]
    return values


@pytest.mark.slow
def test_demo_reports_rows_skips_and_identical_resume(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path), "--samples", "40", "--seq-length", "4096", "--workers", "2"]) == 0
    values = table_values(capsys.readouterr().out)
    assert int(values["rows (W=4096)"]) > 0
    assert int(values["samples read"]) == 40
    assert int(values["samples packed"]) + int(values["skipped (total)"]) == 40
    assert 0 < float(values["fill (real tokens / row slots)"]) <= 1
    assert float(values["worker peak RSS (MiB)"]) > 0
    resume = [value for metric, value in values.items() if metric.startswith("resume after row")]
    assert resume == ["yes"]


def test_simulate_reference_mix_prints_ours_and_ffd(capsys):
    assert main(["simulate", "--samples", "800", "--widths", "8192", "--buffers", "16"]) == 0
    out = capsys.readouterr().out
    assert "FFD fill" in out and "reference VLM length mix" in out
    # One row for the sample buffer, then one per token buffer (1, 2 and 4 rows' worth).
    rows = [line.split() for line in out.strip().splitlines()[-4:]]
    assert [row[1] for row in rows] == ["16", "1W", "2W", "4W"]
    for row in rows:
        ours, ffd = (float(v.rstrip("%")) for v in row[2:4])
        assert ours > ffd


def test_simulate_with_a_vision_budget_prints_both_rows(capsys):
    args = ["simulate", "--samples", "600", "--widths", "8192", "--buffers", "16", "--buffer-rows", "",
            "--max-row-vision-patches", "20000"]
    assert main(args) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    header = re.split(r"\s{2,}", lines[-4].strip())
    free, capped = (dict(zip(header, re.split(r"\s{2,}", line.strip()))) for line in lines[-2:])
    assert (free["vision budget"], capped["vision budget"]) == ("none", "20000")
    assert int(free["vis max"]) > 20000 >= int(capped["vis max"])
    assert int(capped["FFD vis max"]) <= 20000


@pytest.mark.slow
def test_inspect_and_simulate_on_a_dataset(synthetic_dataset, capsys):
    assert main(["inspect", str(synthetic_dataset.out_dir)]) == 0
    values = table_values(capsys.readouterr().out)
    assert int(values["samples"]) == synthetic_dataset.written
    assert int(values["images"]) == synthetic_dataset.images and int(values["videos"]) == synthetic_dataset.videos
    assert int(values["tokens: max"]) > 0
    assert main(["simulate", "--dataset", str(synthetic_dataset.out_dir), "--widths", "4096", "--buffers", "8"]) == 0
    assert f"({synthetic_dataset.written} samples, measured " in capsys.readouterr().out


def test_simulate_global_plan_reports_fill_time_and_size(capsys):
    assert main(["simulate", "--samples", "800", "--widths", "8192", "--buffers", "16", "--global-plan"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    header, _, values = lines[-3:]
    assert header.split() == ["W", "samples", "rows", "fill", "plan_s", "file_kib", "load_s"]
    width, samples, rows, fill, *_ = values.split()
    assert (width, int(samples) <= 800) == ("8192", True) and int(rows) > 0
    online = next(line.split() for line in lines if line.split()[:2] == ["8192", "16"])
    assert float(fill) >= float(online[2].rstrip("%")) / 100


@pytest.mark.slow
def test_plan_command_writes_a_plan_the_loader_reads(tmp_path, capsys, synthetic_dataset, processor):
    from energon_pack.config import PackingConfig
    from energon_pack.loader import get_packing_loader
    from energon_pack.plan.file import PackPlan

    config = PackingConfig(seq_length=2048, num_workers=2, repeat=False)
    config.to_yaml(tmp_path / "packing.yaml")
    out = tmp_path / "train.plan"
    dataset = str(synthetic_dataset.out_dir)
    assert main(["plan", dataset, "--config", str(tmp_path / "packing.yaml"), "--out", str(out)]) == 0
    values = table_values(capsys.readouterr().out)
    plan = PackPlan.load(out)
    assert int(values["samples read"]) == synthetic_dataset.written == plan.samples_in
    assert int(values["rows (W=2048)"]) == plan.num_rows > 0
    assert float(values["fill (real tokens / row slots)"]) > 0.5
    assert float(values["plan file (KiB)"]) > 0
    rows = list(get_packing_loader(dataset, dataclasses.replace(config, num_workers=0), processor, plan=out))
    assert len(rows) == plan.num_rows


@pytest.mark.slow
def test_demo_labels_the_resume_re_read_and_reports_last(tmp_path):
    """Run as a user would (a pipe, stderr and stdout interleaved): every skip warning comes before
    the report, and those of the resume check's re-read follow the line that says so."""
    import os
    import subprocess
    import sys

    repo = REPO
    env = {**os.environ, "PYTHONPATH": str(repo), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "energon_pack.cli", "demo", "--out", str(tmp_path), "--samples", "40", "--workers", "2"]
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:]
    lines = done.stdout.splitlines()
    label = next(i for i, line in enumerate(lines) if line.startswith("resume check: a fresh loader"))
    report = next(i for i, line in enumerate(lines) if line.strip().startswith("metric") and "value" in line)
    skips = [i for i, line in enumerate(lines) if "skipping sample" in line]
    assert skips, "the synthetic data holds corrupt samples"
    assert label < report and all(i < report for i in skips), done.stdout[-4000:]
    assert any(i < label for i in skips), "the first pass reports its skips before the resume check"
