"""``energon-pack bench --stage loader``: the whole packing loader against a loader whose task
encoder runs the Hugging Face processor in ``encode_sample`` and packs each buffer
first-fit-decreasing with Energon's own ``PackingDataset`` (`HFProcessorPackingTaskEncoder`):
samples/s, fill, worker peak RSS and buffered bytes per sample."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

import torch
from megatron.energon import Sample, TaskEncoder
from megatron.energon.edataclass import edataclass
from megatron.energon.task_encoder.base import stateless

from energon_pack.samples import QwenVLChatSample
from energon_pack.tools.common import BenchRows, bench_dataset, hf_processor_outputs


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
    from energon_pack.pinning import pin_only_with_accelerator
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
        return pin_only_with_accelerator(SavableDataLoader(baseline_dataset))

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
