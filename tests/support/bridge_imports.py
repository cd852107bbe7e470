"""Importing Megatron-Bridge's training-step modules on CPU, without Transformer Engine.

``megatron/bridge/peft/lora_layers.py`` imports Transformer Engine unconditionally; a stand-in
module is served to that importer alone (``te_stand_in_for_lora_layers``) and dropped afterwards.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_LORA_LAYERS = "megatron.bridge.peft.lora_layers"


class _AbsentClass:
    """Stand-in for a Transformer Engine class: nothing is an instance of it."""


class _TransformerEngineStandIn(types.ModuleType):
    """``transformer_engine`` / ``.pytorch`` / ``.ops``: lower-case names are submodules, others classes."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _TransformerEngineStandIn(f"{self.__name__}.{name}") if name.islower() else _AbsentClass


class LoraLayersOnly(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves the stand-in to ``megatron/bridge/peft/lora_layers.py`` and to no other importer."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name.split(".")[0] != "transformer_engine":
            return None
        frame = sys._getframe(1)
        while frame is not None and frame.f_globals.get("__name__") != _LORA_LAYERS:
            frame = frame.f_back
        return None if frame is None else importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _TransformerEngineStandIn(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        pass


@contextmanager
def te_stand_in_for_lora_layers() -> Iterator[None]:
    """Within: Bridge's ``lora_layers`` module imports the Transformer Engine stand-in; after: no
    ``transformer_engine`` module is left in ``sys.modules``."""
    finder = LoraLayersOnly()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in [n for n in sys.modules if n.split(".")[0] == "transformer_engine"]:
            del sys.modules[name]


def import_bridge_modules() -> types.SimpleNamespace:
    """Bridge's training-step modules, imported without Transformer Engine."""
    import megatron.core.models.gpt  # noqa: F401  (Megatron-Core probes for TE first: it finds none)
    import megatron.core.utils

    megatron.core.utils.get_te_version()  # cached as "no TE" before the stand-in exists
    with te_stand_in_for_lora_layers():
        vlm_step = importlib.import_module("megatron.bridge.training.vlm_step")
    return types.SimpleNamespace(
        vlm_step=vlm_step,
        packed_seq_utils=importlib.import_module("megatron.bridge.training.utils.packed_seq_utils"),
        checkpointing=importlib.import_module("megatron.bridge.training.checkpointing"),
        data_utils=importlib.import_module("megatron.bridge.data.utils"),
        qwen25_vl=importlib.import_module("megatron.bridge.models.qwen_vl.modeling_qwen25_vl"),
        state=importlib.import_module("megatron.bridge.training.state"),
    )
