"""``LoaderOptions``: how Energon reads the data (workers, repeat, shuffling, seed, prefetch, timeout).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from energon_pack.config.values import NOT_FINGERPRINTED, bool_problem, fingerprint_fields, int_problem, raise_if_problems

@dataclass(frozen=True, kw_only=True)
class LoaderOptions:
    """How Energon reads the data.

    num_workers: Energon DataLoader worker processes per rank (0 = in the main process).
    repeat: loop over the dataset forever (training) or one finite epoch.
    shuffle_buffer_size / max_samples_per_sequence: Energon shuffling knobs (None = Energon default).
    seed: shuffle seed.
    allow_inexact_resume: restore a loader state saved under a different fingerprint anyway.
    prefetch_factor: rows each worker builds ahead of the consumer (Energon's / torch's
        ``prefetch_factor``). Each row in flight holds its whole pixel payload, so a worker's
        memory grows with it; 1 is enough when a row is consumed slower than a worker builds one.
    timeout: seconds to wait for a worker's next row before raising ``RuntimeError`` (torch's
        ``DataLoader`` timeout: a hung worker becomes an error); 0 (the default) waits forever.
        Needs ``num_workers >= 1``.
    sample_mapping: ``"module:function"`` turning each sample of a foreign dataset (an Energon
        sample type, a crude sample) into our record form, replacing the type's default
        (docs/foreign_datasets.md); ``get_packing_loader(sample_mapping=...)`` wins. It enters the
        resume fingerprint by name (as ``sample_mapping``) only when set.
    decode_threads: FFmpeg decoder threads each worker decodes a video with; how many it uses follows
        the picture size (`qwen.decoder_threads.decoder_threading`: slice threads from 720p,
        one thread below; never frame threads, measured slower); the frames
        are the same with any count. None (the default): `auto_decode_threads` (the cores this
        process may use, shared by the workers of every local rank, 1 to 4).
    exclude: samples skipped (counted as ``excluded``) by the online loader, the plan loader and
        ``energon-pack plan``: each entry a sample key (``"000017"``: that key in every shard) or
        ``"SHARD#KEY"`` (``"shards/data-000001.tar#000017"``, or the shard's file name alone). The
        error of a worker killed while decoding a sample prints the entry that excludes it. Not
        part of the resume fingerprint: a state resumes with samples newly excluded
        (docs/state_contract.md).
    max_storage_retries / storage_retry_delay: a transient storage error while reading a shard
        (a reset connection, a timeout, an HTTP 5xx / throttling answer) is retried up to
        ``max_storage_retries`` times, waiting ``storage_retry_delay * 2**attempt`` seconds
        (0.5, 1, 2, 4 s by default) before each retry; corrupt data is never retried. After the
        last retry the error names the object.
    """

    num_workers: int = 2
    repeat: bool = True
    shuffle_buffer_size: int | None = None
    max_samples_per_sequence: int | None = None
    seed: int = 42
    allow_inexact_resume: bool = field(default=False, metadata=NOT_FINGERPRINTED)
    prefetch_factor: int = field(default=2, metadata=NOT_FINGERPRINTED)
    timeout: float = field(default=0, metadata=NOT_FINGERPRINTED)
    sample_mapping: str | None = field(default=None, metadata=NOT_FINGERPRINTED)
    decode_threads: int | None = field(default=None, metadata=NOT_FINGERPRINTED)
    exclude: tuple[str, ...] = field(default=(), metadata=NOT_FINGERPRINTED)
    max_storage_retries: int = field(default=4, metadata=NOT_FINGERPRINTED)
    storage_retry_delay: float = field(default=0.5, metadata=NOT_FINGERPRINTED)

    def __post_init__(self) -> None:
        if isinstance(self.exclude, list):  # as YAML gives it
            object.__setattr__(self, "exclude", tuple(self.exclude))
        raise_if_problems(type(self).__name__, self.problems())

    def fingerprint(self) -> dict[str, Any]:
        """Resume-relevant values."""
        return fingerprint_fields(self)

    def problems(self) -> Iterator[str | None]:
        """One line per violated rule (None for rules that hold)."""
        yield int_problem("num_workers", self.num_workers, minimum=0)
        for name in ("repeat", "allow_inexact_resume"):
            yield bool_problem(name, getattr(self, name))
        yield int_problem("shuffle_buffer_size", self.shuffle_buffer_size, minimum=1, optional=True)
        yield int_problem("max_samples_per_sequence", self.max_samples_per_sequence, minimum=1, optional=True)
        yield int_problem("seed", self.seed, minimum=0)
        yield int_problem("prefetch_factor", self.prefetch_factor, minimum=1)
        yield _timeout_problem(self.timeout, self.num_workers)
        yield _sample_mapping_problem(self.sample_mapping)
        yield int_problem("decode_threads", self.decode_threads, minimum=1, optional=True)
        yield exclude_problem(self.exclude)
        yield int_problem("max_storage_retries", self.max_storage_retries, minimum=0)
        yield _delay_problem(self.storage_retry_delay)

    def resolved_decode_threads(self) -> int:
        """``decode_threads``, or `auto_decode_threads` of this process's cores, the worker count and
        the local ranks (``LOCAL_WORLD_SIZE``, as torchrun sets it; 1 without)."""
        if self.decode_threads is not None:
            return self.decode_threads
        return auto_decode_threads(
            cores=len(os.sched_getaffinity(0)), num_workers=self.num_workers,
            local_ranks=int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1),
        )


#: Most decoder threads the default gives a worker: past 4, one decode gains little
#: (docs/performance.md) and each frame thread holds its own frames (docs/worker_memory.md).
MAX_AUTO_DECODE_THREADS = 4


def auto_decode_threads(*, cores: int, num_workers: int, local_ranks: int = 1) -> int:
    """Decoder threads per worker when ``decode_threads`` is None: the cores left per decoding
    process (workers of every local rank; the main process when ``num_workers`` is 0), 1 to
    `MAX_AUTO_DECODE_THREADS`.

    Example: ``auto_decode_threads(cores=96, num_workers=8, local_ranks=8)`` -> 1;
    ``auto_decode_threads(cores=16, num_workers=2)`` -> 4; ``auto_decode_threads(cores=8, num_workers=0)`` -> 4.
    """
    processes = max(1, num_workers) * max(1, local_ranks)
    return max(1, min(MAX_AUTO_DECODE_THREADS, cores // processes))


def _sample_mapping_problem(spec: Any) -> str | None:
    """``sample_mapping`` must be None or ``"module:function"`` (imported only when a loader is built).

    Example: ``_sample_mapping_problem("my_pkg.maps")`` -> an error showing the ``module:function`` form.
    """
    if spec is None or (isinstance(spec, str) and spec.count(":") == 1 and all(spec.split(":"))):
        return None
    return f"sample_mapping={spec!r}: must be 'module:function'; fix: e.g. sample_mapping: my_pkg.maps:to_record"



def exclude_problem(exclude: Any) -> str | None:
    """``exclude`` must be a list of non-empty strings, each ``KEY`` or ``SHARD#KEY`` with both parts set.

    Example: ``exclude_problem(("a.tar#",))`` -> an error naming ``'a.tar#'``.
    """
    if not isinstance(exclude, tuple) or not all(isinstance(entry, str) for entry in exclude):
        return (
            f"exclude={exclude!r}: must be a list of sample keys or 'SHARD#KEY' strings; "
            "fix: set e.g. exclude: ['shards/data-000001.tar#000017']"
        )
    bad = [entry for entry in exclude if not entry or any(not part for part in entry.split("#")) or entry.count("#") > 1]
    if bad:
        return (
            f"exclude entries {bad!r}: each must be KEY or SHARD#KEY with both parts non-empty; "
            "fix: copy the line the loader's error prints, e.g. 'shards/data-000001.tar#000017'"
        )
    return None


def _delay_problem(delay: Any) -> str | None:
    """``storage_retry_delay`` must be a number of seconds >= 0. Example: ``_delay_problem(-1)`` -> an error line."""
    if isinstance(delay, (int, float)) and not isinstance(delay, bool) and delay >= 0:
        return None
    return f"storage_retry_delay={delay!r}: must be a number of seconds >= 0; fix: set e.g. storage_retry_delay: 0.5"


def _timeout_problem(timeout: Any, num_workers: Any) -> str | None:
    """``timeout`` must be a number of seconds >= 0, and > 0 only with worker processes.

    Example: ``_timeout_problem(60, 0)`` -> an error suggesting num_workers >= 1.
    """
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout < 0:
        return f"timeout={timeout!r}: must be a number of seconds >= 0 (0 waits forever); fix: set e.g. timeout: 600"
    if timeout > 0 and num_workers == 0:
        return (
            f"timeout={timeout!r}: without worker processes (num_workers=0) the main process cannot time "
            "itself out; fix: set num_workers >= 1, or timeout: 0"
        )
    return None
