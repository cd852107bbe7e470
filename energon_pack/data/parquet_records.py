"""Parquet and Hugging Face ``datasets`` input of ``energon-pack prepare``.

A table input is a ``.parquet`` file, a folder of them (searched recursively, sorted by path), or a
folder written by ``datasets.Dataset.save_to_disk`` (``state.json`` naming its Arrow stream files,
read with pyarrow: ``datasets`` is not needed). Its rows become the records the JSON reader yields
(``TableInput.records``), numbered from 1 over all files in order, so ``prepare`` writes them the
way it writes JSON records:

- the conversation column (``messages``, ``conversations`` or ``texts``, or ``--conversation-column``)
  holds messages in any form ``core.conversation`` accepts, a JSON string of them, or the
  ``{"user", "assistant"}`` turn pairs HuggingFaceM4/the_cauldron writes (its images go before the
  first user text);
- the image and video columns (``images``/``image``, ``videos``/``video``, or ``--image-column`` /
  ``--video-column``) hold one item or a list of them per row: a ``{"bytes", "path"}`` struct (the
  ``datasets`` Image/Video feature), a path string, or raw bytes. Bytes are embedded media and become
  shard members byte for byte (``TableInput.with_media`` streams them again when the record is
  written, value by value with ``data.parquet_pages``, so memory holds about one record's media);
  a path alone is read from ``--media-root`` as a JSON record's path is;
- an audio column (``audios``/``audio``; Qwen-Omni) holds items of the same forms (the ``datasets``
  Audio feature stores ``{"bytes", "path"}``), becoming the record's ``audios``;
- every other column is passed through as a record field (``id``, ``tools``, ...).

The record's ``images``/``videos`` hold each item's path, or ``<column>[i]`` for embedded bytes
without one (names for messages only: the bytes are found by position, ``EmbeddedMedia``).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import count, islice, repeat
from pathlib import Path
from typing import Any, NamedTuple

from energon_pack.data.parquet_footer import footer_problems
from energon_pack.data.parquet_pages import CorruptPage, UnsupportedPage, leaf_items
from energon_pack.errors import BadSampleError, UsageError

CONVERSATION_COLUMNS = ("messages", "conversations", "texts")
MEDIA_COLUMNS = {"image": ("images", "image"), "video": ("videos", "video"), "audio": ("audios", "audio")}
#: Rows per record batch read at a time: memory holds one batch of one row group, not the file.
BATCH_ROWS = 64
#: One row's media: by kind, each item's ``(path, bytes)`` (either may be None).
RowMedia = dict[str, list[tuple[str | None, bytes | None]]]
#: ``save_to_disk``'s file listing its Arrow files (``_data_files``), and a ``DatasetDict``'s.
STATE_FILE = "state.json"
DATASET_DICT_FILE = "dataset_dict.json"
#: Image format (PIL) and video demuxer (FFmpeg) -> file extension, for embedded media without a path.
IMAGE_FORMAT_EXTENSIONS = {"JPEG": "jpg", "MPO": "jpg", "PNG": "png", "WEBP": "webp", "GIF": "gif", "BMP": "bmp", "TIFF": "tif"}
VIDEO_CONTAINER_EXTENSIONS = {"mov,mp4,m4a,3gp,3g2,mj2": "mp4", "matroska,webm": "mkv", "avi": "avi"}
WEBM_CODECS = ("vp8", "vp9", "av1")
#: Audio demuxer (FFmpeg) -> file extension, for embedded audio without a path (WebM audio: ``weba``).
AUDIO_CONTAINER_EXTENSIONS = {
    "wav": "wav", "flac": "flac", "mp3": "mp3", "mov,mp4,m4a,3gp,3g2,mj2": "m4a", "aac": "aac", "ogg": "ogg",
    "matroska,webm": "weba",
}


@dataclass(frozen=True)
class EmbeddedMedia:
    """One image or video stored in a row: its bytes (None: the item has neither bytes nor a path),
    and the item's ``path`` (a name; may be None)."""

    path: str | None
    data: bytes | None


@dataclass(frozen=True, kw_only=True)
class TableColumns:
    """Column names chosen by options (None: detect; ``""`` for a media column: none)."""

    conversation: str | None = None
    image: str | None = None
    video: str | None = None
    audio: str | None = None


def is_table_input(path: Path) -> bool:
    """Whether ``path`` is a Parquet file, a folder holding some, or a ``save_to_disk`` folder.

    Example: ``data.parquet`` -> True; ``records.jsonl`` -> False; a folder of ``*.parquet`` -> True.
    """
    if path.is_file():
        return path.suffix == ".parquet"
    return path.is_dir() and ((path / STATE_FILE).is_file() or (path / DATASET_DICT_FILE).is_file()
                              or any(path.rglob("*.parquet")))


def table_files(path: Path) -> list[Path]:
    """The files of a table input in row order; ``UsageError`` for a ``DatasetDict`` folder."""
    if path.is_file():
        return [path]
    if (path / DATASET_DICT_FILE).is_file() and not (path / STATE_FILE).is_file():
        splits = json.loads((path / DATASET_DICT_FILE).read_text(encoding="utf-8")).get("splits", [])
        raise UsageError(
            f"{str(path)!r} is a saved DatasetDict (splits {', '.join(map(str, splits))}); fix: pass one split's "
            f"folder, e.g. {str(path / (splits[0] if splits else 'train'))!r}"
        )
    if (path / STATE_FILE).is_file():
        state = json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
        return [path / entry["filename"] for entry in state["_data_files"]]
    return sorted(path.rglob("*.parquet"))


def files_digest(files: Sequence[Path]) -> str:
    """SHA-256 over the files' names and bytes, in order (what the parts of one run share)."""
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode("utf-8") + b"\0")
        with path.open("rb") as data:
            digest.update(hashlib.file_digest(data, "sha256").digest())
    return digest.hexdigest()


def embedded_extension(item: EmbeddedMedia, kind: str, header: Any, allowed: tuple[str, ...]) -> str:
    """The member extension of embedded media: its path's when allowed, else from the header facts.

    Example: ``path="cat.png"`` -> ``"png"``; ``path=None`` and a JPEG header -> ``"jpg"``; a
    ``matroska,webm`` container with VP9 -> ``"webm"``.
    """
    suffix = os.path.splitext(item.path or "")[1].lower().lstrip(".")  # not Path: it interns every name it parses
    if suffix in allowed:
        return suffix
    if kind == "image":
        extension = IMAGE_FORMAT_EXTENSIONS.get(header.format)
    elif kind == "audio":
        extension = AUDIO_CONTAINER_EXTENSIONS.get(header.container)
    else:
        extension = VIDEO_CONTAINER_EXTENSIONS.get(header.container)
        if extension == "mkv" and header.codec in WEBM_CODECS:
            extension = "webm"
    if extension is None:
        found = header.format if kind == "image" else header.container  # videos and audios: the demuxer
        raise BadSampleError(
            "unsupported_media", f"embedded {kind} {item.path or ''!r} is {found}; store one of {', '.join(allowed)}"
        )
    return extension


def texts_to_messages(turns: Any, num_images: int) -> list[dict[str, Any]]:
    """the_cauldron's ``texts`` turn pairs -> messages, the row's images before the first user text.

    Example: ``[{"user": "What?", "assistant": "A cat."}]`` with 1 image ->
    ``[{"role": "user", "content": [image, text "What?"]}, {"role": "assistant", "content": "A cat."}]``.
    """
    messages: list[dict[str, Any]] = []
    for turn in turns:
        if not isinstance(turn.get("user"), str) or not isinstance(turn.get("assistant"), str):
            raise BadSampleError(
                "malformed_conversation", f"turn {turn!r} needs 'user' and 'assistant' strings (the_cauldron layout)"
            )
        media = [{"type": "image"}] * (num_images if not messages else 0)
        messages.append({"role": "user", "content": [*media, {"type": "text", "text": turn["user"]}]})
        messages.append({"role": "assistant", "content": turn["assistant"]})
    return messages


def _is_turn_pairs(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(turn, Mapping) and ("user" in turn or "assistant" in turn) and not {"role", "from"} & set(turn)
        for turn in value
    )


@dataclass(frozen=True)
class _MediaItems:
    """A media column of one record batch: each row's item positions into ``paths`` / ``data``."""

    rows: list[range]
    paths: list[str | None]
    data: Any  # pyarrow binary array aligned with paths, or None


def _media_items(column: Any, name: str) -> _MediaItems:
    """Split a media column (items, or lists of items) into per-row positions, paths and bytes."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = column.type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        lengths = pc.fill_null(pc.list_value_length(column), 0).to_pylist()
        flat = column.flatten()
    else:
        lengths = [int(valid) for valid in column.is_valid().to_pylist()]
        flat = column
    starts = [0]
    for length in lengths:
        starts.append(starts[-1] + length)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        rows = [range(starts[i], starts[i + 1]) for i in range(len(lengths))]
    else:  # a null cell holds no item: position i is the row's own
        rows = [range(i, i + length) for i, length in enumerate(lengths)]
    item = flat.type
    if pa.types.is_struct(item) and {"bytes", "path"} & {field.name for field in item}:
        fields = {field.name for field in item}
        paths = pc.struct_field(flat, "path").to_pylist() if "path" in fields else [None] * len(flat)
        return _MediaItems(rows, paths, pc.struct_field(flat, "bytes") if "bytes" in fields else None)
    if pa.types.is_string(item) or pa.types.is_large_string(item):
        return _MediaItems(rows, flat.to_pylist(), None)
    if pa.types.is_binary(item) or pa.types.is_large_binary(item):
        return _MediaItems(rows, [None] * len(flat), flat)
    raise UsageError(
        f"media column {name!r} holds {item}; fix: name a column of {{bytes, path}} structs, path strings or bytes "
        "(or lists of them) with --image-column / --video-column"
    )


def _batch_rows(batch: Any, media: dict[str, str]) -> Iterator[RowMedia]:
    """Each row's media of a record batch holding the ``media`` columns (kind -> column), read by pyarrow."""
    items = {kind: _media_items(batch.column(column), column) for kind, column in media.items()}
    for row in range(batch.num_rows):
        yield {kind: [(columns.paths[j], None if columns.data is None else columns.data[j].as_py()) for j in columns.rows[row]]
               for kind, columns in items.items()}


def _media_leaves(parquet: Any, column: str) -> tuple[str | None, str | None]:
    """The leaves (dotted ``path_in_schema``) holding a media column's bytes and paths, for
    ``parquet_pages``: ``image.bytes`` / ``image.path`` of a struct, ``images.list.element.bytes``
    of a list of them, the one leaf of a binary or string column. ``UnsupportedPage`` for another
    layout (a legacy two-level list, ...): pyarrow reads it."""
    import pyarrow as pa

    kind = parquet.schema_arrow.field(column).type
    is_list = pa.types.is_list(kind) or pa.types.is_large_list(kind)
    item = kind.value_type if is_list else kind
    leaves = [parquet.schema.column(i).path for i in range(len(parquet.schema))]
    if pa.types.is_struct(item):
        depth = 4 if is_list else 2  # images.list.element.bytes, image.bytes
        found = {leaf.split(".")[-1]: leaf for leaf in leaves
                 if leaf.split(".")[0] == column and leaf.count(".") + 1 == depth}
        names = {field.name for field in item if not pa.types.is_null(field.type)}  # all-null: no leaf to read
        if not {"bytes", "path"} & names <= found.keys():
            raise UnsupportedPage(f"media column {column!r} of {kind} is not stored as streamed leaves")
        return (found["bytes"] if "bytes" in names else None), (found["path"] if "path" in names else None)
    own = [leaf for leaf in leaves if leaf.split(".")[0] == column]
    if len(own) != 1:
        raise UnsupportedPage(f"media column {column!r} of {kind} is stored in {len(own)} leaves")
    return (None, own[0]) if pa.types.is_string(item) or pa.types.is_large_string(item) else (own[0], None)


def _streamed_rows(path: Path, parquet: Any, group: int, media: dict[str, str]) -> Iterator[RowMedia]:
    """Each row's media of row group ``group`` of the Parquet file ``path`` (``parquet``: its open
    ``ParquetFile``, footer parsed once per file), its leaves streamed value by value
    (``parquet_pages``): memory holds a row's media, not the group's page."""
    columns = {kind: [None if leaf is None else leaf_items(path, group, leaf, parquet=parquet)
                      for leaf in _media_leaves(parquet, column)]
               for kind, column in media.items()}
    yield from (_next_row(columns) for _ in range(parquet.metadata.row_group(group).num_rows))


def _next_row(columns: dict[str, list[Iterator[list[Any] | None] | None]]) -> RowMedia:
    """The next row's media from each kind's streamed ``[bytes leaf, path leaf]`` (None: no such leaf)."""
    row: RowMedia = {}
    for kind, leaves in columns.items():
        data, paths = (None if leaf is None else next(leaf) for leaf in leaves)
        size = len(data or paths or [])
        if data is not None and paths is not None and len(paths) != len(data):
            raise CorruptPage(f"a row's {kind} items have {len(data)} bytes values but {len(paths)} paths")
        row[kind] = list(zip(paths or [None] * size, data or [None] * size))
    return row


@dataclass(frozen=True)
class _Layout:
    """The columns a table input is read with (``None``: no such column)."""

    conversation: str
    media: dict[str, str | None]  # kind -> column


class _RowGroup(NamedTuple):
    """One row group of a Parquet file (``parquet``: the open ``ParquetFile``) or record batch of an
    Arrow file (``parquet`` None): its ``index`` in the file, first row (1-based over all files),
    rows, and a reader of its record batches; or a Parquet file whose footer is not opened, as
    one row that is its ``unreadable_file`` skip (``unreadable``)."""

    path: Path
    parquet: Any
    index: int
    first: int
    rows: int
    batches: Callable[[], Iterator[Any]]
    unreadable: BadSampleError | None = None


class TableInput:
    """A Parquet / ``save_to_disk`` input: its records (text, media names) and, later, their media bytes."""

    def __init__(self, path: Path, columns: TableColumns = TableColumns()) -> None:
        self.path = path
        self.files = table_files(path)
        if not self.files:
            raise UsageError(f"{str(path)!r} holds no .parquet file; fix: pass a Parquet file or a folder of them")
        #: Why each Parquet file whose footer is unsafe to open is not read (``data.parquet_footer``):
        #: pyarrow never opens it in this process; it counts as one ``unreadable_file`` row.
        self.unreadable = footer_problems([file for file in self.files if file.suffix == ".parquet"])
        self.layout = self._detect(columns)

    def _schema_names(self, path: Path) -> list[str]:
        try:
            schema = self._open(path).schema_arrow if path.suffix == ".parquet" else _open_arrow(path).schema
        except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid / ArrowIOError
            raise UsageError(f"{str(path)!r} does not open as a table ({err}); fix: pass a Parquet file or a "
                             "save_to_disk folder") from None
        return list(schema.names)

    def _detect(self, columns: TableColumns) -> _Layout:
        readable = [file for file in self.files if file not in self.unreadable]
        if not readable:
            raise UsageError(f"{str(self.files[0])!r} does not open as a table ({self.unreadable[self.files[0]]}); fix: "
                             "pass a Parquet file or a save_to_disk folder")
        names = self._schema_names(readable[0])
        options = {"conversation": columns.conversation, "image": columns.image, "video": columns.video, "audio": columns.audio}
        for kind, name in options.items():
            if name and name not in names:
                raise UsageError(
                    f"--{kind}-column {name!r} is not a column of {str(readable[0])!r} (columns: {', '.join(names)}); "
                    f"fix: pass one of its columns"
                )
        conversation = columns.conversation or next((n for n in CONVERSATION_COLUMNS if n in names), None)
        if conversation is None:
            raise UsageError(
                f"{str(readable[0])!r} has none of the conversation columns {', '.join(CONVERSATION_COLUMNS)} "
                f"(columns: {', '.join(names)}); fix: name it with --conversation-column"
            )
        media = {kind: (options[kind] if options[kind] is not None else next((n for n in MEDIA_COLUMNS[kind] if n in names), None))
                 for kind in MEDIA_COLUMNS}
        layout = _Layout(conversation, {kind: column or None for kind, column in media.items()})
        for path in readable[1:]:
            missing = [n for n in (conversation, *filter(None, layout.media.values())) if n not in self._schema_names(path)]
            if missing:
                raise UsageError(f"{str(path)!r} has no column {missing[0]!r}, which {str(readable[0])!r} has; "
                                 "fix: pass files of one table layout")
        return layout

    @staticmethod
    def _open(path: Path) -> Any:
        import pyarrow.parquet as pq

        # Unbuffered reads: a page is read whole into one buffer (pyarrow writes a row group's media
        # column as one page); a buffered stream would copy it once more.
        return pq.ParquetFile(path, buffer_size=0, pre_buffer=False)

    def _text_columns(self, path: Path) -> list[str] | None:
        """What the records pass reads of a Parquet file: every column but the media ones' ``bytes``
        leaves (a struct's path tells a row's item count; None: all columns)."""
        if path.suffix != ".parquet":
            return None
        schema = self._open(path).schema
        media = [column for column in self.layout.media.values() if column]
        leaves = [schema.column(i).path for i in range(len(schema))]
        keep = [leaf for leaf in leaves if leaf.split(".")[0] not in media or not leaf.endswith(".bytes")]
        return keep if {leaf.split(".")[0] for leaf in keep} == {leaf.split(".")[0] for leaf in leaves} else None

    def _wanted_groups(self, columns: Callable[[Path], list[str] | None], wanted: Callable[[int, int], bool]) -> Iterator[_RowGroup]:
        """Every row group whose rows ``[first, first + rows)`` are ``wanted``; pyarrow's pool is
        handed back after each."""
        first = 1
        for path in self.files:
            problem = self.unreadable.get(path)
            groups = [_unreadable_file(path, first, problem)] if problem else self._groups(path, columns(path), first)
            for group in groups:
                if wanted(group.first, group.rows):
                    yield group
                    _release_unused()
                first = group.first + group.rows

    def _batches(self, columns: Callable[[Path], list[str] | None]) -> Iterator[tuple[int, int, Any]]:
        """``(first row, rows, record batch or BadSampleError)`` over every row group; a group that
        fails to read gives one error for its rest."""
        for group in self._wanted_groups(columns, lambda first, rows: True):
            if group.unreadable is not None:
                yield group.first, group.rows, group.unreadable
                continue
            done = 0
            try:
                for batch in group.batches():
                    yield group.first + done, batch.num_rows, batch
                    done += batch.num_rows
            except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid / ArrowIOError
                if done < group.rows:
                    last = group.first + group.rows - 1
                    yield group.first + done, group.rows - done, _unreadable(group.path, group.first + done, last, err)

    def _groups(self, path: Path, columns: list[str] | None, first: int) -> Iterator[_RowGroup]:
        """Each row group (Parquet, its footer parsed once for all) or record batch (Arrow) of
        ``path``, its first row ``first`` on."""
        if path.suffix != ".parquet":
            for index, batch in enumerate(_open_arrow(path)):
                yield _RowGroup(path, None, index, first, batch.num_rows,
                                lambda batch=batch: iter([batch if columns is None else batch.select(columns)]))  # top-level names
                first += batch.num_rows
            return
        parquet = self._open(path)
        for index in range(parquet.num_row_groups):
            rows = parquet.metadata.row_group(index).num_rows
            yield _RowGroup(path, parquet, index, first, rows, lambda index=index: parquet.iter_batches(
                batch_size=BATCH_ROWS, row_groups=[index], columns=columns, use_threads=False))
            first += rows

    def records(self) -> Iterator[tuple[int, Any]]:
        """``(row, record)`` of every row (1-based over all files): the JSON reader's record form;
        a row that does not read yields a ``BadSampleError``."""
        media = {kind: column for kind, column in self.layout.media.items() if column}
        for first, rows, batch in self._batches(self._text_columns):
            if isinstance(batch, BadSampleError):
                yield from ((first + i, batch) for i in range(rows))
                continue
            items = {kind: _media_items(batch.column(column), column) for kind, column in media.items()}
            text = batch.drop_columns(list(media.values())).to_pylist()
            for i, record in enumerate(text):
                try:
                    yield first + i, self._record(record, i, items)
                except BadSampleError as err:
                    yield first + i, err

    def _record(self, record: dict[str, Any], row: int, items: dict[str, _MediaItems]) -> dict[str, Any]:
        names = {kind: [columns.paths[j] or f"{self.layout.media[kind]}[{position}]"
                        for position, j in enumerate(columns.rows[row])] for kind, columns in items.items()}
        conversation = record.pop(self.layout.conversation)
        if isinstance(conversation, str):
            try:
                conversation = json.loads(conversation)
            except json.JSONDecodeError as err:
                raise BadSampleError("bad_json", f"column {self.layout.conversation!r} is not valid JSON ({err.msg})") from None
        if _is_turn_pairs(conversation):
            conversation = texts_to_messages(conversation, len(names.get("image", [])))
        for column in ("messages", "conversations"):
            record.pop(column, None)
        audios = {"audios": names["audio"]} if names.get("audio") else {}  # Qwen-Omni tables (the Audio feature)
        return {**record, "messages": conversation, "images": names.get("image", []), "videos": names.get("video", []), **audios}

    def with_media(self, placed: Sequence[Any]) -> Iterator[Any]:
        """The placed records (``prepare.PlacedRecord``, in row order) with their embedded media
        attached (``embedded``), read again row group by row group (only groups holding one of
        them); rows whose media do not read get ``media_error`` (``unreadable_row``: the records
        pass does not read the media bytes)."""
        media = {kind: column for kind, column in self.layout.media.items() if column}
        if not media:
            yield from placed
            return
        pending = iter(placed)
        current = next(pending, None)
        for line, row in self._row_media(media, _RowsWanted(sorted(item.line for item in placed))):
            if current is None or current.line != line:
                continue
            if isinstance(row, BadSampleError):
                yield replace(current, media_error=row)
            else:
                yield replace(current, embedded=_embedded(row))
            del row  # no record's bytes held while the next row is read
            current = next(pending, None)
        if current is not None:
            raise RuntimeError(f"row {current.line} of {str(self.path)!r} was not found again when reading its media")

    def _row_media(self, media: dict[str, str], wanted: Callable[[int, int], bool]) -> Iterator[tuple[int, RowMedia | BadSampleError]]:
        """``(row, its media or why they do not read)`` of every row of the groups ``wanted``: a
        Parquet group's media leaves streamed (``parquet_pages``); an Arrow batch, or the rest of a
        group from a page the stream does not read (``UnsupportedPage``), read by pyarrow."""
        for group in self._wanted_groups(lambda path: list(media.values()), wanted):
            path, first, rows, batches = group.path, group.first, group.rows, group.batches
            done = _Tally(iter(()))
            try:
                if group.parquet is not None:
                    done.items = _streamed_rows(path, group.parquet, group.index, media)
                    try:
                        yield from zip(count(first), done)
                        continue
                    except UnsupportedPage:
                        pass  # pyarrow reads the rest
                done.items = islice((row for batch in batches() for row in _batch_rows(batch, media)), done.count, None)
                yield from zip(count(first + done.count), done)
            except (CorruptPage, OSError, ValueError) as err:  # pyarrow's ArrowInvalid / ArrowIOError too
                error = _unreadable(path, first + done.count, first + rows - 1, err)
                yield from zip(range(first + done.count, first + rows), repeat(error))


class _Tally:
    """The items of an iterator (``items``, which may be swapped), counted as they pass (``count``)."""

    def __init__(self, items: Iterator[Any]) -> None:
        self.items = items
        self.count = 0

    def __iter__(self) -> _Tally:
        return self

    def __next__(self) -> Any:
        item = next(self.items)
        self.count += 1
        return item


class _RowsWanted:
    """Whether a row range holds one of the sorted ``lines`` (a row group is skipped otherwise)."""

    def __init__(self, lines: list[int]) -> None:
        self.lines = lines

    def __call__(self, first: int, rows: int) -> bool:
        from bisect import bisect_left

        index = bisect_left(self.lines, first)
        return index < len(self.lines) and self.lines[index] < first + rows


def _embedded(row: RowMedia) -> dict[tuple[str, int], EmbeddedMedia]:
    """The embedded media of a row by (kind, position): items with bytes, and items with neither
    bytes nor a path (``data`` None: ``check_embedded`` refuses them).

    Example: ``{"image": [("a.jpg", None), (None, b"...")]}`` -> ``{("image", 1): EmbeddedMedia(None, b"...")}``.
    """
    return {(kind, position): EmbeddedMedia(path, data)
            for kind, items in row.items() for position, (path, data) in enumerate(items) if data is not None or not path}


def _unreadable_file(path: Path, first: int, problem: str) -> _RowGroup:
    """The Parquet file ``path`` whose footer is not opened (``problem``: why) as row ``first``,
    its ``unreadable_file`` skip (its rows are not known)."""
    error = BadSampleError("unreadable_file", f"{path.name}: its footer does not open ({problem}); its rows are not "
                                              "read; fix: rewrite the file (e.g. pyarrow.parquet.write_table) or drop it")
    return _RowGroup(path, None, 0, first, 1, lambda: iter(()), unreadable=error)


def _unreadable(path: Path, first: int, last: int, err: Exception) -> BadSampleError:
    """The ``unreadable_row`` skip of rows ``first..last`` of ``path`` that do not read."""
    return BadSampleError("unreadable_row", f"{path.name}: rows {first}..{last} do not read ({err})")


def check_embedded(item: EmbeddedMedia, kind: str, name: str) -> bytes:
    """The bytes of embedded media; an item with neither bytes nor a path is ``empty_media_struct``.

    Example: ``EmbeddedMedia(None, None)`` -> BadSampleError naming ``name`` and the fix.
    """
    if item.data is None:
        raise BadSampleError(
            "empty_media_struct",
            f"{kind} {name!r} has neither bytes nor a path; fix: store the {kind}'s bytes, or its path under --media-root",
        )
    return item.data


def _open_arrow(path: Path) -> Any:
    """A reader of an Arrow file ``save_to_disk`` wrote (IPC stream, memory-mapped; the file format also read)."""
    import pyarrow as pa

    source = pa.memory_map(str(path))
    try:
        return pa.ipc.open_stream(source)
    except pa.ArrowInvalid:
        source.seek(0)
        reader = pa.ipc.open_file(source)
        return _FileBatches(reader)


class _FileBatches:
    """An Arrow IPC file reader iterated batch by batch, with ``schema`` (as a stream reader)."""

    def __init__(self, reader: Any) -> None:
        self.reader = reader
        self.schema = reader.schema

    def __iter__(self) -> Iterator[Any]:
        return (self.reader.get_batch(i) for i in range(self.reader.num_record_batches))



def _release_unused() -> None:
    """Hand the memory pyarrow's pool keeps after a row group back to the system (a hint)."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()
