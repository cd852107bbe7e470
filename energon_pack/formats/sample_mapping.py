"""A user's sample mapping: a callable ``sample -> our record form`` (``formats.record``) that
replaces the default of a foreign dataset's samples, and cooks crude ones.

Where one is given, most specific first:

1. a dataset's subflavor ``sample_mapping: "module:function"`` (a metadataset entry's
   ``subflavors``, or the dataset.yaml's): that dataset only;
2. ``get_packing_loader(..., sample_mapping=fn or "module:function")``, or ``sample_mapping:
   module:function`` in the packing config YAML: every foreign dataset the loader reads;
3. the default of the sample type (``formats.energon_types``).

Our own datasets (``QwenVLChatSample``) are never mapped. The loader's mapping enters the resume
fingerprint by its qualified name (``mapping_name``), so a state saved under one mapping does not
resume silently under another.

Example: ``resolve_mapping("json:loads")`` -> the function ``json.loads``;
``mapping_name(json.loads)`` -> ``"json:loads"``.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from energon_pack.errors import UsageError

#: The subflavor key naming a dataset's own mapping.
SUBFLAVOR_KEY = "sample_mapping"

SampleMapping = Callable[[Any], Any]

_LOADER_MAPPING: contextvars.ContextVar[SampleMapping | None] = contextvars.ContextVar("sample_mapping", default=None)


class SampleMappingError(UsageError):
    """A sample mapping that cannot be used: a bad ``module:function`` or a sample type without one."""


def resolve_mapping(spec: str | SampleMapping | None, *, where: str = "sample_mapping") -> SampleMapping | None:
    """The callable that ``spec`` names: ``"module:function"`` (``function`` may be dotted) is
    imported, a callable is returned as is, None stays None. ``where`` names the setting in errors.

    Example: ``resolve_mapping("os.path:join")`` -> ``os.path.join``; ``resolve_mapping("nope")`` ->
    ``SampleMappingError`` naming the value and the ``module:function`` form.
    """
    if spec is None or callable(spec):
        return spec
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise SampleMappingError(
            f"{where}={spec!r} is not a callable nor 'module:function'; fix: e.g. {where}: my_pkg.maps:to_record"
        )
    module_name, _, attribute = spec.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for name in attribute.split("."):
            target = getattr(target, name)
    except (ImportError, AttributeError) as err:
        raise SampleMappingError(
            f"{where}={spec!r} cannot be loaded ({type(err).__name__}: {err}); fix: make {module_name!r} "
            "importable (on PYTHONPATH) and name a function defined in it"
        ) from None
    if not callable(target):
        raise SampleMappingError(f"{where}={spec!r} names a {type(target).__name__}, not a function; fix: name a function")
    return target


def mapping_name(mapping: SampleMapping | str | None) -> str | None:
    """The qualified name ``module:qualname`` of a mapping (a string spec as given), or None.

    Example: ``mapping_name(json.loads)`` -> ``"json:loads"``; a lambda in ``my_pkg`` ->
    ``"my_pkg:<lambda>"``.
    """
    if mapping is None or isinstance(mapping, str):
        return mapping
    module = getattr(mapping, "__module__", None) or type(mapping).__module__
    qualname = getattr(mapping, "__qualname__", None) or type(mapping).__qualname__
    return f"{module}:{qualname}"


@contextlib.contextmanager
def loader_sample_mapping(mapping: SampleMapping | None) -> Iterator[None]:
    """While active, foreign dataset readers built here use ``mapping`` (``get_packing_loader``
    enters it around building its datasets; readers keep it after it exits)."""
    token = _LOADER_MAPPING.set(mapping)
    try:
        yield
    finally:
        _LOADER_MAPPING.reset(token)


def current_loader_mapping() -> SampleMapping | None:
    """The mapping of the enclosing ``loader_sample_mapping``, else None."""
    return _LOADER_MAPPING.get()


def dataset_mapping(
    subflavors: Mapping[str, Any] | None,
    loader_mapping: SampleMapping | None,
    default: SampleMapping | None,
    *,
    dataset: Any,
    what: str,
    fix: str,
) -> SampleMapping:
    """The mapping a dataset's samples go through: its subflavor ``sample_mapping``, else the
    loader's, else ``default``; ``SampleMappingError`` (one line naming the dataset, ``what`` it holds
    and ``fix``) when there is none.

    Example: ``dataset_mapping({"sample_mapping": "json:loads"}, None, None, ...)`` -> ``json.loads``.
    """
    spec = (subflavors or {}).get(SUBFLAVOR_KEY)
    chosen = resolve_mapping(spec, where=f"subflavor {SUBFLAVOR_KEY}") or loader_mapping or default
    if chosen is None:
        raise SampleMappingError(
            f"dataset {str(dataset)!r} holds {what}, which has no default conversation; fix: {fix}, "
            "passed as get_packing_loader(..., sample_mapping=fn), as 'sample_mapping: module:function' "
            "in the packing config, or as the dataset's subflavor sample_mapping (docs/foreign_datasets.md)"
        )
    return chosen
