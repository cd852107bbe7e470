"""Facts of a dataset read in place, kept outside it: ``energon-pack plan`` on a dataset that
``energon-pack prepare`` did not write (a Megatron-Bridge dataset, ...) never writes into it
(datasets are often read-only or on object storage). Its measurement (tokens, ViT patches, media
count, FLOPs and skip reasons of every sample, from media headers) goes to
``<facts dir>/<dataset name>.<split>.facts.npz``; the next plan of the same dataset, processor and
packing settings reads it instead of preencoding again. The file records what it was measured
for (:func:`facts_key`: the dataset's shard table, the encoder and the packing fingerprint) and the
token-rules version it was counted under (``core.token_rules``); a file of another key or
version is measured again and replaced.

Example: ``kept_facts_path("/data/bridge_ds", "train", Path("plans"))`` ->
``Path("plans/bridge_ds.train.facts.npz")``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from energon_pack.core.token_rules import TOKEN_RULES_VERSION, recorded_rules, stale_rules

KEPT_FACTS_FORMAT = "energon_pack.kept_facts.v1"


def kept_facts_path(dataset: Any, split: str, facts_dir: Path) -> Path:
    """Where the facts of ``dataset``'s ``split`` are kept under ``facts_dir`` (see the module example)."""
    name = str(dataset).rstrip("/").rpartition("/")[2] or "dataset"
    return facts_dir / f"{name}.{split}.facts.npz"


def facts_key(fingerprint: Any) -> str:
    """A 16-hex-digit hash of a JSON-able fingerprint (``identity.plan_fingerprint``).

    Example: ``facts_key({"dataset": {"split": "train"}})`` -> ``"4b6c..."`` (the same for equal input).
    """
    return hashlib.sha256(json.dumps(fingerprint, sort_keys=True, default=str).encode()).hexdigest()[:16]


def save_kept_facts(path: Path, key: str, measurement: Any) -> None:
    """Write ``measurement`` (a ``plan.build.Measurement``) for ``key`` to ``path`` (atomically)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    meta = {"format": KEPT_FACTS_FORMAT, "key": key, "token_rules": TOKEN_RULES_VERSION, "skipped": dict(measurement.skipped),
            "per_worker": dict(measurement.per_worker)}
    with open(partial, "wb") as out:
        np.savez(out, tokens=measurement.tokens, vision=measurement.vision, media=measurement.media,
                 flops=measurement.flops, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8))
    os.replace(partial, path)


def load_kept_facts(path: Path, key: str) -> dict[str, Any] | str:
    """The ``Measurement`` fields kept at ``path`` for ``key``, or why there are none (a short phrase)."""
    if not path.is_file():
        return f"no kept facts at {path}"
    try:
        with np.load(path) as kept:
            meta = json.loads(kept["meta"].tobytes().decode())
            arrays = {name: kept[name].copy() for name in ("tokens", "vision", "media", "flops")}
    except (OSError, ValueError, KeyError) as err:
        return f"kept facts at {path} unreadable ({type(err).__name__})"
    stale = stale_rules(recorded_rules(meta), f"kept facts at {path}")
    if stale is not None:
        return stale
    if meta.get("format") != KEPT_FACTS_FORMAT or meta.get("key") != key:
        return f"kept facts at {path} were measured for another dataset, processor or packing config"
    return {**arrays, "skipped": Counter(meta["skipped"]), "per_worker": Counter(meta["per_worker"])}
