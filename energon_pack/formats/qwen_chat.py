"""Our own format: a WebDataset prepared by ``energon-pack prepare`` (docs/on_disk_format.md).

One sample is ``<key>.json`` (the conversation) plus ``<key>.<i>.<ext>`` media files (images,
videos, audios: the kind is the extension), numbered from 0 per kind; dataset.yaml names ``energon_pack.QwenVLChatWebdataset``. Worked example (a
sample in, our record form out)::

    chat_fields_from_parts({"json": b'[{"role": "user", "content": "<image>Hi"},'
                                    b' {"role": "assistant", "content": "Yo"}]',
                            "0.jpg": b"\\xff\\xd8..."})
    -> {"conversation": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]},
                         {"role": "assistant", "content": [{"type": "text", "text": "Yo"}]}],
        "images": [b"\\xff\\xd8..."], "videos": [], "invalid_reason": None, "invalid_detail": None}
"""

# No `from __future__ import annotations`: Energon's config parser (dataset.yaml -> constructor
# arguments) reads ``QwenVLChatWebdataset.__init__``'s annotations as objects.

from collections.abc import Mapping
from typing import Any, Type

from megatron.energon.flavors.webdataset import DefaultGenericWebdatasetFactory

from energon_pack.core.conversation import decode_conversation_json, parse_stored_conversation
from energon_pack.core.energon_fixes import forget_read_tar_members
from energon_pack.core.samples import (
    AUDIO_EXTENSIONS,
    CONVERSATION_PART,
    IMAGE_EXTENSIONS,
    VIDEO_EXTENSIONS,
    QwenVLChatSample,
)
from energon_pack.errors import BadSampleError

#: ``__module__`` values our dataset.yaml has named for ``QwenVLChatWebdataset``.
OUR_MODULES = ("energon_pack", "energon_pack.core.samples", "energon_pack.formats.qwen_chat")
#: How our samples are read (``energon-pack inspect``).
HOW_READ = "as stored: <key>.json conversation, <key>.<i>.<ext> media bytes (no decoding, no pickles)"


def is_our_dataset_config(config: Mapping[str, Any]) -> bool:
    """Whether a dataset.yaml mapping names our ``QwenVLChatWebdataset`` (under any module it has had).

    Example: ``{"__module__": "energon_pack", "__class__": "QwenVLChatWebdataset"}`` -> True.
    """
    return config.get("__class__") == "QwenVLChatWebdataset" and config.get("__module__") in OUR_MODULES


def _indexed_parts(parts: dict[str, Any], extensions: tuple[str, ...]) -> list[bytes]:
    indexed = []
    for name, value in parts.items():
        index, _, extension = name.partition(".")
        if extension.lower() in extensions and index.isdigit():
            indexed.append((int(index), value))
    indexed.sort(key=lambda item: item[0])
    return [value for _, value in indexed]


def is_chat_part(part: str) -> bool:
    """Part filter: the conversation and media files; other parts are not read from the tar."""
    extension = part.rpartition(".")[2].lower()
    return part == CONVERSATION_PART or extension in IMAGE_EXTENSIONS + VIDEO_EXTENSIONS + AUDIO_EXTENSIONS


def chat_fields_from_parts(parts: dict[str, Any]) -> dict[str, Any]:
    """Build ``QwenVLChatSample`` fields from raw WebDataset parts (bytes, no decoding)."""
    images = _indexed_parts(parts, IMAGE_EXTENSIONS)
    videos = _indexed_parts(parts, VIDEO_EXTENSIONS)
    # Audio fields only when the sample has audio: samples without keep the fields they always had.
    audios = _indexed_parts(parts, AUDIO_EXTENSIONS)
    heard = {"audios": audios} if audios else {}
    try:
        if CONVERSATION_PART not in parts:
            raise BadSampleError("malformed_conversation", "sample has no .json conversation part")
        stored = parse_stored_conversation(
            decode_conversation_json(parts[CONVERSATION_PART]), num_images=len(images), num_videos=len(videos),
            num_audios=len(audios),
        )
    except BadSampleError as err:
        return dict(conversation=[], images=images, videos=videos, invalid_reason=err.reason, invalid_detail=err.detail, **heard)
    if stored.use_audio_in_video:
        heard["use_audio_in_video"] = True
    return dict(
        conversation=stored.messages, images=images, videos=videos, invalid_reason=None, invalid_detail=None,
        tools=stored.tools, chat_template_kwargs=stored.chat_template_kwargs, **heard,
    )


class QwenVLChatWebdataset(DefaultGenericWebdatasetFactory[QwenVLChatSample]):
    """Energon dataset class of our format (dataset.yaml: ``__module__: energon_pack``).

    ``sample_type``: what dataset.yaml's ``sample_type`` block names (``energon info`` reads it);
    only ``QwenVLChatSample`` is accepted, and datasets written without the block load as well.
    """

    __sample_type__ = QwenVLChatSample

    def __init__(
        self, path: Any, *, sample_type: Type[QwenVLChatSample] = QwenVLChatSample, decoder: Any = None, **kwargs: Any
    ) -> None:
        if sample_type is not QwenVLChatSample:
            raise ValueError(
                f"dataset.yaml names sample_type {sample_type.__module__}.{sample_type.__qualname__}, but "
                "QwenVLChatWebdataset reads only energon_pack.core.samples.QwenVLChatSample; fix: rewrite "
                ".nv-meta/dataset.yaml with energon-pack prepare"
            )
        # ``decoder`` (from the task encoder) is accepted and unused: media always stay compressed,
        # and no member is ever unpickled (Energon's default decoder would unpickle .pyd parts).
        forget_read_tar_members()  # before workers fork: their shard readers must not grow
        super().__init__(path, sample_loader=chat_fields_from_parts, part_filter=is_chat_part, **kwargs)
