"""The record form every dataset format ends as: ``QwenVLChatSample`` (typed conversation plus
compressed media), and the member names of our own on-disk format.

The readers (our format's ``QwenVLChatWebdataset`` among them) live in ``energon_pack.formats``.
On disk (WebDataset) one sample is ``<key>.json`` (the conversation: a list of messages, or an
object holding them with the record's ``tools`` and ``chat_template_kwargs``) plus
``<key>.<i>.<ext>`` media files: images (``IMAGE_EXTENSIONS``), videos (``VIDEO_EXTENSIONS``) and
audios (``AUDIO_EXTENSIONS``, Qwen-Omni), numbered from 0 per kind. Media stay compressed bytes: nothing is decoded when loading.
"""

# No `from __future__ import annotations`: Energon reads ``QwenVLChatSample``'s field annotations
# as objects.

from typing import Optional, Union

from megatron.energon import Sample
from megatron.energon.edataclass import edataclass

from energon_pack.core.conversation import Message

#: Image file extensions (every format Pillow decodes that the processor takes; GIF: first frame).
IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "gif", "bmp", "tif", "tiff")
#: Video file extensions (containers PyAV demuxes; audio streams are ignored).
VIDEO_EXTENSIONS = ("mp4", "m4v", "webm", "mkv", "mov", "avi")
#: Audio file extensions (Qwen-Omni; containers PyAV demuxes, the first audio stream is read).
#: An audio-only WebM is stored as ``.weba`` (``.webm`` members are videos).
AUDIO_EXTENSIONS = ("wav", "flac", "mp3", "m4a", "aac", "ogg", "oga", "opus", "weba")
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
    #: Compressed video files (MP4, M4V, WebM, MKV, MOV, AVI bytes), or videos given as a tuple of
    #: encoded frames of one size (frame lists, read in place from Megatron-Bridge datasets), in
    #: placeholder order.
    videos: list[Union[bytes, tuple[bytes, ...]]]
    #: Skip reason (``BadSampleError.reason``) of a conversation that failed validation, else None.
    invalid_reason: Optional[str] = None
    #: What was wrong with it (``BadSampleError.detail``), else None.
    invalid_detail: Optional[str] = None
    #: The record's tool definitions (JSON-schema function objects) passed to the chat template, else None.
    tools: Optional[list] = None
    #: The record's chat template options (over the dataset's ``RowLayout.chat_template_kwargs``), else None.
    chat_template_kwargs: Optional[dict] = None
    #: Qwen-Omni: compressed audio files (WAV, FLAC, MP3, AAC/M4A, Ogg, WebM bytes) in placeholder order, else None.
    audios: Optional[list] = None
    #: Qwen-Omni: hear each video with its sound track (the record's ``use_audio_in_video``).
    use_audio_in_video: bool = False


def media_part_name(index: int, extension: str) -> str:
    """WebDataset part name of a media file. Example: ``(1, "png")`` -> ``"1.png"``."""
    return f"{index}.{extension}"


def media_nbytes(data: Union[bytes, tuple[bytes, ...]]) -> int:
    """Compressed bytes of one image or video: a file, or a frame list (the sum of its frames).

    Example: ``b"abc"`` -> 3; ``(b"ab", b"cd")`` -> 4.
    """
    return len(data) if isinstance(data, (bytes, bytearray)) else sum(len(frame) for frame in data)
