"""Run in a child process (tests/qwen/test_audio_fuzz.py): probe and decode every file of a folder as
an audio (``energon_pack.qwen.audio``) and print one JSON line per file: ``{"file", "outcome"}`` with
the outcome ``ok:<samples>`` or the skip reason. A crash (signal) or hang shows in the parent as a
non-zero exit status or a timeout, with the files reported so far.

``python -m tests.support.audio_fuzz_worker FOLDER``
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from energon_pack.errors import BadSampleError
from energon_pack.qwen.audio import AudioSpec, decode_audio, probe_audio


def main(folder: str) -> None:
    spec = AudioSpec()
    for path in sorted(Path(folder).iterdir()):
        try:
            info = probe_audio(path.read_bytes(), spec, count_up_to=spec.max_samples)
            outcome = f"ok:{decode_audio(path.read_bytes(), spec, expected_samples=info.samples).size}"
        except BadSampleError as err:
            outcome = err.reason
        print(json.dumps({"file": path.name, "outcome": outcome}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
