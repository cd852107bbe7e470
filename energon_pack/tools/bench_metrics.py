"""``energon-pack bench --stage metrics``: what ``RowMetrics`` adds to a training step.

A tiny random-weight Qwen2.5-VL (2 text layers of width 64, a 2-block vision tower, the real
vocabulary) trains on CPU on rows of a two-source blend (about 200 and about 700 real tokens a
sample, the second with an image; generated once under the bench folder), W = 1024. Each row is
trained twice, alternately: the plain step (forward with the row's positions and a THD mask,
per-token loss with ``loss_mask``, backward, AdamW) and the same step plus ``RowMetrics.metrics``
on the per-token losses and ``RowMetrics.reduce`` (one step of one micro-batch). The table shows the median step of each, and the median time of the metrics calls
alone with their share of the plain step: the figure behind "at most 1 %" in docs/metrics.md.
"""

from __future__ import annotations

import itertools
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from energon_pack.tools.common import BenchRows

COLUMNS = ["what", "value"]
#: The blend the rows come from (``energon_pack.data.blend_mix``).
SOURCES = (
    {"name": "short", "samples": 48, "mean_tokens": 200, "answer_fraction": 0.6},
    {"name": "medium", "samples": 24, "mean_tokens": 700, "answer_fraction": 0.3, "image_side": 112},
)
ROWS, ROUNDS, SEQ_LENGTH = 4, 2, 1024


def bench_metrics(num_samples: int, work_dir: Path, options: None = None) -> list[tuple[str, BenchRows, list[str]]]:
    """The table of ``--stage metrics`` (``num_samples`` and ``options`` are not used: the blend and W are fixed)."""
    from energon_pack import PackingConfig, RowMetrics, get_packing_loader, load_processor, to_device_batch
    from energon_pack.data.blend_mix import BlendSource, make_blend

    seq_length = SEQ_LENGTH
    blend = make_blend(Path(work_dir) / "metrics_blend", [BlendSource(**s) for s in SOURCES], weights=[1, 1])
    processor = load_processor(min_pixels=28 * 28, max_pixels=112 * 112)
    config = PackingConfig(seq_length=seq_length, num_workers=0, repeat=True, blend_unit="tokens")
    with get_packing_loader(str(blend), config, processor) as loader:
        rows = [to_device_batch(row, "cpu") for row in itertools.islice(loader, ROWS)]
        metrics = RowMetrics.from_loader(loader)
    model = _tiny_model(processor)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    plain, measured, calls = [], [], []
    for _ in range(ROUNDS):
        for batch in rows:
            plain.append(_step(model, optimizer, batch, None)[0])
            seconds, in_metrics = _step(model, optimizer, batch, metrics)
            measured.append(seconds)
            calls.append(in_metrics)
    step, with_metrics, cost = statistics.median(plain), statistics.median(measured), statistics.median(calls)
    table = [
        {"what": f"training step, W={seq_length}, median of {len(plain)} (s)", "value": f"{step:.4f}"},
        {"what": "same step with RowMetrics (s)", "value": f"{with_metrics:.4f}"},
        {"what": "RowMetrics.metrics + reduce per step (ms)", "value": f"{cost * 1e3:.3f}"},
        {"what": "share of the plain step", "value": f"{cost / step:.2%}"},
    ]
    return [(f"metrics (tiny Qwen2.5-VL on CPU, {len(metrics.keys())} keys, {len(metrics.sources)} sources)", table, COLUMNS)]


def _step(model: Any, optimizer: Any, batch: dict[str, Any], metrics: Any) -> tuple[float, float]:
    """One training step on ``batch``: (its seconds, the seconds of the metrics calls in it)."""
    from energon_pack import RowMetrics

    started = time.perf_counter()
    weights = batch["loss_mask"][0]
    scored = weights.nonzero().squeeze(1)
    logits = model(
        input_ids=batch["input_ids"], position_ids=batch["mrope_position_ids"], attention_mask=_thd_mask(batch),
        **batch["visual_inputs"].normalized_for_model(), logits_to_keep=scored, use_cache=False,
    ).logits[0]
    per_token = F.cross_entropy(logits, batch["labels"][0, scored], reduction="none")
    ((per_token * weights[scored]).sum() / weights.sum()).backward()
    optimizer.step()
    optimizer.zero_grad()
    in_metrics = 0.0
    if metrics is not None:
        begun = time.perf_counter()
        token_loss = torch.zeros_like(weights).index_put((scored,), per_token.detach())
        RowMetrics.reduce([metrics.metrics(batch, token_loss)])
        in_metrics = time.perf_counter() - begun
    return time.perf_counter() - started, in_metrics


def _thd_mask(batch: dict[str, Any]) -> torch.Tensor:
    """Additive float32 [1, 1, W, W]: causal within each segment's real tokens; a gap token sees itself."""
    width = batch["total_tokens"]
    slots = torch.arange(width)
    segment = torch.searchsorted(batch["cu_seqlens_q_padded"].to(torch.int64), slots, right=True)
    real = ~batch["padding_mask"][0]
    allowed = (segment[:, None] == segment[None, :]) & (slots[:, None] >= slots[None, :]) & real[:, None] & real[None, :]
    allowed |= torch.eye(width, dtype=torch.bool)
    return torch.zeros(width, width).masked_fill(~allowed, torch.finfo(torch.float32).min)[None, None]


def _tiny_model(processor: Any) -> Any:
    """A random-weight Qwen2.5-VL small enough for a CPU (seeded; eager attention)."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    config = Qwen2_5_VLConfig(
        text_config=dict(vocab_size=151680, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2,
                         rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[2, 3, 3])),
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                           patch_size=14, temporal_patch_size=2, spatial_merge_size=2, window_size=56,
                           fullatt_block_indexes=[1]),
        image_token_id=processor.image_token_id, video_token_id=processor.video_token_id,
        vision_start_token_id=processor.tokenizer.convert_tokens_to_ids("<|vision_start|>"), tie_word_embeddings=True,
    )
    config._attn_implementation = "eager"
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return Qwen2_5_VLForConditionalGeneration(config).train()
