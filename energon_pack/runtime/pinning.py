"""Pinned host memory only where it helps: Energon's loaders always ask for it."""

from __future__ import annotations

from typing import TypeVar

import torch

LoaderT = TypeVar("LoaderT", bound=torch.utils.data.DataLoader)


def pin_only_with_accelerator(loader: LoaderT) -> LoaderT:
    """Turn off ``loader.pin_memory`` when no accelerator exists; return the loader.

    Energon's ``get_loader`` / ``SavableDataLoader`` pass ``pin_memory=True``; without an
    accelerator torch then warns once per loader ("no accelerator is found") and pins nothing.
    Example: on a CPU-only machine ``pin_only_with_accelerator(loader).pin_memory`` -> False.
    """
    loader.pin_memory = loader.pin_memory and torch.accelerator.is_available()
    return loader
