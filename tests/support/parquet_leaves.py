"""The tests' view of a streamed Parquet leaf as pyarrow gives it, to compare the two."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from energon_pack.data.parquet_pages import leaf_column, leaf_items


def leaf_rows(path: Path, row_group: int, leaf: str) -> Iterator[Any]:
    """Each row's value of one leaf as ``pyarrow`` gives it (``to_pylist()`` of the leaf's array):
    for a list column ``leaf_items``'s rows, for another the value or None.

    Example: a ``video: binary`` column with rows ``b"v"``, ``None`` -> ``b"v"``, ``None``.
    """
    is_list = leaf_column(path, row_group, leaf).max_rep == 1
    # map, not a loop: no row is held here while the next one is read
    return map(lambda items: items if is_list or items is None else items[0], leaf_items(path, row_group, leaf))
