"""``energon-pack prepare``: chat records + media files -> an Energon WebDataset.

Input is JSON Lines (or one JSON list) of records in any form ``energon_pack.core.conversation``
accepts (an assistant message's ``reasoning_content`` included: Qwen3.5 renders it as the
turn's ``<think>`` block, docs/qwen35.md; tool calls, tool messages, a record's ``tools`` and
``chat_template_kwargs``: docs/on_disk_format.md), or a Parquet / ``datasets`` table whose rows become
the same records, embedded media included (``data.parquet_records``; ``open_input`` picks the reader).
Each good record becomes ``<key>.json`` (typed messages) plus ``<key>.<i>.<ext>`` media files
copied byte for byte. Problems are reported per record with its line number;
nothing is pickled.

Records are assigned to the train/val/test splits one by one, in proportion to
``--split-ratio`` (so a small dataset splits as asked), and each split has its own shards
``shards/<split>-NNNNNN.tar``. A record's split and shard depend on the records' text and order
only (``place_records``), so ``--workers N`` (media read and checked in N processes) and
``--part I/N`` runs (part I of N of the shards, e.g. one job of an array, then
``energon-pack merge``, ``data.merge``) write the dataset a single run writes, byte for byte
(but Energon's random ``index.uuid``).
The dataset is written into a staging folder beside ``--out`` and moved into place only when
everything succeeded.

The metadata is read by our loader and by Energon's own tools (``energon lint``, ``energon info``,
``energon preview``): ``split.yaml`` lists every split part (train, val, test; empty ones as
``[]``), and ``dataset.yaml`` names our dataset class and its sample type.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import tempfile
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, Literal

from energon_pack.config.row_layout import DEFAULT_MAX_IMAGE_PIXELS
from energon_pack.core.conversation import ChatRecord, check_no_assistant_media, parse_record, stored_conversation
from energon_pack.core.tables import format_table
from energon_pack.core.token_rules import TOKEN_RULES_VERSION
from energon_pack.data.parquet_records import (
    EmbeddedMedia,
    TableColumns,
    TableInput,
    check_embedded,
    embedded_extension,
    files_digest,
    is_table_input,
)
from energon_pack.errors import BadSampleError, UsageError
from energon_pack.core.samples import (
    CONVERSATION_PART,
    AUDIO_EXTENSIONS,
    IMAGE_EXTENSIONS,
    VIDEO_EXTENSIONS,
    media_part_name,
)

#: ``__module__``/``__class__`` pick our dataset class (our loader, ``energon lint``/``preview``);
#: ``sample_type`` is what ``energon info`` reads (passed to the class, which checks it).
DATASET_YAML = (
    "__module__: energon_pack\n"
    "__class__: QwenVLChatWebdataset\n"
    "sample_type:\n"
    "  __module__: energon_pack.core.samples\n"
    "  __class__: QwenVLChatSample\n"
)
SPLIT_NAMES = ("train", "val", "test")
#: Key prefix of records without an id (``_line7``); user ids may not start with it.
GENERATED_ID_PREFIX = "_line"
#: Most record problems a "no good record" error lists (the report lists them all).
ERROR_PROBLEM_LINES = 20
#: Modification time of every tar member (seconds since the epoch; 2000-01-01 00:00:00.5 UTC): a
#: rerun, ``--workers`` and ``--part`` runs write the same bytes. Its half second makes tarfile
#: write each member's PAX ``mtime`` record as it did for the time of writing, so shard sizes (and
#: the dataset fingerprints of plans) are those of earlier prepares.
SHARD_MTIME = 946684800.5
#: The part manifest ``prepare --part I/N`` writes into ``<out>/.nv-meta`` (docs/on_disk_format.md).
PART_MANIFEST = "energon_pack.part-{part}-of-{parts}.json"
PART_FORMAT = "energon_pack.part/1"


@dataclass(frozen=True)
class RecordProblem:
    """A record that was not written: 1-based line (or list position), record id, skip reason
    (``BadSampleError.reason``) and detail."""

    line: int
    record_id: str | None
    reason: str
    detail: str

    def __str__(self) -> str:
        name = f" (id {self.record_id!r})" if self.record_id is not None else ""
        return f"line {self.line}{name}: {self.reason}: {self.detail}"


@dataclass
class PrepareReport:
    """What ``prepare_dataset`` wrote and what it skipped."""

    out_dir: Path
    written: int = 0
    images: int = 0
    videos: int = 0
    shards: list[str] = field(default_factory=list)
    problems: list[RecordProblem] = field(default_factory=list)
    #: Records written per split, e.g. ``{"train": 21, "val": 5}``.
    split_counts: dict[str, int] = field(default_factory=dict)
    #: Records without an id, written under ``GENERATED_ID_PREFIX`` + line number.
    generated_ids: int = 0
    #: Media files written by (kind, format, codec): images ``("image", "JPEG", "-")`` (PIL
    #: format), videos ``("video", "webm", "vp9")`` (file extension, decoder name).
    media_kinds: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    #: Images whose EXIF orientation (2-8) turns them when loaded (``RowLayout.apply_exif_orientation``).
    oriented_images: int = 0
    #: ``(I, N)`` for ``prepare --part I/N``: what this part wrote (no metadata yet).
    part: tuple[int, int] | None = None

    def problem_counts(self) -> Counter[str]:
        """Skipped records by reason."""
        return Counter(p.reason for p in self.problems)

    def to_json(self) -> dict[str, Any]:
        """The counts, media and problems as JSON data (a part manifest's ``report``)."""
        return {
            "written": self.written, "images": self.images, "videos": self.videos, "shards": self.shards,
            "split_counts": self.split_counts, "generated_ids": self.generated_ids,
            "oriented_images": self.oriented_images,
            "media_kinds": [[*kind, count] for kind, count in sorted(self.media_kinds.items())],
            "problems": [[p.line, p.record_id, p.reason, p.detail] for p in self.problems],
        }

    def add_json(self, data: dict[str, Any]) -> None:
        """Add the counts, shards, media and problems of ``to_json`` data (problems stay in line order)."""
        for name in ("written", "images", "videos", "generated_ids", "oriented_images"):
            setattr(self, name, getattr(self, name) + data[name])
        self.shards = sorted(self.shards + data["shards"])
        for split, count in data["split_counts"].items():
            self.split_counts[split] = self.split_counts.get(split, 0) + count
        self.media_kinds.update({tuple(kind): count for *kind, count in data["media_kinds"]})
        self.problems = sorted(self.problems + [RecordProblem(*problem) for problem in data["problems"]], key=lambda p: p.line)


class PrepareError(RuntimeError):
    """Raised with ``on_error="fail"`` at the first bad record, or when the data cannot make the
    requested dataset (no good record, an empty split)."""


def parse_split_ratio(text: str) -> list[tuple[str, float]]:
    """``"8,1,1"`` -> ``[("train", 8.0), ("val", 1.0), ("test", 1.0)]`` (zero parts omitted)."""
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not 1 <= len(values) <= 3 or any(v < 0 for v in values) or sum(values) <= 0:
        raise UsageError(
            f"split ratio {text!r} must be 1-3 non-negative numbers for train,val,test with a positive sum, e.g. 1,0,0"
        )
    return [(name, value) for name, value in zip(SPLIT_NAMES, values) if value > 0]


def iter_input_records(path: Path) -> Iterator[tuple[int, Any]]:
    """Yield ``(line, record)`` from JSON Lines or a JSON list; a bad line yields a ``BadSampleError``.

    A JSON Lines line that is not UTF-8 is a bad record (``non_utf8_text``), not the end of the run.
    Example: a file ``{"id": 1}\\n\\n{oops`` -> ``(1, {"id": 1})``, ``(3, BadSampleError(...))``.
    """
    data = path.read_bytes()
    if data.lstrip().startswith(b"["):
        for position, record in enumerate(json.loads(data), start=1):
            yield position, record
        return
    for line_number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield line_number, json.loads(line.decode("utf-8"))
        except UnicodeDecodeError as err:
            yield line_number, BadSampleError("non_utf8_text", f"line is not UTF-8 ({err.reason} at byte {err.start})")
        except json.JSONDecodeError as err:
            yield line_number, BadSampleError("bad_json", f"not valid JSON ({err.msg} at column {err.colno})")


def validate_key(key: str) -> str:
    """A WebDataset key cannot hold ``.`` or ``/``. Example: ``"a.b"`` -> BadSampleError."""
    if not key or "." in key or "/" in key:
        raise BadSampleError(
            "bad_id", f"record id {key!r} must be non-empty without '.' or '/' (WebDataset keys split at them)"
        )
    return key


def record_key(record_id: str | None, line: int) -> str:
    """The sample key of a record: its id, or ``GENERATED_ID_PREFIX`` + line for a record without one.

    User ids may not start with the prefix, so a generated key never equals a user id.
    Example: ``(None, 7)`` -> ``"_line7"``; ``("7", 8)`` -> ``"7"``; ``("_line3", 9)`` -> BadSampleError.
    """
    if record_id is None:
        return f"{GENERATED_ID_PREFIX}{line}"
    if record_id.startswith(GENERATED_ID_PREFIX):
        raise BadSampleError(
            "bad_id",
            f"record id {record_id!r} starts with {GENERATED_ID_PREFIX!r}, which is reserved for the keys of "
            "records without an id; fix: rename the id",
        )
    return validate_key(record_id)


def next_split(counts: Sequence[int], weights: Sequence[float]) -> int:
    """Index of the split the next record goes to: the one furthest below its share.

    With ``n = sum(counts) + 1`` records, split i's share is ``n * weights[i] / sum(weights)``;
    the split whose count lags its share most wins (ties: the earlier split). Every split stays
    within one record of its share at every point.
    Example: weights ``(8, 2)``, counts ``(2, 0)`` -> ``1`` (shares 2.4 and 0.6 for 3 records).
    """
    total, weight_sum = sum(counts) + 1, sum(weights)
    lags = [total * weight / weight_sum - count for count, weight in zip(counts, weights)]
    return max(range(len(weights)), key=lambda i: (lags[i], -i))


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
    if kind == "audio" and extension == "webm":
        extension = "weba"  # a .webm member is a video; audio-only WebM is stored as .weba
    if extension not in allowed:
        raise BadSampleError(
            "unsupported_media", f"{kind} {path.name!r} has extension {extension!r}; use one of {', '.join(allowed)}"
        )
    return extension


def _check_media_header(data: bytes, kind: str, name: str, *, max_image_pixels: int) -> Any:
    """The header facts of one media file (``qwen.media.ImageInfo`` / ``VideoInfo``); a bad header is
    ``unreadable_media`` whose detail starts with the loader's reason (``pixel_bomb``, ``unsupported_codec``...)."""
    from energon_pack.qwen.audio import probe_audio
    from energon_pack.qwen.media import probe_image, probe_video

    try:
        if kind == "audio":
            return probe_audio(data)
        return probe_image(data, max_pixels=max_image_pixels) if kind == "image" else probe_video(data)
    except ValueError as err:
        raise BadSampleError("unreadable_media", f"{kind} {name!r}: {err}") from None


def _check_media_decodes(data: bytes, kind: str, name: str, header: Any) -> None:
    """Decode every pixel of an image, or every frame of a video (``--verify-media``)."""
    from energon_pack.qwen.pixels import decode_image, decode_video_frames

    from energon_pack.qwen.audio import decode_audio

    try:
        if kind == "image":
            decode_image(data)
        elif kind == "audio":
            decode_audio(data, expected_samples=header.samples)
        else:
            decode_video_frames(data, (0,), header.num_frames, seek=False)
    except BadSampleError as err:
        raise BadSampleError("unreadable_media", f"{kind} {name!r} does not decode: {err}") from None


def media_kind(kind: str, extension: str, header: Any) -> tuple[str, str, str]:
    """The report's (kind, format, codec) of one media file: images by PIL format (codec ``-``),
    videos and audios by file extension and decoder name.

    Example: ``("video", "webm", <VideoInfo codec="vp9">)`` -> ``("video", "webm", "vp9")``;
    ``("image", "jpg", <ImageInfo format="MPO">)`` -> ``("image", "MPO", "-")``.
    """
    if kind == "image":
        return kind, header.format, "-"
    return kind, extension, header.codec


def build_wds_sample(
    key: str,
    record: ChatRecord,
    media_root: Path,
    *,
    verify_media: bool = False,
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    report: PrepareReport | None = None,
    embedded: Mapping[tuple[str, int], EmbeddedMedia] | None = None,
) -> dict[str, Any]:
    """The WebDataset sample dict of one record (media read as bytes and header-checked; fully
    decoded too with ``verify_media``). With ``report``, its media are counted there
    (``media_kinds``, ``oriented_images``) once the whole record passed. ``embedded`` holds the
    media stored in a table row by (kind, position); the others are paths under ``media_root``."""
    sample: dict[str, Any] = {"__key__": key}
    sample[CONVERSATION_PART] = stored_conversation(record)
    kinds: list[tuple[str, str, str]] = []
    oriented = 0
    for kind, paths, allowed in (
        ("image", record.images, IMAGE_EXTENSIONS), ("video", record.videos, VIDEO_EXTENSIONS),
        ("audio", record.audios, AUDIO_EXTENSIONS),
    ):
        for index, relative in enumerate(paths):
            item = None if embedded is None else embedded.get((kind, index))
            if item is None:
                path = resolve_media_path(media_root, relative)
                extension = _media_extension(path, allowed, kind)
                data = path.read_bytes()
            else:
                data = check_embedded(item, kind, relative)
            header = _check_media_header(data, kind, relative, max_image_pixels=max_image_pixels)
            if item is not None:
                extension = embedded_extension(item, kind, header, allowed)
            if verify_media:
                _check_media_decodes(data, kind, relative, header)
            kinds.append(media_kind(kind, extension, header))
            oriented += kind == "image" and header.orientation != 1
            sample[media_part_name(index, extension)] = data
    if report is not None:
        report.media_kinds.update(kinds)
        report.oriented_images += oriented
    return sample


def write_energon_metadata(out_dir: Path, shard_names: list[str]) -> None:
    """Run Energon's prepare step (index, and each split's shards by name) and write ``dataset.yaml``.

    ``split.yaml`` lists every split of ``SPLIT_NAMES`` (a split without shards as ``[]``, as
    ``energon prepare --split-ratio 1,0,0`` writes it): ``energon lint`` checks train, val and
    test and refuses a dataset that does not list one.
    Example: shards ``["shards/train-000000.tar"]`` -> ``train: [shards/train-000000.tar]``,
    ``val: []``, ``test: []``.
    """
    from megatron.energon.flavors.webdataset import BaseWebdatasetFactory

    BaseWebdatasetFactory.prepare_dataset(
        out_dir,
        shard_names,
        # No backslashes: Energon brace-expands the patterns, which drops them.
        split_parts_patterns=[(name, f"^shards/{name}-[0-9]+[.]tar$") for name in SPLIT_NAMES],
        workers=1,
        shuffle_seed=None,
    )
    (out_dir / ".nv-meta" / "dataset.yaml").write_text(DATASET_YAML, encoding="utf-8")


@dataclass(frozen=True)
class JsonInput:
    """A JSON Lines (or JSON list) records file: its records, and their media as paths only."""

    path: Path

    @property
    def files(self) -> list[Path]:
        return [self.path]

    def records(self) -> Iterator[tuple[int, Any]]:
        return iter_input_records(self.path)

    def with_media(self, placed: Sequence[PlacedRecord]) -> Iterator[PlacedRecord]:
        """The placed records as they are (their media are files under ``--media-root``)."""
        return iter(placed)


def open_input(input_path: Path, columns: TableColumns) -> JsonInput | TableInput:
    """The records input at ``input_path``: a table (``data.parquet_records``) or a JSON records
    file; column options on JSON input are a ``UsageError``."""
    if is_table_input(input_path):
        return TableInput(input_path, columns)
    named = [f"--{kind}-column" for kind in ("conversation", "image", "video") if getattr(columns, kind) is not None]
    if named:
        raise UsageError(
            f"{named[0]} names a Parquet column, but {str(input_path)!r} is not Parquet input; fix: drop it (JSON "
            "records name their fields messages/conversations, images, videos)"
        )
    return JsonInput(input_path)


def check_inputs(input_path: Path, media_root: Path) -> None:
    """Raise ``UsageError`` when the records (a file, or a Parquet / ``datasets`` folder) or the media folder is not there."""
    if not input_path.is_file() and not is_table_input(input_path):
        what = "is a folder without .parquet files" if input_path.is_dir() else "not found"
        raise UsageError(
            f"input {str(input_path)!r} {what}; fix: pass a JSON Lines file (or JSON list) of chat records, a "
            ".parquet file, a folder of them, or a datasets save_to_disk folder"
        )
    if not media_root.is_dir():
        raise UsageError(
            f"--media-root {str(media_root)!r} is not a folder; fix: pass the folder the records' media paths are "
            "relative to (any existing folder for text-only records)"
        )


def _staging_folder(out: Path) -> Path:
    """A fresh folder beside ``out`` (same file system, so it can be moved into place)."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {str(out)!r} is a file; fix: pass a folder path for the dataset")
    out.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))


def run_identity(files: Sequence[Path], options: dict[str, Any]) -> dict[str, Any]:
    """What the parts of one run share: the SHA-256 of the records file (of a table's files, in
    order: ``files_digest``) and the options that shape the dataset (not ``--media-root``, which may
    be mounted elsewhere on each machine, nor ``--workers``)."""
    if len(files) == 1 and files[0].suffix != ".parquet":
        with files[0].open("rb") as records:
            return {"records_sha256": hashlib.file_digest(records, "sha256").hexdigest(), **options}
    return {"records_sha256": files_digest(files), **options}


def part_manifests(out: Path) -> list[Path]:
    """The part manifests in ``out/.nv-meta``, sorted by name."""
    return sorted((out / ".nv-meta").glob(PART_MANIFEST.format(part="*", parts="*")))


def _check_part_out(out: Path) -> None:
    """Refuse to add a part to a finished dataset (its index written, no part manifest left)."""
    if (out / ".nv-meta" / "index.sqlite").exists() and not part_manifests(out):
        raise UsageError(
            f"--out {str(out)!r} holds a finished dataset (a plain prepare or a merge); fix: write the parts to a new "
            "folder, or delete this one first"
        )


def _write_part_manifest(
    folder: Path, report: PrepareReport, recorder: Any, part_of: tuple[int, int], *, run: dict[str, Any], input_path: str
) -> None:
    """Write ``folder/.nv-meta/PART_MANIFEST``: the part, the run, its shards' sizes, report and facts."""
    part, parts = part_of
    manifest = {
        "format": PART_FORMAT, "part": part, "parts": parts, "run": run, "input": input_path, "token_rules": TOKEN_RULES_VERSION,
        "shard_bytes": {name: (folder / name).stat().st_size for name in report.shards},
        "report": report.to_json(), "facts": recorder.by_key,
    }
    (folder / ".nv-meta").mkdir()
    (folder / ".nv-meta" / PART_MANIFEST.format(part=part, parts=parts)).write_text(json.dumps(manifest), encoding="utf-8")


def _move_part_into_place(staging: Path, out: Path) -> None:
    """Move a part's shards, then its manifest, into ``out`` beside the other parts' (replacing this part's)."""
    for name in ("shards", ".nv-meta"):
        (out / name).mkdir(parents=True, exist_ok=True)
    for name in ("shards", ".nv-meta"):
        for path in sorted((staging / name).iterdir()):
            os.replace(path, out / name / path.name)
    shutil.rmtree(staging)


def _move_into_place(staging: Path, out: Path) -> None:
    """Make the staged dataset the one at ``out``; other files already in ``out`` are kept."""
    if not out.exists():
        staging.rename(out)
        return
    replaced = staging / "replaced"
    replaced.mkdir()
    for name in ("shards", ".nv-meta"):
        if (out / name).exists():
            (out / name).rename(replaced / name)
        (staging / name).rename(out / name)
    shutil.rmtree(staging)


def check_positive_int(value: Any, option: str, rest: str) -> None:
    """Raise ``UsageError`` ``"<option> <value> must be an integer >= 1<rest>"`` unless ``value`` is one.
    Example: ``(0, "--workers", ", e.g. 4")`` -> UsageError("--workers 0 must be an integer >= 1, e.g. 4")."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{option} {value!r} must be an integer >= 1{rest}")


def parse_part(text: str) -> tuple[int, int]:
    """``--part I/N`` -> ``(I, N)``: part I of N, counted from 0. Example: ``"1/4"`` -> ``(1, 4)``; ``"4/4"`` -> UsageError."""
    index, _, count = text.partition("/")
    try:
        part, parts = int(index), int(count)
    except ValueError:
        raise UsageError(
            f"--part {text!r} must be I/N, part I of N counted from 0; fix: pass e.g. --part 0/4 (and 1/4, 2/4, 3/4 "
            "to the other runs)"
        ) from None
    if parts < 1:
        raise UsageError(f"--part {text!r} has N={parts} parts; fix: N must be >= 1, e.g. --part 0/4")
    if not 0 <= part < parts:
        raise UsageError(
            f"--part {text!r}: part {part} is not one of the {parts} parts 0..{parts - 1}; fix: pass --part 0/{parts} "
            f"... --part {parts - 1}/{parts}"
        )
    return part, parts


def prepare_dataset(
    input_path: str | Path,
    media_root: str | Path,
    out_dir: str | Path,
    *,
    split_ratio: str = "1,0,0",
    on_error: Literal["skip", "fail"] = "skip",
    samples_per_shard: int = 100,
    allow_assistant_media: bool = False,
    verify_media: bool = False,
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    progress: bool = True,
    processor: Any = None,
    workers: int = 1,
    part: str | None = None,
    columns: TableColumns = TableColumns(),
) -> PrepareReport:
    """Write the records of ``input_path`` as an Energon WebDataset under ``out_dir``.

    Keys are the record ids (``GENERATED_ID_PREFIX`` + line number for records without one).
    Records go to the splits of ``split_ratio`` in proportion, one by one, and to their shards by
    their order only (``place_records``).
    Returns a report of written records and of every skipped one (line, reason); with
    ``on_error="fail"`` the first problem raises ``PrepareError`` instead. Records with media in
    an assistant turn are skipped (``media_in_assistant_turn``) unless ``allow_assistant_media``.
    Media are checked from their headers; ``verify_media`` decodes every image and video frame too
    (slower), so media that are cut after the header are reported here rather than by the loader.
    Images with more than ``max_image_pixels`` stored pixels are skipped (``unreadable_media``,
    ``pixel_bomb``); keep it equal to the loader's ``RowLayout.max_image_pixels``.
    On any error nothing changes at ``out_dir``.
    The facts sidecar (``.nv-meta/energon_pack.facts.npz``, ``data.facts``) records every
    sample's media facts; with ``processor`` (a loaded processor) also its text tokens.
    ``workers`` >= 2 reads, checks and measures media in that many processes; the dataset is the
    same. ``part="I/N"`` writes only part I of N of the shards plus a part manifest
    (``PART_MANIFEST``) into ``out_dir``; ``data.merge.merge_parts`` then writes the metadata once
    all N parts are there, the dataset a single run writes.
    ``input_path`` may be a Parquet file, a folder of them or a ``datasets`` ``save_to_disk``
    folder (``data.parquet_records``; ``columns`` names its columns, None: detected).
    """
    splits = parse_split_ratio(split_ratio)
    check_positive_int(max_image_pixels, "--max-image-pixels", f", e.g. {DEFAULT_MAX_IMAGE_PIXELS}")
    check_positive_int(samples_per_shard, "--samples-per-shard", "; fix: pass e.g. 100")
    check_positive_int(workers, "--workers", " (1: read and check media in this process); fix: pass e.g. --workers 4")
    if on_error not in ("skip", "fail"):
        raise ValueError(f"on_error={on_error!r} must be 'skip' or 'fail'")
    part_of = None if part is None else parse_part(part)
    check_inputs(Path(input_path), Path(media_root))
    source = open_input(Path(input_path), columns)
    out = Path(out_dir)
    if part_of is not None:
        _check_part_out(out)
    staging = _staging_folder(out)
    from energon_pack.data.facts import FactsRecorder

    recorder = FactsRecorder(processor)
    checks = MediaChecks(Path(media_root), verify_media, max_image_pixels)
    try:
        items = place_records(
            source.records(), splits, samples_per_shard=samples_per_shard, allow_assistant_media=allow_assistant_media
        )
        desc = "prepare" + (" (decoding media)" if verify_media else "") + ("" if part is None else f" part {part}")
        if part_of is not None:
            items = part_items(items, *part_of)
        report = _write_shards(
            items, source, staging, checks, recorder, workers=workers, on_error=on_error, progress=progress, desc=desc
        )
        report.split_counts = {name: report.split_counts.get(name, 0) for name, _ in splits}
        if part_of is None:
            check_written(report, str(input_path))
            check_splits_filled(split_ratio, report.split_counts)
            write_energon_metadata(staging, report.shards)
            recorder.write(staging)
            _move_into_place(staging, out)
        else:
            options = dict(
                split_ratio=split_ratio, on_error=on_error, samples_per_shard=samples_per_shard,
                allow_assistant_media=allow_assistant_media, verify_media=verify_media,
                max_image_pixels=max_image_pixels, processor=recorder.fingerprint,
                **({} if isinstance(source, JsonInput) else {"columns": vars(source.layout)}),
            )
            _write_part_manifest(staging, report, recorder, part_of, run=run_identity(source.files, options),
                                 input_path=str(input_path))
            _move_part_into_place(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    report.out_dir = out
    report.part = part_of
    return report


@dataclass(frozen=True)
class PlacedRecord:
    """A record that passed the text checks, and its place: ``split`` and ``shard`` (``shards/<split>-NNNNNN.tar``).

    Every record of the input is placed before the first is written, so each holds its parsed
    record pickled (``packed``, about a third of the objects' size: the prepare bench's 10,000 short
    chats take 5.3 MiB instead of 15.4, by tracemalloc); ``record`` unpickles it.
    """

    line: int
    key: str
    packed: bytes
    split: str
    shard: str
    #: Media stored in the record's table row (``TableInput.with_media`` attaches them when it is
    #: written), or why they could not be read (the record is skipped for it).
    embedded: Mapping[tuple[str, int], EmbeddedMedia] = field(default_factory=dict)
    media_error: BadSampleError | None = None

    @property
    def record(self) -> ChatRecord:
        """The parsed record (a new object at each call)."""
        return pickle.loads(self.packed)


def place_records(
    records: Iterable[tuple[int, Any]], splits: list[tuple[str, float]], *, samples_per_shard: int, allow_assistant_media: bool
) -> list[PlacedRecord | RecordProblem]:
    """Every ``(line, record)`` of ``records`` in order: placed, or the problem that skips it for its text
    (JSON, form, id, a duplicate id, media in an assistant turn unless ``allow_assistant_media``).

    The place depends on the records' text and order only, never on their media or on a process,
    so ``--workers`` and ``--part`` runs place every record as a single run does: the n-th placed
    record goes to the split ``next_split`` picks, and the j-th record of a split to its shard
    ``j // samples_per_shard``. A record skipped later for its media keeps its place (its shard
    holds one sample fewer) and its id (a later record with that id is a ``duplicate_id``).
    Example: 5 records, ratio ``1,0,0``, 2 per shard -> shards ``train-000000`` (2 records),
    ``train-000001`` (2), ``train-000002`` (1).
    """
    weights = [weight for _, weight in splits]
    counts = [0] * len(splits)
    seen_keys: set[str] = set()
    items: list[PlacedRecord | RecordProblem] = []
    for line, record in records:
        record_id = record.get("id") if isinstance(record, dict) else None
        try:
            if isinstance(record, BadSampleError):
                raise record
            parsed = parse_record(record)
            key = record_key(parsed.id, line)
            if key in seen_keys:
                raise BadSampleError("duplicate_id", f"record id {key!r} was used by an earlier record")
            if not allow_assistant_media:
                check_no_assistant_media(parsed.messages)
        except BadSampleError as err:
            items.append(RecordProblem(line, None if record_id is None else str(record_id), err.reason, err.detail))
            continue
        seen_keys.add(key)
        index = next_split(counts, weights)
        split = splits[index][0]
        items.append(PlacedRecord(line, key, pickle.dumps(parsed, protocol=pickle.HIGHEST_PROTOCOL), split, f"shards/{split}-{counts[index] // samples_per_shard:06d}.tar"))
        counts[index] += 1
    return items


def part_items(items: list[PlacedRecord | RecordProblem], part: int, parts: int) -> list[PlacedRecord | RecordProblem]:
    """What part ``part`` of ``parts`` writes: the records of its shards (shard j of the S shard
    names, sorted, belongs to part ``j * parts // S``) and, in part 0, every text problem.
    Example: shards ``test-0, train-0, train-1, val-0`` in 2 parts -> part 0 ``test-0, train-0``."""
    shards = sorted({item.shard for item in items if isinstance(item, PlacedRecord)})
    owned = {name for j, name in enumerate(shards) if j * parts // len(shards) == part}
    return [item for item in items if (item.shard in owned if isinstance(item, PlacedRecord) else part == 0)]


@dataclass(frozen=True)
class MediaChecks:
    """How a record's media are read and checked (``build_wds_sample``; sent to each worker process)."""

    media_root: Path
    verify_media: bool
    max_image_pixels: int


@dataclass
class BuiltSample:
    """A placed record read and checked: its WebDataset sample and facts, or the ``error`` that
    skips it; ``media_kinds`` and ``oriented_images`` count as in ``PrepareReport``; the record's
    own id (None: generated) and its image and video counts, for the report (the record is
    unpickled once, here)."""

    sample: dict[str, Any] | None
    record_id: str | None
    images: int
    videos: int
    error: BadSampleError | None = None
    media_kinds: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    oriented_images: int = 0
    facts: Any = None


def build_placed(placed: PlacedRecord, checks: MediaChecks, recorder: Any) -> BuiltSample:
    """Read and check the media of ``placed`` and measure its facts (``recorder.sample_facts``); with a
    processor, a record its chat template cannot render is skipped (``recorder.check_renders``)."""
    counted = PrepareReport(out_dir=checks.media_root)
    record = placed.record
    about = {"record_id": record.id, "images": len(record.images), "videos": len(record.videos)}
    if placed.media_error is not None:
        return BuiltSample(None, **about, error=placed.media_error)
    try:
        recorder.check_renders(record)
        sample = build_wds_sample(
            placed.key, record, checks.media_root, verify_media=checks.verify_media,
            max_image_pixels=checks.max_image_pixels, report=counted, embedded=placed.embedded,
        )
    except BadSampleError as err:
        return BuiltSample(None, **about, error=err)
    return BuiltSample(sample, **about, media_kinds=counted.media_kinds, oriented_images=counted.oriented_images,
                       facts=recorder.sample_facts(sample))


#: ``(MediaChecks, FactsRecorder)`` of a worker process (set by ``_start_worker``).
_worker_state: tuple[MediaChecks, Any] | None = None
#: Records a worker process gets at a time, and such chunks in flight per worker: the samples
#: (media bytes) waiting for the parent stay few whatever the dataset's size.
WORKER_CHUNK = 4
CHUNKS_AHEAD = 4


def _start_worker(checks: MediaChecks, processor: Any) -> None:
    from energon_pack.data.facts import FactsRecorder

    global _worker_state
    _worker_state = (checks, FactsRecorder(processor))


def _build_in_worker(chunk: list[PlacedRecord]) -> list[BuiltSample]:
    assert _worker_state is not None, "worker started without _start_worker"
    return [build_placed(placed, *_worker_state) for placed in chunk]


def build_all(placed: Iterable[PlacedRecord], checks: MediaChecks, recorder: Any, workers: int) -> Iterator[BuiltSample]:
    """``build_placed`` of every record of ``placed``, in order; with ``workers`` >= 2 in that many
    spawned processes (torch and PyAV are not fork-safe), each with its own ``recorder.processor``,
    at most ``workers * CHUNKS_AHEAD`` chunks of ``WORKER_CHUNK`` records ahead of the caller."""
    if workers == 1:  # map: no record is held here while the next one is read
        yield from map(lambda item: build_placed(item, checks, recorder), placed)
        return
    import multiprocessing

    records = iter(placed)
    chunks = iter(lambda: list(islice(records, WORKER_CHUNK)), [])
    context = multiprocessing.get_context("spawn")
    with context.Pool(workers, initializer=_start_worker, initargs=(checks, recorder.processor)) as pool:
        pending = deque(pool.apply_async(_build_in_worker, (chunk,)) for chunk in islice(chunks, workers * CHUNKS_AHEAD))
        while pending:
            done = pending.popleft().get()
            pending.extend(pool.apply_async(_build_in_worker, (chunk,)) for chunk in islice(chunks, 1))
            yield from done


def _write_shards(
    items: list[PlacedRecord | RecordProblem],
    source: JsonInput | TableInput,
    out: Path,
    checks: MediaChecks,
    recorder: Any,
    *,
    workers: int,
    on_error: Literal["skip", "fail"],
    progress: bool,
    desc: str,
) -> PrepareReport:
    """Write the placed records of ``items`` into their shards under ``out/shards`` (each sample's
    facts to ``recorder``, their embedded media from ``source``); report them and every problem, in
    record order."""
    import webdataset as wds
    from tqdm import tqdm

    (out / "shards").mkdir()
    report = PrepareReport(out_dir=out)
    placed = [item for item in items if isinstance(item, PlacedRecord)]
    built = build_all(source.with_media(placed), checks, recorder, workers)
    writers: dict[str, tuple[str, Any]] = {}  # split -> (shard name, its open writer)
    try:
        for item in tqdm(items, desc=desc, unit="rec", disable=not progress):
            if isinstance(item, PlacedRecord):
                result = next(built)
                if result.error is not None:
                    item = RecordProblem(item.line, result.record_id, result.error.reason, result.error.detail)
            if isinstance(item, RecordProblem):
                if on_error == "fail":
                    raise PrepareError(str(item))
                report.problems.append(item)
                continue
            if item.split not in writers or writers[item.split][0] != item.shard:
                if item.split in writers:
                    writers.pop(item.split)[1].close()
                writers[item.split] = (item.shard, wds.TarWriter(str(out / item.shard), mtime=SHARD_MTIME))
                report.shards.append(item.shard)
            writers[item.split][1].write(result.sample)
            recorder.add(item.key, result.facts)
            report.media_kinds.update(result.media_kinds)
            report.oriented_images += result.oriented_images
            report.split_counts[item.split] = report.split_counts.get(item.split, 0) + 1
            report.written += 1
            report.generated_ids += result.record_id is None
            report.images += result.images
            report.videos += result.videos
            del result  # its media bytes are written: not held while the next record is read
    finally:
        for _, writer in writers.values():
            writer.close()
        built.close()
    report.shards.sort()
    return report


def check_written(report: PrepareReport, input_path: str) -> None:
    """Raise ``PrepareError`` listing the problems when no record of ``input_path`` was written."""
    if not report.written:
        raise PrepareError(
            "\n".join([
                f"no good record in {input_path!r}: nothing to write ({len(report.problems)} problems):",
                *problem_lines(report.problems, limit=ERROR_PROBLEM_LINES),
            ])
        )


def check_splits_filled(split_ratio: str, counts: dict[str, int]) -> None:
    """Raise ``PrepareError`` naming the fix when a split asked for (non-zero ratio) got no record.

    Example: ``("8,2,0", {"train": 1, "val": 0})`` -> PrepareError suggesting ``--split-ratio 8,0,0``.
    """
    empty = [name for name, count in counts.items() if count == 0]
    if empty:
        values = [value.strip() for value in split_ratio.split(",")]
        kept = ",".join("0" if name in empty else value for name, value in zip(SPLIT_NAMES, values))
        raise PrepareError(
            f"split {empty[0]!r} of --split-ratio {split_ratio} got none of the {sum(counts.values())} good "
            f"record(s); fix: add records, or leave the split out with --split-ratio {kept}"
        )


def problem_lines(problems: Sequence[RecordProblem], *, limit: int | None = None) -> list[str]:
    """One indented line per problem (the first ``limit``, then how many more).

    Example: 3 problems with ``limit=2`` -> ``["  line 1: bad_json: ...", "  line 2: ...", "  ... and 1 more"]``.
    """
    shown = problems if limit is None else problems[:limit]
    lines = [f"  {problem}" for problem in shown]
    if len(problems) > len(shown):
        lines.append(f"  ... and {len(problems) - len(shown)} more")
    return lines


def format_media_table(report: PrepareReport) -> str:
    """The media written, one row per (kind, format, codec) with its file count.

    Example: two VP9 WebMs and a JPEG -> a table with rows ``image JPEG - 1`` and ``video webm vp9 2``.
    """
    rows = [
        {"kind": kind, "format": image_format, "codec": codec, "files": count}
        for (kind, image_format, codec), count in sorted(report.media_kinds.items())
    ]
    return format_table(rows, ["kind", "format", "codec", "files"])


def format_report(report: PrepareReport) -> str:
    """Human-readable summary: written counts per split, generated ids, the media table, then one
    line per skipped record."""
    splits = ", ".join(f"{name}: {count}" for name, count in report.split_counts.items())
    lines = [
        ("" if report.part is None else f"part {report.part[0]}/{report.part[1]}: ")
        + f"wrote {report.written} samples ({report.images} images, {report.videos} videos) "
        f"in {len(report.shards)} shard(s) to {report.out_dir} ({splits})",
    ]
    if report.generated_ids:
        lines.append(
            f"{report.generated_ids} record(s) without an id: keys {GENERATED_ID_PREFIX}<line number> were generated"
        )
    if report.media_kinds:
        lines += ["media written:", format_media_table(report)]
    if report.oriented_images:
        lines.append(
            f"{report.oriented_images} image(s) carry an EXIF orientation: the loader turns them upright "
            "(RowLayout.apply_exif_orientation)"
        )
    if report.problems:
        lines.append(f"skipped {len(report.problems)} record(s):")
        lines += problem_lines(report.problems)
    if report.part is not None:
        lines.append(
            f"part {report.part[0]}/{report.part[1]} done; once all {report.part[1]} parts are, run: "
            f"energon-pack merge {report.out_dir}"
        )
    return "\n".join(lines)
