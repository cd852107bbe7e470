"""Synthetic metadataset blends of sources whose samples differ greatly in length, for the blend
bench (``energon-pack bench --stage blend``), the "Mixing by tokens" tutorial and the tests.

``make_blend(root, sources, weights=...)`` prepares one energon_pack dataset per source under
``root`` and writes ``root/blend.yaml``, an Energon metadataset (v2) blending them (``blend`` with
``weight:``, or ``blend_epochized`` with ``repetitions:``); each entry carries the subflavor
``{"source": name}``, so a row tells where each of its segments came from (``__subflavors__``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from energon_pack.data.prepare import prepare_dataset
from energon_pack.data.synthetic import _WORDS, _smooth_pixels, encode_image

#: Approximate tokens of the chat template around one question and answer (Qwen's default system
#: prompt and role markers), and tokens per generated word.
TEMPLATE_TOKENS = 30
TOKENS_PER_WORD = 1.0


@dataclass(frozen=True, kw_only=True)
class BlendSource:
    """One source of a synthetic blend.

    name: dataset folder and subflavor ``source``. samples: records written (a weighted blend loops
    over them). mean_tokens: about how many real tokens a sample has (each sample within +-30 %).
    answer_fraction: the share of a sample's text in its answer (the supervised part).
    answer_spread: each sample's share drawn uniformly within +- this of ``answer_fraction``
    (clipped to 0.02..0.98): 0 gives every answer the same share of its sample.
    image_side: each sample has one square JPEG of this side (None: text only).
    """

    name: str
    samples: int
    mean_tokens: int
    answer_fraction: float = 0.5
    answer_spread: float = 0.0
    image_side: int | None = None


def _words(rng: np.random.Generator, count: int) -> str:
    return " ".join(rng.choice(_WORDS, size=max(1, count)))


def write_source_records(raw_dir: Path, source: BlendSource, *, seed: int) -> Path:
    """Records (and their images) of one source under ``raw_dir``; the JSONL path. Keys are
    ``<name>-<index>``. Image tokens count toward ``mean_tokens``: a side of s pixels adds about
    (s / 28)^2 tokens (Qwen2.5-VL's 28-pixel merged patch)."""
    raw_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    image_tokens = 0 if source.image_side is None else (source.image_side // 28) ** 2
    path = raw_dir / "records.jsonl"
    with path.open("w", encoding="utf-8") as out:
        for index in range(source.samples):
            text_tokens = source.mean_tokens * rng.uniform(0.7, 1.3) - TEMPLATE_TOKENS - image_tokens
            words = max(2, int(text_tokens / TOKENS_PER_WORD))
            fraction = source.answer_fraction
            if source.answer_spread:
                fraction = min(0.98, max(0.02, fraction + rng.uniform(-source.answer_spread, source.answer_spread)))
            answer = max(1, int(words * fraction))
            images = []
            if source.image_side is not None:
                name = f"{source.name}_{index:05d}.jpg"
                pixels = _smooth_pixels(rng, source.image_side, source.image_side)
                (raw_dir / name).write_bytes(encode_image(pixels, "JPEG", "RGB"))
                images.append(name)
            question = "<image>\n" * len(images) + _words(rng, words - answer)
            record = {
                "id": f"{source.name}-{index:05d}",
                "messages": [{"role": "user", "content": question}, {"role": "assistant", "content": _words(rng, answer)}],
                "images": images,
                "videos": [],
            }
            out.write(json.dumps(record) + "\n")
    return path


def metadataset_yaml(names: Sequence[str], *, weights: Sequence[float] | None = None,
                     repetitions: Sequence[float] | None = None) -> str:
    """An Energon metadataset (v2) blending the datasets ``./<name>`` with ``weights`` (``blend``) or
    ``repetitions`` (``blend_epochized``), each entry with subflavors ``{source: name}``.

    Example: ``metadataset_yaml(["short", "long"], weights=[1, 1])`` -> a ``blend`` of two entries of weight 1.
    """
    if (weights is None) == (repetitions is None):
        raise ValueError("metadataset_yaml takes weights (blend) or repetitions (blend_epochized), exactly one")
    key, kind, values = ("blend", "weight", weights) if weights is not None else ("blend_epochized", "repetitions", repetitions)
    entries = [{kind: value, "path": f"./{name}", "subflavors": {"source": name}} for name, value in zip(names, values)]
    document = {"__module__": "megatron.energon", "__class__": "MetadatasetV2", "splits": {"train": {key: entries}}}
    return yaml.safe_dump(document, sort_keys=False)


def make_blend(
    root: str | Path,
    sources: Sequence[BlendSource],
    *,
    weights: Sequence[float] | None = None,
    repetitions: Sequence[float] | None = None,
    seed: int = 0,
    samples_per_shard: int = 64,
) -> Path:
    """Prepare each source as ``root/<name>`` (once: an existing dataset is kept) and write
    ``root/blend.yaml`` blending them; returns the yaml's path."""
    root = Path(root)
    for offset, source in enumerate(sources):
        if not (root / source.name / ".nv-meta" / "dataset.yaml").exists():
            raw = root / f"{source.name}_raw"
            records = write_source_records(raw, source, seed=seed + offset)
            report = prepare_dataset(records, raw, root / source.name, samples_per_shard=samples_per_shard, progress=False)
            if report.written != source.samples:
                raise RuntimeError(f"{source.name}: prepared {report.written} of {source.samples} records: {report.problems}")
    path = root / "blend.yaml"
    path.write_text(metadataset_yaml([s.name for s in sources], weights=weights, repetitions=repetitions), encoding="utf-8")
    return path
