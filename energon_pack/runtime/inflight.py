"""The sample a worker is decoding, readable by the main process after the worker died.

Before a worker reads a sample's media (headers in preencode, pixels in postencode) it writes the
sample's identity (dataset, shard, key, media members, stage) into a small memory-mapped file of
its own, ``inflight-<pid>.bin`` in the loader's statistics folder, and marks it idle afterwards.
The file lives in the page cache, so what a worker wrote survives its death (a native decoder's
segfault or abort, the kernel's OOM killer); when torch reports a dead worker the loader reads the
file of that pid and names the sample and the ``exclude`` entry that skips it
(:func:`worker_death_error`). A write is a ``memmove`` into the mapping: no system call (cost in
docs/bad_input_policy.md).

File layout: 4-byte little-endian length ``n`` then ``n`` bytes of JSON; ``n == 0``: idle.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import re
import struct
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from energon_pack.runtime.exclude import exclude_entry, sample_shard

__all__ = ["InflightRecorder", "WorkerDiedError", "naming_dead_workers", "read_inflight", "sample_identity", "worker_death_error"]

#: Bytes of one worker's record file (a record longer than this is cut to its identity).
RECORD_BYTES = 4096
_LENGTH = struct.Struct("<I")


class WorkerDiedError(RuntimeError):
    """A loader worker process died; the message names the sample(s) it was decoding, when known,
    and the ``exclude`` entries that skip them. ``samples``: those records."""

    def __init__(self, message: str, samples: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.samples = samples


def _path(directory: str, pid: int) -> str:
    return os.path.join(directory, f"inflight-{pid}.bin")


class InflightRecorder:
    """One process's record of the sample it is decoding (``directory``: the loader's statistics
    folder; None records nothing). The file is created on the first record in each process, so
    a recorder built in the main process works in forked workers."""

    def __init__(self, directory: str | None) -> None:
        self.directory = directory
        self._mapping: tuple[int, mmap.mmap] | None = None  # (pid, mapping)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without the mapping (a spawned process maps its own file)."""
        return {"directory": self.directory, "_mapping": None}

    def _map(self) -> mmap.mmap | None:
        pid = os.getpid()
        if self._mapping is None or self._mapping[0] != pid:
            if self.directory is None or not os.path.isdir(self.directory):
                return None
            with open(_path(self.directory, pid), "w+b") as handle:
                handle.truncate(RECORD_BYTES)
                self._mapping = (pid, mmap.mmap(handle.fileno(), RECORD_BYTES))
        return self._mapping[1]

    @contextlib.contextmanager
    def decoding(self, sample: Any, stage: str, members: Sequence[str] = ()) -> Iterator[None]:
        """Record ``sample`` (an Energon sample: ``__key__``, ``__sources__``) as being
        decoded in ``stage`` for the ``with`` block; idle again when the block ends, even by an exception."""
        mapping = self._map()
        if mapping is None:
            yield
            return
        record = sample_identity(sample, stage, members)
        data = json.dumps(record).encode("utf-8")[: RECORD_BYTES - _LENGTH.size]
        mapping[_LENGTH.size : _LENGTH.size + len(data)] = data
        mapping[: _LENGTH.size] = _LENGTH.pack(len(data))
        try:
            yield
        finally:
            mapping[: _LENGTH.size] = _LENGTH.pack(0)


def sample_identity(sample: Any, stage: str, members: Sequence[str] = ()) -> dict[str, Any]:
    """What names a sample in an error: dataset path, shard, key, media members, stage and this pid.

    Example: a sample ``000017`` of ``shards/data-000001.tar`` in ``/data/ds`` -> ``{"dataset":
    "/data/ds", "shard": "shards/data-000001.tar", "key": "000017", "members": ["000017.0.jpg"],
    "stage": "postencode", "pid": 4242}``.
    """
    sources = getattr(sample, "__sources__", None) or ()
    source = sources[0] if sources else None
    dataset = str(getattr(source, "dataset_path", "") or "")
    if not members and source is not None:
        members = [name for name in getattr(source, "file_names", ()) if not name.endswith(".json")]
    return {
        "dataset": dataset,
        "shard": sample_shard(sample),
        "key": str(getattr(sample, "__key__", "")),
        "members": list(members),
        "stage": stage,
        "pid": os.getpid(),
    }


def read_inflight(directory: str, pid: int) -> dict[str, Any] | None:
    """The sample worker ``pid`` was decoding when it last wrote its record, or None (idle, no file,
    or an unreadable record)."""
    try:
        with open(_path(directory, pid), "rb") as handle:
            data = handle.read(RECORD_BYTES)
    except OSError:
        return None
    if len(data) < _LENGTH.size:
        return None
    (length,) = _LENGTH.unpack_from(data)
    if not 0 < length <= len(data) - _LENGTH.size:
        return None
    try:
        record = json.loads(data[_LENGTH.size : _LENGTH.size + length])
    except ValueError:
        return None
    return record if isinstance(record, Mapping) else None


#: torch's messages for a dead worker: ``DataLoader worker (pid 123) is killed by signal: Aborted.``
#: and ``DataLoader worker (pid(s) 123, 456) exited unexpectedly``.
_DEAD_WORKER = re.compile(r"DataLoader worker \(pid\(?s?\)? ?([\d, ]+)\)")


def worker_death_error(error: BaseException, directory: str | None) -> WorkerDiedError | None:
    """For torch's error about a dead worker, a ``WorkerDiedError`` whose message is torch's plus
    the sample(s) each dead worker was decoding and the ``exclude`` lines that skip them; None for
    any other error. Example message tail::

        worker pid 4242 died while decoding (postencode) sample key '000017' of shard
        'shards/data-000001.tar' (members ['000017.0.jpg']) of dataset /data/ds
        fix: exclude it and restart from the last saved state; in the YAML config:
          exclude: ['shards/data-000001.tar#000017']
        or get_packing_loader(..., exclude=['shards/data-000001.tar#000017'])
    """
    match = _DEAD_WORKER.search(str(error))
    if match is None:
        return None
    pids = [int(pid) for pid in re.findall(r"\d+", match.group(1))]
    records = [record for pid in pids if directory and (record := read_inflight(directory, pid)) is not None]
    lines = [str(error)]
    if not records:
        lines.append(
            f"worker pid(s) {pids} were decoding no sample when they died (e.g. killed from outside, or out "
            "of memory while packing); fix: see the worker's memory (docs/worker_memory.md) and restart from "
            "the last saved state"
        )
        return WorkerDiedError("\n".join(lines), [])
    for record in records:
        lines.append(
            f"worker pid {record['pid']} died while decoding ({record['stage']}) sample key {record['key']!r} of "
            f"shard {record['shard']!r} (members {record['members']}) of dataset {record['dataset'] or '?'}"
        )
    entries = sorted({exclude_entry(record["shard"], record["key"]) for record in records})
    lines += [
        "fix: exclude it and restart from the last saved state; in the YAML config:",
        f"  exclude: {entries!r}",
        f"or get_packing_loader(..., exclude={entries!r})",
    ]
    return WorkerDiedError("\n".join(lines), records)


@contextlib.contextmanager
def naming_dead_workers(directory: str | None) -> Iterator[None]:
    """Turn torch's error about a dead worker raised in the block (reading a row, saving a state)
    into the ``WorkerDiedError`` of :func:`worker_death_error`; other errors pass unchanged."""
    try:
        yield
    except RuntimeError as err:
        died = worker_death_error(err, directory)
        if died is None:
            raise
        raise died from err
