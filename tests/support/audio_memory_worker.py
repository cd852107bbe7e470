"""Run in a fresh process (tests/qwen/test_audio_memory.py, docs/worker_memory.md figures): preencode
and postencode one Qwen2.5-Omni audio chat and print, as JSON, the peak RSS growth of each step and
the features' bytes.

``python -m tests.support.audio_memory_worker CLIP [CLIP ...]``: one JSON line per clip. Peaks are the
kernel's VmHWM, reset before each step after the heap's free pages went back (as
``video_memory_worker`` does); the clip's bytes and the processor are loaded before, so they do not
count.
"""

from __future__ import annotations

import ctypes
import gc
import json
import sys
from pathlib import Path
from typing import Any

from tests.support.video_memory_worker import _status


def _reset() -> int:
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")
    return _status("VmRSS")


def main(clips: list[str]) -> list[dict[str, float]]:
    from energon_pack.config import PackingConfig
    from energon_pack.core.samples import QwenVLChatSample
    from energon_pack.qwen.processor import load_processor
    from energon_pack.runtime.task_encoder import QwenVLPackingTaskEncoder

    encoder = QwenVLPackingTaskEncoder(PackingConfig(seq_length=1 << 14), load_processor(family="qwen2.5-omni"))
    messages = [{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "What?"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "That."}]}]
    return [_measure(encoder, messages, Path(clip).read_bytes()) for clip in clips]


def _measure(encoder: Any, messages: list[dict[str, Any]], data: bytes) -> dict[str, float]:
    from energon_pack.core.samples import QwenVLChatSample

    sample = QwenVLChatSample(__key__="clip", __restore_key__=(), __subflavors__=None, __sources__=None,
                              conversation=messages, images=[], videos=[], audios=[data])
    before = _reset()
    prepared = encoder.preencode_sample(sample)
    preencode = _status("VmHWM") - before
    assert prepared.skip_reason is None, prepared.skip_detail
    before = _reset()
    audio = encoder.postencode_sample(prepared).segment.audio
    postencode = _status("VmHWM") - before
    return {"preencode": preencode, "postencode": postencode, "features": audio.input_features.numel() * 4,
            "frames": audio.frames, "samples": prepared.audio_samples[0]}


if __name__ == "__main__":
    for figures in main(sys.argv[1:]):
        print(json.dumps(figures))
