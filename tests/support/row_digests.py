"""Digests of what the loader yields (rows), saves (states) and plans (plan files), for the
byte-identity checks of ``tests/golden/test_row_digests.py``.

Only public names and ``energon_pack.plan.build`` are used, so the same code measures any
version of the package. Telemetry (``__stats__``: per-worker counters and stage seconds) is left
out; everything a trainer reads is in, but for ``segment_source`` (each segment's source, added by
issue 48): it is left out of the row digests, so the digests recorded before it still hold, and
``measure`` reports the values it takes instead (all 0 for this plain dataset).

Run ``python tests/support/row_digests.py > tests/support/golden_row_digests.json`` to record new golden digests
(only when a change is meant to alter rows, states or plans).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pickle
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch


#: Row keys the digests leave out (see the module doc).
LEFT_OUT = ("__stats__", "segment_source")


def update(hasher: Any, value: Any) -> None:
    """Feed ``value`` (tensors, arrays, dataclasses, mappings, sequences, scalars) into ``hasher``."""
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous().reshape(-1)
        hasher.update(f"T{tensor.dtype}{tuple(value.shape)}".encode())
        hasher.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    elif isinstance(value, np.ndarray):
        hasher.update(f"A{value.dtype}{value.shape}".encode() + np.ascontiguousarray(value).tobytes())
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        update(hasher, {f.name: getattr(value, f.name) for f in dataclasses.fields(value)})
    elif isinstance(value, dict):
        for key in sorted(value, key=str):
            if key not in LEFT_OUT:
                hasher.update(f"K{key}".encode())
                update(hasher, value[key])
    elif isinstance(value, (list, tuple)):
        hasher.update(f"L{len(value)}".encode())
        for item in value:
            update(hasher, item)
    else:
        hasher.update(f"V{value!r}".encode())


def row_sources(row: dict[str, Any]) -> list[int]:
    """The row's ``segment_source`` values ([] from a package older than the field)."""
    return row["segment_source"].tolist() if "segment_source" in row else []


def digest(value: Any) -> str:
    hasher = hashlib.sha256()
    update(hasher, value)
    return hasher.hexdigest()[:20]


def single_thread_encode_video(frames: Any, fps: int, *, codec: str = "libx264", preset: str | None = None) -> bytes:
    """MPEG-4 Part 2 MP4 of RGB frames on one thread: x264 output can differ from run to run here,
    and the digests need the same media every time (``codec`` and ``preset`` are ignored)."""
    import io
    import itertools
    from fractions import Fraction

    import av

    frames = iter(frames)
    first = next(frames)
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = container.add_stream("mpeg4", rate=Fraction(fps), options={"threads": "1"})
        stream.height, stream.width, stream.pix_fmt = first.shape[0], first.shape[1], "yuv420p"
        for frame in itertools.chain([first], frames):
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buffer.getvalue()


def measure(root: Path, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Rows of one epoch (online and planned), a mid-epoch state and the plan, as digests
    (``overrides``: config keys set on top of the measured config)."""
    from energon_pack import PackingConfig, SyntheticSpec, get_packing_loader, load_processor, make_synthetic_dataset
    from energon_pack.plan.build import build_plan

    synthetic = sys.modules[make_synthetic_dataset.__module__]
    encode_video, synthetic.encode_video = synthetic.encode_video, single_thread_encode_video
    try:  # restored after: later tests in the same process get the real encoder
        spec = SyntheticSpec(max_image_side=512, max_video_seconds=2.0, max_video_side=96)
        dataset = make_synthetic_dataset(root / "data", 40, seed=5, spec=spec, samples_per_shard=8).out_dir
    finally:
        synthetic.encode_video = encode_video
    processor = load_processor()
    config = PackingConfig(seq_length=2048, buffer_size=6, num_workers=0, repeat=False, **(overrides or {}))
    out: dict[str, Any] = {}
    sources: set[int] = set()
    with get_packing_loader(dataset, config, processor, split="train") as loader:
        rows = []
        for index, row in enumerate(loader):
            rows.append(digest(row))
            sources.update(row_sources(row))
            if index == 1:
                state = loader.save_state_rank()
                out["state"] = digest(pickle.dumps(state.energon_state)) + "/" + digest(state.fingerprint)
    out["online_rows"] = rows
    plan = build_plan(dataset, config, processor, progress=False)
    out["plan"] = digest([plan.fingerprint, plan.row_offsets, plan.member_shard, plan.member_index,
                          plan.member_tokens, plan.samples_in, plan.skipped])
    with get_packing_loader(dataset, config, processor, split="train", plan=plan) as loader:
        out["plan_rows"] = []
        for row in loader:
            out["plan_rows"].append(digest(row))
            sources.update(row_sources(row))
    out["segment_sources"] = sorted(sources)
    return out


#: The media knobs at the behaviour before they existed (stored pixels, PIL's own image limit):
#: states and plans measured so must equal those recorded before the knobs were added.
LEGACY_MEDIA = {"apply_exif_orientation": False, "max_image_pixels": 89_478_485}


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        out = measure(Path(tmp) / "now")
        legacy = measure(Path(tmp) / "legacy", LEGACY_MEDIA)
        out.update(legacy_media_state=legacy["state"], legacy_media_plan=legacy["plan"])
        json.dump(out, sys.stdout, indent=1)
        print()
