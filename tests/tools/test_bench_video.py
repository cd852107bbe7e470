"""``python -m energon_pack.tools.bench_video``: bad options are usage errors (exit 2, one line), and a
tiny clip's run times every setting and finds the row's pixels identical to the processor's."""

from __future__ import annotations

import pytest

from energon_pack.tools.bench_video import main


@pytest.mark.parametrize("argv", [["--threads", "0"], ["--threads", "a,b"], ["--noise", "200"], ["--seconds", "0"],
                                  ["--max-frames", "-1"], ["--family", "qwen9"]])
def test_bad_options_are_usage_errors(argv, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.slow
def test_a_tiny_clip_runs_and_its_pixels_are_identical(tmp_path, capsys) -> None:
    assert main(["--seconds", "4", "--width", "160", "--height", "96", "--max-frames", "4", "--threads", "1,2",
                 "--repeats", "1", "--noise", "8", "--clips", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "pixels identical: True" in out and "row, 2 thread(s)" in out and "plain decode" in out
