"""``energon-pack bench --stage preencode``: preencode (tokens from media headers) against the
full Hugging Face processor call, and the bytes a buffered sample holds against the bytes of the
processor output."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from energon_pack.core.samples import QwenVLChatSample
from energon_pack.tools.common import BenchRows, bench_samples, hf_processor_outputs, tensor_bytes


def bench_preencode(num_samples: int, work_dir: Path) -> BenchRows:
    """Preencode vs the full HF processor on the same samples: speed, bytes held, identical ids."""
    import torch
    from tqdm import tqdm

    from energon_pack.config import PackingConfig
    from energon_pack.qwen.processor import load_processor
    from energon_pack.runtime.task_encoder import QwenVLPackingTaskEncoder

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
