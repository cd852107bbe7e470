"""The per-user cache folder for generated data and converted tokenizers."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir"]


def cache_dir(name: str) -> Path:
    """``<root>/<name>``, root = ``$ENERGON_PACK_CACHE``, else ``$XDG_CACHE_HOME/energon_pack``,
    else ``~/.cache/energon_pack``. Nothing is created.

    Example: with ``ENERGON_PACK_CACHE=/tmp/ep``, ``cache_dir("demo")`` -> ``Path("/tmp/ep/demo")``.
    """
    root = os.environ.get("ENERGON_PACK_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "energon_pack"
    )
    return Path(root) / name
