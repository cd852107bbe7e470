"""The Energon sample type and the dataset class named in ``.nv-meta/dataset.yaml``.

On disk (WebDataset) one sample is ``<key>.json`` (the conversation: a list of messages, or an
object holding them with the record's ``tools`` and ``chat_template_kwargs``) plus
``<key>.<i>.<ext>`` media files: images (``IMAGE_EXTENSIONS``) and videos (``VIDEO_EXTENSIONS``),
numbered from 0 per kind. Media stay compressed bytes: nothing is decoded when loading.
"""

# No `from __future__ import annotations`: Energon's config parser (dataset.yaml -> constructor
# arguments) reads ``QwenVLChatWebdataset.__init__``'s annotations as objects.

from typing import Any, Optional, Type

from megatron.energon import Sample
from megatron.energon.edataclass import edataclass
from megatron.energon.flavors.webdataset import DefaultGenericWebdatasetFactory

from energon_pack.core.conversation import (
    Message,
    decode_conversation_json,
    parse_stored_conversation,
)
from energon_pack.core.energon_fixes import forget_read_tar_members
from energon_pack.errors import BadSampleError

#: Image file extensions (every format Pillow decodes that the processor takes; GIF: first frame).
IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "gif", "bmp", "tif", "tiff")
#: Video file extensions (containers PyAV demuxes; audio streams are ignored).
VIDEO_EXTENSIONS = ("mp4", "m4v", "webm", "mkv", "mov", "avi")
CONVERSATION_PART = "json"


@edataclass
class QwenVLChatSample(Sample):
    """One chat sample: typed messages and the compressed bytes of its images and videos.

    ``invalid_reason`` / ``invalid_detail`` are set (and ``conversation`` empty) when the stored
    conversation is bad; the task encoder counts such samples as skips under that reason
    instead of crashing.
    """

    #: Typed messages (see ``energon_pack.core.conversation``).
    conversation: list[Message]
    #: Compressed image files (JPEG, PNG, WebP, GIF, BMP, TIFF bytes), in placeholder order.
    images: list[bytes]
    #: Compressed video files (MP4, M4V, WebM, MKV, MOV, AVI bytes), in placeholder order.
    videos: list[bytes]
    #: Skip reason (``BadSampleError.reason``) of a conversation that failed validation, else None.
    invalid_reason: Optional[str] = None
    #: What was wrong with it (``BadSampleError.detail``), else None.
    invalid_detail: Optional[str] = None
    #: The record's tool definitions (JSON-schema function objects) passed to the chat template, else None.
    tools: Optional[list] = None
    #: The record's chat template options (over the dataset's ``RowLayout.chat_template_kwargs``), else None.
    chat_template_kwargs: Optional[dict] = None


def media_part_name(index: int, extension: str) -> str:
    """WebDataset part name of a media file. Example: ``(1, "png")`` -> ``"1.png"``."""
    return f"{index}.{extension}"


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
    return part == CONVERSATION_PART or extension in IMAGE_EXTENSIONS + VIDEO_EXTENSIONS


def chat_fields_from_parts(parts: dict[str, Any]) -> dict[str, Any]:
    """Build ``QwenVLChatSample`` fields from raw WebDataset parts (bytes, no decoding)."""
    images = _indexed_parts(parts, IMAGE_EXTENSIONS)
    videos = _indexed_parts(parts, VIDEO_EXTENSIONS)
    try:
        if CONVERSATION_PART not in parts:
            raise BadSampleError("malformed_conversation", "sample has no .json conversation part")
        stored = parse_stored_conversation(
            decode_conversation_json(parts[CONVERSATION_PART]), num_images=len(images), num_videos=len(videos)
        )
    except BadSampleError as err:
        return dict(conversation=[], images=images, videos=videos, invalid_reason=err.reason, invalid_detail=err.detail)
    return dict(
        conversation=stored.messages, images=images, videos=videos, invalid_reason=None, invalid_detail=None,
        tools=stored.tools, chat_template_kwargs=stored.chat_template_kwargs,
    )


class QwenVLChatWebdataset(DefaultGenericWebdatasetFactory[QwenVLChatSample]):
    """Energon dataset class for Qwen-VL chat WebDatasets (``__module__: energon_pack``).

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
