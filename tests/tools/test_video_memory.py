"""Acceptance of issue 33: a long or high-resolution video's row is built at bounded worker memory,
with the Hugging Face processor's pixels.

Each build runs in a fresh process (tests/support/video_memory_worker.py): the peak RSS growth while
building the row, less the row's own pixel payload, must lie within
``qwen.pixels.video_memory_bound`` (docs/worker_memory.md) and at most 256 MB, for a 4K 60 s clip
and a 1080p 5-minute clip, default sampling and ``max_frames=64``. Clips are made once
(``energon_pack.tools.clips``) and cached under the temp dir, keyed by their parameters.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from energon_pack.qwen.pixels import video_memory_bound
from energon_pack.tools.clips import ClipSpec, cached_clip
from tests.support.paths import REPO
from tests.support.tensor_checks import max_abs_difference

CLIPS = Path(tempfile.gettempdir()) / "energon_pack_clips"
LIMIT = 256 << 20
#: Reference frames the bound assumes: H.264's maximum (16), and at 4K its level limit (6).
REFERENCE_FRAMES = {1080: 16, 2160: 6}


def build_row(clip: Path, family: str = "qwen2.5-vl", max_frames: int = 0, pixel_dtype: str = "uint8",
              threads: int = 1) -> dict:
    """The worker's figures (growth, payload bytes, grid, sampled frames) for one build."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.video_memory_worker", str(clip), family, str(max_frames), pixel_dtype, str(threads)],
        capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("spec", [
    ClipSpec(seconds=60, width=3840, height=2160, keyframe_seconds=2),
    ClipSpec(seconds=300, width=1920, height=1080, keyframe_seconds=2),
], ids=["4k_60s", "1080p_5min"])
@pytest.mark.parametrize("max_frames", [0, 64], ids=["default_sampling", "max_frames_64"])
def test_a_long_or_4k_video_row_is_built_within_the_bound(spec: ClipSpec, max_frames: int) -> None:
    figures = build_row(cached_clip(CLIPS, spec), max_frames=max_frames)
    grid = figures["grid"]
    bound = video_memory_bound(
        (spec.height, spec.width), (grid[1] * 14, grid[2] * 14), temporal_patch_size=2, float32=False,
        reference_frames=REFERENCE_FRAMES[spec.height],
    )
    above = figures["growth"] - figures["payload"]
    print(f"{spec.name} max_frames={max_frames}: {figures}; above the payload {above / 2**20:.1f} MiB, "
          f"bound {bound / 2**20:.1f} MiB")
    assert figures["frames"] == (64 if max_frames else min(768, spec.seconds * 2))
    assert above <= min(bound, LIMIT)


@pytest.mark.slow
def test_float32_payload_stays_within_the_bound() -> None:
    spec = ClipSpec(seconds=60, width=1920, height=1080, keyframe_seconds=2)
    figures = build_row(cached_clip(CLIPS, spec), pixel_dtype="float32")
    grid = figures["grid"]
    bound = video_memory_bound((spec.height, spec.width), (grid[1] * 14, grid[2] * 14), temporal_patch_size=2,
                               float32=True)
    assert figures["growth"] - figures["payload"] <= min(bound, LIMIT)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen2.5-vl", "qwen3-vl", "qwen3.5"])
def test_high_resolution_clip_pixels_equal_the_hf_processor(family: str, request: pytest.FixtureRequest) -> None:
    """A 1080p and a 4K clip (short: HF holds every frame): float32 segment pixels equal the processor's
    exactly, the uint8 payload its resized pixels; the frames are sought (a keyframe every 1 s, 2 fps sampling
    with max_frames 4) and resized one by one."""
    from energon_pack.config import PackingConfig
    from energon_pack.qwen.processor import load_processor
    from energon_pack.runtime.task_encoder import QwenVLPackingTaskEncoder
    from tests.support.golden_media import GoldenSample, chat_sample
    from tests.support.hf_reference import hf_reference

    processor = load_processor(family=family, max_frames=4)
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What?"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "That."}]}]
    for spec in (ClipSpec(seconds=6, width=1920, height=1080, keyframe_seconds=1),
                 ClipSpec(seconds=3, width=3840, height=2160, keyframe_seconds=1)):
        data = cached_clip(CLIPS, spec).read_bytes()
        sample = chat_sample(GoldenSample(messages, [], [data]), spec.name)
        reference = hf_reference(processor, messages, [], [data], max_frames=4)
        for dtype in ("float32", "uint8"):
            encoder = QwenVLPackingTaskEncoder(PackingConfig(seq_length=1 << 16, pixel_dtype=dtype), processor)
            assert encoder.chat._video_patcher is not None
            visual = encoder.postencode_sample(encoder.preencode_sample(sample)).segment.visual
            assert torch.equal(visual.video_grid_thw, reference["video_grid_thw"]), (spec.name, dtype)
            if dtype == "float32":
                assert torch.equal(visual.pixel_values_videos, reference["pixel_values_videos"]), spec.name
            else:
                normalised = visual.normalized_for_model()["pixel_values_videos"]
                assert max_abs_difference(normalised, reference["pixel_values_videos"]) <= 1e-6
