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

# Slow: encodes a 30-minute and a 10-minute file, then decodes 300 s of each in a child process.
pytestmark = pytest.mark.slow

#: docs/worker_memory.md: peak growth per audio at the 300-s cap, whatever the file's length.
BOUND = 320 * 2**20


@pytest.mark.parametrize(("codec", "minutes"), [("wav_s16", 30), ("mp3", 10)])
def test_long_audio_memory_is_bounded(tmp_path: Path, codec: str, minutes: int):
    signal = (0.1 * np.random.default_rng(0).standard_normal((1, minutes * 60 * 16000))).astype(np.float32)
    clip = tmp_path / f"long.{codec}"
    clip.write_bytes(encode_audio(signal, 16000, codec))
    del signal
    out = subprocess.run([sys.executable, "-m", "tests.support.audio_memory_worker", str(clip)],
                         cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300,
                         check=True)
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    print(codec, minutes, {k: v / 2**20 if k in ("preencode", "postencode", "features") else v for k, v in figures.items()})
    assert figures["frames"] == 30000 and figures["features"] == 128 * 30000 * 4
    assert figures["preencode"] < 32 * 2**20  # a header read, or a counted decode one frame at a time
    assert figures["postencode"] < BOUND
