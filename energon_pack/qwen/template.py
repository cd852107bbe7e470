"""Chat template, tokenization with media placeholders expanded, and the assistant-only loss mask.

Token ids come from the processor given to the plugin, exactly as
``processor(text=[processor.apply_chat_template(messages)], images=..., videos=...)`` would give
them, but computed from media *geometry* only (grids, frame indices), never from pixels: each
placeholder is replaced by the processor's own replacement string for that grid
(``replace_image_token`` / ``replace_video_token``), then the text is tokenized.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from energon_pack.errors import BadSampleError

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
class TokenizedConversation:
    """``input_ids`` int64 [L]; ``labels`` int64 [L] (next-token targets, -100 off-loss);
    ``loss_mask`` float32 [L] (1.0 where ``labels`` is a target)."""

    input_ids: np.ndarray
    labels: np.ndarray
    loss_mask: np.ndarray


def render_conversation(processor: Any, messages: Sequence[dict[str, Any]]) -> str:
    """Render typed messages with the processor's chat template (no generation prompt)."""
    return processor.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=False)


def expand_media_placeholders(
    processor: Any,
    text: str,
    *,
    image_grid_thw: np.ndarray | None,
    video_grid_thw: np.ndarray | None,
    videos: Sequence[VideoTiming] = (),
) -> str:
    """Replace each image/video pad token by the processor's replacement for its grid.

    Raises ``BadSampleError("placeholder_mismatch")`` when the pad tokens in ``text`` and the
    grids differ in number (a sample whose media list does not match its media parts).
    Example (Qwen2.5-VL): one ``<|image_pad|>`` with grid (1, 4, 6) -> 6 ``<|image_pad|>``.
    """
    import torch

    for kind, token, grids in (
        ("image", processor.image_token, image_grid_thw),
        ("video", processor.video_token, video_grid_thw),
    ):
        placeholders, media = text.count(token), 0 if grids is None else len(grids)
        if placeholders != media:
            raise BadSampleError(
                "placeholder_mismatch",
                f"the rendered conversation has {placeholders} {kind} placeholder(s) but the sample has "
                f"{media} {kind}(s); put one {{'type': '{kind}'}} part per {kind}",
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
        video_replacements = [processor.replace_video_token(video_inputs, video_idx=i) for i in range(len(video_grid_thw))]
    expanded, _ = processor.get_text_with_replacements([text], image_replacements, video_replacements, [])
    return expanded[0]


def placeholder_token_count(
    processor: Any,
    *,
    image_grid_thw: np.ndarray | None,
    video_grid_thw: np.ndarray | None,
    videos: Sequence[VideoTiming] = (),
) -> int:
    """Tokens that a sample's image and video placeholders expand to, without building the long
    replacements that `expand_media_placeholders` tokenizes.

    Each replacement is the processor's own (``replace_image_token`` / ``replace_video_token``)
    for a grid of the same temporal length t with one merged patch per step, tokenized (special
    tokens delimit it, so it tokenizes alone as in context), plus t * (h*w/merge**2 - 1) pad
    tokens for the other merged patches of each step. Qwen2/2.5-VL: t*h*w/merge**2 per medium;
    Qwen3-VL videos add each step's timestamp text and its vision start/end tokens.

    Example (Qwen2.5-VL): image grid (1, 4, 6) -> 6; image (1, 4, 6) and video (2, 4, 4) -> 14.
    """
    import torch

    merge = int(processor.image_processor.merge_size)
    total = 0
    for kind, grids in (("image", image_grid_thw), ("video", video_grid_thw)):
        for index, (steps, height, width) in enumerate([] if grids is None else np.asarray(grids).tolist()):
            inputs: dict[str, Any] = {f"{kind}_grid_thw": torch.tensor([[steps, merge, merge]])}
            if kind == "image":
                text = processor.replace_image_token(inputs, image_idx=0)
            else:
                inputs["video_metadata"] = [videos[index].metadata()]
                text = processor.replace_video_token(inputs, video_idx=0)
            tokens = len(processor.tokenizer(text, add_special_tokens=False)["input_ids"])
            total += tokens + steps * (height * width // merge**2 - 1)
    return total


@dataclass(frozen=True)
class ChatMarkers:
    """Strings that delimit assistant turns in a ChatML rendering."""

    assistant_header: str = "<|im_start|>assistant\n"
    end_of_turn: str = "<|im_end|>"

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> ChatMarkers:
        """ChatML markers of a Qwen tokenizer, which must know ``<|im_end|>`` as one token."""
        markers = cls()
        if tokenizer.convert_tokens_to_ids(markers.end_of_turn) in (None, tokenizer.unk_token_id):
            raise ValueError(
                f"tokenizer {type(tokenizer).__name__} has no {markers.end_of_turn!r} token: assistant turns "
                "cannot be found; use the tokenizer of a Qwen-VL processor (ChatML template)"
            )
        return markers


def assistant_target_mask(text: str, offsets: np.ndarray, markers: ChatMarkers) -> np.ndarray:
    """Bool [L]: True on tokens of each assistant message's content and its closing ``<|im_end|>``.

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
) -> TokenizedConversation:
    """Render, expand placeholders, tokenize and build assistant-only targets."""
    text = expand_media_placeholders(
        processor,
        render_conversation(processor, messages),
        image_grid_thw=image_grid_thw,
        video_grid_thw=video_grid_thw,
        videos=videos,
    )
    tokenizer = processor.tokenizer
    encoded = tokenizer(text, return_offsets_mapping=True)
    input_ids = np.asarray(encoded["input_ids"], dtype=np.int64)
    targets = assistant_target_mask(text, encoded["offset_mapping"], markers or ChatMarkers.from_tokenizer(tokenizer))
    labels, loss_mask = shifted_targets(input_ids, targets)
    return TokenizedConversation(input_ids=input_ids, labels=labels, loss_mask=loss_mask)
