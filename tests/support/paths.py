"""Paths of this checkout that tests read: the repository root, README, configs, tutorials, templates."""

from __future__ import annotations

from pathlib import Path

#: The repository root (the folder holding ``pyproject.toml``).
REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
CONFIGS = REPO / "configs"
TUTORIALS = REPO / "tutorials"
TEMPLATES = REPO / "energon_pack" / "qwen" / "templates"
#: This folder: helpers and their data files (``golden_row_digests.json``), and the worker scripts.
SUPPORT = Path(__file__).resolve().parent
