"""Chat template, tokenization with media placeholders expanded, and the assistant-only loss mask.

Loss is on assistant text and each assistant turn's closing ``<|im_end|>``: everything the
template renders after an ``<|im_start|>assistant\n`` header, so for Qwen3.5 / Qwen3.6 and
Qwen3-Omni the ``<think>...</think>`` block (empty or not) too (docs/qwen35.md, docs/omni.md), and
an assistant turn's ``<tool_call>`` blocks. System, user and tool messages never carry loss (the Qwen templates render
tool results inside a user turn, ``<|im_start|>user\n<tool_response>...``). Media tokens never
carry loss, in any turn (a model does not generate vision tokens).

Token ids come from the processor given to the plugin, exactly as
``processor(text=[processor.apply_chat_template(messages)], images=..., videos=...)`` would give
them, but computed from media *geometry* only (grids, frame indices), never from pixels: each
placeholder is replaced by the processor's own replacement string for that grid
(``replace_image_token`` / ``replace_video_token``), then the text is tokenized.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from jinja2 import TemplateError

from energon_pack.errors import BadSampleError
from energon_pack.qwen.family import OMNI_FAMILIES, processor_family

#: Label value that the loss ignores (gaps, segment ends, non-assistant tokens).
IGNORE_INDEX = -100


@dataclass(frozen=True)
class VideoTiming:
    """Frame sampling of one video: source frame count T, source fps and sampled frame indices."""

    total_frames: int
    fps: float
    frame_indices: tuple[int, ...]

    def metadata(self) -> Any:
        """The Hugging Face ``VideoMetadata`` the processor expects for these frames."""
        from transformers.video_utils import VideoMetadata

        return VideoMetadata(total_num_frames=self.total_frames, fps=self.fps, frames_indices=list(self.frame_indices))


@dataclass(frozen=True)
class SoundTokens:
    """Audio token counts of one Qwen-Omni sample: ``audios`` per standalone audio (placeholder
    order); ``videos`` per video: the tokens of its sound track when it is heard
    (``use_audio_in_video``), else None; ``video_second_per_grid`` per video (seconds per temporal
    grid step, as the Omni processor sets them).

    Example: one 1-s clip and one silent-or-unheard video -> ``SoundTokens((25,), (None,), (1.0,))``.
    """

    audios: tuple[int, ...] = ()
    videos: tuple[int | None, ...] = ()
    video_second_per_grid: tuple[float, ...] = ()


@dataclass(frozen=True, kw_only=True)
class MediaExpansion:
    """What a sample's media placeholders expand by: its image and video grids ([n, 3] rows of
    (t, h, w) patches; None: none), each video's frame timing, and (Qwen-Omni) its sound tokens
    (None: no audio and no video heard).

    Example: one image of 4x6 patches -> ``MediaExpansion(image_grid_thw=np.array([[1, 4, 6]]))``.
    """

    image_grid_thw: np.ndarray | None = None
    video_grid_thw: np.ndarray | None = None
    videos: Sequence[VideoTiming] = ()
    sound: SoundTokens | None = None


@dataclass(frozen=True)
class TokenizedConversation:
    """``input_ids`` int64 [L]; ``labels`` int64 [L] (next-token targets, -100 off-loss);
    ``loss_mask`` float32 [L] (1.0 where ``labels`` is a target)."""

    input_ids: np.ndarray
    labels: np.ndarray
    loss_mask: np.ndarray


def template_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Typed messages in the form chat templates receive them: a message whose parts are all text
    gets its text as one string (``""`` for no parts), a message with media keeps its parts (a
    string content stays as it is).

    Every template renders the two forms alike but the released Qwen3-Omni ones, which count a user
    turn as a query (its answer then renders its ``<think>`` block) only when its content is a
    string, as the Qwen3 text templates they come from; text turns arrive as strings from every
    record form but typed text parts (docs/omni.md, "Chat templates").
    Example: ``[{"role": "user", "content": [text "Hi"]}]`` -> ``[{"role": "user", "content": "Hi"}]``;
    ``[audio, text "Hi"]`` stays as it is.
    """
    return [
        {**message, "content": "".join(part["text"] for part in message["content"])}
        if not isinstance(message["content"], str) and all(part["type"] == "text" for part in message["content"])
        else message
        for message in messages
    ]


def render_conversation(
    processor: Any,
    messages: Sequence[dict[str, Any]],
    *,
    tools: Sequence[dict[str, Any]] | None = None,
    options: Mapping[str, Any] | None = None,
) -> str:
    """Render typed messages with the processor's chat template, no generation prompt:
    ``processor.apply_chat_template(template_messages(messages), tools=tools, **options)``.

    ``tools``: the record's function definitions; ``options``: template options
    (``chat_template_kwargs``). Raises ``BadSampleError`` when the template cannot render the
    conversation (`check_template_use`) or fails on it (``template_error``, its message quoted).
    Example: Qwen3-VL, ``options={"add_vision_id": True}`` -> ``"...Picture 1: <|vision_start|>..."``.
    """
    check_template_use(processor, messages, tools=tools, options=options or {})
    try:
        return processor.apply_chat_template(
            template_messages(messages), tools=list(tools) if tools else None, tokenize=False, add_generation_prompt=False,
            **(options or {}),
        )
    except (TemplateError, TypeError, ValueError, KeyError, AttributeError) as err:
        raise BadSampleError(
            "template_error",
            f"the chat template of {template_name(processor)} cannot render this conversation: "
            f"{type(err).__name__}: {err}; fix: change the record so the template accepts it (e.g. tool-call "
            "arguments as a JSON object where the template iterates them, one system message first)",
        ) from None


def template_name(processor: Any) -> str:
    """How errors name a processor's chat template. Example: ``"Qwen3VLProcessor (Qwen/Qwen3-VL-8B-Instruct)"``."""
    path = str(getattr(processor.tokenizer, "name_or_path", "") or "") or "offline"
    return f"{type(processor).__name__} ({path})"


@functools.lru_cache(maxsize=16)
def template_variables(template: str) -> frozenset[str]:
    """The variables a chat template reads from its caller (Jinja's undeclared variables), as
    transformers finds them to tell template options from processor options.

    Example: the official Qwen3-VL template -> ``{"messages", "tools", "add_vision_id", "add_generation_prompt"}``.
    """
    from transformers.utils.chat_template_utils import _get_template_variables

    return _get_template_variables(template)


def check_template_use(
    processor: Any, messages: Sequence[dict[str, Any]], *, tools: Sequence[Any] | None, options: Mapping[str, Any]
) -> None:
    """Raise ``BadSampleError`` when the processor's chat template would silently drop part of the input:
    ``template_cannot_render_tools`` for tool calls, tool messages or ``tools`` on a template that
    renders no tools (the official Qwen2-VL / Qwen2.5-VL ones), ``unknown_template_option`` for an
    option the template never reads.

    Example: the Qwen2.5-VL template and a message with ``tool_calls`` -> BadSampleError naming it.
    """
    template = processor.chat_template if isinstance(processor.chat_template, str) else ""
    variables = template_variables(template)
    uses_tools = bool(tools) or any(m.get("tool_calls") or m["role"] == "tool" for m in messages)
    if uses_tools and not ("tools" in variables and "tool_calls" in template):
        raise BadSampleError(
            "template_cannot_render_tools",
            f"the record uses tools (tool calls, tool results or a tools list) but the chat template of "
            f"{template_name(processor)} renders none of them (as the official Qwen2-VL / Qwen2.5-VL templates); "
            "fix: train a model whose template renders tools (Qwen3-VL, Qwen3.5 / Qwen3.6, Qwen3-Omni), or write the calls "
            "and their results as plain text turns",
        )
    unknown = sorted(set(options) - variables)
    if unknown:
        raise BadSampleError(
            "unknown_template_option",
            f"chat_template_kwargs {', '.join(map(repr, unknown))} are not read by the chat template of "
            f"{template_name(processor)} (it reads {', '.join(sorted(variables - {'messages'})) or 'no options'}); "
            "fix: drop them, or use a processor whose template takes them",
        )


def expand_media_placeholders(processor: Any, text: str, media: MediaExpansion) -> str:
    """Replace each image/video (and, with ``media.sound``, audio) pad token by the processor's replacement
    for its grid (audio: its token count; a video heard with its sound: video and audio tokens
    interleaved by the processor's ``replace_video_token``).

    Raises ``BadSampleError("placeholder_mismatch")`` when the pad tokens in ``text`` and the
    grids differ in number (a sample whose media list does not match its media parts).
    Example (Qwen2.5-VL): one ``<|image_pad|>`` with grid (1, 4, 6) -> 6 ``<|image_pad|>``;
    (Qwen2.5-Omni) one ``<|AUDIO|>`` with ``sound.audios == (25,)`` -> 25 ``<|AUDIO|>``.
    """
    import torch

    image_grid_thw, video_grid_thw = media.image_grid_thw, media.video_grid_thw
    videos, sound = media.videos, media.sound
    _check_placeholders(
        processor, text.count, image_grid_thw=image_grid_thw, video_grid_thw=video_grid_thw,
        audios=None if sound is None else len(sound.audios),
    )
    image_replacements: list[str] = []
    video_replacements: list[str] = []
    if image_grid_thw is not None and len(image_grid_thw):
        image_inputs = {"image_grid_thw": torch.as_tensor(image_grid_thw)}
        image_replacements = [processor.replace_image_token(image_inputs, image_idx=i) for i in range(len(image_grid_thw))]
    if video_grid_thw is not None and len(video_grid_thw):
        video_inputs = {
            "video_grid_thw": torch.as_tensor(video_grid_thw),
            "video_metadata": [timing.metadata() for timing in videos],
        }
        if sound is None:
            video_replacements = [processor.replace_video_token(video_inputs, video_idx=i) for i in range(len(video_grid_thw))]
        else:
            video_replacements = _omni_video_replacements(processor, video_inputs, sound)
    audio_replacements = []
    if sound is not None and sound.audios:
        audio_inputs = {"num_audio_tokens": list(sound.audios)}
        audio_replacements = [processor.replace_audio_token(audio_inputs, audio_idx=i) for i in range(len(sound.audios))]
    expanded, _ = processor.get_text_with_replacements([text], image_replacements, video_replacements, audio_replacements)
    return expanded[0]


def _omni_video_replacements(processor: Any, video_inputs: dict[str, Any], sound: SoundTokens) -> list[str]:
    """Each video's replacement from the Omni processor's ``replace_video_token``: its video tokens,
    or, when its sound is heard, video and audio tokens interleaved (Qwen2.5-Omni by 2-s chunks,
    Qwen3-Omni by time)."""
    heard = [tokens for tokens in sound.videos if tokens is not None]
    slots = iter(range(len(heard)))
    video_to_audio = [None if tokens is None else next(slots) for tokens in sound.videos]
    options = {
        "load_audio_from_video": bool(heard),
        "position_id_per_seconds": processor.position_id_per_seconds,
        "seconds_per_chunk": processor.seconds_per_chunk,
    }
    inputs = {**video_inputs, "video_second_per_grid": list(sound.video_second_per_grid)}
    return [
        processor.replace_video_token(
            inputs, video_idx=i, processed_audio={"num_audio_tokens": heard}, video_to_audio_indices=video_to_audio,
            **options,
        )
        for i in range(len(sound.videos))
    ]


def _check_placeholders(
    processor: Any,
    count: Any,
    *,
    image_grid_thw: np.ndarray | None,
    video_grid_thw: np.ndarray | None,
    audios: int | None = None,
) -> None:
    """``BadSampleError("placeholder_mismatch")`` unless ``count(token)`` (placeholders of each media
    pad token in the rendering) equals the number of grids of that kind (and of ``audios``, when given)."""
    kinds: list[tuple[str, str, int]] = [
        ("image", processor.image_token, 0 if image_grid_thw is None else len(image_grid_thw)),
        ("video", processor.video_token, 0 if video_grid_thw is None else len(video_grid_thw)),
    ]
    if audios is not None:
        kinds.append(("audio", processor.audio_token, audios))
    for kind, token, media in kinds:
        placeholders = count(token)
        if placeholders != media:
            raise BadSampleError(
                "placeholder_mismatch",
                f"the rendered conversation has {placeholders} {kind} placeholder(s) but the sample has "
                f"{media} {kind}(s); put one {{'type': '{kind}'}} part per {kind}",
            )


def placeholder_token_count(processor: Any, media: MediaExpansion) -> int:
    """Tokens that a sample's image, video (and, Qwen-Omni, audio) placeholders expand to, without
    building the long replacements that `expand_media_placeholders` tokenizes.

    Each replacement is the processor's own (``replace_image_token`` / ``replace_video_token`` /
    ``replace_audio_token``) for a grid of the same temporal length t with one merged patch per
    step (an audio: one token), tokenized (special tokens delimit it, so it tokenizes alone as in
    context), plus t * (h*w/merge**2 - 1) pad tokens for the other merged patches of each step (an
    audio of n tokens: n - 1). Qwen2/2.5-VL: t*h*w/merge**2 per medium; Qwen3-VL videos add each
    step's timestamp text and its vision start/end tokens. Qwen-Omni processors (``media.sound``: the
    sample's sound tokens; None: no audio, no video heard): a video heard with its sound expands
    to its video tokens, its sound's tokens and the two audio span markers, however the processor
    interleaves them.

    Example (Qwen2.5-VL): image grid (1, 4, 6) -> 6; image (1, 4, 6) and video (2, 4, 4) -> 14;
    (Qwen2.5-Omni) video (2, 4, 4) heard with a sound of 25 tokens -> 8 + 25 + 2 = 35.
    """
    import torch

    image_grid_thw, video_grid_thw = media.image_grid_thw, media.video_grid_thw
    videos, sound = media.videos, media.sound
    merge = int(processor.image_processor.merge_size)
    grids = [] if video_grid_thw is None else np.asarray(video_grid_thw).tolist()
    if sound is None and processor_family(processor) in OMNI_FAMILIES:  # nothing heard
        sound = SoundTokens(videos=(None,) * len(grids), video_second_per_grid=(1.0,) * len(grids))
    video_texts: list[str] = []
    if grids:
        inputs: dict[str, Any] = {
            "video_grid_thw": torch.tensor([[steps, merge, merge] for steps, _, _ in grids]),
            "video_metadata": [timing.metadata() for timing in videos],
        }
        if sound is None:
            video_texts = [processor.replace_video_token(inputs, video_idx=i) for i in range(len(grids))]
        else:
            video_texts = _omni_video_replacements(processor, inputs, sound)
    texts = [
        processor.replace_image_token({"image_grid_thw": torch.tensor([[steps, merge, merge]])}, image_idx=0)
        for steps, _, _ in ([] if image_grid_thw is None else np.asarray(image_grid_thw).tolist())
    ]
    total = sum(steps * (height * width // merge**2 - 1) for grid in (image_grid_thw, video_grid_thw)
                for steps, height, width in ([] if grid is None else np.asarray(grid).tolist()))
    if sound is not None and sound.audios:
        texts.append(processor.replace_audio_token({"num_audio_tokens": [1]}, audio_idx=0) * len(sound.audios))
        total += sum(sound.audios) - len(sound.audios)
    for text in [*texts, *video_texts]:
        total += len(processor.tokenizer(text, add_special_tokens=False)["input_ids"])
    return total


@dataclass(frozen=True)
class ChatMarkers:
    """Strings that delimit assistant turns in a ChatML rendering, and the media token ids.

    ``vision_start_id`` / ``vision_end_id`` open and close a media span; ``media_pad_ids`` are
    the image and video pad tokens. -1 / empty: the tokenizer has no such token.
    """

    assistant_header: str = "<|im_start|>assistant\n"
    end_of_turn: str = "<|im_end|>"
    vision_start_id: int = -1
    vision_end_id: int = -1
    media_pad_ids: tuple[int, ...] = ()

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> ChatMarkers:
        """ChatML markers of a Qwen tokenizer, which must know ``<|im_end|>`` as one token."""

        def token_id(token: str) -> int | None:
            found = tokenizer.convert_tokens_to_ids(token)
            return None if found in (None, tokenizer.unk_token_id) else int(found)

        if token_id(cls.end_of_turn) is None:
            raise ValueError(
                f"tokenizer {type(tokenizer).__name__} has no {cls.end_of_turn!r} token: assistant turns "
                "cannot be found; use the tokenizer of a Qwen-VL processor (ChatML template)"
            )
        # Qwen-VL names, then Qwen2.5-Omni's and Qwen3-Omni's audio pad (an audio span sits inside a
        # video's span or holds only pads).
        names = ("<|image_pad|>", "<|video_pad|>", "<|IMAGE|>", "<|VIDEO|>", "<|AUDIO|>", "<|audio_pad|>")
        pads = [token_id(name) for name in names]
        return cls(
            vision_start_id=token_id("<|vision_start|>") or token_id("<|vision_bos|>") or -1,
            vision_end_id=token_id("<|vision_end|>") or token_id("<|vision_eos|>") or -1,
            media_pad_ids=tuple(pad for pad in pads if pad is not None),
        )


def media_token_mask(input_ids: np.ndarray, markers: ChatMarkers) -> np.ndarray:
    """Bool [L]: True on media tokens, which never carry loss.

    A media span runs from a ``<|vision_start|>`` to its matching ``<|vision_end|>`` (spans nest:
    Qwen3-VL puts per-frame timestamps and inner spans inside a video's span); pad tokens
    outside any span count too.

    Example (ids: S=start, E=end, P=pad): ``[7, S, P, P, E, 8, P]`` -> ``[F, T, T, T, T, F, T]``.
    """
    ids = np.asarray(input_ids)
    mask = np.isin(ids, markers.media_pad_ids)
    depth, opened = 0, 0
    for position in np.flatnonzero((ids == markers.vision_start_id) | (ids == markers.vision_end_id)).tolist():
        if ids[position] == markers.vision_start_id:
            opened = position if depth == 0 else opened
            depth += 1
        elif depth > 0:
            depth -= 1
            if depth == 0:
                mask[opened : position + 1] = True
    if depth > 0:
        mask[opened:] = True
    return mask


def assistant_target_mask(text: str, offsets: np.ndarray, markers: ChatMarkers) -> np.ndarray:
    """Bool [L]: True on tokens of each assistant message's content and its closing ``<|im_end|>``
    (content: all the template renders after the header, a Qwen3.5 think block included).

    ``offsets`` int [L, 2] are the tokens' character spans in ``text`` (a fast tokenizer's
    ``offset_mapping``). A token is a target when its span overlaps a content span (content start
    up to the end of the closing marker), so a token that merges the header's newline with
    content that starts with a newline (``"\\n\\n"``) is a target too.

    Example: text ``"<|im_start|>assistant\\nHi<|im_end|>\\n"`` tokenized as
    ``<|im_start|>``, ``assistant``, ``\\n``, ``Hi``, ``<|im_end|>``, ``\\n`` -> ``[F, F, F, T, T, F]``.
    """
    spans = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    mask = np.zeros(len(spans), dtype=bool)
    header, end = markers.assistant_header, markers.end_of_turn
    position = text.find(header)
    while position >= 0:
        content_start = position + len(header)
        close = text.find(end, content_start)
        stop = close + len(end) if close >= 0 else len(text)
        mask |= (spans[:, 0] < stop) & (spans[:, 1] > content_start)
        position = text.find(header, stop)
    return mask


def shifted_targets(input_ids: np.ndarray, target_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Next-token ``labels`` and ``loss_mask``: position t predicts token t+1 when that is a target.

    Example: ids ``[5, 6, 7]``, target mask ``[F, T, T]`` -> labels ``[6, 7, -100]``,
    loss_mask ``[1, 1, 0]``.
    """
    ids = np.asarray(input_ids, dtype=np.int64)
    loss_mask = np.zeros(len(ids), dtype=np.float32)
    loss_mask[:-1] = target_mask[1:]
    labels = np.full(len(ids), IGNORE_INDEX, dtype=np.int64)
    labels[:-1] = np.where(target_mask[1:], ids[1:], IGNORE_INDEX)
    return labels, loss_mask


def tokenize_conversation(
    processor: Any,
    messages: Sequence[dict[str, Any]],
    *,
    image_grid_thw: np.ndarray | None = None,
    video_grid_thw: np.ndarray | None = None,
    videos: Sequence[VideoTiming] = (),
    markers: ChatMarkers | None = None,
    tools: Sequence[dict[str, Any]] | None = None,
    options: Mapping[str, Any] | None = None,
    sound: SoundTokens | None = None,
) -> TokenizedConversation:
    """Render (with ``tools`` and template ``options``, `render_conversation`), expand placeholders
    (audio ones too with ``sound``, Qwen-Omni), tokenize and build assistant-only targets (media tokens excluded)."""
    text = expand_media_placeholders(
        processor,
        render_conversation(processor, messages, tools=tools, options=options),
        MediaExpansion(image_grid_thw=image_grid_thw, video_grid_thw=video_grid_thw, videos=videos, sound=sound),
    )
    tokenizer = processor.tokenizer
    encoded = tokenizer(text, return_offsets_mapping=True)
    input_ids = np.asarray(encoded["input_ids"], dtype=np.int64)
    markers = markers or ChatMarkers.from_tokenizer(tokenizer)
    targets = assistant_target_mask(text, encoded["offset_mapping"], markers) & ~media_token_mask(input_ids, markers)
    labels, loss_mask = shifted_targets(input_ids, targets)
    return TokenizedConversation(input_ids=input_ids, labels=labels, loss_mask=loss_mask)


class SplitTokenizer:
    """:func:`tokenize_conversation` for one processor, tokenising only the text between media
    placeholders: the same input_ids, labels and loss_mask, several times faster on media-heavy chats.

    The rendering is split at the image / video pad tokens; the text pieces go through ONE batched
    tokenizer call, and each placeholder's replacement goes in between as ids: ``[pad_id] * n``
    without tokenising when the replacement is ``pad * n`` (Qwen2/2.5-VL), else its string
    tokenised (cached). Exact because the pad tokens are special tokens, which the tokenizer
    splits off before normalising or merging, so the text between them tokenises the same alone;
    :meth:`applies` checks that. Replacement tokens get zero-width offsets: media tokens never
    carry loss. Example (Qwen2.5-VL): a chat with one image of grid (1, 4, 6) -> the ids of
    ``tokenize_conversation``, its 6 ``<|image_pad|>`` inserted without tokenising.
    """

    def __init__(self, processor: Any, markers: ChatMarkers | None = None) -> None:
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.markers = markers or ChatMarkers.from_tokenizer(self.tokenizer)
        self.image_token, self.video_token = processor.image_token, processor.video_token
        self.pad_ids = {token: int(self.tokenizer.convert_tokens_to_ids(token)) for token in (self.image_token, self.video_token)}
        self._split = re.compile("(" + "|".join(map(re.escape, (self.image_token, self.video_token))) + ")")
        #: Replacement ids by replacement string (videos) and by grid (t, h, w): an image's replacement
        #: depends on its grid only. Plain dicts (the encoder is pickled into spawned workers), cleared when full.
        self._cache: dict[Any, Sequence[int]] = {}

    @staticmethod
    def applies(processor: Any) -> bool:
        """Whether splitting is exact for this processor's tokenizer: it adds no special tokens of its
        own to a call, and both media pad tokens are special tokens. Example: Qwen2.5-VL -> True."""
        tokenizer = processor.tokenizer
        if tokenizer("a b")["input_ids"] != tokenizer("a b", add_special_tokens=False)["input_ids"]:
            return False
        special = set(getattr(tokenizer, "all_special_tokens", ())) | {
            str(token) for token in getattr(tokenizer, "added_tokens_decoder", {}).values()
        }
        return processor.image_token in special and processor.video_token in special

    def _encode(self, texts: list[str]) -> list[tuple[list[int], list[tuple[int, int]]]]:
        """(ids, character offsets) of each text, no special tokens added: ``tokenizer(texts,
        add_special_tokens=False, return_offsets_mapping=True)``. Straight from the Rust backend
        (a third of the wrapper's time) while the backend is as that call leaves it (no truncation,
        no padding, special tokens not split), else through the wrapper."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if (
            backend is not None and backend.truncation is None and backend.padding is None
            and backend.encode_special_tokens == bool(getattr(self.tokenizer, "split_special_tokens", False))
        ):
            return [(encoding.ids, encoding.offsets) for encoding in backend.encode_batch(texts, add_special_tokens=False)]
        encoded = self.tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
        return list(zip(encoded["input_ids"], encoded["offset_mapping"]))

    def _cached(self, key: Any, make: Any) -> Sequence[int]:
        if key not in self._cache:
            if len(self._cache) >= 4096:
                self._cache.clear()
            self._cache[key] = make()
        return self._cache[key]

    def _replacement_ids(self, token: str, text: str) -> Sequence[int]:
        count, rest = divmod(len(text), len(token))
        if not rest and text == token * count:  # Qwen2/2.5-VL: pad tokens only
            return [self.pad_ids[token]] * count
        return self._cached(text, lambda: tuple(self.tokenizer(text, add_special_tokens=False)["input_ids"]))

    def _image_ids(self, grid: tuple[int, ...]) -> Sequence[int]:
        import torch

        def make() -> Sequence[int]:
            text = self.processor.replace_image_token({"image_grid_thw": torch.tensor([grid])}, image_idx=0)
            return self._replacement_ids(self.image_token, text)

        return self._cached(grid, make)

    def __call__(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        image_grid_thw: np.ndarray | None = None,
        video_grid_thw: np.ndarray | None = None,
        videos: Sequence[VideoTiming] = (),
        tools: Sequence[dict[str, Any]] | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> TokenizedConversation:
        """The :func:`tokenize_conversation` result of ``messages`` with these media grids, tools and template options."""
        import torch

        text = render_conversation(self.processor, messages, tools=tools, options=options)
        pieces = self._split.split(text)  # text, token, text, token, ..., text
        texts, tokens = pieces[0::2], pieces[1::2]
        _check_placeholders(self.processor, tokens.count, image_grid_thw=image_grid_thw, video_grid_thw=video_grid_thw)
        image_grids = [] if image_grid_thw is None else [tuple(grid) for grid in np.asarray(image_grid_thw).tolist()]
        video_inputs = None if video_grid_thw is None else {
            "video_grid_thw": torch.as_tensor(video_grid_thw),
            "video_metadata": [timing.metadata() for timing in videos],
        }
        encoded = self._encode(texts)
        ids: list[int] = []
        spans: list[np.ndarray] = []
        position = 0
        media = {self.image_token: 0, self.video_token: 0}
        for index, piece in enumerate(texts):
            ids += encoded[index][0]
            spans.append(np.asarray(encoded[index][1], dtype=np.int64).reshape(-1, 2) + position)
            position += len(piece)
            if index < len(tokens):
                token = tokens[index]
                if token == self.image_token:
                    replacement = self._image_ids(image_grids[media[token]])
                else:
                    text_of = self.processor.replace_video_token(video_inputs, video_idx=media[token])
                    replacement = self._replacement_ids(token, text_of)
                media[token] += 1
                ids += replacement
                # Zero-width spans at the placeholder: media tokens are never targets anyway.
                spans.append(np.full((len(replacement), 2), position, dtype=np.int64))
                position += len(token)
        input_ids = np.asarray(ids, dtype=np.int64)
        offsets = np.concatenate(spans) if spans else np.zeros((0, 2), dtype=np.int64)
        targets = assistant_target_mask(text, offsets, self.markers) & ~media_token_mask(input_ids, self.markers)
        labels, loss_mask = shifted_targets(input_ids, targets)
        return TokenizedConversation(input_ids=input_ids, labels=labels, loss_mask=loss_mask)
