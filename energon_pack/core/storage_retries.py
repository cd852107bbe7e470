"""Retries of sample reads that fail on a transient storage error (object storage hiccups).

Energon reads a sample from its shard through ``EPath`` (local files, or ``msc://`` through the
Multi-Storage Client, MSC). MSC retries a 429 / 503 answer as its profile's ``retry`` block says,
and botocore retries some connection errors itself; what still surfaces from a sample read (a reset
or dropped connection wrapped in MSC's ``RuntimeError``, a timeout, MSC's ``RetryableError`` once its
attempts are spent) would otherwise kill the epoch. ``install_storage_retries`` wraps Energon
7.4.1's per-sample tar read (``ITarReader._get_item_by_sample_pointer``) so that such an error is
retried up to ``max_retries`` times, after ``delay * 2**attempt`` seconds each, reopening the shard;
an error that is not transient (corrupt data: a bad tar header, a short file) is raised at once,
never retried. After the last retry the error names the shard object and the sample.

The settings are process-wide (the loader that was built last sets them; forked workers inherit
them); each retry is counted in this process until ``take_storage_retries`` collects the count.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["StorageReadError", "install_storage_retries", "is_transient", "take_storage_retries"]

_LOG = logging.getLogger(__name__)

#: Exception classes (by name, anywhere in an error's MRO or its chain of causes) that mark a
#: transient storage error: MSC's retryable class, botocore's and urllib3's connection and read
#: errors, http.client's incomplete reads. Builtin ``ConnectionError`` and ``TimeoutError`` count too.
TRANSIENT_NAMES = frozenset({
    "RetryableError", "HTTPClientError", "ConnectionClosedError", "EndpointConnectionError", "ReadTimeoutError",
    "ConnectTimeoutError", "ProtocolError", "IncompleteRead", "IncompleteReadError", "ResponseStreamingError",
    "NewConnectionError",
})


class StorageReadError(OSError):
    """A sample read still failing on a transient storage error after every retry; names the object."""


@dataclass
class _Policy:
    max_retries: int = 4
    delay: float = 0.5


_POLICY = _Policy()
_RETRIES = [0]  # retries done in this process since the last take_storage_retries()


def is_transient(error: BaseException) -> bool:
    """Whether ``error`` (or an error in its ``__cause__`` / ``__context__`` chain) is a transient
    storage error worth retrying. Example: MSC's ``RuntimeError`` caused by botocore's
    ``ConnectionClosedError`` -> True; ``ValueError("Unexpected end of tar file")`` -> False."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, (ConnectionError, TimeoutError)):
            return True
        if any(cls.__name__ in TRANSIENT_NAMES for cls in type(error).__mro__):
            return True
        error = error.__cause__ or error.__context__
    return False


def take_storage_retries() -> int:
    """Retries done in this process since the last call (and reset the count to 0)."""
    count, _RETRIES[0] = _RETRIES[0], 0
    return count


def with_retries(read: Any, what: Any, reopen: Any) -> Any:
    """``read()``, retried on a transient error as the installed policy says (``reopen()`` before
    each retry; ``what()``: the object's name for the final error)."""
    attempt = 0
    while True:
        try:
            return read()
        except Exception as error:
            if not is_transient(error):
                raise
            if attempt >= _POLICY.max_retries:
                raise StorageReadError(
                    f"reading {what()} failed on a transient storage error after {attempt} retries "
                    f"({type(error).__name__}: {error}); fix: check the storage endpoint, or raise "
                    "max_storage_retries / storage_retry_delay in the config"
                ) from error
            wait = _POLICY.delay * 2**attempt
            _LOG.warning("transient storage error reading %s (%s); retry %d in %.2f s", what(), error, attempt + 1, wait)
            time.sleep(wait)
            reopen()
            attempt += 1
            _RETRIES[0] += 1


def install_storage_retries(max_retries: int, delay: float) -> None:
    """Set the process-wide retry policy and wrap Energon's per-sample tar read (idempotent)."""
    from megatron.energon.flavors.webdataset.itar_reader import ITarReader

    _POLICY.max_retries, _POLICY.delay = max_retries, delay
    if getattr(ITarReader._get_item_by_sample_pointer, "_energon_pack_retries", False):
        return
    energon_read = ITarReader._get_item_by_sample_pointer

    def read_with_retries(self: Any, sample_pointer: Any, *args: Any, **kwargs: Any) -> Any:
        shard = sample_pointer.tar_file_id
        return with_retries(
            lambda: energon_read(self, sample_pointer, *args, **kwargs),
            lambda: f"sample at byte {sample_pointer.byte_offset} of {self.tar_filepaths[shard]}",
            lambda: _forget_open_shard(self, shard),
        )

    read_with_retries._energon_pack_retries = True  # type: ignore[attr-defined]
    ITarReader._get_item_by_sample_pointer = read_with_retries


def _forget_open_shard(reader: Any, shard: int) -> None:
    """Drop the reader's cached open file of ``shard`` (its stream may be broken); reopened on the next read."""
    tar_file = reader.itar_files_cache.pop(shard, None)
    if tar_file is None:
        return
    for close in (tar_file.fileobj.close, tar_file.close):
        try:
            close()
        except Exception:  # a broken stream may fail to close; it is dropped either way
            pass
