"""Fuzzed audio files (bit flips, cuts, garbage runs, swapped headers in every container/codec) are
probed and decoded in a child process: each ends as a decode or a counted skip reason, with no crash
and no hang (docs/bad_input_policy.md)."""

from __future__ import annotations

import json
from collections import Counter
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.support.audio_media import CODECS, encode_audio, tone
from tests.support.paths import REPO

# Slow: a child process (imports) decoding ~80 fuzzed files.
pytestmark = pytest.mark.slow

RATES = {"ogg_opus": (48000, 2), "webm_opus": (16000, 1), "ogg_vorbis": (44100, 2)}
REASONS = {"corrupt_audio", "empty_audio", "undecodable_audio"}


def _mutations(data: bytes, rng: np.random.Generator) -> dict[str, bytes]:
    raw = np.frombuffer(data, dtype=np.uint8)
    flipped = raw.copy()
    spots = rng.integers(0, raw.size, max(1, raw.size // 200))
    flipped[spots] ^= rng.integers(1, 256, spots.size, dtype=np.uint8)
    header = raw.copy()
    header[: min(64, raw.size)] = rng.integers(0, 256, min(64, raw.size), dtype=np.uint8)
    middle = raw.size // 2
    garbage = np.concatenate([raw[:middle], rng.integers(0, 256, 4096, dtype=np.uint8), raw[middle:]])
    return {
        "flips": flipped.tobytes(),
        "header": header.tobytes(),
        "cut_half": data[: raw.size // 2],
        "cut_head": data[:40],
        "garbage_run": garbage.tobytes(),
        "tail_only": data[raw.size // 2 :],
        "zeros": bytes(raw.size),
        "doubled": data + data,
    }


def test_fuzzed_audio_never_crashes_or_hangs(tmp_path: Path):
    rng = np.random.default_rng(42)
    expected = []
    for codec in CODECS:
        rate, channels = RATES.get(codec, (16000, 1))
        data = encode_audio(tone(0.8, rate, channels), rate, codec)
        for name, mutated in _mutations(data, rng).items():
            path = tmp_path / f"{codec}.{name}.{CODECS[codec][3]}"
            path.write_bytes(mutated)
            expected.append(path.name)
    run = subprocess.run(
        [sys.executable, "-m", "tests.support.audio_fuzz_worker", str(tmp_path)], cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300,
    )
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert run.returncode == 0, f"child died ({run.returncode}) after {len(lines)} files: {run.stderr[-2000:]}"
    outcomes = {line["file"]: line["outcome"] for line in lines}
    assert sorted(outcomes) == sorted(expected)
    assert all(o.startswith("ok:") or o in REASONS for o in outcomes.values()), outcomes
    print("fuzzed audio outcomes:", sorted(Counter(o.split(":")[0] for o in outcomes.values()).items()))
    assert sum(o in REASONS for o in outcomes.values()) >= len(CODECS)  # the fuzzing does break files
