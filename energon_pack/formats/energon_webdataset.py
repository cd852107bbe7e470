"""Readers of Energon's own dataset kinds, read in place: a ``sample_type`` dataset (what
``energon prepare`` writes for ``CaptioningSample``, ``VQASample``, ...: a ``field_map`` or a
``sample_loader``) and a ``CrudeWebdataset`` (samples cooked by the user's mapping).

Each reads the shard members (``formats.parts``: media stay compressed bytes), builds the sample
the dataset describes, and maps it to our record form with the dataset's mapping
(``formats.sample_mapping``: the user's, else the type's default of ``formats.energon_types``);
every sample comes out as a ``QwenVLChatSample``. A sample that cannot be built or mapped carries
its skip reason (counted at preencode); a sample type without a mapping is refused when the loader
is built (``SampleMappingError``, one line).

Example: a ``CaptioningSample`` dataset (``field_map: {image: jpg, caption: txt}``) whose sample
``a`` holds ``a.jpg`` and ``a.txt`` = ``"A cat."`` -> ``QwenVLChatSample(__key__="a",
conversation=[user [image, text "Describe the image."], assistant [text "A cat."]],
images=[<a.jpg bytes>], videos=[])``.
"""

# No `from __future__ import annotations`: Energon's config parser (dataset.yaml -> constructor
# arguments) reads the readers' ``__init__`` annotations as objects.

from collections.abc import Mapping
from typing import Any, Callable, Optional, Type

from megatron.energon import Sample
from megatron.energon.flavors.webdataset import DefaultGenericWebdatasetFactory

from energon_pack.core.energon_fixes import forget_read_tar_members
from energon_pack.core.samples import QwenVLChatSample
from energon_pack.errors import BadSampleError
from energon_pack.formats.energon_types import default_conversion
from energon_pack.formats.parts import decode_parts
from energon_pack.formats.record import chat_fields, invalid_fields
from energon_pack.formats.sample_mapping import current_loader_mapping, dataset_mapping, mapping_name

#: Energon's module, as dataset.yaml files name it.
ENERGON_MODULE = "megatron.energon"
#: Energon's deprecated per-type dataset classes (a dataset.yaml's ``__class__`` before the
#: ``sample_type`` block existed) -> the sample type each reads; each has a reader ``Deprecated<Class>``.
DEPRECATED_CLASSES = {
    "CaptioningWebdataset": "CaptioningSample",
    "VQAWebdataset": "VQASample",
    "VidQAWebdataset": "VidQASample",
    "MultiChoiceVQAWebdataset": "MultiChoiceVQASample",
    "OCRWebdataset": "OCRSample",
    "TextWebdataset": "TextSample",
    "InterleavedWebdataset": "InterleavedSample",
    "SimilarityInterleavedWebdataset": "SimilarityInterleavedSample",
}
#: Class names dataset.yaml may give Energon's crude dataset.
CRUDE_CLASSES = ("megatron.energon.CrudeWebdataset", "megatron.energon.flavors.crude.CrudeWebdataset")

HOW_READ_SAMPLE_TYPE = (
    "members through the dataset's field_map / sample_loader (media kept as compressed bytes) into its "
    "sample type, then the user's sample mapping or the type's default conversation"
)
HOW_READ_CRUDE = "members (JSON parsed, text as str, media as compressed bytes) through the user's sample mapping (cooker)"

_BASE_KEYS = ("__key__", "__restore_key__", "__sources__")


def _class_name(config: Mapping[str, Any]) -> Optional[str]:
    module, name = config.get("__module__"), config.get("__class__")
    return f"{module}.{name}" if module and name else None


def is_sample_type_config(config: Mapping[str, Any]) -> bool:
    """Whether a dataset.yaml describes a ``sample_type`` dataset (read by Energon's standard
    factory) that we read: one of Energon's sample types, or any type while the loader has a sample
    mapping (``formats.sample_mapping``; a type of the user's own is imported only then).

    Example: ``{"sample_type": {"__module__": "megatron.energon", "__class__": "VQASample"},
    "field_map": {...}}`` -> True; ``{"__module__": "energon_pack", "__class__": "QwenVLChatWebdataset"}`` -> False.
    """
    block = config.get("sample_type")
    if _class_name(config) is not None or not isinstance(block, Mapping) or block.get("__class__") in (
        None, QwenVLChatSample.__name__
    ):
        return False
    return str(block.get("__module__", "")).startswith(ENERGON_MODULE) or current_loader_mapping() is not None


def names_deprecated_class(name: str, config: Mapping[str, Any]) -> bool:
    """Whether a dataset.yaml names Energon's deprecated class ``name`` (under any module of Energon's).

    Example: ``("CaptioningWebdataset", {"__module__": "megatron.energon", "__class__": "CaptioningWebdataset",
    "field_map": {...}})`` -> True.
    """
    return config.get("__class__") == name and str(config.get("__module__", "")).startswith(ENERGON_MODULE)


def is_crude_config(config: Mapping[str, Any]) -> bool:
    """Whether a dataset.yaml names Energon's ``CrudeWebdataset``.

    Example: ``{"__module__": "megatron.energon", "__class__": "CrudeWebdataset"}`` -> True.
    """
    return _class_name(config) in CRUDE_CLASSES


def _sample_fields(sample: Mapping[str, Any], subflavors: Mapping[str, Any]) -> dict[str, Any]:
    return {**{key: sample[key] for key in _BASE_KEYS}, "__subflavors__": subflavors}


class _MappedWebdataset(DefaultGenericWebdatasetFactory[QwenVLChatSample]):
    """Shared part of the readers: the mapping (chosen when built) and one sample's way to a record."""

    __sample_type__ = QwenVLChatSample

    #: What the dataset holds, for the error of a dataset without a mapping.
    holds: str
    #: The default conversion of its samples, or None.
    default: Optional[Callable[[Any], Any]] = None

    def _init_reader(self) -> None:
        #: The loader's mapping when this reader was built (``formats.sample_mapping``).
        self.loader_mapping = current_loader_mapping()
        self._mapping: Optional[Callable[[Any], Any]] = None
        forget_read_tar_members()  # before workers fork: their shard readers must not grow

    def mapping(self) -> Callable[[Any], Any]:
        """The mapping of this dataset's samples; ``SampleMappingError`` when it has none."""
        if self._mapping is None:
            self._mapping = dataset_mapping(
                self.subflavors, self.loader_mapping, self.default, dataset=self.path, what=self.holds,
                fix=f"write a function ({self.holds} -> our record form)",
            )
        return self._mapping

    def build(self, worker_rotation_offset: int = 0) -> Any:
        """Energon's, after checking that the samples have a mapping (the loader is refused otherwise)."""
        self.mapping()
        return super().build(worker_rotation_offset)

    def _chat_sample(self, raw: Mapping[str, Any], make: Callable[[dict[str, Any]], Any]) -> QwenVLChatSample:
        """``make`` (decoded members -> the dataset's sample), then the mapping, as a ``QwenVLChatSample``."""
        base = _sample_fields(raw, self.subflavors)
        try:
            sample = make(decode_parts(raw))
        except BadSampleError as err:
            return QwenVLChatSample(**base, **invalid_fields(err))
        except Exception as err:  # the dataset's own field_map / sample_loader failed on this sample
            detail = f"the dataset's field_map / sample_loader failed: {type(err).__name__}: {err}"
            return QwenVLChatSample(**base, **invalid_fields(BadSampleError("malformed_sample", detail)))
        mapping = self.mapping()
        try:
            record = mapping(sample)
        except BadSampleError as err:
            return QwenVLChatSample(**base, **invalid_fields(err))
        except Exception as err:
            detail = f"sample mapping {mapping_name(mapping)} raised {type(err).__name__}: {err}"
            return QwenVLChatSample(**base, **invalid_fields(BadSampleError("sample_mapping_error", detail)))
        return QwenVLChatSample(**base, **chat_fields(record))


class EnergonSampleWebdataset(_MappedWebdataset):
    """Reader of a ``sample_type`` dataset (dataset.yaml: ``sample_type`` + ``field_map`` or
    ``sample_loader`` / ``part_filter``), yielding ``QwenVLChatSample``.

    ``sample_type``: the Energon ``Sample`` class the dataset.yaml names (e.g. ``VQASample``).
    ``decoder`` (from the task encoder) is accepted and unused: members are read by ``formats.parts``.
    """

    def __init__(self, path: Any, *, sample_type: Type[Sample], decoder: Any = None, **kwargs: Any) -> None:
        #: The sample type the dataset describes (its field map fills that type's fields).
        self.energon_sample_type = sample_type
        self.holds = f"samples of type {sample_type.__module__}.{sample_type.__qualname__}"
        self.default = default_conversion(sample_type)
        self._init_reader()
        self.__sample_type__ = sample_type  # Energon checks the field_map against the sample type's fields
        try:
            super().__init__(path, **kwargs)
        finally:
            del self.__sample_type__  # the samples this reader yields: QwenVLChatSample

    def load_sample(self, sample: Any) -> QwenVLChatSample:
        return self._chat_sample(sample, lambda parts: self.energon_sample_type(**self._sample_loader(parts)))


class DeprecatedClassWebdataset(EnergonSampleWebdataset):
    """Reader of a dataset.yaml naming one of Energon's deprecated per-type classes (e.g.
    ``CaptioningWebdataset`` with a ``field_map``): one subclass per class fixes the sample type."""

    #: The Energon sample type (a name in ``megatron.energon``) the deprecated class reads.
    deprecated_sample_type: str

    def __init__(self, path: Any, **kwargs: Any) -> None:
        import megatron.energon

        super().__init__(path, sample_type=getattr(megatron.energon, self.deprecated_sample_type), **kwargs)


for _class, _sample_type in DEPRECATED_CLASSES.items():
    globals()[f"Deprecated{_class}"] = type(
        f"Deprecated{_class}", (DeprecatedClassWebdataset,), {"deprecated_sample_type": _sample_type, "__module__": __name__}
    )


class CookedWebdataset(_MappedWebdataset):
    """Reader of a ``CrudeWebdataset``: every member (``formats.parts``) in one dict (Energon's
    ``CrudeSample``), cooked by the dataset's sample mapping into our record form.

    The mapping (the cooker) receives ``{"__key__": ..., "__subflavors__": ..., "jpg": b"...",
    "json": {...}, ...}`` and returns our record form. ``part_filter``: which members to read
    (default all); ``decoder`` is accepted and unused.
    """

    holds = "crude samples (CrudeWebdataset)"

    def __init__(self, path: Any, *, part_filter: Any = None, decoder: Any = None, **kwargs: Any) -> None:
        self._init_reader()
        super().__init__(
            path, sample_loader=lambda sample: {}, part_filter=part_filter or (lambda _part: True), **kwargs
        )

    def load_sample(self, sample: Any) -> QwenVLChatSample:
        from megatron.energon import CrudeSample

        def crude(parts: dict[str, Any]) -> Any:
            return CrudeSample({**parts, "__subflavors__": self.subflavors})

        return self._chat_sample(sample, crude)
