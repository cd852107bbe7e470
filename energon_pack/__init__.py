"""energon_pack: online sequence packing of Qwen-VL chat samples for Megatron-Energon.

Public names are imported lazily (PEP 562) so that ``import energon_pack`` stays
cheap in Energon worker processes and in the CLI.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_PUBLIC_NAMES = {
    "PackingConfig": "energon_pack.config",
    "ParallelTopology": "energon_pack.config",
    "check_training_compat": "energon_pack.config",
    "ResumeMismatchError": "energon_pack.identity",
    "QwenVLChatSample": "energon_pack.core.samples",
    "QwenVLChatWebdataset": "energon_pack.formats.qwen_chat",
    "load_processor": "energon_pack.qwen.processor",
    "QwenVLPackingTaskEncoder": "energon_pack.runtime.task_encoder",
    "VisualInputs": "energon_pack.core.visual",
    "get_packing_loader": "energon_pack.loader",
    "RowMetrics": "energon_pack.metrics",
    "SourceInfo": "energon_pack.metrics",
    "to_device_batch": "energon_pack.rows.step",
    "thd_partition_indices": "energon_pack.rows.step",
    "SyntheticSpec": "energon_pack.data.synthetic",
    "make_synthetic_dataset": "energon_pack.data.synthetic",
    "MixSample": "energon_pack.packing.simulate",
    "dataset_samples": "energon_pack.cli.simulate",
    "reference_mix": "energon_pack.packing.simulate",
    "simulate_stream": "energon_pack.packing.simulate",
    "simulate_ffd_per_buffer": "energon_pack.packing.simulate",
    "simulation_table": "energon_pack.packing.simulate",
}

__all__ = sorted(_PUBLIC_NAMES)


def __getattr__(name: str) -> Any:
    module_name = _PUBLIC_NAMES.get(name)
    if module_name is None:
        raise AttributeError(f"module 'energon_pack' has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
