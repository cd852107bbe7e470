"""Run in a fresh process (tests/tools/test_video_memory.py, ``energon_pack.tools`` figures): build one
video's row segment and print, as JSON, the process's peak RSS growth while building it and the
segment's pixel payload bytes.

``python -m tests.support.video_memory_worker CLIP FAMILY MAX_FRAMES PIXEL_DTYPE DECODE_THREADS`` (MAX_FRAMES 0:
the processor's default). The peak is the kernel's VmHWM, reset just before the build
(``/proc/self/clear_refs`` 5) after the heap's free pages went back to the kernel (``malloc_trim``),
so loading the processor and preencode do not count and memory they freed cannot hide the build's.
"""

from __future__ import annotations

import ctypes
import gc
import json
import sys
from pathlib import Path


def _status(field: str) -> int:
    """A ``/proc/self/status`` memory field in bytes (``VmRSS``, ``VmHWM``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def main(clip: str, family: str, max_frames: int, pixel_dtype: str, decode_threads: int) -> dict[str, float]:
    from energon_pack.config import PackingConfig
    from energon_pack.qwen.processor import load_processor
    from energon_pack.runtime.task_encoder import QwenVLPackingTaskEncoder
    from tests.support.golden_media import GoldenSample, chat_sample

    processor = load_processor(family=family, max_frames=max_frames or None)
    config = PackingConfig(seq_length=1 << 20, pixel_dtype=pixel_dtype, decode_threads=decode_threads)
    encoder = QwenVLPackingTaskEncoder(config, processor)
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What?"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "That."}]}]
    sample = chat_sample(GoldenSample(messages, [], [Path(clip).read_bytes()]), "clip")
    prepared = encoder.preencode_sample(sample)
    assert prepared.skip_reason is None, prepared.skip_reason
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed heap pages go back: they cannot hide the build's own
    Path("/proc/self/clear_refs").write_text("5")
    before = _status("VmRSS")
    segment = encoder.postencode_sample(prepared).segment
    peak = _status("VmHWM")
    payload = segment.visual.pixel_values_videos
    grid = segment.visual.video_grid_thw[0].tolist()
    return {"growth": peak - before, "payload": payload.numel() * payload.element_size(), "grid": grid,
            "frames": len(prepared.video_timings[0].frame_indices)}


if __name__ == "__main__":
    clip, family, max_frames, pixel_dtype, threads = sys.argv[1:6]
    print(json.dumps(main(clip, family, int(max_frames), pixel_dtype, int(threads))))
