"""Audio payload of a packed row (Qwen-Omni): log-mel features of every sound, without padding.

The Hugging Face processor pads each clip's features to 300 s ([n, 128, 30000] with a
``feature_attention_mask``); a row carries only the real frames, concatenated along time, and the
frames of each sound, which is what the thinker's audio tower takes
(``audio_tower(input_features, feature_lens=audio_feature_lengths)``, docs/batch_contract.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import numpy as np
import torch

__all__ = ["AudioInputs"]


@dataclass(frozen=True, kw_only=True)
class AudioInputs:
    """input_features: float32 [n_mels, F] (the sounds' frames one after another, in token order);
    audio_feature_lengths: int64 [n] (frames of each sound, summing to F).

    Example: sounds of 100 and 37 frames -> input_features [128, 137], audio_feature_lengths [100, 37].
    """

    input_features: torch.Tensor
    audio_feature_lengths: torch.Tensor

    def __post_init__(self) -> None:
        total = int(self.audio_feature_lengths.sum()) if self.audio_feature_lengths.numel() else 0
        if self.input_features.dim() != 2 or self.input_features.shape[1] != total:
            raise ValueError(
                f"input_features has shape {tuple(self.input_features.shape)} but audio_feature_lengths sum to {total}: "
                "features must be [n_mels, sum of frames]; fix: concatenate each sound's real frames along time"
            )

    @classmethod
    def of(cls, features: Sequence[np.ndarray]) -> AudioInputs:
        """One sample's payload from each sound's features [n_mels, F_i] (written once into one tensor)."""
        lengths = [int(f.shape[1]) for f in features]
        out = torch.empty((int(features[0].shape[0]), sum(lengths)), dtype=torch.float32)
        start = 0
        for block, length in zip(features, lengths):
            out[:, start : start + length] = torch.from_numpy(block)
            start += length
        return cls(input_features=out, audio_feature_lengths=torch.tensor(lengths, dtype=torch.int64))

    @property
    def frames(self) -> int:
        """Feature frames F (what the audio encoder reads)."""
        return int(self.input_features.shape[1])

    @classmethod
    def concat(cls, parts: Sequence[AudioInputs | None]) -> AudioInputs | None:
        """The payloads of a row's segments in row order (None: no segment hears anything).

        Example: concat([100 frames, None, 37 frames]) -> [128, 137], lengths [100, 37].
        """
        present = [part for part in parts if part is not None]
        if not present:
            return None
        return cls(
            input_features=torch.cat([part.input_features for part in present], dim=1),
            audio_feature_lengths=torch.cat([part.audio_feature_lengths for part in present]),
        )

    def to(self, device: torch.device | str, non_blocking: bool = False) -> AudioInputs:
        """Copy with both tensors on ``device``."""
        return replace(self, **{f.name: getattr(self, f.name).to(device, non_blocking=non_blocking) for f in fields(self)})

    def pin_memory(self) -> AudioInputs:
        """Copy with both tensors in page-locked host memory (needs an accelerator)."""
        return replace(self, **{f.name: getattr(self, f.name).pin_memory() for f in fields(self)})
