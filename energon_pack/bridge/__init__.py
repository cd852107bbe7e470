"""Training with Megatron-Bridge on energon_pack rows.

* :class:`PackingDatasetProvider` (``cfg.dataset``): builds this rank's train and validation
  iterators (the data-parallel group comes from Bridge);
* :class:`PackingIterator`: the iterator Bridge consumes; cycles epochs, and its ``save_state()``
  / ``restore_state()`` put our loader state (fingerprint included) into Bridge's checkpoints;
* :func:`forward_step`: Bridge's VLM ``forward_step`` whose reporting dict also holds the rows'
  :class:`~energon_pack.RowMetrics` (loss per source, mixture, fill, skips, loader wait), which
  Bridge reduces and logs like its ``lm loss``;
* :func:`check_bridge_config`: Bridge's training config against packed-row training, every
  violation with its fix.

Only :class:`PackingDatasetProvider` and :func:`forward_step` need Megatron-Bridge
(``pip install 'energon-pack[bridge]'``, Python 3.12); they are imported on first use (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import Any

from energon_pack.bridge.checks import check_bridge_config
from energon_pack.bridge.iterator import PackingIterator

#: Names whose modules import Megatron-Bridge, and those modules.
_NEED_BRIDGE = {"PackingDatasetProvider": "energon_pack.bridge.provider", "forward_step": "energon_pack.bridge.step"}

__all__ = ["PackingDatasetProvider", "PackingIterator", "check_bridge_config", "forward_step"]


def __getattr__(name: str) -> Any:
    module_name = _NEED_BRIDGE.get(name)
    if module_name is None:
        raise AttributeError(f"module 'energon_pack.bridge' has no attribute {name!r}")
    return getattr(importlib.import_module(module_name), name)  # imports Megatron-Bridge, so only on first use
