"""``energon-pack merge OUT``: the metadata of a dataset written by ``prepare --part I/N`` runs.

Each part run writes its shards and a part manifest (``prepare.PART_MANIFEST``: the part, the
run's records digest and options, its shards' sizes, counts, media, problems and per-sample
facts, and the token-rules version they were measured under) into ``OUT``. Merge checks that all N parts of one run are there with their shards, then writes
Energon's index and ``split.yaml``, ``dataset.yaml`` and the facts sidecar, exactly as a single
``prepare`` does, and removes the manifests. Nothing reads the records or media again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from energon_pack.core.token_rules import recorded_rules, stale_rules
from energon_pack.data.prepare import (
    PART_FORMAT,
    PART_MANIFEST,
    PrepareReport,
    check_splits_filled,
    check_written,
    part_manifests,
    write_energon_metadata,
)
from energon_pack.errors import UsageError

__all__ = ["merge_parts"]


def merge_parts(out_dir: str | Path) -> PrepareReport:
    """Write the index, splits, ``dataset.yaml`` and facts of the parts in ``out_dir``; return
    their report summed (as a single run's). Raises ``UsageError`` naming the fix when a part is
    missing, comes from another run or lost a shard, ``PrepareError`` when the data make no
    dataset (no good record, an empty split)."""
    from energon_pack.data.facts import FactsRecorder

    out = _check_folder(out_dir)
    paths = part_manifests(out)
    manifests = [_load(path) for path in paths]
    first = _check_one_run(manifests)
    _check_shards(out, manifests)
    report = PrepareReport(out_dir=out)
    recorder = FactsRecorder(fingerprint=first["run"]["processor"])
    for manifest in manifests:
        report.add_json(manifest["report"])
        for key, facts in manifest["facts"].items():
            recorder.add(key, facts)
    check_written(report, first["input"])
    check_splits_filled(first["run"]["split_ratio"], report.split_counts)
    write_energon_metadata(out, report.shards)
    recorder.write(out)
    for path in paths:
        path.unlink()
    return report


def _check_folder(out_dir: str | Path) -> Path:
    """The local folder ``out_dir`` holding part manifests, else ``UsageError`` naming the fix."""
    if str(out_dir).startswith("msc://"):
        raise UsageError(
            f"merge needs a local folder, not {str(out_dir)!r}; fix: run merge where the parts' --out folder is "
            "mounted (prepare --part writes local folders)"
        )
    out = Path(out_dir)
    if not out.is_dir():
        raise UsageError(
            f"{str(out)!r} is not a folder; fix: pass the --out folder of the `energon-pack prepare --part I/N` runs"
        )
    if not part_manifests(out):
        if (out / ".nv-meta" / "index.sqlite").exists():
            raise UsageError(
                f"{str(out)!r} is a finished dataset (a plain prepare, or merged already): no part manifest "
                f"{PART_MANIFEST.format(part='I', parts='N')} is left in its .nv-meta; fix: nothing to merge, use it as it is"
            )
        raise UsageError(
            f"{str(out)!r} holds no part manifest .nv-meta/{PART_MANIFEST.format(part='I', parts='N')}; fix: run "
            "`energon-pack prepare ... --part I/N --out` this folder for every I first"
        )
    return out


def _load(path: Path) -> dict[str, Any]:
    """One part manifest; an unreadable one, of another format or of other token rules
    (``core.token_rules``: its facts hold other counts) is a ``UsageError``."""
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        manifest = {"format": f"unreadable ({err})"}
    if not isinstance(manifest, dict) or manifest.get("format") != PART_FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise UsageError(
            f"part manifest {str(path)!r} is not a {PART_FORMAT} manifest ({found}); fix: rerun that part with this "
            "energon-pack"
        )
    if path.name != PART_MANIFEST.format(part=manifest["part"], parts=manifest["parts"]):
        raise UsageError(
            f"part manifest {str(path)!r} describes part {manifest['part']}/{manifest['parts']}; fix: rerun that part "
            "instead of renaming manifests"
        )
    stale = stale_rules(recorded_rules(manifest), f"part manifest {str(path)!r}")
    if stale is not None:
        raise UsageError(f"{stale}; fix: rerun prepare --part {manifest['part']}/{manifest['parts']} with this energon_pack")
    return manifest


def _check_one_run(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    """The first manifest, once all N parts of one run (same records and options) are there."""
    first = manifests[0]
    name = "part {part}/{parts}".format
    for manifest in manifests[1:]:
        if manifest["parts"] != first["parts"]:
            raise UsageError(
                f"{name(**manifest)} and {name(**first)} are parts of different runs (N={manifest['parts']} and "
                f"N={first['parts']}); fix: delete the folder's manifests and shards of the old run, or rerun all parts "
                "into a new folder"
            )
        differ = [field for field in first["run"] if manifest["run"].get(field) != first["run"][field]]
        if differ:
            raise UsageError(
                f"{name(**manifest)} and {name(**first)} are parts of different runs ({differ[0]}: "
                f"{manifest['run'].get(differ[0])!r} vs {first['run'][differ[0]]!r}); fix: rerun "
                f"prepare --part {manifest['part']}/{manifest['parts']} with the records and options of the other parts"
            )
    missing = sorted(set(range(first["parts"])) - {manifest["part"] for manifest in manifests})
    if missing:
        parts = ", ".join(f"{part}/{first['parts']}" for part in missing)
        raise UsageError(
            f"part(s) {parts} missing (no .nv-meta/{PART_MANIFEST.format(part=missing[0], parts=first['parts'])}); "
            f"fix: run `energon-pack prepare ... --part {missing[0]}/{first['parts']}` into this folder (each part "
            "missing), then merge again"
        )
    return first


def _check_shards(out: Path, manifests: list[dict[str, Any]]) -> None:
    """Every part's shards are there with the size it wrote, and no other shard is."""
    claimed: dict[str, int] = {}
    for manifest in manifests:
        for shard, size in manifest["shard_bytes"].items():
            path = out / shard
            if not path.is_file() or path.stat().st_size != size:
                raise UsageError(
                    f"shard {shard!r} of part {manifest['part']}/{manifest['parts']} is missing or changed since that "
                    f"part wrote it ({size} bytes); fix: rerun prepare --part {manifest['part']}/{manifest['parts']}"
                )
            claimed[shard] = size
    stray = sorted(path.relative_to(out).as_posix() for path in (out / "shards").glob("*.tar"))
    stray = [shard for shard in stray if shard not in claimed]
    if stray:
        raise UsageError(
            f"shard {stray[0]!r} belongs to no part of this run ({len(stray)} such); fix: delete it (left by an "
            "earlier run), or rerun all parts into a new folder"
        )
