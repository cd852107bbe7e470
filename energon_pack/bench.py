"""``energon-pack bench``: side-by-side speed and memory figures, measured in one run.

Each stage is a function ``(num_samples, work_dir) -> table rows`` registered in `BENCHES`; a row
is ``{"what": ..., "ours": ..., "HF": ..., "ratio": ...}`` with ``ratio = ours / HF``. Both sides run
on the same samples, interleaved sample by sample, so the ratio holds on a noisy machine.

- ``preencode``: `bench_preencode` - ``QwenVLPackingTaskEncoder.preencode_sample`` (tokens from
  media headers) against the full Hugging Face processor call, and the bytes a buffered sample
  holds against the bytes of the processor output.
- ``postencode``: `bench_postencode` - ``postencode_sample`` with float32 and uint8 payloads against
  the same processor call, per media class, and the pixel payload bytes of each.
- ``loader``: `bench_loader` - the whole packing loader against a loader whose task encoder runs
  the processor in ``encode_sample`` and packs each buffer first-fit-decreasing with Energon's
  own ``PackingDataset`` (`HFProcessorPackingTaskEncoder`): samples/s, fill, worker peak RSS and
  buffered bytes per sample.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from megatron.energon import Sample, TaskEncoder
from megatron.energon.edataclass import edataclass
from megatron.energon.task_encoder.base import stateless

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
    processor: Any,
    messages: Sequence[dict],
    images: Sequence[bytes],
    videos: Sequence[bytes],
    *,
    image_max_pixels: int | None = None,
    max_frames: int | None = None,
) -> Any:
    """The Hugging Face processor output for one chat, called as docs/batch_contract.md says.

    Images go in as opened PIL images; video frames are decoded with PyAV (rgb24) at the
    frame indices of ``sample_frame_indices`` and passed with ``do_sample_frames=False`` and
    their ``VideoMetadata``. Returns the processor's ``BatchFeature`` (tensors, batch of 1).
    Per-sample limits, when given, go into this call only: ``image_max_pixels`` as the image
    processor's ``size["longest_edge"]``, ``max_frames`` into the frame sampling.
    """
    from PIL import Image

    from energon_pack.qwen.geometry import VisionSpec, sample_frame_indices
    from energon_pack.qwen.media import probe_video
    from energon_pack.qwen.pixels import decode_video_frames
    from energon_pack.qwen.template import VideoTiming

    call_kwargs: dict[str, Any] = {}
    if image_max_pixels is not None:
        call_kwargs["images_kwargs"] = {"size": {**dict(processor.image_processor.size), "longest_edge": image_max_pixels}}
    if videos:
        spec = VisionSpec.from_processor(processor)
        spec = spec if max_frames is None else dataclasses.replace(spec, max_frames=max_frames)
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
        call_kwargs.update(videos=frames, video_metadata=metadata, do_sample_frames=False)
    return processor(
        text=[processor.apply_chat_template(list(messages))],
        images=[Image.open(io.BytesIO(data)) for data in images] or None,
        return_tensors="pt",
        **call_kwargs,
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


# --- postencode ------------------------------------------------------------------------------

#: Row width of the postencode benchmark: wide enough that no sample of the mix is overlong.
POSTENCODE_ROW_WIDTH = 131072
#: Images of at least this many pixels count as "big" in the per-class figures (1 MPix).
BIG_IMAGE_PIXELS = 1_000_000


def media_class(sample: QwenVLChatSample) -> str:
    """Benchmark class of a sample: "video", "big image" (any image >= 1 MPix), "small images" or "text".

    Example: a chat with one 4000x3000 JPEG -> "big image".
    """
    from energon_pack.qwen.media import probe_image

    if sample.videos:
        return "video"
    if any(info.width * info.height >= BIG_IMAGE_PIXELS for info in map(probe_image, sample.images)):
        return "big image"
    return "small images" if sample.images else "text"


def pixel_bytes(payload: Any) -> int:
    """Bytes of ``pixel_values`` + ``pixel_values_videos`` of a ``VisualInputs`` or a processor output mapping.

    Example: a payload with float32 pixel_values [4, 1176] and no video -> 18816.
    """
    names = ("pixel_values", "pixel_values_videos")
    tensors = [payload.get(n) for n in names] if isinstance(payload, Mapping) else [getattr(payload, n) for n in names]
    return sum(t.nbytes for t in tensors if t is not None)


def bench_postencode(num_samples: int, work_dir: Path) -> BenchRows:
    """Postencode (float32 and uint8 payloads) vs the full HF processor on the same samples.

    Per sample, interleaved: our preencode (timed apart), our postencode with a float32 and with
    a uint8 payload, and the Hugging Face processor call of docs/batch_contract.md. Rows give
    samples/s overall and per media class, pixel payload bytes, and the largest pixel difference.
    """
    from tqdm import tqdm

    from energon_pack.config import PackingConfig
    from energon_pack.qwen.processor import load_processor
    from energon_pack.task_encoder import QwenVLPackingTaskEncoder

    samples = bench_samples(work_dir, num_samples)
    processor = load_processor()
    encoders = {
        dtype: QwenVLPackingTaskEncoder(PackingConfig(seq_length=POSTENCODE_ROW_WIDTH, pixel_dtype=dtype), processor)
        for dtype in ("float32", "uint8")
    }
    preencode = encoders["float32"].preencode_sample
    steps: dict[str, Callable[[QwenVLChatSample, Any], Any]] = {
        "float32": lambda sample, prepared: encoders["float32"].postencode_sample(prepared).segment.visual,
        "uint8": lambda sample, prepared: encoders["uint8"].postencode_sample(prepared).segment.visual,
        "HF": lambda sample, _: hf_processor_outputs(processor, sample.conversation, sample.images, sample.videos),
    }
    warm_ups = (next((s for s in samples if s.images), samples[0]), next((s for s in samples if s.videos), samples[0]))
    for warm_up in warm_ups:
        prepared = preencode(warm_up)
        for step in steps.values():
            step(warm_up, prepared)
    timings: dict[str, list[float]] = {name: [] for name in ("preencode", *steps)}
    payload: dict[str, list[int]] = {name: [] for name in steps}
    classes: list[str] = []
    worst_difference = 0.0
    skipped = 0
    for position, sample in enumerate(tqdm(samples, desc="postencode vs HF", unit="sample")):
        start = time.perf_counter()
        prepared = preencode(sample)
        elapsed = time.perf_counter() - start
        if prepared.skip_reason is not None:
            skipped += 1
            continue
        timings["preencode"].append(elapsed)
        outputs: dict[str, Any] = {}
        # Alternate the order so that no side always runs first (allocator and cache warm-up).
        for name in steps if position % 2 == 0 else reversed(steps):
            start = time.perf_counter()
            outputs[name] = steps[name](sample, prepared)
            timings[name].append(time.perf_counter() - start)
        for name in payload:
            payload[name].append(pixel_bytes(outputs[name]))
        for name in ("pixel_values", "pixel_values_videos"):
            ours, theirs = getattr(outputs["float32"], name), outputs["HF"].get(name)
            if ours is not None and theirs is not None and ours.shape == theirs.shape:
                worst_difference = max(worst_difference, float((ours - theirs).abs().max()) if ours.numel() else 0.0)
            elif ours is not None or theirs is not None:
                worst_difference = float("inf")
        classes.append(media_class(sample))

    seconds = {name: np.asarray(values) for name, values in timings.items()}

    def rate_row(what: str, ours: np.ndarray, hf: np.ndarray) -> dict[str, Any]:
        ours_rate, hf_rate = len(ours) / ours.sum(), len(hf) / hf.sum()
        return {"what": what, "ours": ours_rate, "HF": hf_rate, "ratio": ours_rate / hf_rate}

    rows = [
        rate_row("samples/s, postencode float32", seconds["float32"], seconds["HF"]),
        rate_row("samples/s, postencode uint8", seconds["uint8"], seconds["HF"]),
        rate_row("samples/s, preencode + postencode float32", seconds["preencode"] + seconds["float32"], seconds["HF"]),
    ]
    labels = np.asarray(classes)
    for label in ("text", "small images", "big image", "video"):
        chosen = labels == label
        if chosen.any():
            what = f"samples/s, float32, {label} (n={int(chosen.sum())})"
            rows.append(rate_row(what, seconds["float32"][chosen], seconds["HF"][chosen]))
    sizes = {name: np.asarray(values, dtype=np.float64) for name, values in payload.items()}
    for name in ("float32", "uint8"):
        rows.append(
            {
                "what": f"pixel KiB per sample, {name} payload",
                "ours": sizes[name].mean() / 2**10,
                "HF": sizes["HF"].mean() / 2**10,
                "ratio": sizes[name].sum() / sizes["HF"].sum(),
            }
        )
    rows.append({"what": "max |float32 pixels - HF pixels|", "ours": worst_difference, "HF": "", "ratio": ""})
    rows.append({"what": "samples measured / skipped", "ours": f"{len(classes)} / {skipped}", "HF": "", "ratio": ""})
    return rows


# --- whole loader ----------------------------------------------------------------------------

#: Row width W and buffer size of the loader benchmark (both loaders, 2 worker processes each).
LOADER_ROW_WIDTH = 8192
LOADER_BUFFER_SIZE = 16
LOADER_WORKERS = 2
#: Finite epochs each loader runs (taking turns), so that one noisy epoch does not decide samples/s.
LOADER_EPOCHS = 2


#: Visual fields of the processor output that the baseline buffers and packs.
PROCESSED_FIELDS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")


@edataclass
class ProcessedSample(Sample):
    """Baseline sample: the full HF processor output of one chat (token ids and pixel tensors)."""

    input_ids: torch.Tensor
    pixel_values: Optional[torch.Tensor] = None
    image_grid_thw: Optional[torch.Tensor] = None
    pixel_values_videos: Optional[torch.Tensor] = None
    video_grid_thw: Optional[torch.Tensor] = None

    def nbytes(self) -> int:
        """Bytes of every tensor the sample holds."""
        tensors = (self.input_ids, *(getattr(self, name) for name in PROCESSED_FIELDS))
        return sum(t.nbytes for t in tensors if t is not None)


class HFProcessorPackingTaskEncoder(TaskEncoder[QwenVLChatSample, ProcessedSample, dict, dict]):
    """The baseline: the full HF processor in ``encode_sample``, then Energon's own ``PackingDataset``.

    Every buffered sample is fully processed (pixel tensors held in the buffer); each buffer
    of ``packing_buffer_size`` samples is packed first-fit-decreasing into rows of ``seq_length``
    tokens (overlong samples dropped). Each row carries ``__stats__`` with the bytes and sample
    count of the worker's last full buffer, as the packing loader's rows carry theirs.
    """

    decoder = None

    def __init__(self, processor: Any, *, seq_length: int) -> None:
        super().__init__()
        self.processor = processor
        self.seq_length = seq_length
        self._buffer_bytes = 0
        self._buffer_samples = 0

    @stateless
    def encode_sample(self, sample: QwenVLChatSample) -> ProcessedSample:
        outputs = hf_processor_outputs(self.processor, sample.conversation, sample.images, sample.videos)
        visual = {name: outputs.get(name) for name in PROCESSED_FIELDS}
        return ProcessedSample.derive_from(sample, input_ids=outputs["input_ids"][0], **visual)

    def select_samples_to_pack(self, samples: list[ProcessedSample]) -> list[list[ProcessedSample]]:
        from energon_pack.packing.algorithms import first_fit_decreasing

        self._buffer_bytes = sum(s.nbytes() for s in samples)
        self._buffer_samples = len(samples)
        fitting = [s for s in samples if s.input_ids.numel() <= self.seq_length]
        bins = first_fit_decreasing([s.input_ids.numel() for s in fitting], self.seq_length)
        return [[fitting[i] for i in positions] for positions in bins]

    def pack_selected_samples(self, samples: list[ProcessedSample]) -> dict:
        lengths = torch.tensor([0] + [s.input_ids.numel() for s in samples])
        input_ids = torch.full((1, self.seq_length), int(self.processor.tokenizer.pad_token_id), dtype=torch.int64)
        tokens = torch.cat([s.input_ids for s in samples])
        input_ids[0, : tokens.numel()] = tokens
        row: dict[str, Any] = {
            "input_ids": input_ids,
            "cu_seqlens_q": torch.cumsum(lengths, 0).to(torch.int32),
            "__keys__": [s.__key__ for s in samples],
            "__restore_key__": (),
            "__stats__": {"buffered_bytes": self._buffer_bytes, "buffered_samples": self._buffer_samples},
        }
        for name in PROCESSED_FIELDS:
            present = [getattr(s, name) for s in samples if getattr(s, name) is not None]
            row[name] = torch.cat(present) if present else None
        return row

    @stateless
    def batch(self, rows: list[dict]) -> dict:
        return rows[0]


def bench_dataset(work_dir: Path, num_samples: int, *, seed: int = 0) -> Path:
    """The benchmark mix of `bench_samples` prepared (once) as an Energon dataset; returns its path."""
    from energon_pack.prepare import prepare_dataset

    bench_samples(work_dir, num_samples, seed=seed)
    raw = Path(work_dir) / f"mix-{num_samples}-{seed}"
    out = Path(work_dir) / f"dataset-{num_samples}-{seed}"
    if not (out / ".nv-meta" / "dataset.yaml").exists():
        prepare_dataset(raw / "records.jsonl", raw, out, samples_per_shard=16, progress=False)
    return out


def worker_peak_rss(exclude: set[int]) -> int:
    """Largest ``VmHWM`` (bytes) among this process's child processes not in ``exclude``."""
    import psutil

    from energon_pack.stats import peak_rss_bytes

    peak = 0
    for child in psutil.Process().children(recursive=True):
        if child.pid in exclude:
            continue
        try:
            peak = max(peak, peak_rss_bytes(child.pid))
        except psutil.NoSuchProcess:  # the worker just exited
            continue
    return peak


def measure_loader(loader: Any, desc: str, *, row_width: int) -> dict[str, float]:
    """Run ``loader`` to its end: samples/s, rows, fill of ``row_width``-token rows, worker RSS, buffered bytes.

    Worker peak RSS is read from ``/proc/<pid>/status`` of the child processes after every row
    (forked workers start at the parent's RSS, so the growth over it is reported too);
    buffered bytes come from each row's ``__stats__`` telemetry.
    """
    import psutil
    from tqdm import tqdm

    parent = psutil.Process()
    before = {child.pid for child in parent.children(recursive=True)}
    parent_rss = parent.memory_info().rss
    samples = rows = real_tokens = 0
    peak_rss = buffered_bytes = buffered_samples = peak_buffered = 0
    start = time.perf_counter()
    for row in tqdm(iter(loader), desc=desc, unit="row"):
        rows += 1
        samples += len(row["__keys__"])
        real_tokens += int(row["cu_seqlens_q"][-1])
        telemetry = row["__stats__"]
        buffered_bytes += telemetry["buffered_bytes"]
        buffered_samples += telemetry["buffered_samples"]
        peak_buffered = max(peak_buffered, telemetry["buffered_bytes"])
        peak_rss = max(peak_rss, worker_peak_rss(before))
    seconds = time.perf_counter() - start
    return {
        "samples": samples,
        "rows": rows,
        "fill": real_tokens / (rows * row_width) if rows else 0.0,
        "samples_per_s": samples / seconds,
        "worker_peak_rss": peak_rss,
        "worker_rss_growth": peak_rss - parent_rss,
        "buffered_per_sample": buffered_bytes / buffered_samples if buffered_samples else 0.0,
        "peak_buffered": peak_buffered,
    }


def bench_loader(num_samples: int, work_dir: Path) -> BenchRows:
    """The whole packing loader vs the HF-processor-in-``encode_sample`` loader (2 workers each).

    Same prepared dataset, row width, buffer size and worker count. The two loaders take turns
    (`LOADER_EPOCHS` finite epochs each, alternating which goes first); samples/s is the best
    epoch of each, worker RSS the largest, the other figures are the same every epoch.
    """
    from megatron.energon import SavableDataLoader, WorkerConfig, get_train_dataset

    from energon_pack.config import PackingConfig
    from energon_pack.loader import get_packing_loader
    from energon_pack.qwen.processor import load_processor

    dataset = bench_dataset(work_dir, num_samples)
    processor = load_processor()
    config = PackingConfig(
        seq_length=LOADER_ROW_WIDTH, buffer_size=LOADER_BUFFER_SIZE, num_workers=LOADER_WORKERS, repeat=False
    )

    def ours_loader() -> Any:
        return get_packing_loader(dataset, config, processor)

    def baseline_loader() -> Any:
        baseline_dataset = get_train_dataset(
            dataset,
            worker_config=WorkerConfig(rank=0, world_size=1, num_workers=LOADER_WORKERS, seed_offset=config.seed),
            batch_size=1,
            packing_buffer_size=LOADER_BUFFER_SIZE,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
            task_encoder=HFProcessorPackingTaskEncoder(processor, seq_length=LOADER_ROW_WIDTH),
            repeat=False,
        )
        return SavableDataLoader(baseline_dataset)

    loaders = {"ours": ours_loader, "HF": baseline_loader}
    epochs: dict[str, list[dict[str, float]]] = {"ours": [], "HF": []}
    for epoch in range(LOADER_EPOCHS):
        for side in loaders if epoch % 2 == 0 else reversed(loaders):
            run = measure_loader(loaders[side](), f"{side} loader, epoch {epoch + 1}", row_width=LOADER_ROW_WIDTH)
            epochs[side].append(run)
    summary: dict[str, dict[str, float]] = {}
    for side, runs in epochs.items():
        summary[side] = dict(runs[0])
        for key in ("samples_per_s", "worker_peak_rss", "worker_rss_growth"):
            summary[side][key] = max(run[key] for run in runs)

    def row(what: str, key: str, scale: float = 1.0) -> dict[str, Any]:
        ours_value, hf_value = summary["ours"][key] / scale, summary["HF"][key] / scale
        ratio = ours_value / hf_value if hf_value else float("nan")
        return {"what": what, "ours": ours_value, "HF": hf_value, "ratio": ratio}

    return [
        row(f"samples/s (whole loader, best of {LOADER_EPOCHS} epochs)", "samples_per_s"),
        row(f"fill (real tokens / rows*{LOADER_ROW_WIDTH})", "fill"),
        row("rows", "rows"),
        row("samples packed", "samples"),
        row("worker peak RSS (MiB)", "worker_peak_rss", 2**20),
        row("worker peak RSS over the parent's (MiB)", "worker_rss_growth", 2**20),
        row("buffered KiB per sample", "buffered_per_sample", 2**10),
        row("peak buffered MiB per worker", "peak_buffered", 2**20),
    ]


#: Stage name -> benchmark; other stages register here (``bench_postencode``, ``bench_loader``).
BENCHES: dict[str, Callable[[int, Path], BenchRows]] = {
    "preencode": bench_preencode,
    "postencode": bench_postencode,
    "loader": bench_loader,
}
#: Stages of ``--stage all``, in run order.
STAGES: tuple[str, ...] = ("preencode", "postencode", "loader")


def run_bench(args: argparse.Namespace) -> int:
    """Run ``args.stage`` ("all" = every stage in `STAGES`) on ``args.samples`` samples; print one table per stage."""
    from energon_pack.cache import cache_dir

    work_dir = Path(args.out) if args.out is not None else cache_dir("bench")
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
