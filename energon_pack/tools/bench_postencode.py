"""``energon-pack bench --stage postencode``: postencode with float32 and uint8 payloads against
the Hugging Face processor call, per media class, and the pixel payload bytes of each."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from energon_pack.core.samples import QwenVLChatSample
from energon_pack.tools.common import BenchRows, bench_samples, hf_processor_outputs


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
    samples/s overall and per media class, pixel payload bytes, the largest pixel difference, and
    what recording the sample being decoded (``runtime.inflight``) costs per sample.
    """
    from tqdm import tqdm

    from energon_pack.config import PackingConfig
    from energon_pack.qwen.processor import load_processor
    from energon_pack.runtime.inflight import InflightRecorder
    from energon_pack.runtime.task_encoder import QwenVLPackingTaskEncoder

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
    # What a loader worker adds per sample to name the sample it dies on (runtime.inflight):
    # one record before preencode and one before postencode, each cleared after.
    recorder, recording = InflightRecorder(str(work_dir)), []
    for position, sample in enumerate(tqdm(samples, desc="postencode vs HF", unit="sample")):
        start = time.perf_counter()
        prepared = preencode(sample)
        elapsed = time.perf_counter() - start
        if prepared.skip_reason is not None:
            skipped += 1
            continue
        timings["preencode"].append(elapsed)
        start = time.perf_counter()
        for stage in ("preencode", "postencode"):
            with recorder.decoding(sample, stage):
                pass
        recording.append(time.perf_counter() - start)
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
    in_flight = np.asarray(recording)
    rows.append({
        "what": "us per sample, in-flight records (ratio: share of pre+postencode uint8)",
        "ours": in_flight.mean() * 1e6, "HF": "",
        "ratio": in_flight.sum() / (seconds["preencode"].sum() + seconds["uint8"].sum()),
    })
    rows.append({"what": "max |float32 pixels - HF pixels|", "ours": worst_difference, "HF": "", "ratio": ""})
    rows.append({"what": "samples measured / skipped", "ours": f"{len(classes)} / {skipped}", "HF": "", "ratio": ""})
    return rows
