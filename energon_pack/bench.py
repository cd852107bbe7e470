"""``energon-pack bench``: side-by-side speed and memory figures, measured in one run (DESIGN.md section 9).

Each stage is a function ``(num_samples, work_dir) -> table rows`` registered in `BENCHES`; a row
is ``{"what": ..., "ours": ..., "HF": ..., "ratio": ...}`` with ``ratio = ours / HF``. Both sides run
on the same samples, interleaved sample by sample, so the ratio holds on a noisy machine.

- ``preencode``: `bench_preencode` - ``QwenVLPackingTaskEncoder.preencode_sample`` (tokens from
  media headers) against the full Hugging Face processor call, and the bytes a buffered sample
  holds against the bytes of the processor output.
"""

from __future__ import annotations

import argparse
import io
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from energon_pack.samples import QwenVLChatSample
from energon_pack.tables import format_table

#: Image and video sizes of the benchmark mix: photo-sized images, short VGA-ish clips.
BENCH_SPEC_KWARGS: dict[str, Any] = dict(max_image_side=4000, max_video_seconds=10.0, max_video_side=480)
TABLE_COLUMNS = ("what", "ours", "HF", "ratio")

BenchRows = list[dict[str, Any]]


def bench_samples(work_dir: Path, num_samples: int, *, seed: int = 0) -> list[QwenVLChatSample]:
    """The benchmark mix (``energon_pack.synthetic`` records with big images), generated once under ``work_dir``.

    Media are read back as compressed bytes into ``QwenVLChatSample`` objects (no Energon dataset).
    """
    from energon_pack.conversation import parse_record
    from energon_pack.synthetic import SyntheticSpec, make_records

    raw = Path(work_dir) / f"mix-{num_samples}-{seed}"
    done = raw / ".complete"
    if not done.exists():
        print(f"generating {num_samples} benchmark samples in {raw} (once)")
        make_records(raw, num_samples, seed=seed, spec=SyntheticSpec(**BENCH_SPEC_KWARGS))
        done.touch()
    samples = []
    for line in (raw / "records.jsonl").read_text(encoding="utf-8").splitlines():
        record = parse_record(json.loads(line))
        samples.append(
            QwenVLChatSample(
                __key__=record.id,
                __restore_key__=(),
                __subflavors__=None,
                __sources__=None,
                conversation=record.messages,
                images=[(raw / name).read_bytes() for name in record.images],
                videos=[(raw / name).read_bytes() for name in record.videos],
            )
        )
    return samples


def hf_processor_outputs(
    processor: Any, messages: Sequence[dict], images: Sequence[bytes], videos: Sequence[bytes]
) -> Any:
    """The Hugging Face processor output for one chat, called as DESIGN.md section 3 says.

    Images go in as opened PIL images; video frames are decoded with PyAV (rgb24) at the
    frame indices of ``sample_frame_indices`` and passed with ``do_sample_frames=False`` and
    their ``VideoMetadata``. Returns the processor's ``BatchFeature`` (tensors, batch of 1).
    """
    from PIL import Image

    from energon_pack.qwen.geometry import VisionSpec, sample_frame_indices
    from energon_pack.qwen.media import probe_video
    from energon_pack.qwen.pixels import decode_video_frames
    from energon_pack.qwen.template import VideoTiming

    video_kwargs: dict[str, Any] = {}
    if videos:
        spec = VisionSpec.from_processor(processor)
        frames, metadata = [], []
        for data in videos:
            info = probe_video(data)
            timing = VideoTiming(
                total_frames=info.num_frames,
                fps=info.fps,
                frame_indices=tuple(sample_frame_indices(info.num_frames, info.fps, spec)),
            )
            frames.append(decode_video_frames(data, timing.frame_indices, timing.total_frames))
            metadata.append(timing.metadata())
        video_kwargs = dict(videos=frames, video_metadata=metadata, do_sample_frames=False)
    return processor(
        text=[processor.apply_chat_template(list(messages))],
        images=[Image.open(io.BytesIO(data)) for data in images] or None,
        return_tensors="pt",
        **video_kwargs,
    )


def tensor_bytes(outputs: Any) -> int:
    """Bytes of every tensor in a mapping (e.g. a ``BatchFeature``). Example: {"a": int64 [4]} -> 32."""
    import torch

    return sum(v.numel() * v.element_size() for v in outputs.values() if isinstance(v, torch.Tensor))


def bench_preencode(num_samples: int, work_dir: Path) -> BenchRows:
    """Preencode vs the full HF processor on the same samples: speed, bytes held, identical ids."""
    import torch
    from tqdm import tqdm

    from energon_pack.config import PackingConfig
    from energon_pack.qwen.processor import load_processor
    from energon_pack.task_encoder import QwenVLPackingTaskEncoder

    samples = bench_samples(work_dir, num_samples)
    processor = load_processor()
    encoder = QwenVLPackingTaskEncoder(PackingConfig(seq_length=131072), processor)

    def run_ours(sample: QwenVLChatSample) -> Any:
        return encoder.preencode_sample(sample)

    def run_hf(sample: QwenVLChatSample) -> Any:
        return hf_processor_outputs(processor, sample.conversation, sample.images, sample.videos)

    # Warm-up on the first image and the first video sample: lazy imports and caches are not timed.
    first_image = next((s for s in samples if s.images), samples[0])
    first_video = next((s for s in samples if s.videos), samples[0])
    for warm_up in (first_image, first_video):
        run_ours(warm_up)
        run_hf(warm_up)
    seconds: dict[str, list[float]] = {"ours": [], "HF": []}
    held: dict[str, list[int]] = {"ours": [], "HF": []}
    identical = 0
    for sample in tqdm(samples, desc="preencode vs HF", unit="sample"):
        start = time.perf_counter()
        prepared = run_ours(sample)
        seconds["ours"].append(time.perf_counter() - start)
        start = time.perf_counter()
        reference = run_hf(sample)
        seconds["HF"].append(time.perf_counter() - start)
        held["ours"].append(prepared.nbytes())
        held["HF"].append(tensor_bytes(reference))
        identical += int(prepared.skip_reason is None and torch.equal(prepared.input_ids, reference["input_ids"][0]))

    def row(what: str, ours: float, hf: float) -> dict[str, Any]:
        return {"what": what, "ours": ours, "HF": hf, "ratio": ours / hf if hf else float("nan")}

    count = len(samples)
    time_ours, time_hf = (np.asarray(seconds[k]) for k in ("ours", "HF"))
    bytes_ours, bytes_hf = (np.asarray(held[k], dtype=np.float64) for k in ("ours", "HF"))
    return [
        row("samples/s (higher is better)", count / time_ours.sum(), count / time_hf.sum()),
        row("ms per sample, mean", 1e3 * time_ours.mean(), 1e3 * time_hf.mean()),
        row("ms per sample, worst", 1e3 * time_ours.max(), 1e3 * time_hf.max()),
        row("MiB held per sample, mean", bytes_ours.mean() / 2**20, bytes_hf.mean() / 2**20),
        row("MiB held per sample, worst", bytes_ours.max() / 2**20, bytes_hf.max() / 2**20),
        {"what": "samples with identical input_ids", "ours": f"{identical}/{count}", "HF": "(reference)", "ratio": ""},
    ]


#: Stage name -> benchmark; other stages register here (``bench_postencode``, ``bench_loader``).
BENCHES: dict[str, Callable[[int, Path], BenchRows]] = {
    "preencode": bench_preencode,
}
#: Stages of ``--stage all``, in run order.
STAGES: tuple[str, ...] = ("preencode", "postencode", "loader")


def run_bench(args: argparse.Namespace) -> int:
    """Run ``args.stage`` ("all" = every stage in `STAGES`) on ``args.samples`` samples; print one table per stage."""
    from energon_pack.demo import default_work_dir

    work_dir = Path(args.out) if args.out is not None else default_work_dir("bench")
    stages = STAGES if args.stage == "all" else (args.stage,)
    for stage in stages:
        bench = BENCHES.get(stage)
        if bench is None:
            print(f"energon-pack bench --stage {stage}: not implemented yet")
            continue
        rows = bench(args.samples, work_dir)
        print(f"\n{stage} ({args.samples} samples; ratio = ours / HF)")
        print(format_table(rows, TABLE_COLUMNS))
    return 0
