"""Warnings about skipped samples: one per sample key per process (each Energon worker).

A bad sample is met again every epoch (and by every resume); its skip is always counted
(``PackingStats.skipped``), but it is logged only the first time this process meets its key, so
the log does not repeat itself and does not grow epoch after epoch.
"""

from __future__ import annotations

import logging
import os
from typing import Any

logger = logging.getLogger(__name__)

#: Keys already warned about, and the process they were warned in (a forked worker starts empty).
_warned: set[Any] = set()
_owner_pid = os.getpid()


def warn_skip(key: Any, reason: Any) -> bool:
    """Log ``skipping sample KEY: REASON`` unless this process already did for ``key``; True when logged.

    Example: ``warn_skip("a", "corrupt_image: ...")`` -> True (logged), again -> False (silent).
    """
    global _owner_pid
    if _owner_pid != os.getpid():
        _warned.clear()
        _owner_pid = os.getpid()
    if key in _warned:
        return False
    _warned.add(key)
    logger.warning("energon_pack: skipping sample %r: %s (its later skips are counted, not logged)", key, reason)
    return True
