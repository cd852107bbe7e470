"""Training with Megatron-Bridge on energon_pack rows.

* :class:`PackingDatasetProvider` (``cfg.dataset``): builds this rank's train and validation
  iterators (the data-parallel group comes from Bridge);
* :class:`PackingIterator`: the iterator Bridge consumes; cycles epochs, and its ``save_state()``
  / ``restore_state()`` put our loader state (fingerprint included) into Bridge's checkpoints;
* :func:`check_bridge_config`: Bridge's training config against packed-row training, every
  violation with its fix.

Only :class:`PackingDatasetProvider` needs Megatron-Bridge (``pip install 'energon-pack[bridge]'``,
Python 3.12); it is imported on first use (PEP 562).
"""

from __future__ import annotations

from typing import Any

from energon_pack.bridge.checks import check_bridge_config
from energon_pack.bridge.iterator import PackingIterator

__all__ = ["PackingDatasetProvider", "PackingIterator", "check_bridge_config"]


def __getattr__(name: str) -> Any:
    if name == "PackingDatasetProvider":  # imports Megatron-Bridge, so only on first use
        from energon_pack.bridge.provider import PackingDatasetProvider

        return PackingDatasetProvider
    raise AttributeError(f"module 'energon_pack.bridge' has no attribute {name!r}")
