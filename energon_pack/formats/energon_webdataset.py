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
from energon_pack.errors import BadSampleError, UsageError
from energon_pack.formats.energon_types import default_conversion
from energon_pack.formats.parts import decode_parts
from energon_pack.formats.record import chat_fields, invalid_fields
from energon_pack.formats.sample_mapping import SampleMappingError, current_loader_mapping, dataset_mapping, mapping_name

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
            record = self._apply(mapping, sample)
        except BadSampleError as err:
            return QwenVLChatSample(**base, **invalid_fields(err))
        except Exception as err:
            detail = f"sample mapping {mapping_name(mapping)} raised {type(err).__name__}: {err}"
            return QwenVLChatSample(**base, **invalid_fields(BadSampleError("sample_mapping_error", detail)))
        return QwenVLChatSample(**base, **chat_fields(record))

    def _apply(self, mapping: Callable[..., Any], sample: Any) -> Any:
        """The mapping's record of one sample."""
        return mapping(sample)


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
        #: The metadataset entry's auxiliary datasets by name (``use_aux``), as Energon's file stores.
        self.aux: dict[str, Any] = {}
        self._primary: Any = None
        super().__init__(
            path, sample_loader=lambda sample: {}, part_filter=part_filter or (lambda _part: True), **kwargs
        )

    def use_aux(self, aux: Mapping[str, Any]) -> None:
        """Hand the cooker the metadataset entry's ``aux:`` datasets (Energon's ``FileStore`` objects by
        name), as Energon's task encoder does: each a keyword argument of the cooker, which reads
        ``store.get("name.ext", crude)`` (raw bytes: our record form takes the compressed files). A
        cooker marked ``@cooker(need_primary=True)`` also gets ``primary``, this dataset's own store
        (a key starting with "." is the current sample's member); ``need_cache`` is refused (no
        Energon cache pool here; fix: read the aux store directly)."""
        self.aux = dict(aux)

    def config(self) -> dict[str, Any]:
        """Energon's, plus the auxiliary datasets' paths when there are any (the resume fingerprint
        then tells a state saved with other aux datasets)."""
        config = super().config()
        if self.aux:
            config["aux"] = {name: str(store.get_path()) for name, store in sorted(self.aux.items())}
        return config

    def build(self, worker_rotation_offset: int = 0) -> Any:
        """Energon's, after checking that the cooker asks for nothing this reader cannot give."""
        from megatron.energon.task_encoder.cooking import get_cooker_need_cache

        if get_cooker_need_cache(self.mapping()):
            raise SampleMappingError(
                f"sample mapping {mapping_name(self.mapping())} of {self.path} is a cooker with need_cache=True; "
                "energon_pack has no Energon cache pool (its rows are built in the workers from compressed bytes); "
                "fix: drop need_cache and read the aux datasets' stores directly (store.get(key, crude))"
            )
        return super().build(worker_rotation_offset)

    def _apply(self, mapping: Callable[..., Any], sample: Any) -> Any:
        """The cooker's record of one crude sample, given the aux datasets (and ``primary``) as Energon gives them."""
        from megatron.energon.cache.base import PrimaryFileStore
        from megatron.energon.task_encoder.cooking import get_cooker_need_primary

        stores = dict(self.aux)
        if get_cooker_need_primary(mapping):
            if self._primary is None:  # opened once per process (it reads the dataset's index)
                self._primary = self.aux.get("primary") or self.as_file_store()
            stores["primary"] = PrimaryFileStore(self._primary, current_key=sample["__key__"])
        return mapping(sample, **stores)

    def load_sample(self, sample: Any) -> QwenVLChatSample:
        from megatron.energon import CrudeSample

        def crude(parts: dict[str, Any]) -> Any:
            return CrudeSample({**parts, "__subflavors__": self.subflavors})

        return self._chat_sample(sample, crude)


def give_aux(reader: Any, aux: Mapping[str, Any]) -> None:
    """Hand a metadataset entry's ``aux:`` datasets (name -> Energon ``FileStore``) to its reader, as
    Energon hands them to its cookers: only a crude dataset's (`CookedWebdataset.use_aux`);
    ``UsageError`` naming the dataset, the reason and the fix for any other reader.

    Example: a ``CrudeWebdataset`` entry with ``aux: {photos: ./photos}`` -> its cooker is called
    ``cook(crude, photos=<store>)``; the same ``aux:`` on a ``CaptioningSample`` dataset -> UsageError.
    """
    if not isinstance(reader, CookedWebdataset):
        raise UsageError(
            f"dataset {str(reader.path)!r} has aux: datasets ({', '.join(sorted(aux))}), which Energon gives to cookers, "
            f"so only to a crude dataset (CrudeWebdataset); it is read as {type(reader).__name__}; fix: remove aux: "
            "from its metadataset entry, or prepare it as a CrudeWebdataset whose cooker (sample_mapping) reads them"
        )
    reader.use_aux(aux)


class AuxLoading:
    """A task-encoder mixin (before Energon's ``TaskEncoder`` in the bases): a crude dataset's
    ``aux:`` datasets go to its reader (`give_aux`), whose cooker call gets them as Energon's does;
    our readers cook while reading, so Energon's own cooking step (which refuses aux on a reader
    whose samples are not ``CrudeSample``) is not used. Other datasets load as Energon loads them."""

    def _load_dataset(self, dataset: Any, worker_rotation_offset: int, worker_config: Any) -> Any:
        if dataset.aux:
            give_aux(dataset.dataset, dataset.aux)
            return dataset.dataset.build(worker_rotation_offset=worker_rotation_offset)
        return super()._load_dataset(dataset, worker_rotation_offset, worker_config)  # type: ignore[misc]
