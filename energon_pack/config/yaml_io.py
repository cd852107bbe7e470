"""YAML files of a packing config: reading one into a plain mapping, writing one from a mapping.

Validation is the config's (``PackingConfig.from_dict``); this module only turns bytes into a
mapping with errors that name the file and the fix.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import yaml

__all__ = ["read_yaml_mapping", "write_yaml"]


def read_yaml_mapping(path: str | os.PathLike[str]) -> Any:
    """The YAML document of the file at ``path`` (raises ValueError naming the file when it is not
    valid YAML or empty).

    Example: a file holding ``seq_length: 8192`` -> ``{"seq_length": 8192}``.
    """
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{os.fspath(path)}: not valid YAML ({exc}); fix: correct the YAML syntax") from exc
    if data is None:
        raise ValueError(f"{os.fspath(path)}: the config file is empty; fix: add at least 'seq_length: N'")
    return data


def write_yaml(mapping: Mapping[str, Any], path: str | os.PathLike[str] | None = None) -> str:
    """YAML text of ``mapping`` (key order kept); also written to ``path`` when given.

    Example: ``write_yaml({"seq_length": 8192})`` -> ``"seq_length: 8192\\n"``.
    """
    text = yaml.safe_dump(dict(mapping), sort_keys=False)
    if path is not None:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
    return text
