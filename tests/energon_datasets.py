"""Datasets of Energon's own kinds, written the way a user of Energon writes them: WebDataset tar
shards of plain members (``<key>.jpg``, ``<key>.txt``, ``<key>.json``, ...), then Energon's own
``energon prepare`` command (non-interactive) for the index, the split and ``.nv-meta/dataset.yaml``
(``--sample-type`` with ``--field-map``, or a ``sample_loader.py``, or ``CrudeWebdataset``).
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from click.testing import CliRunner

from energon_pack.data.synthetic import encode_image, encode_video


def small_jpeg(seed: int, size: tuple[int, int] = (56, 84)) -> bytes:
    """A small JPEG of smooth random colours (height, width)."""
    rng = np.random.default_rng(seed)
    corners = rng.integers(0, 256, (2, 2, 3)).astype(np.float32)
    ys, xs = np.linspace(0, 1, size[0])[:, None, None], np.linspace(0, 1, size[1])[None, :, None]
    pixels = (corners[0, 0] * (1 - ys) * (1 - xs) + corners[0, 1] * (1 - ys) * xs
              + corners[1, 0] * ys * (1 - xs) + corners[1, 1] * ys * xs)
    return encode_image(pixels.astype(np.uint8), "JPEG", "RGB")


def small_mp4(seed: int, frames: int = 8, size: tuple[int, int] = (64, 96), fps: int = 4) -> bytes:
    """A short MP4 (H.264) of moving colours."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 200, (1, 1, 3))
    video = np.stack([np.broadcast_to(base + 6 * t, (*size, 3)) for t in range(frames)]).astype(np.uint8)
    return encode_video(video, fps, preset="ultrafast")


def member_bytes(value: Any) -> bytes:
    """A member's stored bytes: bytes as they are, text as UTF-8, anything else as JSON."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    return json.dumps(value).encode("utf-8")


def write_shards(root: Path, samples: Sequence[Mapping[str, Any]], *, per_shard: int = 4) -> None:
    """Write ``samples`` (``{"__key__": k, ext: value}``) as ``root/shard-NNNNNN.tar`` files of ``per_shard``."""
    root.mkdir(parents=True, exist_ok=True)
    for start in range(0, len(samples), per_shard):
        with tarfile.open(root / f"shard-{start // per_shard:06d}.tar", "w") as tar:
            for sample in samples[start : start + per_shard]:
                for extension, value in sample.items():
                    if extension == "__key__":
                        continue
                    data = member_bytes(value)
                    info = tarfile.TarInfo(f"{sample['__key__']}.{extension}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))


def energon_prepare(root: Path, *, sample_type: str, field_map: Mapping[str, str] | None = None,
                    sample_loader: str | None = None) -> None:
    """Run Energon's ``energon prepare`` on ``root`` as a user does (all samples in ``train``).

    ``field_map``: ``--field-map``; ``sample_loader``: the source of ``.nv-meta/sample_loader.py``
    (``energon prepare`` writes a template there when no field map is given; the user edits it).
    """
    from megatron.energon.tools.prepare import command

    args = [str(root), "--non-interactive", "--split-ratio", "1,0,0", "--sample-type", sample_type, "--no-progress"]
    if field_map is not None:
        args += ["--field-map", json.dumps(dict(field_map))]
    result = CliRunner().invoke(command, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    if sample_loader is not None:
        (root / ".nv-meta" / "sample_loader.py").write_text(sample_loader, encoding="utf-8")


def captioning_samples(n: int, *, seed: int = 0, prefix: str = "cap") -> list[dict[str, Any]]:
    """``n`` captioning samples: ``jpg`` + ``txt``."""
    return [{"__key__": f"{prefix}{i:03d}", "jpg": small_jpeg(seed + i), "txt": f"Caption number {i}: a smooth gradient."}
            for i in range(n)]


def make_captioning_dataset(root: Path, n: int = 6, *, seed: int = 0) -> list[dict[str, Any]]:
    """A ``CaptioningSample`` dataset (``field_map: {image: jpg, caption: txt}``); returns its samples."""
    samples = captioning_samples(n, seed=seed)
    write_shards(root, samples)
    energon_prepare(root, sample_type="CaptioningSample", field_map={"image": "jpg", "caption": "txt"})
    return samples


#: A VQA sample loader as a user writes it into the template ``energon prepare`` leaves.
VQA_SAMPLE_LOADER = '''
def sample_loader(raw: dict) -> dict:
    qa = raw["json"]
    return dict(
        __key__=raw["__key__"],
        image=raw["jpg"],
        context=qa["question"],
        answers=qa["answers"],
        answer_weights=qa.get("weights"),
    )


def part_filter(part: str) -> bool:
    return part in ("jpg", "json")
'''


def vqa_samples(n: int, *, seed: int = 100) -> list[dict[str, Any]]:
    """``n`` VQA samples (``jpg`` + ``json`` with question, answers and weights)."""
    return [
        {"__key__": f"vqa{i:03d}", "jpg": small_jpeg(seed + i),
         "json": {"question": f"What is in picture {i}?", "answers": ["colours", f"gradient {i}", "paint"],
                  "weights": [0.2, 0.5, 0.5] if i % 2 else [1.0, 0.0, 0.0]}}
        for i in range(n)
    ]


def make_vqa_dataset(root: Path, n: int = 6) -> list[dict[str, Any]]:
    """A ``VQASample`` dataset read by a ``sample_loader.py`` (``VQA_SAMPLE_LOADER``); returns its samples."""
    samples = vqa_samples(n)
    write_shards(root, samples)
    energon_prepare(root, sample_type="VQASample", sample_loader=VQA_SAMPLE_LOADER)
    return samples
