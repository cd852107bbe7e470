"""Packing configuration: one module per part, one for the rules that span parts, one for YAML.

``topology`` (:class:`ParallelTopology`), ``row_layout`` (:class:`RowLayout`), ``policy``
(:class:`PackingPolicy`), ``loader_options`` (:class:`LoaderOptions`), ``trainer``
(:class:`TrainerSettings`), ``cross_part`` (rules over several parts), ``packing_config``
(:class:`PackingConfig`, ``check_training_compat``), ``yaml_io`` and ``values`` (the value rules).
Everything is plain Python (no torch), cheap to import in the CLI, in Energon worker processes and
in training scripts. A configuration error fails fast, on construction, with a ``ValueError``
that names the offending value, the rule and the fix (docs/configuration.md). Resume identity
(fingerprints and their comparison) is ``energon_pack.identity``.
"""

from __future__ import annotations

from energon_pack.config.loader_options import LoaderOptions
from energon_pack.config.packing_config import CONFIG_PARTS, PackingConfig, check_training_compat
from energon_pack.config.policy import (
    DEFAULT_BALANCE_WINDOW_ROWS,
    DEFAULT_ROUND_ROWS,
    OLD_DEFAULT_BALANCE_WINDOW_ROWS,
    OLD_DEFAULT_BUFFER_SIZE,
    OVERLONG_POLICIES,
    PACKING_MODES,
    PackingPolicy,
)
from energon_pack.config.row_layout import LOSS_REDUCTIONS, PIXEL_DTYPES, RowLayout
from energon_pack.config.topology import ParallelTopology
from energon_pack.config.trainer import TrainerSettings
from energon_pack.config.values import ConfigError, closest_keys

__all__ = [
    "CONFIG_PARTS",
    "DEFAULT_BALANCE_WINDOW_ROWS",
    "DEFAULT_ROUND_ROWS",
    "OLD_DEFAULT_BALANCE_WINDOW_ROWS",
    "OLD_DEFAULT_BUFFER_SIZE",
    "LOSS_REDUCTIONS",
    "OVERLONG_POLICIES",
    "PACKING_MODES",
    "PIXEL_DTYPES",
    "ConfigError",
    "LoaderOptions",
    "PackingConfig",
    "PackingPolicy",
    "ParallelTopology",
    "RowLayout",
    "TrainerSettings",
    "check_training_compat",
    "closest_keys",
]
