"""Identity for exact resume and for plans: every fingerprint, and the comparison that names the
fields where two differ.

A fingerprint is a plain JSON-able dict. The online loader stores ``resume_fingerprint`` in
each state; a pack plan stores ``plan_fingerprint`` (dataset shards, encoder, packing budgets) and
the plan loader's state ``plan_loader_fingerprint``; a restore or a plan that does not match is
refused naming every differing field (``check_resume_fingerprint``, ``check_plan_fingerprint``).
Objects are read by duck typing (a processor with ``tokenizer`` and ``chat_template``; an encoder
with ``processor``, ``vision`` and ``rope_spec``), so this module sits just above the config.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from typing import Any

from energon_pack.config import (
    DEFAULT_BALANCE_WINDOW_ROWS,
    DEFAULT_ROUND_ROWS,
    OLD_DEFAULT_BALANCE_WINDOW_ROWS,
    OLD_DEFAULT_BUFFER_SIZE,
    PackingConfig,
)
from energon_pack.core.token_rules import TOKEN_RULES_VERSION

__all__ = [
    "ResumeMismatchError",
    "check_plan_fingerprint",
    "check_resume_fingerprint",
    "dataset_config_fingerprint",
    "encoder_fingerprint",
    "encoder_fingerprint_of",
    "feature_extractor_fingerprint",
    "fingerprint_mismatches",
    "flat_fingerprint",
    "packing_fingerprint",
    "plan_fingerprint",
    "plan_loader_fingerprint",
    "processor_fingerprint",
    "resume_fingerprint",
    "split_fingerprint",
]

_LOG = logging.getLogger(__name__)

# --------------------------------------------------------------------------- comparison

_ABSENT = object()


class ResumeMismatchError(ValueError):
    """A loader state was saved under a different fingerprint; ``fields`` names the differences."""

    def __init__(self, message: str, fields: list[str]) -> None:
        super().__init__(message)
        self.fields = fields


def fingerprint_mismatches(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Sorted keys whose values differ, including keys present in only one mapping.

    Example: ``fingerprint_mismatches({"a": 1, "b": 2}, {"a": 1, "b": 3, "c": 0})`` -> ``["b", "c"]``.
    """
    keys = set(saved) | set(current)
    return sorted(k for k in keys if saved.get(k, _ABSENT) != current.get(k, _ABSENT))


def check_resume_fingerprint(
    saved: Mapping[str, Any], current: Mapping[str, Any], *, allow_inexact: bool = False
) -> None:
    """Raise ResumeMismatchError naming every differing field (saved vs current) unless ``allow_inexact``.

    With ``allow_inexact=True`` a mismatch is only logged as a warning.
    Example: saved ``{"buffer_size": 16}``, current ``{"buffer_size": 32}`` -> error naming buffer_size.
    """
    fields = fingerprint_mismatches(saved, current)
    if not fields:
        return

    def show(mapping: Mapping[str, Any], key: str) -> str:
        return repr(mapping[key]) if key in mapping else "<absent>"

    lines = [f"  - {key}: saved {show(saved, key)}, current {show(current, key)}" for key in fields]
    body = "\n".join(lines) + old_default_round_hint(saved, current) + old_default_window_hint(saved, current)
    if allow_inexact:
        _LOG.warning("inexact resume: the loader state was saved under a different configuration:\n%s", body)
        return
    raise ResumeMismatchError(
        "cannot resume exactly: the loader state was saved under a different configuration "
        f"({', '.join(fields)} differ):\n{body}\n"
        "fix: rebuild the loader with the saved configuration (same values as 'saved' above), "
        "or pass allow_inexact_resume=True to accept a non-exact continuation",
        fields,
    )


def old_default_round_hint(saved: Mapping[str, Any], current: Mapping[str, Any]) -> str:
    """A line for a state saved under the old default round (16 samples) read under the new one
    (``DEFAULT_ROUND_ROWS * seq_length`` tokens), else "".

    Example: saved ``{"buffer_size": 16}``, current ``{"buffer_size": None, "buffer_tokens": 16384}`` ->
    "\n  the default round changed ... set buffer_size: 16 ...".
    """
    if not (
        saved.get("buffer_size") == OLD_DEFAULT_BUFFER_SIZE
        and "buffer_tokens" not in saved
        and current.get("buffer_size") is None
        and current.get("buffer_tokens") is not None
    ):
        return ""
    return (
        f"\n  the default round changed from buffer_size={OLD_DEFAULT_BUFFER_SIZE} samples to buffer_tokens = "
        f"{DEFAULT_ROUND_ROWS} * seq_length tokens (full rows at every width); this state may be an old default "
        f"state: to resume it exactly, set buffer_size: {OLD_DEFAULT_BUFFER_SIZE} in the config"
    )


def old_default_window_hint(saved: Mapping[str, Any], current: Mapping[str, Any]) -> str:
    """A line for an online balanced state saved under the old default window (256 rows a worker)
    read under the new one (1024), else "".

    Example: saved ``{"balance_window_rows": 256}``, current ``{"balance_window_rows": 1024}`` ->
    "\n  the default balance_window_rows changed ... set balance_window_rows: 256 ...".
    """
    if not (saved.get("balance_window_rows") == OLD_DEFAULT_BALANCE_WINDOW_ROWS
            and current.get("balance_window_rows") == DEFAULT_BALANCE_WINDOW_ROWS):
        return ""
    return (
        f"\n  the default balance_window_rows changed from {OLD_DEFAULT_BALANCE_WINDOW_ROWS} to "
        f"{DEFAULT_BALANCE_WINDOW_ROWS} rows (windows hold restore keys, not samples: steadier steps at no memory); "
        f"this state may be an old default state: to resume it exactly, set balance_window_rows: "
        f"{OLD_DEFAULT_BALANCE_WINDOW_ROWS} in the config"
    )


def check_plan_fingerprint(
    saved: Mapping[str, Any], current: Mapping[str, Any], *, digest: str, allow_inexact: bool = False
) -> None:
    """Raise ResumeMismatchError naming every field where a plan (``saved``, nested as
    ``plan_fingerprint`` returns it) was built for something else than ``current``, unless
    ``allow_inexact`` (then only a warning).

    Example: a plan for ``{"packing": {"seq_length": 8192}}`` read with ``seq_length`` 4096 ->
    an error naming ``packing.seq_length``.
    """
    saved, current = flat_fingerprint(saved), flat_fingerprint(current)
    fields = fingerprint_mismatches(saved, current)
    if not fields:
        return
    detail = "\n".join(f"  - {key}: plan {saved.get(key, '<absent>')!r}, current {current.get(key, '<absent>')!r}" for key in fields)
    if allow_inexact:
        _LOG.warning("the pack plan was built for a different dataset or configuration:\n%s", detail)
        return
    raise ResumeMismatchError(
        f"the pack plan (digest {digest[:16]}) was built for a different dataset or configuration "
        f"({', '.join(fields)} differ):\n{detail}\n"
        "fix: rebuild the plan with energon-pack plan for this dataset, processor and config, or pass "
        "allow_inexact_resume=True to read it anyway",
        fields,
    )


# --------------------------------------------------------------------------- what rows depend on


def processor_fingerprint(processor: Any) -> dict[str, Any]:
    """Identity of a processor for exact resume: class, tokenizer vocabulary and template hash, and
    for a processor that hears (Qwen-Omni) its feature extractor's settings
    (:func:`feature_extractor_fingerprint`; a Qwen-VL processor has none, so its fingerprint is unchanged).

    Example: the offline default -> ``{"processor_class": "Qwen2_5_VLProcessor", "processor_path": "",
    "vocab_size": 151669, "chat_template_sha": "8a85099125b36041"}``.
    """
    tokenizer = processor.tokenizer
    template = getattr(processor, "chat_template", None) or ""
    extractor = getattr(processor, "feature_extractor", None)
    return {
        "processor_class": type(processor).__name__,
        "processor_path": str(getattr(tokenizer, "name_or_path", "") or ""),
        "vocab_size": len(tokenizer),
        "chat_template_sha": hashlib.sha256(template.encode("utf-8")).hexdigest()[:16],
        **({} if extractor is None else feature_extractor_fingerprint(extractor)),
    }


def feature_extractor_fingerprint(extractor: Any) -> dict[str, Any]:
    """The settings of an audio feature extractor that decide features and token counts: every
    number, string and flag of its ``to_dict()`` (mel bins, sampling rate, hop, FFT size, chunk
    length, samples per chunk, padding value, dither, its class), as ``feature_extractor.<name>``.

    Example (Qwen2.5-Omni's ``WhisperFeatureExtractor``) -> ``{"feature_extractor.feature_size": 128,
    "feature_extractor.hop_length": 160, "feature_extractor.sampling_rate": 16000, ...}``.
    """
    settings = extractor.to_dict()
    return {
        f"feature_extractor.{name}": value
        for name, value in sorted(settings.items())
        if value is None or isinstance(value, (bool, int, float, str))
    }


def encoder_fingerprint(encoder: Any) -> dict[str, Any]:
    """Identity of what turns a sample into tokens and pixels: processor, vision limits, rope
    (``encoder``: a ``QwenVLPackingTaskEncoder``)."""
    return encoder_fingerprint_of(processor_fingerprint(encoder.processor), encoder.vision, repr(encoder.rope_spec))


def encoder_fingerprint_of(processor: Mapping[str, Any], vision: Any, rope: str) -> dict[str, Any]:
    """``encoder_fingerprint`` from its parts: a ``processor_fingerprint``, a ``VisionSpec`` and
    the ``repr`` of a ``RopeSpec`` (as a processor card holds them, ``qwen.card``), plus the
    ``token_rules`` version its tokens are counted with (``core.token_rules``)."""
    return {
        **processor, **{f"vision.{name}": value for name, value in vars(vision).items()}, "rope": rope,
        "token_rules": TOKEN_RULES_VERSION,
    }


def dataset_config_fingerprint(dataset_config: Any) -> str:
    """Identity of the data a loader reads: a hash of every shard's name and sample count.

    Paths are left out, so a dataset copied elsewhere still resumes; a dataset whose shards hold
    other sample counts (or have other names) does not.
    Example: a config tree holding ``{"shards": [{"name": "shards/train-000000.tar", "count": 8,
    "_path": ...}]}`` -> a 16-hex-digit hash of ``[["shards/train-000000.tar", 8]]``.
    """
    shards: list[list[Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, Mapping):
            for key, value in node.items():
                if key == "shards" and isinstance(value, list):
                    shards.extend([s.get("name"), s.get("count")] for s in value if isinstance(s, Mapping))
                else:
                    walk(value)
        elif isinstance(node, (list, tuple)):
            for value in node:
                walk(value)

    walk(dataset_config)
    return hashlib.sha256(repr(shards).encode("utf-8")).hexdigest()[:16]


def resume_fingerprint(
    config: PackingConfig, encoder: Any, *, rank: int, world_size: int, split: str, dataset: str
) -> dict[str, Any]:
    """Everything exact resume of the online loader depends on, as one flat JSON-able dict
    (``dataset``: ``dataset_config_fingerprint``)."""
    return {
        **config.fingerprint(token_blend=getattr(encoder, "token_blend", False)),
        **encoder_fingerprint(encoder),
        "rank": rank,
        "world_size": world_size,
        "split": split,
        "dataset": dataset,
        **online_balance_fingerprint(config),
    }


def online_balance_fingerprint(config: PackingConfig) -> dict[str, Any]:
    """What an online loader with balanced steps (``balance_steps`` without a plan) adds to its
    resume fingerprint: the row order depends on the cost model, the window and the step size
    ({} when it does not balance, so other states keep their fingerprint).

    Example: ``balance_steps=True, cost_model="qwen2.5-vl-7b", micro_batches_per_step=2`` ->
    ``{"balance_steps": True, "cost_model": "qwen2.5-vl-7b", "frozen_vision": False,
    "balance_window_rows": 1024, "micro_batches_per_step": 2}``.
    """
    policy = config.policy
    if not policy.balance_steps or policy.mode != "online" or config.trainer.micro_batches_per_step is None:
        return {}
    return {"balance_steps": True, "cost_model": policy.cost_model, "frozen_vision": policy.frozen_vision,
            "balance_window_rows": policy.balance_window_rows,
            "micro_batches_per_step": config.trainer.micro_batches_per_step}


# --------------------------------------------------------------------------- plans


def split_fingerprint(factory: Any, split: str) -> dict[str, Any]:
    """Split name and shard table ``[[name, samples, bytes], ...]`` of one prepared split
    (``factory``: Energon's dataset factory of that split).

    Example: ``{"split": "train", "shards": [["shards/data-000000.tar", 16, 1048576], ...],
    "excluded_samples": 0}``.
    """
    shards = [[shard.name, int(shard.count), int(shard.path.size())] for shard in factory.shards]
    return {"split": split, "shards": shards, "excluded_samples": len(factory.sample_excludes)}


def packing_fingerprint(config: PackingConfig) -> dict[str, Any]:
    """The config fields that decide which rows a plan holds (not how they are read or built);
    the cost model only with ``balance_steps`` (so plans built before it keep their digest), the
    media knobs only away from their old behaviour (``RowLayout.media_fingerprint``)."""
    values = {
        **config.row.media_fingerprint(),
        "seq_length": config.seq_length,
        "pad_multiple": config.pad_multiple,
        "max_segments": config.max_segments,
        "min_fill": config.min_fill,
        "on_overlong": config.on_overlong,
        "max_row_vision_patches": config.max_row_vision_patches,
        "max_row_media": config.max_row_media,
    }
    if config.policy.balance_steps:
        values.update(
            balance_steps=True, cost_model=config.policy.cost_model, frozen_vision=config.policy.frozen_vision
        )
    return values


def plan_fingerprint(
    dataset: Mapping[str, Any], encoder: Mapping[str, Any], config: PackingConfig, *, sample_mapping: str | None = None
) -> dict[str, Any]:
    """What a plan depends on: ``{"dataset": ..., "encoder": ..., "packing": ...}``; the name of the
    sample mapping foreign samples were read under (``formats.sample_mapping.mapping_name``) joins
    ``packing`` only when one is set, so plans built without one keep their digest; a plan over a
    metadataset (``dataset`` holds ``blend``: every leaf's shards, path, split, subflavors and
    weight or repetitions) adds ``blend_unit`` and ``blend_seed`` (the seed of its selection), and
    with a ``blend_schedule`` its points, mode and ``blend_step_rows`` (:func:`schedule_step_rows`)."""
    packing = packing_fingerprint(config)
    if sample_mapping is not None:
        packing["sample_mapping"] = sample_mapping
    if "blend" in dataset:  # a metadataset's plan: which samples it picks depends on the unit and seed
        packing.update(blend_unit=config.policy.blend_unit, blend_seed=config.seed)
        if config.policy.blend_schedule is not None:
            packing.update(
                blend_schedule=[point.to_dict() for point in config.policy.blend_schedule],
                blend_schedule_mode=config.policy.blend_schedule_mode,
                blend_step_rows=schedule_step_rows(config),
            )
    return {"dataset": dict(dataset), "encoder": dict(encoder), "packing": packing}


def schedule_step_rows(config: PackingConfig) -> int:
    """Rows of one global training step in a plan's positions: ``topology.dp`` x ``micro_batches_per_step``.

    Example: dp 4, 2 micro-batches a step -> 8.
    """
    return config.topology.dp * (config.trainer.micro_batches_per_step or 1)


def flat_fingerprint(fingerprint: Mapping[str, Any]) -> dict[str, Any]:
    """``{"dataset": {"split": "train"}}`` -> ``{"dataset.split": "train"}`` (for naming mismatches)."""
    return {f"{part}.{name}": value for part, values in fingerprint.items() for name, value in values.items()}


def plan_loader_fingerprint(
    plan_digest: str, config: PackingConfig, *, repeat: bool, balanced: bool = False
) -> dict[str, Any]:
    """What a plan loader's rows depend on besides the plan: its digest, the seed of the row order,
    the row-building settings a plan leaves open, the ``token_rules`` version and, when it deals
    balanced steps, the cost window (the step size is checked by the balanced resume rule, not here)."""
    window = {"balance_window_steps": config.policy.balance_window_steps} if balanced else {}
    return {
        **window,
        "plan": plan_digest,
        "token_rules": TOKEN_RULES_VERSION,
        "seed": config.seed,
        "repeat": repeat,
        "fixed_width": config.fixed_width,
        "width_multiple": config.width_multiple,
        "pad_cu_seqlens": config.pad_cu_seqlens,
        "pixel_dtype": config.pixel_dtype,
    }
