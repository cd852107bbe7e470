"""Megatron-Bridge's VLM format (its ``ChatMLWebdataset``), read without Megatron-Bridge.

dataset.yaml names ``ChatMLWebdataset`` (module ``megatron.bridge.data.energon.task_encoder_utils``
or an earlier path, :data:`BRIDGE_MODULES`) with a ``field_map`` from Bridge's sample fields
(``conversation``, ``imgs``, ``videos``, ``audio``, ``tools``) to member names of a sample. How a
member is read depends on its extension (:func:`member_kind`):

- ``conversation``: JSON (``json``, ``conversation.json``): a list of turns in ``role``/``content`` or
  ``from``/``value`` form, or an object holding it under ``conversations`` / ``messages`` /
  ``conversation`` (and optional ``tools``);
- ``tools``: the chat template's tool definitions (a list of JSON-schema function objects), as JSON
  (``json``, ``tools.json``, any other name) or a pickled list (``pyd`` / ``pickle`` / ``pkl``); it wins
  over the conversation JSON's ``tools``, as in Bridge. Given to the record's ``tools``
  (``apply_chat_template(messages, tools=...)``); one that is not a list of objects is the skip
  ``malformed_tools``;
- ``imgs``: a pickled list of encoded images (``jpgs``; also ``pyd`` / ``pickle`` / ``pkl``), or one
  encoded image (``jpg``, ``image.png``, ...);
- ``videos``: a pickled list of videos, each a list of encoded frames (``mp4s``, ``videos``; also
  ``pyd`` / ``pickle`` / ``pkl``), or one video file (``mp4``, ``video.mp4``, ...);
- ``audio``: one audio file (``wav``, ``flac``, ``mp3``, ``audio``, the extensions Bridge's
  ``audiohandler`` decodes, or another audio extension of ours, ``AUDIO_EXTENSIONS``), kept encoded
  as the record's one audio (``audios``); its place in the conversation is an ``{"type": "audio"}``
  part or an ``<audio>`` placeholder (one per sample, else the skip ``placeholder_mismatch``). A
  Qwen-Omni processor hears it; a Qwen-VL one makes the sample the skip ``audio_not_supported``.

Pickles are read by ``formats.safe_pickle`` (nothing executed); text-only samples carry empty
pickled lists. A missing member reads as empty. The conversation is normalised as Bridge 0.6.2's
``QwenVLTaskEncoder.encode_sample`` does (``human``/``gpt`` roles, the media parts of a turn placed
before its text) except where Bridge's behaviour is a bug (docs/foreign_datasets.md): the text
around a placeholder keeps one space (Bridge strips it and glues the words). Worked example::

    field_map {"imgs": "jpgs", "conversation": "json"}, parts
    {"jpgs": pickle.dumps([b"<jpeg>"]), "json": b'[{"from": "human", "value": "What is <image> this?"},'
                                               b' {"from": "gpt", "value": "A cat."}]'}
    -> {"conversation": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]},
                         {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]}],
        "images": [b"<jpeg>"], "videos": [], "invalid_reason": None, "invalid_detail": None, "tools": None}
"""

# No `from __future__ import annotations`: Energon's config parser (dataset.yaml -> constructor
# arguments) reads ``BridgeChatMLWebdataset.__init__``'s annotations as objects.

import functools
import json
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any, Dict, Optional

from megatron.energon.flavors.webdataset import DefaultGenericWebdatasetFactory

from energon_pack.core.conversation import (
    ALL_MEDIA_KINDS,
    MEDIA_KINDS,
    REASONING_FIELD,
    TOOL_CALLS_FIELD,
    TOOL_MESSAGE_FIELDS,
    check_tools,
    normalize_conversation,
    split_placeholders,
)
from energon_pack.core.energon_fixes import forget_read_tar_members
from energon_pack.core.samples import AUDIO_EXTENSIONS, IMAGE_EXTENSIONS, VIDEO_EXTENSIONS, QwenVLChatSample
from energon_pack.errors import BadSampleError, UsageError
from energon_pack.formats.safe_pickle import MAX_PICKLE_BYTES, load_plain_pickle

#: Every module Megatron-Bridge has defined or re-exported ``ChatMLWebdataset`` in (newest first);
#: any other ``megatron.bridge.*`` module naming a ``ChatMLWebdataset`` is read the same way.
BRIDGE_MODULES = (
    "megatron.bridge.data.energon.task_encoder_utils",
    "megatron.bridge.models.qwen_vl.data.energon",
    "megatron.bridge.recipes.qwen_vl.data.energon.task_encoder",
)
#: ``ChatMLSample``'s fields, the keys a Bridge ``field_map`` may have.
BRIDGE_FIELDS = ("conversation", "imgs", "videos", "audio", "tools")
#: Member extensions holding a pickled list (of images for ``imgs``, of frame lists for ``videos``).
PICKLED_LIST_EXTENSIONS = ("jpgs", "mp4s", "videos", "pyd", "pickle", "pkl")
#: Extensions of an ``audio`` member: Bridge 0.6.2's ``audiohandler`` decodes ``wav``, ``flac``,
#: ``mp3`` and ``audio`` (any container soundfile reads); ours adds the other audio files we decode.
BRIDGE_AUDIO_EXTENSIONS = tuple(dict.fromkeys(("wav", "flac", "mp3", "audio", *AUDIO_EXTENSIONS)))
#: Turn fields kept beside the role and content (Bridge's ``cook_chatml_sample`` keeps every field;
#: these are the ones a chat template reads): reasoning, an assistant's tool calls, a tool result's
#: function name and call id.
KEPT_TURN_FIELDS = (REASONING_FIELD, TOOL_CALLS_FIELD, *TOOL_MESSAGE_FIELDS)
HOW_READ = (
    "conversation JSON normalised as Bridge 0.6.2 does (media before text per turn, words around a placeholder "
    "keep their space); pickled media lists through a restricted unpickler; media stay encoded"
)


def is_bridge_dataset_config(config: Mapping[str, Any]) -> bool:
    """Whether a dataset.yaml mapping names Bridge's ``ChatMLWebdataset`` (any module path it has used).

    Example: ``{"__module__": "megatron.bridge.data.energon.task_encoder_utils", "__class__":
    "ChatMLWebdataset", "field_map": {...}}`` -> True.
    """
    module = str(config.get("__module__") or "")
    return config.get("__class__") == "ChatMLWebdataset" and (
        module in BRIDGE_MODULES or module.startswith("megatron.bridge.")
    )


def member_kind(field: str, member: str) -> str:
    """How the member ``member`` of Bridge field ``field`` is read: ``"json"``, ``"pickled_list"``,
    ``"one_image"``, ``"one_video"`` or ``"one_audio"``.

    Example: ``("imgs", "jpgs")`` -> ``"pickled_list"``; ``("imgs", "image.png")`` -> ``"one_image"``;
    ``("audio", "wav")`` -> ``"one_audio"``.
    """
    extension = member.rpartition(".")[2].lower()
    if field == "conversation":
        return "json"
    if field == "audio":
        if extension in BRIDGE_AUDIO_EXTENSIONS:
            return "one_audio"
        raise UsageError(
            f"Bridge field_map audio: {member!r} is not an audio file member (extension {extension!r}); energon_pack reads "
            f"one encoded audio file per sample ({', '.join(BRIDGE_AUDIO_EXTENSIONS)}), not pre-computed features or "
            "pickled waveforms; fix: store the sample's audio file as a member such as audio.wav"
        )
    if extension in PICKLED_LIST_EXTENSIONS:
        return "pickled_list"
    if field == "tools":
        return "json"
    if field == "imgs" and extension in IMAGE_EXTENSIONS:
        return "one_image"
    if field == "videos" and extension in VIDEO_EXTENSIONS:
        return "one_video"
    raise UsageError(
        f"Bridge field_map {field}: {member!r} is a member energon_pack cannot read as {field} (extension "
        f"{extension!r}); fix: use a pickled list ({', '.join(PICKLED_LIST_EXTENSIONS)}) or one "
        f"{'image (' + ', '.join(IMAGE_EXTENSIONS) if field == 'imgs' else 'video (' + ', '.join(VIDEO_EXTENSIONS)})"
    )


def check_field_map(field_map: Mapping[str, str]) -> None:
    """Raise ``UsageError`` for a field_map energon_pack cannot read (at start, one line)."""
    unknown = sorted(set(field_map) - set(BRIDGE_FIELDS))
    if unknown or "conversation" not in field_map:
        raise UsageError(
            f"Bridge field_map {dict(field_map)!r}: {'unknown fields ' + str(unknown) if unknown else 'no conversation'};"
            f" fix: map only {', '.join(BRIDGE_FIELDS)}, conversation included"
        )
    if field_map.get("videos", "").rpartition(".")[2].lower() == "jpgs":
        raise UsageError(
            "Bridge field_map videos: 'jpgs' makes each frame its own one-frame video in Bridge; fix: store videos "
            "as a pickled list of frame lists (videos: mp4s) or as video files (videos: video.mp4)"
        )
    for field, member in field_map.items():
        member_kind(field, member)


def _media_list(value: Any, *, what: str, nested: bool) -> list[Any]:
    """The encoded images (``nested=False``) or frame lists (``nested=True``) of an unpickled member."""

    def is_encoded(item: Any) -> bool:
        return isinstance(item, (bytes, bytearray))

    if not isinstance(value, (list, tuple)):
        raise BadSampleError("malformed_media_list", f"member {what!r} holds a {type(value).__name__}, not a list")
    if not nested:
        if not all(is_encoded(item) for item in value):
            raise BadSampleError("malformed_media_list", f"member {what!r}: every image must be encoded bytes")
        return [bytes(item) for item in value]
    videos = []
    for number, video in enumerate(value):
        if not isinstance(video, (list, tuple)) or not video or not all(is_encoded(frame) for frame in video):
            raise BadSampleError(
                "malformed_media_list", f"member {what!r}: video {number} is not a non-empty list of encoded frames"
            )
        videos.append(tuple(bytes(frame) for frame in video))
    return videos


def _read_media(parts: Mapping[str, Any], field_map: Mapping[str, str], field: str, max_pickle_bytes: int) -> list[Any]:
    member = field_map.get(field)
    if member is None or member not in parts:
        return []
    data = parts[member]
    kind = member_kind(field, member)
    if kind == "pickled_list":
        value = load_plain_pickle(data, what=member, max_bytes=max_pickle_bytes)
        return _media_list(value, what=member, nested=field == "videos")
    return [data] if data else []


def _member_tools(parts: Mapping[str, Any], member: Optional[str], max_pickle_bytes: int) -> Any:
    """The unchecked value of the ``tools`` member (JSON or a pickled list), None when absent or empty."""
    if member is None or not parts.get(member):
        return None
    if member_kind("tools", member) == "pickled_list":
        return load_plain_pickle(parts[member], what=member, max_bytes=max_pickle_bytes)
    try:
        return json.loads(parts[member].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BadSampleError("malformed_tools", f"tools member {member!r} is not UTF-8 JSON ({err})") from None


def _joined_text(pieces: Sequence[str]) -> str:
    """Text pieces around placeholders, each stripped of spaces (as Bridge does), joined by one space,
    except before a piece that starts with whitespace or closing punctuation, or after one that ends
    with whitespace.

    Example: ``["Compare ", " and ", "."]`` -> ``"Compare and."``; ``["Look:\\n", "\\nWhy?"]`` -> ``"Look:\\n\\nWhy?"``.
    """
    text = ""
    for piece in (piece.strip(" ") for piece in pieces):
        if not piece:
            continue
        glued = not text or text[-1].isspace() or piece[0].isspace() or unicodedata.category(piece[0]) in ("Po", "Pe", "Pf")
        text += piece if glued else " " + piece
    return text


def _bridge_content(content: Any) -> Any:
    """One turn's content as Bridge orders it: image and video parts first, then its text (see the
    module notes). A typed audio part keeps its place (Bridge moves only images and videos); an
    ``<audio>`` placeholder in a string, which Bridge leaves as text, is placed with the media.

    Example: ``"<audio> What is said?"`` -> ``[{"type": "audio"}, {"type": "text", "text": "What is said?"}]``.
    """
    if isinstance(content, str):
        if not any(f"<{kind}>" in content for kind in ALL_MEDIA_KINDS):
            return content
        parts = split_placeholders(content)
        media = [part for part in parts if part["type"] in ALL_MEDIA_KINDS]
        text = _joined_text([part["text"] for part in parts if part["type"] == "text"])
        return media + ([{"type": "text", "text": text}] if text else [])
    if isinstance(content, list):
        media = [part for part in content if isinstance(part, Mapping) and part.get("type") in MEDIA_KINDS]
        return media + [part for part in content if part not in media]
    return content


def bridge_conversation(payload: Any) -> tuple[list[dict[str, Any]], Any]:
    """Bridge turns (``role``/``content`` or ``from``/``value``; a list or an object holding it) as
    messages in Bridge's order, and the payload's ``tools`` (None when absent).

    A turn's `KEPT_TURN_FIELDS` (``tool_calls``, a tool turn's ``name`` / ``tool_call_id``,
    ``reasoning_content``) go with it. Example: ``[{"from": "human", "value": "<image>Hi"},
    {"from": "gpt", "value": "Yo"}]`` -> ``([{"role": "human", "content": [image, text "Hi"]},
    {"role": "gpt", "content": "Yo"}], None)`` (``normalize_conversation`` maps the speaker names).
    """
    tools = None
    if isinstance(payload, Mapping):
        tools = payload.get("tools")
        payload = payload.get("conversations", payload.get("messages", payload.get("conversation")))
    if not isinstance(payload, list):
        raise BadSampleError("malformed_conversation", "the conversation JSON holds no list of turns")
    messages = []
    for turn in payload:
        if not isinstance(turn, Mapping):
            raise BadSampleError("malformed_conversation", f"turn {turn!r} is not a mapping")
        speaker = turn.get("role", turn.get("from"))
        content = turn["content"] if "role" in turn else turn.get("value", "")
        message = {"role": speaker, "content": _bridge_content(content)}
        message.update({name: turn[name] for name in KEPT_TURN_FIELDS if turn.get(name) is not None})
        messages.append(message)
    return messages, tools


def bridge_fields(parts: Dict[str, Any], *, field_map: Mapping[str, str], max_pickle_bytes: int = MAX_PICKLE_BYTES) -> Dict[str, Any]:
    """``QwenVLChatSample`` fields of one Bridge sample's raw members (see the module's worked example);
    a bad sample gets ``invalid_reason`` / ``invalid_detail`` and empty lists."""
    try:
        images = _read_media(parts, field_map, "imgs", max_pickle_bytes)
        videos = _read_media(parts, field_map, "videos", max_pickle_bytes)
        audios = _read_media(parts, field_map, "audio", max_pickle_bytes)
        member = field_map["conversation"]
        if member not in parts:
            raise BadSampleError("malformed_conversation", f"sample has no {member!r} conversation member")
        try:
            payload = json.loads(parts[member].decode("utf-8"))
        except UnicodeDecodeError as err:
            raise BadSampleError("non_utf8_text", f"conversation is not valid UTF-8 ({err.reason})") from None
        except json.JSONDecodeError as err:
            raise BadSampleError("malformed_conversation", f"conversation is not valid JSON: {err}") from None
        messages, payload_tools = bridge_conversation(payload)
        member_tools = _member_tools(parts, field_map.get("tools"), max_pickle_bytes)
        tools = check_tools(member_tools if member_tools is not None else payload_tools)
        conversation = normalize_conversation(
            messages, num_images=len(images), num_videos=len(videos), num_audios=len(audios)
        )
    except BadSampleError as err:
        return dict(conversation=[], images=[], videos=[], invalid_reason=err.reason, invalid_detail=err.detail)
    return dict(
        conversation=conversation, images=images, videos=videos, invalid_reason=None, invalid_detail=None, tools=tools,
        **({"audios": audios} if audios else {}),
    )


class BridgeChatMLWebdataset(DefaultGenericWebdatasetFactory[QwenVLChatSample]):
    """Energon dataset class reading a Bridge ``ChatMLWebdataset`` as ``QwenVLChatSample``.

    ``field_map``: dataset.yaml's (checked at start: :func:`check_field_map`). Bridge's decoding
    options (``auto_decode``, ``image_decode_spec``, ``decoder``) are accepted and unused: media stay
    encoded until the packer decodes the samples of an emitted row.
    """

    __sample_type__ = QwenVLChatSample

    def __init__(
        self,
        path: Any,
        *,
        field_map: Dict[str, str],
        auto_decode: bool = True,
        image_decode_spec: Optional[str] = None,
        decoder: Any = None,
        **kwargs: Any,
    ) -> None:
        check_field_map(field_map)
        forget_read_tar_members()
        #: The field_map as dataset.yaml gives it (``energon-pack inspect`` prints it).
        self.field_map = dict(field_map)
        members = set(field_map.values())
        super().__init__(
            path,
            sample_loader=functools.partial(bridge_fields, field_map=self.field_map),
            part_filter=members.__contains__,
            **kwargs,
        )
