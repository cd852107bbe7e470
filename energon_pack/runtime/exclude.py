"""The ``exclude`` list: samples the loaders and ``energon-pack plan`` skip as ``excluded``.

An entry is a sample key (every shard) or ``SHARD#KEY``, where SHARD is the shard's name as
Energon gives it (``shards/data-000001.tar``) or its file name (``data-000001.tar``).
Exclusion happens in preencode, so the sample stream, its indices and the loader states stay what
they were: a skip marker takes the sample's place (docs/state_contract.md).
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from typing import Any

__all__ = ["ExcludeList", "exclude_entry", "sample_shard"]


def sample_shard(sample: Any) -> str | None:
    """The shard name of an Energon sample (its first ``__sources__`` entry), else None.

    Example: a sample read from ``shards/data-000001.tar`` -> ``"shards/data-000001.tar"``.
    """
    sources = getattr(sample, "__sources__", None) or ()
    return getattr(sources[0], "shard_name", None) if sources else None


def exclude_entry(shard: str | None, key: str) -> str:
    """The ``exclude`` list entry of one sample. Example: ``("shards/data-000001.tar", "000017")``
    -> ``"shards/data-000001.tar#000017"``; without a shard: the key alone."""
    return f"{shard}#{key}" if shard else key


class ExcludeList:
    """The entries of an ``exclude`` list, matched by key or by (shard, key).

    Example: ``ExcludeList(["7", "a/b.tar#3"]).match("x.tar", "7")`` -> ``"7"``;
    ``.match("a/b.tar", "3")`` and ``.match("b.tar", "3")`` -> ``"a/b.tar#3"``; ``.match("c.tar", "3")`` -> None.
    """

    def __init__(self, entries: Iterable[str]) -> None:
        self.entries = tuple(entries)
        self._keys = {entry for entry in self.entries if "#" not in entry}
        self._pairs: dict[tuple[str, str], str] = {}
        for entry in self.entries:
            if "#" in entry:
                shard, key = entry.split("#")
                self._pairs[(shard, key)] = entry
                self._pairs.setdefault((posixpath.basename(shard), key), entry)

    def __bool__(self) -> bool:
        return bool(self.entries)

    def match(self, shard: str | None, key: str) -> str | None:
        """The entry that excludes the sample ``key`` of ``shard``, else None."""
        if key in self._keys:
            return key
        if not shard:
            return None
        return self._pairs.get((shard, key)) or self._pairs.get((posixpath.basename(shard), key))

    def of_sample(self, sample: Any) -> str | None:
        """The entry that excludes an Energon sample (its shard and ``__key__``), else None."""
        if not self.entries:
            return None
        return self.match(sample_shard(sample), str(getattr(sample, "__key__", "")))
