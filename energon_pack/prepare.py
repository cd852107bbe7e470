"""``energon-pack prepare``: chat records + media files -> an Energon WebDataset.

Input is JSON Lines (or one JSON list) of records in any form ``energon_pack.conversation``
accepts. Each good record becomes ``<key>.json`` (typed messages) plus ``<key>.<i>.<ext>``
media files copied byte for byte. Problems are reported per record with its line number;
nothing is pickled.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from energon_pack.conversation import ChatRecord, parse_record
from energon_pack.errors import BadSampleError
from energon_pack.samples import (
    CONVERSATION_PART,
    IMAGE_EXTENSIONS,
    VIDEO_EXTENSIONS,
    media_part_name,
)

DATASET_YAML = "__module__: energon_pack\n__class__: QwenVLChatWebdataset\n"
SPLIT_NAMES = ("train", "val", "test")


@dataclass(frozen=True)
class RecordProblem:
    """A record that was not written: 1-based line (or list position), record id and reason."""

    line: int
    record_id: str | None
    reason: str

    def __str__(self) -> str:
        name = f" (id {self.record_id!r})" if self.record_id is not None else ""
        return f"line {self.line}{name}: {self.reason}"


@dataclass
class PrepareReport:
    """What ``prepare_dataset`` wrote and what it skipped."""

    out_dir: Path
    written: int = 0
    images: int = 0
    videos: int = 0
    shards: list[str] = field(default_factory=list)
    problems: list[RecordProblem] = field(default_factory=list)

    def problem_counts(self) -> Counter[str]:
        """Skipped records by reason (the text before the first colon)."""
        return Counter(p.reason.split(":", 1)[0] for p in self.problems)


class PrepareError(RuntimeError):
    """Raised with ``on_error="fail"`` at the first bad record."""


def parse_split_ratio(text: str) -> list[tuple[str, float]]:
    """``"8,1,1"`` -> ``[("train", 8.0), ("val", 1.0), ("test", 1.0)]`` (zero parts omitted)."""
    values = [float(v) for v in text.split(",")]
    if not 1 <= len(values) <= 3 or any(v < 0 for v in values) or sum(values) <= 0:
        raise ValueError(
            f"split ratio {text!r} must be 1-3 non-negative numbers for train,val,test with a positive sum, e.g. 1,0,0"
        )
    return [(name, value) for name, value in zip(SPLIT_NAMES, values) if value > 0]


def iter_input_records(path: Path) -> Iterator[tuple[int, Any]]:
    """Yield ``(line, record)`` from JSON Lines or a JSON list; a bad line yields a ``BadSampleError``.

    Example: a file ``{"id": 1}\\n\\n{oops`` -> ``(1, {"id": 1})``, ``(3, BadSampleError(...))``.
    """
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        for position, record in enumerate(json.loads(text), start=1):
            yield position, record
        return
    for line_number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield line_number, json.loads(line)
        except json.JSONDecodeError as err:
            yield line_number, BadSampleError("bad_json", f"not valid JSON ({err.msg} at column {err.colno})")


def validate_key(key: str) -> str:
    """A WebDataset key cannot hold ``.`` or ``/``. Example: ``"a.b"`` -> BadSampleError."""
    if not key or "." in key or "/" in key:
        raise BadSampleError(
            "bad_id", f"record id {key!r} must be non-empty without '.' or '/' (WebDataset keys split at them)"
        )
    return key


def resolve_media_path(media_root: Path, relative: str) -> Path:
    """Resolve ``relative`` under ``media_root``; escaping it or a missing file is a bad record."""
    root = media_root.resolve()
    path = (root / relative).resolve()
    if not path.is_relative_to(root):
        raise BadSampleError("path_escape", f"media path {relative!r} leaves --media-root {str(root)!r}")
    if not path.is_file():
        raise BadSampleError("missing_media", f"media file {relative!r} not found under {str(root)!r}")
    return path


def _media_extension(path: Path, allowed: tuple[str, ...], kind: str) -> str:
    extension = path.suffix.lower().lstrip(".")
    if extension not in allowed:
        raise BadSampleError(
            "unsupported_media", f"{kind} {path.name!r} has extension {extension!r}; use one of {', '.join(allowed)}"
        )
    return extension


def _check_media_header(data: bytes, kind: str, name: str) -> None:
    from energon_pack.qwen.media import probe_image, probe_video

    try:
        probe_image(data) if kind == "image" else probe_video(data)
    except ValueError as err:
        raise BadSampleError("unreadable_media", f"{kind} {name!r}: {err}") from None


def build_wds_sample(key: str, record: ChatRecord, media_root: Path) -> dict[str, Any]:
    """The WebDataset sample dict of one record (media read as bytes and header-checked)."""
    sample: dict[str, Any] = {"__key__": key}
    sample[CONVERSATION_PART] = json.dumps(record.messages, ensure_ascii=False).encode("utf-8")
    for kind, paths, allowed in (("image", record.images, IMAGE_EXTENSIONS), ("video", record.videos, VIDEO_EXTENSIONS)):
        for index, relative in enumerate(paths):
            path = resolve_media_path(media_root, relative)
            extension = _media_extension(path, allowed, kind)
            data = path.read_bytes()
            _check_media_header(data, kind, relative)
            sample[media_part_name(index, extension)] = data
    return sample


def write_energon_metadata(out_dir: Path, shard_names: list[str], split_ratio: str) -> None:
    """Run Energon's prepare step (index + split) and write ``dataset.yaml``."""
    from megatron.energon.flavors.webdataset import BaseWebdatasetFactory

    BaseWebdatasetFactory.prepare_dataset(
        out_dir, shard_names, split_parts_ratio=parse_split_ratio(split_ratio), workers=1, shuffle_seed=None
    )
    (out_dir / ".nv-meta" / "dataset.yaml").write_text(DATASET_YAML, encoding="utf-8")


def prepare_dataset(
    input_path: str | Path,
    media_root: str | Path,
    out_dir: str | Path,
    *,
    split_ratio: str = "1,0,0",
    on_error: Literal["skip", "fail"] = "skip",
    samples_per_shard: int = 100,
    progress: bool = True,
) -> PrepareReport:
    """Write the records of ``input_path`` as an Energon WebDataset under ``out_dir``.

    Keys are the record ids (or the line number for records without one). Returns a report of
    written records and of every skipped one (line, reason); with ``on_error="fail"`` the first
    problem raises ``PrepareError`` instead.
    """
    import webdataset as wds
    from tqdm import tqdm

    parse_split_ratio(split_ratio)
    if on_error not in ("skip", "fail"):
        raise ValueError(f"on_error={on_error!r} must be 'skip' or 'fail'")
    out = Path(out_dir)
    for stale in (out / "shards", out / ".nv-meta"):
        shutil.rmtree(stale, ignore_errors=True)
    (out / "shards").mkdir(parents=True)
    report = PrepareReport(out_dir=out)
    seen_keys: set[str] = set()
    pattern = str(out / "shards" / "data-%06d.tar")
    with wds.ShardWriter(pattern, maxcount=samples_per_shard, verbose=0) as writer:
        records = tqdm(iter_input_records(Path(input_path)), desc="prepare", unit="rec", disable=not progress)
        for line, record in records:
            record_id = record.get("id") if isinstance(record, dict) else None
            try:
                if isinstance(record, BadSampleError):
                    raise record
                parsed = parse_record(record)
                key = validate_key(parsed.id if parsed.id is not None else str(line))
                if key in seen_keys:
                    raise BadSampleError("duplicate_id", f"record id {key!r} was used by an earlier record")
                sample = build_wds_sample(key, parsed, Path(media_root))
            except BadSampleError as err:
                problem = RecordProblem(line=line, record_id=None if record_id is None else str(record_id), reason=str(err))
                if on_error == "fail":
                    raise PrepareError(str(problem)) from None
                report.problems.append(problem)
                continue
            seen_keys.add(key)
            writer.write(sample)
            report.written += 1
            report.images += len(parsed.images)
            report.videos += len(parsed.videos)
    report.shards = sorted(p.relative_to(out).as_posix() for p in (out / "shards").glob("data-*.tar"))
    if not report.written:
        raise PrepareError(f"no good record in {str(input_path)!r}: nothing to write ({len(report.problems)} problems)")
    write_energon_metadata(out, report.shards, split_ratio)
    return report


def format_report(report: PrepareReport) -> str:
    """Human-readable summary: written counts, then one line per skipped record."""
    lines = [
        f"wrote {report.written} samples ({report.images} images, {report.videos} videos) "
        f"in {len(report.shards)} shard(s) to {report.out_dir}",
    ]
    if report.problems:
        lines.append(f"skipped {len(report.problems)} record(s):")
        lines += [f"  {problem}" for problem in report.problems]
    return "\n".join(lines)

