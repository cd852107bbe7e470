"""``make gpu-check`` (tests/support/gpu_check.py) on a machine without CUDA: it says so and exits 0;
bad options are usage errors; its checks run on the CPU as they will on the device."""

from __future__ import annotations

import pytest
import torch

from tests.support import gpu_check
from tests.support.model_oracle import MULTIMODAL_CASES


def test_without_cuda_it_says_so_and_exits_0(monkeypatch, capsys) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main([]) == 0
    out = capsys.readouterr().out
    assert "no CUDA device" in out and "Nothing checked" in out and "|" not in out


@pytest.mark.parametrize("argv", [["--workers", "0"], ["--workers", "1,x"], ["--mix-scale", "0"], ["--repeats", "-1"]])
def test_bad_options_are_usage_errors(argv, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        gpu_check.main(argv)
    assert exit_.value.code == 2 and "Traceback" not in capsys.readouterr().err


def test_it_finds_the_cuda_tests_and_prints_one_table() -> None:
    assert gpu_check.ROOT.joinpath("tests/rows/test_step.py") in gpu_check.cuda_test_files()
    assert gpu_check.TABLE_HEADER == "| check | result | ok |\n|---|---|---|"
    assert gpu_check.table_row({"check": "a", "result": "1", "ok": True}) == "| a | 1 | yes |"
    assert gpu_check.table_row({"check": "b", "result": "2", "ok": False}) == "| b | 2 | NO |"
    assert gpu_check.seconds_ratio({"uint8": [9, 1, 1], "float32": [9, 3, 3]}) == 3.0


@pytest.mark.slow
def test_transfer_and_model_checks_run_on_the_cpu() -> None:
    """The transfer timing and the packed-vs-alone model check (float32, within the oracle's 1e-4)
    on the CPU, as on the device (bfloat16 runs the same code; on the CPU it only costs time)."""
    transfer = gpu_check.transfer_rates("cpu", patches=64, width=256, repeats=1)
    assert [row["check"] for row in transfer] == ["to_device_batch uint8", "to_device_batch float32", "uint8 / float32 rows/s"]
    image, video = MULTIMODAL_CASES[0], MULTIMODAL_CASES[2]
    figure = gpu_check.model_agreement("cpu", torch.float32, [image, video])
    assert figure["ok"] and "float32" in figure["check"], figure
