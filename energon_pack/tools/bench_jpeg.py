"""``energon-pack bench --stage jpeg``: the optional fast JPEG decode against the exact path.

For every JPEG of the bench mix whose resized size is at most half its own (the images
``fast_jpeg_decode`` changes), both paths run on the same bytes, interleaved: the exact path
(full decode, the processor's resize) and the fast one (DCT-domain decode at 1/2-1/8 scale,
bicubic to the target size, then the processor). Reported: images/s of each, and the
difference of the uint8 patches: largest absolute difference and PSNR over all of them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from energon_pack.core.samples import QwenVLChatSample
from energon_pack.tools.common import BenchRows, bench_samples

__all__ = ["bench_fast_jpeg", "bench_jpeg", "psnr"]


def psnr(squared_error: float, count: int, peak: float = 255.0) -> float:
    """Peak signal-to-noise ratio in dB of ``count`` values with summed ``squared_error``; inf when equal.

    Example: ``psnr(4.0 * 100, 100)`` (every value off by 2) -> 42.11.
    """
    if squared_error == 0:
        return math.inf
    return 10 * math.log10(peak**2 / (squared_error / count))


def bench_fast_jpeg(samples: Sequence[QwenVLChatSample]) -> list[dict[str, Any]]:
    """Fast vs exact JPEG decode on the JPEGs of ``samples`` (the bench mix) that the fast path changes."""
    from tqdm import tqdm

    from energon_pack.qwen.geometry import VisionSpec, image_grid
    from energon_pack.qwen.media import probe_image
    from energon_pack.qwen.pixels import image_pixels
    from energon_pack.qwen.processor import load_processor

    processor = load_processor()
    spec = VisionSpec.from_processor(processor)
    jpegs = []
    for sample in samples:
        for data in sample.images:
            info = probe_image(data)
            grid = np.array([image_grid(info.height, info.width, spec)])
            if data[:2] == b"\xff\xd8" and 2 * grid[0, 1] * spec.patch_size <= info.height and 2 * grid[0, 2] * spec.patch_size <= info.width:
                jpegs.append((data, grid))
    seconds = {False: 0.0, True: 0.0}
    worst, squared, count = 0.0, 0.0, 0
    for position, (data, grid) in enumerate(tqdm(jpegs, desc="fast vs exact JPEG", unit="image")):
        pixels = {}
        for fast in (False, True) if position % 2 == 0 else (True, False):
            start = time.perf_counter()
            pixels[fast] = image_pixels(processor, [data], grid, uint8=True, fast_jpeg=fast)
            seconds[fast] += time.perf_counter() - start
        difference = pixels[True].double() - pixels[False].double()
        worst = max(worst, float(difference.abs().max()))
        squared += float((difference**2).sum())
        count += difference.numel()
    rate = {fast: len(jpegs) / value if value else 0.0 for fast, value in seconds.items()}
    return [
        {"what": "images/s (JPEGs downscaled >= 2x)", "ours": rate[True], "HF": rate[False],
         "ratio": rate[True] / rate[False] if rate[False] else float("nan")},
        {"what": "max |fast - exact| (uint8 patches)", "ours": worst, "HF": "", "ratio": ""},
        {"what": "PSNR fast vs exact (dB)", "ours": psnr(squared, count), "HF": "", "ratio": ""},
        {"what": "JPEGs measured", "ours": len(jpegs), "HF": "", "ratio": ""},
    ]


def bench_jpeg(num_samples: int, work_dir: Path) -> BenchRows:
    """Fast JPEG decode ("ours") vs the exact path ("HF") on the bench mix of ``num_samples`` samples."""
    return bench_fast_jpeg(bench_samples(work_dir, num_samples))
