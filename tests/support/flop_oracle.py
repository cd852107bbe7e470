"""Counted FLOPs of packed rows through tiny random Hugging Face Qwen-VL models (test helper, CPU).

How a row is run so that ``torch.utils.flop_counter.FlopCounterMode`` sees what a varlen (THD)
kernel computes:

* ``attn_implementation="eager"``: CPU SDPA (``_scaled_dot_product_flash_attention_for_cpu``) has
  no flop formula, so FlopCounterMode counts 0 for it; eager attention is two matmuls, counted.
* Each segment of the row runs alone (batch of one sequence, its own media), and the counts are
  summed: the linears are per token either way, and the LLM attention is then the square of each
  segment, as with ``cu_seqlens`` (one packed call with a block mask would count the square of the
  whole row). The count is the full square (the causal mask is an addition): compare with
  ``causal_fraction=1``.
* The vision tower already splits its attention by ``cu_seqlens`` (per frame, per window) when
  not using flash attention, so its count is per group as in the kernel.
* Forward + backward: ``logits.sum().backward()`` inside the counter; pixels need no grad (the
  patch embedding's backward is its weight grad only). ``frozen_vision``: the tower's parameters
  are set to ``requires_grad=False``.

Small vocabulary (1024) and media token ids inside it, so the LM head does not dwarf the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch.utils.flop_counter import FlopCounterMode

VOCAB = 1024
VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = 1000, 1001, 1002, 1003


@dataclass(frozen=True)
class Segment:
    """One sample of a row: ``text`` plain tokens plus its media grids (t, h, w)."""

    text: int
    images: Sequence[tuple[int, int, int]] = field(default_factory=tuple)
    videos: Sequence[tuple[int, int, int]] = field(default_factory=tuple)

    def length(self, family: str, merge: int = 2) -> int:
        """Real tokens: text + per image (start, h*w/merge^2 pads, end) + per video the same with
        t*h*w/merge^2 pads (Qwen3-VL: one start/end pair per temporal step, as its processor)."""
        images = sum(2 + t * h * w // merge**2 for t, h, w in self.images)
        frames = 2 if family != "qwen3_vl" else 0
        videos = sum(frames + t * ((2 if family == "qwen3_vl" else 0) + h * w // merge**2) for t, h, w in self.videos)
        return self.text + images + videos

    @property
    def grids(self) -> list[tuple[int, int, int]]:
        return [*self.images, *self.videos]


def tiny_config(family: str, *, moe: bool = False):
    """A tiny random config of ``family`` ("qwen2_5_vl" or "qwen3_vl"), eager attention."""
    text = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16,
    )
    tokens = dict(image_token_id=IMAGE_PAD, video_token_id=VIDEO_PAD, vision_start_token_id=VISION_START)
    if family == "qwen2_5_vl":
        from transformers import Qwen2_5_VLConfig

        text["rope_parameters"] = dict(rope_type="default", rope_theta=10000.0, mrope_section=[2, 3, 3])
        vision = dict(depth=4, hidden_size=64, intermediate_size=96, num_heads=2, out_hidden_size=64, patch_size=14,
                      temporal_patch_size=2, spatial_merge_size=2, window_size=112, fullatt_block_indexes=[1, 3])
        config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, **tokens)
    elif family == "qwen3_vl":
        text["rope_parameters"] = dict(rope_type="default", rope_theta=10000.0, mrope_section=[2, 3, 3],
                                       mrope_interleaved=True)
        vision = dict(depth=3, hidden_size=64, intermediate_size=96, num_heads=2, out_hidden_size=64, patch_size=16,
                      temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=64,
                      deepstack_visual_indexes=[0, 1])
        if moe:
            from transformers import Qwen3VLMoeConfig as Config

            text.update(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, decoder_sparse_step=1,
                        mlp_only_layers=[0])
        else:
            from transformers import Qwen3VLConfig as Config
        config = Config(text_config=text, vision_config=vision, vision_end_token_id=VISION_END, **tokens)
    else:
        raise ValueError(f"family={family!r}: the oracle builds qwen2_5_vl or qwen3_vl")
    config._attn_implementation = "eager"
    for sub in (config, config.text_config, config.vision_config):
        sub._attn_implementation = "eager"
        sub._experts_implementation = "eager"
    return config


def tiny_model(config, *, seed: int = 0, frozen_vision: bool = False) -> torch.nn.Module:
    """The random-weight model of ``config`` (float32, train mode, fixed seed, global RNG untouched)."""
    import transformers

    cls = {
        "qwen2_5_vl": transformers.Qwen2_5_VLForConditionalGeneration,
        "qwen3_vl": transformers.Qwen3VLForConditionalGeneration,
        "qwen3_vl_moe": transformers.Qwen3VLMoeForConditionalGeneration,
    }[config.model_type]
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = cls(config).to(torch.float32)
    model.train()
    if frozen_vision:
        for p in model.model.visual.parameters():
            p.requires_grad_(False)
    return model


def _segment_inputs(seg: Segment, config, generator: torch.Generator) -> dict:
    vision = config.vision_config
    merge = vision.spatial_merge_size
    per_frame = config.model_type.startswith("qwen3_vl")  # Qwen3-VL: one start/end pair per video frame group
    ids: list[int] = []
    types: list[int] = []
    for kind, pad, grids in ((1, IMAGE_PAD, seg.images), (2, VIDEO_PAD, seg.videos)):
        for t, h, w in grids:
            groups = [h * w // merge**2] * t if per_frame and kind == 2 else [t * h * w // merge**2]
            for n in groups:
                ids += [VISION_START] + [pad] * n + [VISION_END]
                types += [0] + [kind] * n + [0]
    ids += torch.randint(0, 900, (seg.text,), generator=generator).tolist()
    types += [0] * seg.text
    out: dict = {"input_ids": torch.tensor([ids]), "mm_token_type_ids": torch.tensor([types])}
    depth = vision.in_channels * vision.temporal_patch_size * vision.patch_size**2
    for key, grid_key, grids in (("pixel_values", "image_grid_thw", seg.images),
                                 ("pixel_values_videos", "video_grid_thw", seg.videos)):
        if grids:
            patches = sum(t * h * w for t, h, w in grids)
            out[key] = torch.randn(patches, depth, generator=generator)
            out[grid_key] = torch.tensor([list(g) for g in grids])
    return out


def counted_row_flops(model: torch.nn.Module, row: Sequence[Segment], *, seed: int = 0) -> dict[str, int]:
    """FLOPs FlopCounterMode counts for ``row`` forward + backward, each segment run alone;
    keys: ``total``, ``vision`` (the tower, ``model.visual`` and its mergers), ``lm_head``."""
    generator = torch.Generator().manual_seed(seed)
    totals = {"total": 0, "vision": 0, "lm_head": 0}
    for seg in row:
        inputs = _segment_inputs(seg, model.config, generator)
        model.zero_grad(set_to_none=True)
        with FlopCounterMode(display=False) as counter:
            logits = model(**inputs, use_cache=False).logits
            logits.sum().backward()
        counts = counter.get_flop_counts()
        totals["total"] += counter.get_total_flops()
        totals["vision"] += _module_total(counts, ".visual")
        totals["lm_head"] += _module_total(counts, "lm_head")
    return totals


def _module_total(counts: dict, suffix: str) -> int:
    """Sum of the module of ``counts`` whose name ends with ``suffix`` (shortest such name)."""
    names = sorted((n for n in counts if n.endswith(suffix)), key=len)
    return sum(counts[names[0]].values()) if names else 0
