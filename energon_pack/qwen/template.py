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

    Example (Qwen2.5-VL): one ``<|image_pad|>`` with grid (1, 4, 6) -> 6 ``<|image_pad|>``.
    """
    import torch

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


@dataclass(frozen=True)
class ChatMarkers:
    """Token ids that delimit assistant turns in a ChatML rendering."""

    assistant_header: tuple[int, ...]
    end_of_turn: int

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> ChatMarkers:
        """``<|im_start|>assistant\\n`` and ``<|im_end|>`` ids of a Qwen tokenizer."""
        header = tuple(tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False))
        return cls(assistant_header=header, end_of_turn=tokenizer.convert_tokens_to_ids("<|im_end|>"))


def assistant_target_mask(input_ids: np.ndarray, markers: ChatMarkers) -> np.ndarray:
    """Bool [L]: True on each assistant message's content tokens and its closing ``<|im_end|>``.

    Example: ids ``[S, A, N, x, y, E, N]`` with header ``(S, A, N)`` and end ``E``
    -> ``[F, F, F, T, T, T, F]`` (the header and the newline after ``E`` are never targets).
    """
    ids = np.asarray(input_ids)
    mask = np.zeros(len(ids), dtype=bool)
    header = np.asarray(markers.assistant_header)
    width = len(header)
    if len(ids) < width:
        return mask
    windows = np.lib.stride_tricks.sliding_window_view(ids, width)
    ends = np.flatnonzero(ids == markers.end_of_turn)
    for start in np.flatnonzero((windows == header).all(axis=1)):
        content_start = start + width
        later_ends = ends[ends >= content_start]
        stop = later_ends[0] + 1 if len(later_ends) else len(ids)
        mask[content_start:stop] = True
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
    input_ids = np.asarray(tokenizer(text)["input_ids"], dtype=np.int64)
    labels, loss_mask = shifted_targets(input_ids, assistant_target_mask(input_ids, markers or ChatMarkers.from_tokenizer(tokenizer)))
    return TokenizedConversation(input_ids=input_ids, labels=labels, loss_mask=loss_mask)
