"""A long audio (30 minutes) costs a worker what the 300 s the model hears cost: bounded by the
features plus a constant (docs/worker_memory.md), measured in a fresh process
(tests/support/audio_memory_worker.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.support.audio_media import encode_audio
from tests.support.paths import REPO

# Slow: encodes a 30-minute and a 6-minute file, then decodes 300 s of each in a child process.
pytestmark = pytest.mark.slow

#: docs/worker_memory.md: peak growth per audio at the 300-s cap, whatever the file's length.
BOUND = 320 * 2**20


def test_long_audio_memory_is_bounded(tmp_path: Path):
    """A 30-minute 16 kHz WAV (length from the header) and a 6-minute 8 kHz MP3 (length counted by
    decoding, up to the cap): both read 300 s; preencode holds next to nothing, postencode < BOUND."""
    rng = np.random.default_rng(0)
    clips = []
    for codec, minutes, rate in (("wav_s16", 30, 16000), ("mp3", 6, 8000)):
        clip = tmp_path / f"long.{codec}"
        clip.write_bytes(encode_audio((0.1 * rng.standard_normal((1, minutes * 60 * rate))).astype(np.float32), rate, codec))
        clips.append(str(clip))
    out = subprocess.run([sys.executable, "-m", "tests.support.audio_memory_worker", *clips],
                         cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300,
                         check=True)
    for clip, line in zip(clips, out.stdout.strip().splitlines()[-2:]):
        figures = json.loads(line)
        print(clip, {k: v / 2**20 if k in ("preencode", "postencode", "features") else v for k, v in figures.items()})
        assert figures["frames"] == 30000 and figures["features"] == 128 * 30000 * 4
        assert figures["preencode"] < 32 * 2**20  # a header read, or a counted decode one frame at a time
        assert figures["postencode"] < BOUND
