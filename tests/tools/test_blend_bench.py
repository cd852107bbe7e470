"""``energon-pack bench --stage blend``: its options, its table rows, and a tiny run on the synthetic blend."""

from __future__ import annotations

import pytest

from energon_pack.cli import main
from energon_pack.tools.bench_blend import unit_rows


@pytest.mark.parametrize("argv, named", [
    (["--blend-units", "samples,tokenz"], "'tokenz' is not a blend unit"),
    (["--dataset", "some/folder"], "reads a metadataset YAML"),
    (["--rows", "0"], "--rows"),
])
def test_bad_options_are_usage_errors(argv, named, capsys, tmp_path) -> None:
    try:  # argparse exits; a UsageError is returned as exit status 2
        code = main(["bench", "--stage", "blend", "--out", str(tmp_path), *argv])
    except SystemExit as exit_info:
        code = exit_info.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert named in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_unit_rows_show_weight_and_realized_shares() -> None:
    sources = [
        {"index": 0, "path": "/d/short", "subflavors": {"source": "short"}, "weight": 0.5, "samples": 10, "real_tokens": 2000,
         "samples_share": 0.5, "real_tokens_share": 0.1, "supervised_tokens_share": 0.4},
        {"index": 1, "path": "/d/long", "subflavors": {}, "weight": 0.5, "samples": 0, "real_tokens": 0,
         "samples_share": 0.5, "real_tokens_share": 0.9, "supervised_tokens_share": None},
    ]
    rows = unit_rows("samples", sources, 0.99)
    assert rows[0] | {} == {"unit": "samples", "source": "0 short", "weight share": "50.0%", "samples": "50.0%",
                            "real tokens": "10.0%", "supervised": "40.0%", "tokens/sample": "200", "fill": "0.9900"}
    assert rows[1]["source"] == "1 long" and rows[1]["supervised"] == "-" and rows[1]["tokens/sample"] == "-"


@pytest.mark.slow
def test_a_tiny_blend_bench_prints_one_row_per_unit_and_source(tmp_path, capsys) -> None:
    assert main(["bench", "--stage", "blend", "--out", str(tmp_path), "--rows", "6", "--workers", "1",
                 "--blend-units", "samples,tokens"]) == 0
    table = capsys.readouterr().out.split("shares of the rows)")[-1]
    lines = [line for line in table.splitlines() if "short" in line or "long" in line]
    assert [line.split()[0] for line in lines] == ["samples", "samples", "tokens", "tokens"]
