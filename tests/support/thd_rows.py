"""Hand-built THD rows for the step adapter's tests and the GPU check: random token ids, one image
per sample, raw uint8 patches or their normalised float32 values."""

from __future__ import annotations

import torch

from energon_pack.core.visual import VisualInputs, normalize_patches
from energon_pack.qwen.template import IGNORE_INDEX
from energon_pack.rows.encoded import PackedSegment
from energon_pack.rows.thd import build_thd_row

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def make_row(
    lengths: list[int], width: int, multiple: int, *, uint8: bool, seed: int = 0,
    grid: tuple[int, int, int] = (1, 2, 2), patch_dim: int = 24,
) -> dict:
    """Row of samples with ``lengths`` tokens each carrying one image of ``grid`` (t, h, w) patches of
    ``patch_dim`` values (default 4 patches, D = 3*2*2*2 = 24; Qwen's is 3*2*14*14 = 1176): uint8
    patches, or float32 normalised with the CLIP mean / std.

    Example: ``make_row([5, 3], width=16, multiple=4, uint8=True)`` -> a row dict with
    ``input_ids`` [1, 16] and 8 uint8 patch rows of 24 values."""
    gen = torch.Generator().manual_seed(seed)
    patches = grid[0] * grid[1] * grid[2]
    segments = []
    for i, n in enumerate(lengths):
        ids = torch.randint(0, 1000, (n,), generator=gen)
        raw = torch.randint(0, 256, (patches, patch_dim), generator=gen, dtype=torch.uint8)
        if uint8:
            visual = VisualInputs(
                pixel_values=raw, image_grid_thw=torch.tensor([grid]), image_mean=CLIP_MEAN, image_std=CLIP_STD,
                rescale_factor=1 / 255,
            )
        else:
            visual = VisualInputs(
                pixel_values=normalize_patches(raw, CLIP_MEAN, CLIP_STD, 1 / 255), image_grid_thw=torch.tensor([grid]),
            )
        segments.append(
            PackedSegment(
                key=f"s{i}",
                input_ids=ids,
                labels=torch.cat([ids[1:], torch.tensor([IGNORE_INDEX])]),
                loss_mask=torch.ones(n),
                mrope_position_ids=torch.arange(n).expand(3, n).clone(),
                visual=visual,
            )
        )
    return build_thd_row(segments, seq_length=width, pad_multiple=multiple, pad_token_id=0)
