"""Trainer log figures of packed rows: loss per source, mixture shares, fill, skips, loader wait
(``RowMetrics``; every key in docs/metrics.md), and the blend's sources they are named after."""

from energon_pack.metrics.row_metrics import (
    DEFAULT_SKIP_REASONS,
    RowMetrics,
    SourceInfo,
    SourceNameError,
    TOKEN_KEYS,
    source_infos,
    source_name,
)

__all__ = [
    "DEFAULT_SKIP_REASONS", "TOKEN_KEYS", "RowMetrics", "SourceInfo", "SourceNameError", "source_infos", "source_name",
]
