"""The ``energon-pack`` commands run end to end and print their tables."""

from __future__ import annotations

import re

import pytest

from energon_pack.cli import main


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


def test_inspect_and_simulate_on_a_dataset(synthetic_dataset, capsys):
    assert main(["inspect", str(synthetic_dataset.out_dir)]) == 0
    values = table_values(capsys.readouterr().out)
    assert int(values["samples"]) == synthetic_dataset.written
    assert int(values["images"]) == synthetic_dataset.images and int(values["videos"]) == synthetic_dataset.videos
    assert int(values["tokens: max"]) > 0
    assert main(["simulate", "--dataset", str(synthetic_dataset.out_dir), "--widths", "4096", "--buffers", "8"]) == 0
    assert f"({synthetic_dataset.written} samples)" in capsys.readouterr().out
