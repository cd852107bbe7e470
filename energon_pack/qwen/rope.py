"""Qwen-VL 3-D rope positions (M-RoPE) for one unpacked sample.

Reproduces ``get_rope_index`` of the Hugging Face Qwen2-VL, Qwen2.5-VL, Qwen3-VL and
Qwen3.5 models (transformers 5.12 to 5.24, called with ``mm_token_type_ids``; Qwen3.5's is
Qwen3-VL's rule, see ``vision_rules``):

- tokens are grouped into runs of equal modality (text, image token, video
  token), exactly as the processor's ``mm_token_type_ids`` marks them;
- a text run of length n gets ``p, p+1, ..., p+n-1`` on all three rows and
  advances the running position ``p`` by n;
- a vision run (one image, one video, or for Qwen3-VL one video frame) with
  merged grid ``(t, gh, gw)`` gets rows ``(p + temporal(i), p + row, p + col)``
  in raster order and advances ``p`` by ``max(gh, gw)`` only (not by the
  temporal extent: this is what transformers does);
- ``temporal(i) = i`` except for Qwen2.5-VL videos, where it is
  ``long(i * tokens_per_second * second_per_grid_ts[video])`` in the dtype of
  ``second_per_grid_ts`` (float32, as the processor returns it) from transformers 5.18
  on, and ``i * tokens_per_second * int(second_per_grid_ts[video])`` before (seconds
  truncated to whole seconds first: 0.5 s per grid step gives 0, 0, 0 instead of 0, 1, 2
  at 2 tokens per second). ``RopeSpec.whole_seconds`` selects the rule; by default it
  follows the installed transformers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from energon_pack.qwen.family import FAMILIES, Family, family_of_model_config, processor_family, vision_rules
from energon_pack.qwen.hf_release import qwen25_rope_whole_seconds

_TEXT, _IMAGE, _VIDEO = 0, 1, 2
#: tokens_per_second of the released Qwen2.5-VL checkpoints (used when no model config is known).
QWEN25_TOKENS_PER_SECOND = 2


@dataclass(frozen=True, kw_only=True)
class RopeSpec:
    """Model-side constants that 3-D rope positions depend on.

    ``spatial_merge_size``: patches merged per side into one LLM token.
    ``tokens_per_second``: temporal positions per second of video; Qwen2.5-VL
    only (2 for the released checkpoints), must be None for other families.
    ``whole_seconds``: Qwen2.5-VL only: True truncates each video's seconds per grid
    step to whole seconds before scaling (transformers < 5.18), False keeps the fraction
    and floors each grid step's position (transformers >= 5.18); None (the default)
    becomes what the installed transformers does. Must stay None for other families.
    """

    family: Family
    spatial_merge_size: int = 2
    tokens_per_second: float | None = None
    whole_seconds: bool | None = None
    image_token_id: int = 151655
    video_token_id: int = 151656

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(
                f"RopeSpec.family={self.family!r} is not supported; use one of "
                f"{sorted(FAMILIES)}."
            )
        if self.spatial_merge_size < 1:
            raise ValueError(
                f"RopeSpec.spatial_merge_size={self.spatial_merge_size} must be >= 1 "
                "(2 for all released Qwen-VL checkpoints)."
            )
        if self.family == "qwen2.5-vl":
            if self.tokens_per_second is None or self.tokens_per_second <= 0:
                raise ValueError(
                    f"RopeSpec.tokens_per_second={self.tokens_per_second!r}: qwen2.5-vl needs a positive "
                    "value; pass the model's vision_config.tokens_per_second (2 for released checkpoints)."
                )
            if self.whole_seconds is None:
                object.__setattr__(self, "whole_seconds", qwen25_rope_whole_seconds())
        else:
            for name in ("tokens_per_second", "whole_seconds"):
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"RopeSpec.{name}={getattr(self, name)!r} has no effect for family "
                        f"{self.family!r} (only qwen2.5-vl scales video time); leave it None."
                    )
        if self.image_token_id == self.video_token_id:
            raise ValueError(
                f"RopeSpec.image_token_id and video_token_id are both {self.image_token_id}; "
                "they must differ (151655 and 151656 for Qwen-VL tokenizers)."
            )

    @classmethod
    def from_model_config(cls, config: Any) -> RopeSpec:
        """Build from a Hugging Face Qwen2-VL / Qwen2.5-VL / Qwen3-VL (MoE) / Qwen3.5 (MoE) model config.

        Example: ``RopeSpec.from_model_config(Qwen3_5MoeConfig())`` -> ``RopeSpec(family="qwen3.5",
        image_token_id=248056, video_token_id=248057, ...)``.
        """
        family = family_of_model_config(config)
        config = getattr(config, "thinker_config", config)  # Qwen-Omni: the thinker's
        vision = config.vision_config
        return cls(
            family=family,
            spatial_merge_size=int(vision.spatial_merge_size),
            tokens_per_second=vision.tokens_per_second if family == "qwen2.5-vl" else None,
            image_token_id=int(config.image_token_id),
            video_token_id=int(config.video_token_id),
        )

    @classmethod
    def from_processor(cls, processor: Any) -> RopeSpec:
        """Rope constants for a processor: from the model config ``load_processor(path)`` found
        next to it, else from the processor itself (family, merge size, image/video token ids;
        Qwen2.5-VL ``tokens_per_second`` = 2 as in the released checkpoints).

        Example: ``RopeSpec.from_processor(load_processor())`` -> ``RopeSpec(family="qwen2.5-vl",
        tokens_per_second=2, ...)``.
        """
        model_config = getattr(processor, "energon_pack_model_config", None)
        if model_config is not None:
            return cls.from_model_config(model_config)
        family = processor_family(processor)
        return cls(
            family=family,
            spatial_merge_size=int(processor.image_processor.merge_size),
            tokens_per_second=QWEN25_TOKENS_PER_SECOND if family == "qwen2.5-vl" else None,
            image_token_id=int(processor.image_token_id),
            video_token_id=int(processor.video_token_id),
        )


def mrope_position_ids(
    input_ids: torch.Tensor,
    *,
    spec: RopeSpec,
    image_grid_thw: torch.Tensor | None = None,
    video_grid_thw: torch.Tensor | None = None,
    second_per_grid_ts: Sequence[float] | torch.Tensor | None = None,
) -> torch.Tensor:
    """3-D rope positions of one unpacked sample: CPU int64 [3, L] (rows: temporal, height, width).

    ``input_ids``: int [L] with placeholders already expanded (one token per merged patch).
    ``image_grid_thw`` / ``video_grid_thw``: int [n, 3] patch grids (t, h, w), in sequence order.
    ``second_per_grid_ts``: seconds per temporal grid step for each video (Qwen2.5-VL only;
    a sequence becomes a float32 tensor as the processor returns it; None means 1.0 s).

    Example (merge 2; ``I`` = image token; one image of grid (1, 4, 4) -> 2x2 = 4 tokens)::

        input_ids = [5, 6, I, I, I, I, 7], image_grid_thw = [[1, 4, 4]]
        -> [[0, 1, 2, 2, 2, 2, 4],    # temporal
            [0, 1, 2, 2, 3, 3, 4],    # height
            [0, 1, 2, 3, 2, 3, 4]]    # width

    Raises ValueError when the placeholder runs do not match the grids.
    """
    if input_ids.dim() != 1:
        raise ValueError(
            f"input_ids has shape {tuple(input_ids.shape)}; expected one unpacked sample of shape [L] "
            "(index a batch row first)."
        )
    images = _grid_list(image_grid_thw, "image_grid_thw", spec.spatial_merge_size)
    videos = _grid_list(video_grid_thw, "video_grid_thw", spec.spatial_merge_size)
    blocks = {
        _IMAGE: [((gh, gw), np.arange(t)) for t, gh, gw in images],
        _VIDEO: _video_blocks(spec, videos, second_per_grid_ts),
    }
    used = {_IMAGE: 0, _VIDEO: 0}

    ids = input_ids.detach().cpu().numpy()
    out = np.empty((3, ids.size), dtype=np.int64)
    position = 0
    for start, end, kind in _modality_runs(ids, spec):
        if kind == _TEXT:
            out[:, start:end] = np.arange(position, position + end - start)
            position += end - start
            continue
        name = "image" if kind == _IMAGE else "video"
        index = used[kind]
        if index >= len(blocks[kind]):
            raise ValueError(
                f"{name} placeholder run at token {start} has no grid left: {name}_grid_thw describes only "
                f"{len(blocks[kind])} {name} blocks; pass the grids the processor returned for this sample."
            )
        (gh, gw), temporal = blocks[kind][index]
        used[kind] = index + 1
        if end - start != temporal.size * gh * gw:
            raise ValueError(
                f"{name} placeholder run #{index} at token {start} has {end - start} tokens but its grid "
                f"needs {temporal.size}*{gh}*{gw}={temporal.size * gh * gw} (merged t*h*w); the token "
                "expansion and the grids disagree."
            )
        grid = (temporal.size, gh, gw)  # a contiguous row slice reshapes to a view: writes land in out
        out[0, start:end].reshape(grid)[...] = (temporal + position)[:, None, None]
        out[1, start:end].reshape(grid)[...] = np.arange(position, position + gh)[:, None]
        out[2, start:end].reshape(grid)[...] = np.arange(position, position + gw)
        position += max(gh, gw)

    for kind, name in ((_IMAGE, "image"), (_VIDEO, "video")):
        if used[kind] != len(blocks[kind]):
            raise ValueError(
                f"{name}_grid_thw describes {len(blocks[kind])} {name} blocks but input_ids has "
                f"{used[kind]} {name} placeholder runs; every grid needs its expanded placeholder tokens."
            )
    return torch.from_numpy(out)


def _modality_runs(ids: np.ndarray, spec: RopeSpec) -> list[tuple[int, int, int]]:
    """Maximal runs (start, end, kind) of equal token kind: 0 text, 1 image token, 2 video token.

    Example: [5, I, I, 6, V] -> [(0, 1, 0), (1, 3, 1), (3, 4, 0), (4, 5, 2)].
    """
    kind = np.full(ids.shape, _TEXT, dtype=np.int8)
    kind[ids == spec.image_token_id] = _IMAGE
    kind[ids == spec.video_token_id] = _VIDEO
    boundaries = (np.flatnonzero(kind[1:] != kind[:-1]) + 1).tolist()
    starts = [0, *boundaries] if ids.size else []
    return list(zip(starts, [*boundaries, ids.size], kind[starts].tolist()))


def _grid_list(grid_thw: torch.Tensor | None, name: str, merge: int) -> list[tuple[int, int, int]]:
    """Patch grids [n, 3] -> merged LLM grids (t, h // merge, w // merge), validated."""
    if grid_thw is None:
        return []
    grid = torch.as_tensor(grid_thw)
    if grid.dim() != 2 or grid.shape[1] != 3:
        raise ValueError(f"{name} has shape {tuple(grid.shape)}; expected [n, 3] rows of (t, h, w).")
    merged = []
    for t, h, w in grid.tolist():
        if t < 1 or h < 1 or w < 1 or h % merge or w % merge:
            raise ValueError(
                f"{name} row {(t, h, w)} is invalid: t, h, w must be positive and h, w multiples of "
                f"spatial_merge_size={merge}."
            )
        merged.append((int(t), int(h) // merge, int(w) // merge))
    return merged


def _video_blocks(
    spec: RopeSpec,
    videos: list[tuple[int, int, int]],
    second_per_grid_ts: Sequence[float] | torch.Tensor | None,
) -> list[tuple[tuple[int, int], np.ndarray]]:
    """Vision blocks of the video runs: ((gh, gw), temporal offsets [t]) in sequence order.

    Qwen3-VL and Qwen3.5: one block per frame (temporal grid step), offsets [0]. Qwen2-VL: offsets 0..t-1.
    Qwen2.5-VL: ``long(i * tokens_per_second * seconds)`` computed with the same torch scalar
    types as HF (float32 seconds, as the processor returns them), so truncation rounds identically;
    with ``spec.whole_seconds`` the seconds are truncated first (``int(seconds)``).
    """
    if vision_rules(spec.family) == "qwen3-vl":
        return [((gh, gw), np.zeros(1, dtype=np.int64)) for t, gh, gw in videos for _ in range(t)]
    if spec.family == "qwen2-vl":
        return [((gh, gw), np.arange(t)) for t, gh, gw in videos]
    if second_per_grid_ts is None:
        seconds: Sequence[Any] = [1] * len(videos)
    else:
        seconds = torch.as_tensor(second_per_grid_ts).reshape(-1)
        if len(seconds) != len(videos):
            raise ValueError(
                f"second_per_grid_ts has {len(seconds)} values but video_grid_thw has {len(videos)} videos; "
                "give one value per video (temporal_patch_size / sampled fps)."
            )
    steps = [int(step) for step in seconds] if spec.whole_seconds else seconds
    return [
        ((gh, gw), (torch.arange(t) * (spec.tokens_per_second * step)).long().numpy())
        for (t, gh, gw), step in zip(videos, steps)
    ]
