"""The cost of one long video's row against a plain decode of the clip (issue 33's decode check).

``python -m energon_pack.tools.bench_video`` makes (once, cached under ``--clips``) an H.264 clip
(``energon_pack.tools.clips``: default 10 minutes of 720p at 30 fps, a keyframe every second, as
phones write them, ~5 Mbit/s of moving texture and noise) and times, interleaved, ``--repeats`` times each:

- ``plain decode``: a sequential PyAV decode of every frame of the clip (no conversion, PyAV's default threading);
- ``row``: building the clip's row segment with ``QwenVLPackingTaskEncoder.postencode_sample``
  (the processor's ``max_frames``: ``--max-frames``), for each ``--threads`` setting
  (``decode_threads``; ``auto``: the default, as a loader of each ``--workers`` count resolves it on
  this machine): frames sought, resized as decoded, patches into the payload;
- ``before``: what the row cost before issue 33: every frame decoded and counted, the sampled
  ones stacked at source size, then the video processor.

It prints the medians (wall, and CPU seconds of every thread of this process), the row's ratio to
the plain decode in both, and checks the row's payload equals
the video processor's on the sequentially decoded frames (``pixels identical: True``).
"""

from __future__ import annotations

import argparse
import io
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from energon_pack.core.arg_types import decode_thread_counts, worker_counts

__all__ = ["bench_video", "main"]


def _plain_decode(data: bytes) -> int:
    """Frames of a sequential PyAV decode of the whole clip (PyAV's default threading)."""
    import av

    with av.open(io.BytesIO(data)) as container:
        return sum(1 for _ in container.decode(container.streams.video[0]))


def row_settings(threads: Sequence[int | None], workers: Sequence[int]) -> dict[str, int]:
    """Row label -> ``decode_threads`` per ``threads`` setting; None (``auto``) is resolved as a
    loader with each count of ``workers`` resolves it here (`LoaderOptions.resolved_decode_threads`).

    Example (2 cores): ``row_settings([1, None], [0, 2])`` -> {"row, 1 thread(s)": 1,
    "row, auto, 0 workers (2 thread(s))": 2, "row, auto, 2 workers (1 thread(s))": 1}.
    """
    from energon_pack.config import LoaderOptions

    out = {}
    for count in threads:
        if count is not None:
            out[f"row, {count} thread(s)"] = count
            continue
        for number in workers:
            resolved = LoaderOptions(num_workers=number).resolved_decode_threads()
            out[f"row, auto, {number} workers ({resolved} thread(s))"] = resolved
    return out


def _timed(run: Callable[[], Any]) -> tuple[float, float]:
    """(wall, CPU) seconds of one ``run()``; CPU is this process's, every thread's included (decoder
    threads too), so it does not move with the share of the cores other jobs leave it."""
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - wall, time.process_time() - cpu


def bench_video(
    *, seconds: float, width: int, height: int, fps: int, keyframe_seconds: float, max_frames: int,
    threads: Sequence[int | None], family: str, repeats: int, clips: Path, pixel_dtype: str = "uint8", noise: int = 20,
    encoding: str = "ultrafast", grain: int = 1, workers: Sequence[int] = (2,),
) -> dict[str, Any]:
    """Figures of one clip: plain decode, row per thread setting (`row_settings`) and the
    pre-issue-33 row, in wall and CPU seconds (medians)."""
    import torch

    from energon_pack.config import PackingConfig
    from energon_pack.core.samples import QwenVLChatSample
    from energon_pack.qwen.pixels import decode_video_frames
    from energon_pack.qwen.processor import load_processor
    from energon_pack.runtime.task_encoder import QwenVLPackingTaskEncoder
    from energon_pack.tools.clips import ClipSpec, cached_clip

    spec = ClipSpec(seconds=seconds, width=width, height=height, fps=fps, keyframe_seconds=keyframe_seconds, noise=noise,
                    encoding=encoding, grain=grain)
    data = cached_clip(clips, spec).read_bytes()
    processor = load_processor(family=family, max_frames=max_frames)
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What happens?"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "A bar moves."}]}]
    sample = QwenVLChatSample(__key__="clip", __restore_key__=(), __subflavors__=None, __sources__=None,
                              conversation=messages, images=[], videos=[data])
    encoders = {
        label: QwenVLPackingTaskEncoder(PackingConfig(seq_length=1 << 20, pixel_dtype=pixel_dtype,
                                                      decode_threads=count), processor)
        for label, count in row_settings(threads, workers).items()
    }
    first = next(iter(encoders.values()))
    prepared = first.preencode_sample(sample)
    timing = prepared.video_timings[0]
    uint8 = pixel_dtype == "uint8"

    def before() -> Any:
        frames = decode_video_frames(data, timing.frame_indices, timing.total_frames, seek=False)
        return processor.video_processor(
            videos=[frames], video_metadata=[timing.metadata()], do_sample_frames=False, return_tensors="pt",
            **({"do_rescale": False, "do_normalize": False} if uint8 else {}),
        )

    runs: dict[str, list[tuple[float, float]]] = {"plain decode": [], "before": [], **{label: [] for label in encoders}}
    for _ in range(repeats):  # interleaved, so load changes hit every setting alike
        runs["plain decode"].append(_timed(lambda: _plain_decode(data)))
        for label, encoder in encoders.items():
            runs[label].append(_timed(lambda: encoder.postencode_sample(prepared)))
        runs["before"].append(_timed(before))
    row = first.postencode_sample(prepared).segment.visual.pixel_values_videos
    reference = before()["pixel_values_videos"]
    medians = {name: statistics.median(wall for wall, _ in values) for name, values in runs.items()}
    cpu = {name: statistics.median(seconds for _, seconds in values) for name, values in runs.items()}
    return {
        "clip": spec.name, "frames": spec.num_frames, "sampled": len(timing.frame_indices), "family": family,
        "seconds": medians, "cpu seconds": cpu, "runs": runs,
        "ratio to plain decode": {name: value / medians["plain decode"] for name, value in medians.items()},
        "cpu ratio to plain decode": {name: value / cpu["plain decode"] for name, value in cpu.items()},
        "pixels identical": bool(torch.equal(row, reference)),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Parse options, run :func:`bench_video`, print its figures."""
    from energon_pack.tools.clips import ENCODINGS

    parser = argparse.ArgumentParser(
        prog="python -m energon_pack.tools.bench_video", description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--seconds", type=float, default=600.0, help="clip length")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=720)
    parser.add_argument("--fps", type=int, default=30)
    parser.add_argument("--keyframe-seconds", type=float, default=1.0, help="seconds between keyframes")
    parser.add_argument("--noise", type=int, default=20,
                        help="noise amplitude of the clip's frames (20: ~5 Mbit/s at 720p, a camera clip's decode cost)")
    parser.add_argument("--grain", type=int, default=1,
                        help="side in pixels of the noise's blocks (4 with --noise 10: a web clip's inter-frame cost)")
    parser.add_argument("--encoding", default="ultrafast", choices=sorted(ENCODINGS),
                        help="how the clip is encoded (h264-web, hevc-web, vp9-web: web video with B-frames or alt-ref "
                        "frames; ultrafast: x264 without CABAC or B-frames)")
    parser.add_argument("--max-frames", type=int, default=64, help="the processor's max_frames")
    parser.add_argument("--threads", type=decode_thread_counts, default=[1],
                        help="decode_threads settings to time, e.g. 1,2,4,auto (auto: the default, per --workers count)")
    parser.add_argument("--workers", type=worker_counts, default=[2],
                        help="loader worker counts the auto setting is resolved for, e.g. 0,2 (0: in one process)")
    parser.add_argument("--family", default="qwen2.5-vl", choices=["qwen2-vl", "qwen2.5-vl", "qwen3-vl", "qwen3.5"])
    parser.add_argument("--pixel-dtype", default="uint8", choices=["uint8", "float32"])
    parser.add_argument("--repeats", type=int, default=3, help="interleaved runs of each setting")
    parser.add_argument("--clips", type=Path, default=Path(tempfile.gettempdir()) / "energon_pack_clips",
                        help="folder the generated clips are cached in")
    args = parser.parse_args(argv)
    for name in ("seconds", "width", "height", "fps", "keyframe_seconds", "max_frames", "repeats", "grain"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)}: must be > 0")
    if not 0 <= args.noise <= 127:
        parser.error(f"--noise {args.noise}: must be 0 to 127")
    figures = bench_video(
        seconds=args.seconds, width=args.width, height=args.height, fps=args.fps,
        keyframe_seconds=args.keyframe_seconds, max_frames=args.max_frames, threads=args.threads,
        family=args.family, repeats=args.repeats, clips=args.clips, pixel_dtype=args.pixel_dtype, noise=args.noise,
        encoding=args.encoding, grain=args.grain, workers=args.workers,
    )
    print(f"{figures['clip']}: {figures['frames']} frames, {figures['sampled']} sampled, {figures['family']}, "
          f"medians of {args.repeats}")
    for name, value in figures["seconds"].items():
        print(f"  {name:<36} {value:8.2f} s   {figures['ratio to plain decode'][name]:.3f}x plain decode   "
              f"CPU {figures['cpu seconds'][name]:8.2f} s   {figures['cpu ratio to plain decode'][name]:.3f}x")
    print(f"  pixels identical: {figures['pixels identical']}")
    return 0 if figures["pixels identical"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
