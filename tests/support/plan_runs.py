"""The plan-loader tests' config and row digest (rows of 2048 tokens, one epoch)."""

from __future__ import annotations

from typing import Any

from energon_pack.config import PackingConfig
from tests.support.loader_runs import tensor_digest as row_digest

__all__ = ["W", "make_config", "row_digest"]

#: Row width (tokens) of the plan tests.
W = 2048


def make_config(num_workers: int = 0, **overrides: Any) -> PackingConfig:
    """A one-epoch config of ``W``-token rows."""
    return PackingConfig(**{"seq_length": W, "num_workers": num_workers, "repeat": False, **overrides})
