"""Blends of sources of very different lengths and what their rows carry, per source, measured from
the rows alone (``__subflavors__``, ``cu_seqlens_q``, ``loss_tokens``): the blend tests' helpers."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from energon_pack.data.blend_mix import BlendSource, make_blend, metadataset_yaml

#: About 200 real tokens a sample against about 2000 (one small image): a 1:1 sample blend gives
#: the short source about 10 % of the tokens. Answers vary widely in length: 5-95 % of a short
#: sample's text is its (supervised) answer, 2-50 % of a long one's.
SHORT = BlendSource(name="short", samples=400, mean_tokens=200, answer_fraction=0.5, answer_spread=0.45)
LONG = BlendSource(name="long", samples=100, mean_tokens=2000, answer_fraction=0.26, answer_spread=0.24, image_side=112)
MEDIUM = BlendSource(name="medium", samples=200, mean_tokens=700, answer_fraction=0.3)


def make_blends(root: Path) -> dict[str, Path]:
    """The blends of the tests under ``root``: ``two`` (short and long, 1:1) and ``three`` (short,
    medium, long at 0.6 / 0.3 / 0.1), their datasets prepared once."""
    two = make_blend(root, [SHORT, LONG], weights=[1, 1])
    two = two.rename(root / "two.yaml")
    three = make_blend(root, [SHORT, MEDIUM, LONG], weights=[0.6, 0.3, 0.1])
    three = three.rename(root / "three.yaml")
    return {"two": two, "three": three}


def write_blend(root: Path, name: str, names: Sequence[str], **weights_or_repetitions: Any) -> Path:
    """Another metadataset over the datasets already under ``root`` (``weights=`` or ``repetitions=``)."""
    path = root / f"{name}.yaml"
    path.write_text(metadataset_yaml(names, **weights_or_repetitions), encoding="utf-8")
    return path


def row_sources(row: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """Per source (subflavor ``source``) of a row: (real tokens, supervised tokens) of its segments."""
    cu = row["cu_seqlens_q"].tolist()
    out: dict[str, tuple[int, int]] = {}
    for index, subflavors in enumerate(row["__subflavors__"]):
        real, supervised = out.get(subflavors["source"], (0, 0))
        out[subflavors["source"]] = (real + cu[index + 1] - cu[index], supervised + int(row["loss_tokens"][index]))
    return out


def take_rows(loader: Iterable[dict[str, Any]], count: int, metrics: Any = None) -> list[dict[str, Any]]:
    """Per row: ``sources`` (``row_sources``), ``width`` and ``real`` tokens, for ``count`` rows; with
    ``metrics`` (a ``RowMetrics``) also ``logged``: the figures a trainer logs for a step of that one row."""
    return [
        {
            "sources": row_sources(row), "width": int(row["input_ids"].shape[1]), "real": int(row["cu_seqlens_q"][-1]),
            **({} if metrics is None else {"logged": metrics.reduce([metrics.metrics(row)])}),
        }
        for row in itertools.islice(loader, count)
    ]


def share(rows: Sequence[dict[str, Any]], source: str, *, supervised: bool = False) -> float:
    """``source``'s share of the rows' real (or supervised) tokens."""
    column = 1 if supervised else 0
    total = sum(counts[column] for row in rows for counts in row["sources"].values())
    return sum(row["sources"].get(source, (0, 0))[column] for row in rows) / total


def fill(rows: Sequence[dict[str, Any]]) -> float:
    """Real tokens over row slots."""
    return sum(row["real"] for row in rows) / sum(row["width"] for row in rows)
