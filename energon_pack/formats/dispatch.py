"""Which reader reads a dataset, decided from the dataset's own ``.nv-meta/dataset.yaml`` (no flag).

Energon builds a WebDataset by importing the class its dataset.yaml names (``__module__`` /
``__class__``), or, without one, its ``StandardWebdatasetFactory`` for the named ``sample_type``.
Inside :func:`reading_formats` (``get_packing_loader``, ``energon-pack plan``, ``inspect`` and
``simulate`` enter it), every dataset.yaml that Energon's ``get_dataset_from_config`` loads, a plain
dataset or a leaf of a metadataset, local or ``msc://``, first goes through :func:`reader_config`:
the first registered :class:`DatasetFormat` that recognises it names the reader class that Energon
then builds, with the dataset.yaml's other keys (``field_map``, ``sample_type``, ``subflavors``,
...) as its arguments. Every reader yields :class:`~energon_pack.core.samples.QwenVLChatSample`
(a typed conversation plus compressed media; a bad sample carries ``invalid_reason``), so the task
encoder sees one sample type. The class named in dataset.yaml is never imported (Megatron-Bridge
need not be installed). A dataset no format recognises is refused before any sample is read with
one line naming its type and the fix (:class:`UnreadableDatasetError`, a ``UsageError``).

Registry API, for a new format (one module in this folder, with a worked example)::

    FORMAT = DatasetFormat(
        name="megatron-bridge-chatml",                 # shown by ``energon-pack inspect``
        recognises=lambda config: ...,                 # the raw dataset.yaml mapping -> bool
        reader="energon_pack.formats.bridge_chatml:BridgeChatMLWebdataset",
        how_read="one-line summary for inspect",
    )

and add it to ``FORMATS`` below (formats shipped with energon_pack), or call
:func:`register_format` at run time (a user's own format; it is tried before the shipped ones).
``reader`` is ``"module:Class"``: a ``BaseCoreDatasetFactory`` whose samples are
``QwenVLChatSample``. :func:`dataset_class_name` and :func:`sample_type_name` read the two names a
dataset.yaml may carry. Example: ``reader_config({"__module__": "megatron.bridge.data.energon.
task_encoder_utils", "__class__": "ChatMLWebdataset", "field_map": {...}})`` ->
``{"__module__": "energon_pack.formats.bridge_chatml", "__class__": "BridgeChatMLWebdataset",
"field_map": {...}}``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from energon_pack.errors import UsageError
from energon_pack.formats import bridge_chatml, energon_webdataset, qwen_chat


@dataclass(frozen=True, kw_only=True)
class DatasetFormat:
    """A dataset format we read: how to recognise its dataset.yaml and which reader reads it."""

    #: Short name (``energon-pack inspect`` prints it), e.g. ``"energon-pack"``.
    name: str
    #: Whether a raw dataset.yaml mapping is of this format.
    recognises: Callable[[Mapping[str, Any]], bool]
    #: The reader class, ``"module:Class"``, built by Energon with the dataset.yaml's other keys.
    reader: str
    #: How its samples become our record form, one line (``energon-pack inspect`` prints it).
    how_read: str


class UnreadableDatasetError(UsageError):
    """A dataset.yaml names a dataset class or sample type that no registered format reads."""


def dataset_class_name(config: Mapping[str, Any]) -> str | None:
    """``module.Class`` that a dataset.yaml names at its top level, or None.

    Example: ``{"__module__": "energon_pack", "__class__": "QwenVLChatWebdataset"}`` ->
    ``"energon_pack.QwenVLChatWebdataset"``; ``{"sample_type": {...}, "field_map": {...}}`` -> None.
    """
    module, name = config.get("__module__"), config.get("__class__")
    return f"{module}.{name}" if module and name else None


def sample_type_name(config: Mapping[str, Any]) -> str | None:
    """``module.Class`` of a dataset.yaml's ``sample_type`` block, or None.

    Example: ``{"sample_type": {"__module__": "megatron.energon", "__class__": "CaptioningSample"}}``
    -> ``"megatron.energon.CaptioningSample"``.
    """
    block = config.get("sample_type")
    return dataset_class_name(block) if isinstance(block, Mapping) else None


def shipped_format(name: str, recognises: Callable[[Mapping[str, Any]], bool], reader: type, how_read: str) -> DatasetFormat:
    """A format of this package, its reader given as the class itself (``reader`` is derived from it).

    Example: ``shipped_format("energon-pack", qwen_chat.is_our_dataset_config, qwen_chat.QwenVLChatWebdataset,
    qwen_chat.HOW_READ).reader`` -> ``"energon_pack.formats.qwen_chat:QwenVLChatWebdataset"``.
    """
    return DatasetFormat(name=name, recognises=recognises, reader=f"{reader.__module__}:{reader.__qualname__}", how_read=how_read)


#: Formats shipped with energon_pack, tried in order (after the user's, see :func:`register_format`).
FORMATS: tuple[DatasetFormat, ...] = (
    shipped_format("energon-pack", qwen_chat.is_our_dataset_config, qwen_chat.QwenVLChatWebdataset, qwen_chat.HOW_READ),
    shipped_format(
        "megatron-bridge-chatml", bridge_chatml.is_bridge_dataset_config, bridge_chatml.BridgeChatMLWebdataset,
        bridge_chatml.HOW_READ,
    ),
    shipped_format(
        "energon-sample-type", energon_webdataset.is_sample_type_config, energon_webdataset.EnergonSampleWebdataset,
        energon_webdataset.HOW_READ_SAMPLE_TYPE,
    ),
    *(
        shipped_format(
            f"energon-{name}", functools.partial(energon_webdataset.names_deprecated_class, name),
            getattr(energon_webdataset, f"Deprecated{name}"), energon_webdataset.HOW_READ_SAMPLE_TYPE,
        )
        for name in energon_webdataset.DEPRECATED_CLASSES
    ),
    shipped_format(
        "energon-crude", energon_webdataset.is_crude_config, energon_webdataset.CookedWebdataset,
        energon_webdataset.HOW_READ_CRUDE,
    ),
)
_USER_FORMATS: list[DatasetFormat] = []


def register_format(dataset_format: DatasetFormat) -> None:
    """Register a format for this process; it is tried before the shipped ``FORMATS``."""
    _USER_FORMATS.insert(0, dataset_format)


def registered_formats() -> tuple[DatasetFormat, ...]:
    """Every format in the order they are tried."""
    return (*_USER_FORMATS, *FORMATS)


def format_of(config: Mapping[str, Any], *, dataset: Any = "dataset") -> DatasetFormat:
    """The format that reads a dataset.yaml mapping; ``UnreadableDatasetError`` when none does."""
    for dataset_format in registered_formats():
        if dataset_format.recognises(config):
            return dataset_format
    named = dataset_class_name(config) or (
        f"a StandardWebdatasetFactory of {sample_type_name(config)}" if sample_type_name(config) else "unnamed"
    )
    raise UnreadableDatasetError(
        f"dataset {str(dataset)!r} is of type {named}, which energon_pack does not read (formats read: "
        f"{', '.join(f.name for f in registered_formats())}); fix: convert it with `energon-pack prepare`, or "
        "read it as a CrudeWebdataset with a cooker that returns our record form (docs/foreign_datasets.md)"
    )


def reader_config(config: Mapping[str, Any], *, dataset: Any = "dataset") -> dict[str, Any]:
    """``config`` (a raw dataset.yaml mapping) rewritten to name the reader of its format."""
    module, _, name = format_of(config, dataset=dataset).reader.partition(":")
    return {**config, "__module__": module, "__class__": name}


def read_dataset_yaml(dataset: Any, dataset_config: str = "dataset.yaml") -> dict[str, Any]:
    """The raw mapping of ``dataset``'s ``.nv-meta/<dataset_config>`` (local or ``msc://``)."""
    from megatron.energon.epathlib import EPath
    from megatron.energon.eyaml import load_yaml

    with (EPath(dataset) / ".nv-meta" / dataset_config).open("rb") as stream:
        return dict(load_yaml(stream) or {})


def describe_format(config: Mapping[str, Any], *, dataset: Any = "dataset") -> list[str]:
    """What a dataset.yaml mapping is and how it will be read, as ``energon-pack inspect`` prints it.

    Example: a Bridge dataset.yaml -> ``["format: megatron-bridge-chatml", "dataset class:
    megatron.bridge.data.energon.task_encoder_utils.ChatMLWebdataset (not imported)",
    "field map: imgs: jpgs, conversation: json", "read as: ..."]``.
    """
    dataset_format = format_of(config, dataset=dataset)
    lines = [f"format: {dataset_format.name}"]
    if dataset_class_name(config):
        lines.append(f"dataset class: {dataset_class_name(config)} (not imported; read by {dataset_format.reader})")
    if sample_type_name(config):
        lines.append(f"sample type: {sample_type_name(config)}")
    field_map = config.get("field_map")
    if isinstance(field_map, Mapping):
        lines.append("field map: " + ", ".join(f"{field}: {member}" for field, member in field_map.items()))
    lines.append(f"read as: {dataset_format.how_read}")
    return lines


@contextlib.contextmanager
def reading_formats() -> Iterator[None]:
    """While active, Energon builds every WebDataset with the reader of its format (re-entrant).

    Datasets built inside keep their reader after it exits (worker processes fork from them).
    """
    import megatron.energon.dataset_config as energon_dataset_config

    energon_load_config = energon_dataset_config.load_config
    if getattr(energon_load_config, "reads_formats", False):
        yield
        return

    def load_config_with_reader(path: Any, *, default_type: Any, **kwargs: Any) -> Any:
        if isinstance(path, Mapping) or not str(path).endswith((".yaml", ".yml")):
            return energon_load_config(path, default_type=default_type, **kwargs)
        from megatron.energon.eyaml import load_yaml

        with path.open("rb") as stream:
            config = dict(load_yaml(stream) or {})
        dataset = path.parent.parent  # <dataset>/.nv-meta/dataset.yaml
        return energon_load_config(reader_config(config, dataset=dataset), default_type=default_type, **kwargs)

    load_config_with_reader.reads_formats = True  # type: ignore[attr-defined]
    energon_dataset_config.load_config = load_config_with_reader
    try:
        yield
    finally:
        energon_dataset_config.load_config = energon_load_config
