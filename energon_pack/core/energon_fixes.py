"""Workarounds for Megatron-Energon 7.4.1 behaviour, applied when an energon_pack dataset is built.

``forget_read_tar_members``: each Energon worker keeps an open ``ITarFile`` (a ``tarfile.TarFile``)
per shard and reads a sample by seeking to its offset and calling ``next()``. ``TarFile.next()``
also appends every header it reads to ``TarFile.members``, a list Energon never uses (it extracts
by ``TarInfo``); with a few shards and ``repeat=True`` the list grows by every member of every
epoch, for the whole run (measured: ~140 Python objects, ~9 KB, per W=1024 row and worker). The
patched ``next`` returns the same header and keeps no record of it.
"""

from __future__ import annotations

import tarfile

from megatron.energon.flavors.webdataset.itar import ITarFile

_energon_next = ITarFile.next


def _next_without_member_record(self: ITarFile) -> tarfile.TarInfo | None:
    """``ITarFile.next`` minus the ``members`` record (Energon reads members by offset, never by name)."""
    info = _energon_next(self)
    self.members.clear()
    return info


def forget_read_tar_members() -> None:
    """Install ``_next_without_member_record`` as ``ITarFile.next`` (idempotent)."""
    ITarFile.next = _next_without_member_record
