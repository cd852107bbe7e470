"""``python -m energon_pack.tools.bench_video``: bad options are usage errors (exit 2, one line), and a
tiny clip's run times every setting and finds the row's pixels identical to the processor's."""

from __future__ import annotations

import io

import av
import pytest

from energon_pack.qwen.media import probe_video
from energon_pack.tools.bench_video import main, row_settings
from energon_pack.tools.clips import ClipSpec, make_clip


@pytest.mark.parametrize("argv", [["--threads", "0"], ["--threads", "a,b"], ["--threads", "auto,0"], ["--workers", "-1"],
                                  ["--noise", "200"], ["--seconds", "0"],
                                  ["--max-frames", "-1"], ["--family", "qwen9"],
                                  ["--grain", "0"], ["--encoding", "h263"]])
def test_bad_options_are_usage_errors(argv, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.slow
def test_a_tiny_clip_runs_and_its_pixels_are_identical(tmp_path, capsys) -> None:
    assert main(["--seconds", "4", "--width", "160", "--height", "96", "--max-frames", "4", "--threads", "2,auto",
                 "--workers", "0", "--repeats", "1", "--noise", "8", "--clips", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "pixels identical: True" in out and "row, 2 thread(s)" in out and "plain decode" in out
    assert "row, auto, 0 workers (" in out  # the default, as a loader in one process resolves it


def test_auto_rows_resolve_decode_threads_as_a_loader_of_each_worker_count(monkeypatch) -> None:
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: set(range(8)))
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert row_settings([1, None], [0, 2, 8]) == {
        "row, 1 thread(s)": 1, "row, auto, 0 workers (4 thread(s))": 4, "row, auto, 2 workers (4 thread(s))": 4,
        "row, auto, 8 workers (1 thread(s))": 1,
    }


@pytest.mark.parametrize("encoding", ["h264-web", "hevc-web", "vp9-web"])
def test_web_clips_hold_every_frame_and_reorder_frames(encoding) -> None:
    """A web clip holds its frames (as counted and decoded), a keyframe every interval; H.264 / HEVC
    ones have B-frames (a packet's dts below its pts)."""
    spec = ClipSpec(seconds=2, width=64, height=48, fps=10, keyframe_seconds=0.5, noise=10, grain=4, encoding=encoding)
    data = make_clip(spec)
    assert probe_video(data).num_frames == spec.num_frames == 20
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        packets = [packet for packet in container.demux(stream) if packet.size > 0]
        name = stream.codec_context.name
    with av.open(io.BytesIO(data)) as container:
        assert sum(1 for _ in container.decode(container.streams.video[0])) == 20
    assert sum(packet.is_keyframe for packet in packets) == 4
    if encoding == "vp9-web":
        assert name in ("vp9", "libvpx-vp9")
    else:
        assert any(packet.dts < packet.pts for packet in packets), "no B-frames"
