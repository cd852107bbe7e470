"""``energon-pack bench --stage foreign``: the preencode cost of a sample read in place (Megatron-
Bridge's format: pickled image list + JSON conversation) against the same sample in our format.

Both sides start from a sample's raw WebDataset members (bytes, as Energon hands them to the
reader) and end at the prepared sample (tokens and grids from media headers): the reader (ours:
``formats.qwen_chat.chat_fields_from_parts``; Bridge's: ``formats.bridge_chatml.bridge_fields``,
restricted unpickling included) plus ``preencode_sample``. The image and text samples of the bench
mix are used (its videos are video files, which the two formats store alike); interleaved sample by
sample.
"""

from __future__ import annotations

import json
import pickle
import time
from pathlib import Path
from typing import Any

import numpy as np

from energon_pack.core.samples import QwenVLChatSample, media_part_name
from energon_pack.tools.common import bench_samples

BRIDGE_MAP = {"imgs": "jpgs", "conversation": "json"}


def _bridge_turns(conversation: list[dict[str, Any]]) -> list[dict[str, str]]:
    """Typed messages as Bridge's ``from``/``value`` turns with ``<image>`` placeholders (media first)."""
    speakers = {"user": "human", "assistant": "gpt", "system": "system"}
    turns = []
    for message in conversation:
        value = "".join("<image>" if part["type"] == "image" else part.get("text", "") for part in message["content"])
        turns.append({"from": speakers[message["role"]], "value": value})
    return turns


def _media_first(content: list[dict[str, Any]]) -> bool:
    """Whether a turn's media parts all come before its text (Bridge's order; other orders it changes)."""
    kinds = [part["type"] == "text" for part in content]
    return kinds == sorted(kinds)


def bench_foreign(num_samples: int, work_dir: Path, options: Any = None) -> list[tuple[str, list[dict[str, Any]], list[str]]]:
    """Milliseconds per sample, reader alone and reader + preencode, ours vs the Bridge format."""
    from tqdm import tqdm

    from energon_pack.config import PackingConfig
    from energon_pack.formats.bridge_chatml import bridge_fields
    from energon_pack.formats.qwen_chat import chat_fields_from_parts
    from energon_pack.qwen.processor import load_processor
    from energon_pack.runtime.task_encoder import QwenVLPackingTaskEncoder

    del options
    samples = [s for s in bench_samples(work_dir, num_samples) if not s.videos]
    encoder = QwenVLPackingTaskEncoder(PackingConfig(seq_length=131072), load_processor())
    ours_parts = [
        {"json": json.dumps(s.conversation).encode(), **{media_part_name(i, "jpg"): data for i, data in enumerate(s.images)}}
        for s in samples
    ]
    bridge_parts = [
        {"json": json.dumps(_bridge_turns(s.conversation)).encode(), "jpgs": pickle.dumps(list(s.images))} for s in samples
    ]
    readers = {
        "ours": lambda parts: chat_fields_from_parts(parts),
        "Bridge format": lambda parts: bridge_fields(parts, field_map=BRIDGE_MAP),
    }
    inputs = {"ours": ours_parts, "Bridge format": bridge_parts}
    read: dict[str, list[float]] = {name: [] for name in readers}
    total: dict[str, list[float]] = {name: [] for name in readers}
    same = media_first = 0
    for index, sample in enumerate(tqdm(samples, desc="preencode, ours vs Bridge format", unit="sample")):
        ids = {}
        for name, reader in readers.items():
            start = time.perf_counter()
            fields = reader(inputs[name][index])
            middle = time.perf_counter()
            prepared = encoder.preencode_sample(QwenVLChatSample(
                __key__=sample.__key__, __restore_key__=(), __subflavors__=None, __sources__=None, **fields
            ))
            end = time.perf_counter()
            if index > 0:  # the first sample warms lazy imports and caches
                read[name].append(middle - start)
                total[name].append(end - start)
            ids[name] = None if prepared.skip_reason is not None else prepared.input_ids.tolist()
        if all(_media_first(message["content"]) for message in sample.conversation):
            media_first += 1
            same += int(ids["ours"] is not None and ids["ours"] == ids["Bridge format"])
    rows = []
    for what, figures in (("reader ms/sample, mean", read), ("reader + preencode ms/sample, mean", total)):
        ours, bridge = (1e3 * float(np.mean(figures[name])) for name in ("ours", "Bridge format"))
        rows.append({"what": what, "ours": ours, "Bridge format": bridge, "ratio": bridge / ours})
    rows.append({"what": "identical input_ids (samples whose media already lead their turn)", "ours": f"{same}/{media_first}",
                 "Bridge format": "", "ratio": ""})
    title = f"foreign (image and text samples of the mix: {len(samples)}; ratio = Bridge format / ours)"
    return [(title, rows, ["what", "ours", "Bridge format", "ratio"])]
