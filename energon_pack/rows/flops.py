"""Modelled FLOPs of one packed THD row for Qwen2-VL, Qwen2.5-VL and Qwen3-VL (dense and MoE).

Pure arithmetic (no torch): a :class:`ModelSpec` is read from a Hugging Face model config (object,
``config.json`` dict, path, or a named preset in :data:`PRESETS`), then

* :func:`token_flops` - LLM linears (attention projections, dense or active-expert MLP, router)
  plus the LM head, per token slot;
* :func:`segment_attention_flops` - causal self-attention of one segment of ``n`` tokens, over all
  layers (``QK^T`` and ``AV``: ``4 * n^2 * heads * head_dim`` per layer, times the causal
  fraction);
* :func:`media_flops` - the vision tower on one image / video grid ``(t, h, w)`` (ViT input
  patches ``t*h*w``): patch embedding, block linears per patch, block attention per attention
  group as the family's HF vision model builds its ``cu_seqlens`` (one group per frame of
  ``h*w`` patches; Qwen2.5-VL windowed blocks: one group per window of
  ``window_size / patch_size`` patches a side, cut per frame), merger(s) per merged token
  (Qwen3-VL: the final merger plus one per deepstack layer);
* :func:`row_flops` - a row: the sum of the three over its segments and media, as a
  :class:`RowFlops` breakdown;
* :func:`sample_flops` - what one sample adds to a fixed-width row (its attention and its media),
  and :func:`row_constant` - what every row of W slots pays whatever it holds (``W *
  token_flops``): a fixed-width row costs ``row_constant + sum(sample_flops)``, so a plan needs
  one number per sample. See ``docs/balanced_steps.md`` for the formulas.

Units: FLOPs, 2 per multiply-accumulate. Only matrix products count (norms, activations,
rotary, softmax, biases, the loss do not): the same things ``torch.utils.flop_counter`` counts.

Training (``training=True``) adds the backward: 2x the forward of every matmul (input grad +
weight grad), except the patch embedding, whose input (pixels) needs no grad (1x: weight grad
only). ``frozen_vision=True``: the whole vision tower (patch embedding, blocks, merger(s)) is
forward only - nothing in it needs a gradient, so autograd runs no backward through it.

Causal attention: a varlen kernel (flash, cuDNN, TE) skips the masked upper triangle, so the
default ``causal_fraction=0.5`` counts half of ``n^2``; ``torch.utils.flop_counter`` (and an
eager or SDPA run with a causal mask) counts the full square: pass ``causal_fraction=1``.
Vision attention is bidirectional (always the full square of each group).

Worked example (Qwen2.5-VL-7B preset, forward+backward, kernel convention): a text token costs
``token_flops`` = 3 * (28 * (2*3584*(3584 + 2*512) + 2*3584*3584 + 6*3584*18944)
+ 2*3584*152064) = 42.4 GFLOP per slot; one 448x448 image (grid (1, 32, 32): 1024 patches,
256 merged tokens) costs ``media_flops`` ~= 4.04 TFLOP, i.e. ~15.8 GFLOP per LLM token it
becomes, on top of those tokens' own 42.4 GFLOP each.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "PRESETS",
    "CostModel",
    "ModelSpec",
    "RowFlops",
    "TextSpec",
    "VisionSpec",
    "media_flops",
    "model_spec",
    "row_flops",
    "grid_rows",
    "row_constant",
    "sample_flops",
    "segment_attention_flops",
    "token_flops",
    "window_groups",
]

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")


@dataclass(frozen=True, kw_only=True)
class MoESpec:
    """The routed MLP of an MoE LLM: ``num_experts`` experts of width ``intermediate_size``, of which
    ``experts_per_token`` run per token, plus an always-on shared expert of width
    ``shared_intermediate_size`` (Qwen2-MoE style; 0 = none, as in Qwen3-VL-MoE), on the layers
    ``layers`` (indices; the other layers' MLP is dense)."""

    num_experts: int
    experts_per_token: int
    intermediate_size: int
    shared_intermediate_size: int = 0
    layers: tuple[int, ...] = ()

    def mlp_flops(self, hidden_size: int) -> int:
        """Forward FLOPs per token of one MoE layer's MLP: router ``2*h*E`` + active experts
        ``k*6*h*I`` + shared expert ``6*h*I_shared``.

        Example: ``MoESpec(num_experts=8, experts_per_token=2, intermediate_size=32).mlp_flops(64)``
        -> 2*64*8 + 2*6*64*32 = 25_600.
        """
        return (
            2 * hidden_size * self.num_experts
            + self.experts_per_token * 6 * hidden_size * self.intermediate_size
            + 6 * hidden_size * self.shared_intermediate_size
        )


@dataclass(frozen=True, kw_only=True)
class TextSpec:
    """LLM sizes; ``moe``: the routed MLP of an MoE model (None: every layer's MLP is dense)."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    moe: MoESpec | None = None


@dataclass(frozen=True, kw_only=True)
class VisionSpec:
    """Vision tower sizes. ``mlp_matrices``: 3 for a gated MLP (Qwen2.5-VL), 2 for fc1/fc2."""

    depth: int
    hidden_size: int
    intermediate_size: int
    mlp_matrices: int
    num_heads: int
    patch_size: int
    temporal_patch_size: int
    in_channels: int
    spatial_merge_size: int
    out_hidden_size: int
    #: Qwen2.5-VL: window side in pixels (0: every block full attention).
    window_size: int = 0
    #: Qwen2.5-VL: blocks with full attention (the rest windowed); ignored when window_size is 0.
    fullatt_block_indexes: tuple[int, ...] = ()
    #: Qwen3-VL: extra mergers, one per deepstack layer.
    deepstack_mergers: int = 0


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """What the cost model needs of a model: its family (``qwen2_vl``, ``qwen2_5_vl``, ``qwen3_vl``),
    LLM and vision tower sizes (see :func:`model_spec`)."""

    family: str
    text: TextSpec
    vision: VisionSpec


@dataclass(frozen=True, kw_only=True)
class RowFlops:
    """Modelled FLOPs of one row by part (every part stated, 0 where none); ``total`` is their sum."""

    text_linear: int
    lm_head: int
    text_attention: int
    vision_linear: int
    vision_attention: int
    merger: int

    @property
    def total(self) -> int:
        return sum(getattr(self, name) for name in _PARTS)

    def __add__(self, other: RowFlops) -> RowFlops:
        return RowFlops(**{name: getattr(self, name) + getattr(other, name) for name in _PARTS})


_PARTS = ("text_linear", "lm_head", "text_attention", "vision_linear", "vision_attention", "merger")
#: The text parts of a vision tower's breakdown.
_NO_TEXT = {"text_linear": 0, "lm_head": 0, "text_attention": 0}

# ---------------------------------------------------------------------------------- presets

#: Approximations of the published HF ``config.json`` numbers (from memory of the released
#: checkpoints; check against the real config for exact figures, or pass that config instead).
PRESETS: dict[str, dict[str, Any]] = {
    "qwen2-vl-7b": {
        "model_type": "qwen2_vl",
        "text_config": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                            num_attention_heads=28, num_key_value_heads=4, vocab_size=152064),
        "vision_config": dict(depth=32, embed_dim=1280, mlp_ratio=4, num_heads=16, hidden_size=3584,
                              patch_size=14, temporal_patch_size=2, spatial_merge_size=2, in_channels=3),
    },
    **{
        name: {
            "model_type": "qwen2_5_vl",
            "text_config": dict(hidden_size=h, intermediate_size=i, num_hidden_layers=n, num_attention_heads=a,
                                num_key_value_heads=kv, vocab_size=v),
            "vision_config": dict(depth=32, hidden_size=1280, intermediate_size=vi, num_heads=16, out_hidden_size=h,
                                  patch_size=14, temporal_patch_size=2, spatial_merge_size=2, in_channels=3,
                                  window_size=112, fullatt_block_indexes=[7, 15, 23, 31]),
        }
        for name, h, i, n, a, kv, v, vi in (
            ("qwen2.5-vl-3b", 2048, 11008, 36, 16, 2, 151936, 3420),
            ("qwen2.5-vl-7b", 3584, 18944, 28, 28, 4, 152064, 3420),
            ("qwen2.5-vl-72b", 8192, 29568, 80, 64, 8, 152064, 3456),
        )
    },
    "qwen3-vl-8b": {
        "model_type": "qwen3_vl",
        "text_config": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                            num_key_value_heads=8, head_dim=128, vocab_size=151936),
        "vision_config": dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, out_hidden_size=4096,
                              patch_size=16, temporal_patch_size=2, spatial_merge_size=2, in_channels=3,
                              deepstack_visual_indexes=[8, 16, 24]),
    },
    "qwen3-vl-30b-a3b": {
        "model_type": "qwen3_vl_moe",
        "text_config": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=48, num_attention_heads=32,
                            num_key_value_heads=4, head_dim=128, vocab_size=151936, num_experts=128,
                            num_experts_per_tok=8, moe_intermediate_size=768, decoder_sparse_step=1,
                            mlp_only_layers=[]),
        "vision_config": dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, out_hidden_size=2048,
                              patch_size=16, temporal_patch_size=2, spatial_merge_size=2, in_channels=3,
                              deepstack_visual_indexes=[8, 16, 24]),
    },
}


# ---------------------------------------------------------------------------------- config


def model_spec(config: Any) -> ModelSpec:
    """The :class:`ModelSpec` of a preset name (:data:`PRESETS`), a path to ``config.json`` (or its
    folder), a config dict, or a Hugging Face config object (``Qwen2_5_VLConfig``, ...).

    Example: ``model_spec("qwen2.5-vl-7b").text.num_layers`` -> 28.
    """
    if isinstance(config, (str, os.PathLike)):
        name = str(config)
        if name in PRESETS:
            config = PRESETS[name]
        else:
            path = os.path.join(name, "config.json") if os.path.isdir(name) else name
            if not os.path.isfile(path):
                raise ValueError(
                    f"cost model {name!r} is neither a preset ({', '.join(sorted(PRESETS))}) nor a config.json; "
                    "fix: name a preset or the path of the model's config.json"
                )
            with open(path, encoding="utf-8") as handle:
                config = json.load(handle)
    cfg = _as_dict(config)
    model_type = str(cfg.get("model_type", ""))
    family = model_type.removesuffix("_moe")
    if family not in FAMILIES:
        raise ValueError(
            f"model_type={model_type!r}: the cost model knows {', '.join(FAMILIES)} (and *_moe); "
            "fix: pass a Qwen2-VL, Qwen2.5-VL or Qwen3-VL config"
        )
    text = _as_dict(cfg.get("text_config")) or cfg  # early Qwen2(.5)-VL configs keep text fields at top level
    vision = _as_dict(cfg.get("vision_config"))
    return ModelSpec(family=family, text=_text_spec(text), vision=_vision_spec(family, vision))


def _as_dict(config: Any) -> dict[str, Any]:
    if config is None:
        return {}
    if isinstance(config, Mapping):
        return dict(config)
    if hasattr(config, "to_dict"):
        out = config.to_dict()
        for sub in ("text_config", "vision_config"):  # keep live sub-config objects' attributes
            if getattr(config, sub, None) is not None:
                out[sub] = _as_dict(getattr(config, sub))
        return out
    raise TypeError(f"config of type {type(config).__name__}: pass a preset name, path, dict or HF config object")


def _text_spec(t: Mapping[str, Any]) -> TextSpec:
    hidden, layers, heads = int(t["hidden_size"]), int(t["num_hidden_layers"]), int(t["num_attention_heads"])
    experts = int(t.get("num_experts") or t.get("num_local_experts") or 0)  # HF attribute_map alias
    sparse_step = int(t.get("decoder_sparse_step") or 1)
    mlp_only = set(t.get("mlp_only_layers") or ())
    moe_layers = tuple(
        i for i in range(layers) if experts > 0 and i not in mlp_only and (i + 1) % sparse_step == 0
    )
    return TextSpec(
        hidden_size=hidden,
        intermediate_size=int(t["intermediate_size"]),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(t.get("num_key_value_heads") or heads),
        head_dim=int(t.get("head_dim") or hidden // heads),
        vocab_size=int(t["vocab_size"]),
        moe=MoESpec(
            num_experts=experts,
            experts_per_token=int(t.get("num_experts_per_tok") or 0),
            intermediate_size=int(t.get("moe_intermediate_size") or 0),
            shared_intermediate_size=int(t.get("shared_expert_intermediate_size") or 0),
            layers=moe_layers,
        ) if experts > 0 else None,
    )


def _vision_spec(family: str, v: Mapping[str, Any]) -> VisionSpec:
    common = dict(
        depth=int(v.get("depth") or v["num_hidden_layers"]),
        num_heads=int(v.get("num_heads") or v["num_attention_heads"]),
        patch_size=int(v.get("patch_size", 14)),
        temporal_patch_size=int(v.get("temporal_patch_size", 2)),
        in_channels=int(v.get("in_channels", 3)),
        spatial_merge_size=int(v.get("spatial_merge_size", 2)),
    )
    if family == "qwen2_vl":  # embed_dim is the ViT width; hidden_size is the merger output (LLM width)
        width = int(v["embed_dim"])
        return VisionSpec(hidden_size=width, intermediate_size=int(v.get("mlp_ratio", 4) * width), mlp_matrices=2,
                          out_hidden_size=int(v["hidden_size"]), **common)
    if family == "qwen2_5_vl":
        return VisionSpec(hidden_size=int(v["hidden_size"]), intermediate_size=int(v["intermediate_size"]),
                          mlp_matrices=3, out_hidden_size=int(v["out_hidden_size"]),
                          window_size=int(v.get("window_size") or 0),
                          fullatt_block_indexes=tuple(int(i) for i in v.get("fullatt_block_indexes") or ()), **common)
    return VisionSpec(hidden_size=int(v["hidden_size"]), intermediate_size=int(v["intermediate_size"]), mlp_matrices=2,
                      out_hidden_size=int(v["out_hidden_size"]),
                      deepstack_mergers=len(v.get("deepstack_visual_indexes") or ()), **common)


# ---------------------------------------------------------------------------------- formulas


def _train_factor(training: bool) -> int:
    return 3 if training else 1


def token_flops(spec: ModelSpec, *, training: bool = True) -> int:
    """LLM linears + LM head per token slot (router and active experts for MoE layers).

    Per layer, forward: ``2*h*(q + 2*kv) + 2*q*h`` (q = heads*head_dim, kv = kv_heads*head_dim)
    plus the MLP: dense ``6*h*I``; MoE ``2*h*E + k*6*h*I_moe (+ 6*h*I_shared)``. LM head ``2*h*V``.
    Example: preset "qwen2.5-vl-7b", ``training=False`` -> 14_140_571_648.
    """
    t = spec.text
    q, kv = t.num_heads * t.head_dim, t.num_kv_heads * t.head_dim
    attention = 2 * t.hidden_size * (q + 2 * kv) + 2 * q * t.hidden_size
    dense = 6 * t.hidden_size * t.intermediate_size
    moe_layers = t.moe.layers if t.moe is not None else ()
    moe = t.moe.mlp_flops(t.hidden_size) if t.moe is not None else 0
    layers = sum(attention + (moe if i in moe_layers else dense) for i in range(t.num_layers))
    return _train_factor(training) * (layers + 2 * t.hidden_size * t.vocab_size)


def segment_attention_flops(spec: ModelSpec, n: int, *, training: bool = True, causal_fraction: float = 0.5) -> int:
    """Causal self-attention of one segment of ``n`` real tokens, all layers:
    ``layers * 4 * n^2 * heads * head_dim * causal_fraction`` (x3 for training).

    Example: preset "qwen2.5-vl-7b", n=1000, forward, causal_fraction=1 -> 28 * 4e6 * 3584 = 401_408_000_000.
    """
    t = spec.text
    return round(_train_factor(training) * t.num_layers * 4 * n * n * t.num_heads * t.head_dim * causal_fraction)


def window_groups(h: int, w: int, spec: VisionSpec) -> list[int]:
    """Patches per attention window of one frame of ``h x w`` patches (Qwen2.5-VL windowed blocks),
    as HF's ``get_vision_window_index`` cuts it: the merged grid ``(h/m, w/m)`` tiled by windows of
    ``window_size / m / patch_size`` merged tokens a side, edge windows smaller; ``m^2`` patches
    per merged token.

    Example: h=w=20, window 112, patch 14, m=2 -> windows of 4 merged a side on a 10x10 merged grid:
    rows 4, 4, 2 x cols 4, 4, 2 -> [64, 64, 32, 64, 64, 32, 32, 32, 16].
    """
    m = spec.spatial_merge_size
    side = spec.window_size // m // spec.patch_size
    if side < 1:
        raise ValueError(
            f"window_size={spec.window_size} is smaller than patch_size*spatial_merge_size="
            f"{spec.patch_size * m}: no window holds a merged token; fix: check the vision config"
        )
    rows = _tiles(h // m, side)
    cols = _tiles(w // m, side)
    return [r * c * m * m for r in rows for c in cols]


def _tiles(n: int, side: int) -> list[int]:
    """[side, side, ..., rest]: n cut into tiles of ``side``. Example: (10, 4) -> [4, 4, 2]."""
    return [min(side, n - start) for start in range(0, n, side)]


def media_flops(
    spec: ModelSpec, grid: Sequence[int], *, training: bool = True, frozen_vision: bool = False
) -> RowFlops:
    """Vision tower FLOPs of one image or video of patch grid ``(t, h, w)`` (P = t*h*w patches).

    Forward: patch embed ``2*P*(C*T*p*p)*D``; per block per patch ``2*D*3D + 2*D*D +
    mlp_matrices*2*D*I``; per block attention ``4*D*sum(g^2)`` over its groups g (one per frame of
    h*w patches; Qwen2.5-VL windowed blocks: the :func:`window_groups` of each frame); merger(s) per
    merged token (P/m^2): ``2*(m^2 D)^2 + 2*m^2 D*out``, times (1 + deepstack mergers).
    Backward (training, tower not frozen): 2x, the patch embed 1x (no grad w.r.t. pixels).
    Example: Qwen2.5-VL-7B, grid (1, 32, 32), training -> total ~4.04e12.
    """
    t, h, w = (int(x) for x in grid)
    v = spec.vision
    m2 = v.spatial_merge_size**2
    if t < 1 or h % v.spatial_merge_size or w % v.spatial_merge_size or h < 1 or w < 1:
        raise ValueError(
            f"grid (t, h, w)={tuple(grid)}: need t >= 1 and h, w positive multiples of spatial_merge_size="
            f"{v.spatial_merge_size}; fix: pass the processor's image_grid_thw / video_grid_thw rows"
        )
    patches = t * h * w
    d = v.hidden_size
    embed = 2 * patches * v.in_channels * v.temporal_patch_size * v.patch_size**2 * d
    block = 2 * d * 3 * d + 2 * d * d + v.mlp_matrices * 2 * d * v.intermediate_size
    linear = v.depth * patches * block
    full = t * (h * w) ** 2
    if v.window_size:
        windowed = t * sum(g * g for g in window_groups(h, w, v))
        full_blocks = sum(1 for i in range(v.depth) if i in v.fullatt_block_indexes)
        squares = full_blocks * full + (v.depth - full_blocks) * windowed
    else:
        squares = v.depth * full
    attention = 4 * d * squares
    merged = patches // m2
    merger = (1 + v.deepstack_mergers) * merged * (2 * (m2 * d) ** 2 + 2 * m2 * d * v.out_hidden_size)
    if training and not frozen_vision:
        return RowFlops(**_NO_TEXT, vision_linear=2 * embed + 3 * linear, vision_attention=3 * attention, merger=3 * merger)
    return RowFlops(**_NO_TEXT, vision_linear=embed + linear, vision_attention=attention, merger=merger)



def row_flops(
    spec: ModelSpec,
    lengths: Sequence[int],
    grids: Sequence[Sequence[int]] = (),
    *,
    width: int | None = None,
    training: bool = True,
    frozen_vision: bool = False,
    causal_fraction: float = 0.5,
) -> RowFlops:
    """Modelled FLOPs of a packed row: segments of ``lengths`` real tokens and the ``(t, h, w)``
    grids of every image and video in the row (any segment order).

    LLM linears and the LM head run over ``width`` slots when given (a fixed-width THD row: gap
    tokens pass through every linear, they only skip attention), else over the real tokens;
    attention over each segment alone (varlen: ``cu_seqlens``); vision per medium.
    Example: Qwen2.5-VL-7B, lengths [1000], no media, forward, causal_fraction=1 ->
    text_linear + lm_head = 1000 * 14_140_571_648, text_attention = 401_408_000_000.
    """
    slots = sum(lengths) if width is None else width
    if width is not None and sum(lengths) > width:
        raise ValueError(f"segments of {sum(lengths)} tokens exceed width={width}; fix: pass the row's width")
    per_token = token_flops(spec, training=training)
    head = _train_factor(training) * 2 * spec.text.hidden_size * spec.text.vocab_size
    out = RowFlops(
        text_linear=slots * (per_token - head),
        lm_head=slots * head,
        text_attention=sum(
            segment_attention_flops(spec, n, training=training, causal_fraction=causal_fraction) for n in lengths
        ),
        vision_linear=0,
        vision_attention=0,
        merger=0,
    )
    for grid in grids:
        out = out + media_flops(spec, grid, training=training, frozen_vision=frozen_vision)
    return out


def sample_flops(
    spec: ModelSpec,
    tokens: int,
    grids: Sequence[Sequence[int]] = (),
    *,
    frozen_vision: bool = False,
    causal_fraction: float = 0.5,
) -> int:
    """What one sample of ``tokens`` real tokens and media ``grids`` adds to a fixed-width row
    (fwd+bwd): its segment's attention plus its media's vision tower; the linears over the row's
    slots are :func:`row_constant`.

    Example: preset "qwen2.5-vl-7b", 1000 tokens, no media -> ``3 * 28 * 4e6 * 3584 * 0.5`` =
    602_112_000_000.
    """
    cost = segment_attention_flops(spec, tokens, causal_fraction=causal_fraction)
    return cost + sum(media_flops(spec, grid, frozen_vision=frozen_vision).total for grid in grids)


def row_constant(spec: ModelSpec, width: int) -> int:
    """FLOPs (fwd+bwd) every fixed-width row of ``width`` slots pays whatever it holds:
    ``width * token_flops`` (gap slots pass through every linear).

    Example: preset "qwen2.5-vl-7b", width 2 -> 2 * 42_421_714_944 = 84_843_429_888.
    """
    return width * token_flops(spec)


def grid_rows(*grids: Any) -> list[tuple[int, int, int]]:
    """The ``(t, h, w)`` rows of ``image_grid_thw`` / ``video_grid_thw`` arrays or tensors (None
    skipped). Example: ``grid_rows(np.array([[1, 4, 6]]), None)`` -> ``[(1, 4, 6)]``."""
    return [tuple(int(x) for x in row) for grid in grids if grid is not None for row in grid.tolist()]


@dataclass(frozen=True, kw_only=True)
class CostModel:
    """The cost model of a config: :func:`model_spec` of ``cost_model`` plus the frozen-tower switch
    (fwd+bwd, kernel convention ``causal_fraction=0.5``).

    Example: ``CostModel.of("qwen2.5-vl-7b").sample(1000, [])`` -> 602_112_000_000.
    """

    spec: ModelSpec
    frozen_vision: bool = False

    @classmethod
    def of(cls, cost_model: Any, *, frozen_vision: bool = False) -> CostModel:
        """From a preset name, config path, dict or HF config object (see :func:`model_spec`)."""
        return cls(spec=model_spec(cost_model), frozen_vision=frozen_vision)

    def sample(self, tokens: int, grids: Sequence[Sequence[int]]) -> int:
        """:func:`sample_flops` of one sample."""
        return sample_flops(self.spec, tokens, grids, frozen_vision=self.frozen_vision)

    def row(self, lengths: Sequence[int], grids: Sequence[Sequence[int]], *, width: int) -> int:
        """Total :func:`row_flops` of a row of ``width`` slots."""
        return row_flops(self.spec, lengths, grids, width=width, frozen_vision=self.frozen_vision).total

    def constant(self, width: int) -> int:
        """:func:`row_constant` of a row of ``width`` slots."""
        return row_constant(self.spec, width)
