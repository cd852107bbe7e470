"""``energon-pack bench --stage audio``: ours against the Hugging Face processor's 300-s padding."""

from __future__ import annotations

import math

import numpy as np
import pytest

from energon_pack.tools.audio_mix import AUDIO_MIX_FORMATS
from energon_pack.tools.bench_audio import bench_audio

# Slow: builds the offline Qwen2.5-Omni processor and pads two clips to 300 s.
pytestmark = pytest.mark.slow


def test_bench_audio_counts_real_and_padded_frames(tmp_path):
    features, frames, mib, *steps = bench_audio(2, tmp_path)
    seconds = np.random.default_rng(0).uniform(1, 30, 2)
    assert frames["HF"] == 2 * 30000
    # MP3 decoding adds the encoder delay: a little more than the clip's own frames.
    assert sum(math.ceil(s * 100) for s in seconds) <= frames["ours"] < sum(math.ceil(s * 100) for s in seconds) + 200
    assert mib["ours"] == round(frames["ours"] * 128 * 4 / 2**20, 1) and features["ours"] > 0 and features["HF"] > 0
    assert list(tmp_path.iterdir()) == []
    # Each step per mix format: ours against its reference (PyAV alone, torch.stft alone), timed.
    assert [row["what"].split(",")[0] for row in steps] == ["probe ms", "decode ms", "features ms"] * len(AUDIO_MIX_FORMATS)
    assert {row["what"].split(", ")[1].split(" ")[0] for row in steps} == set(AUDIO_MIX_FORMATS)
    for row in steps:
        assert row["ours"] >= 0 and row["HF"] > 0 and row["ratio"] == pytest.approx(row["ours"] / row["HF"], rel=0.02, abs=0.01)  # of rounded ms
