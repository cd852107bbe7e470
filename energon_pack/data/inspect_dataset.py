"""``energon-pack inspect``: what a prepared dataset holds, measured with preencode (no pixels)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from energon_pack.config import PackingConfig
from energon_pack.core.dataset_path import check_dataset_path
from energon_pack.core.samples import media_nbytes
from energon_pack.core.tables import format_table
from energon_pack.formats.dispatch import reading_formats

#: Rows wide enough for any sample: inspect and simulate measure, they do not pack.
_WIDE = PackingConfig(seq_length=1 << 20)


def _wide_encoder(processor: Any) -> Any:
    """A task encoder of ``_WIDE`` rows."""
    from energon_pack.runtime.task_encoder import QwenVLPackingTaskEncoder

    return QwenVLPackingTaskEncoder(_WIDE, processor)


def _reading_task_encoder() -> Any:
    """Energon's default task encoder (samples as read), a crude dataset's ``aux:`` handed to its cooker."""
    from megatron.energon import DefaultTaskEncoder

    from energon_pack.formats.energon_webdataset import AuxLoading

    class ReadingTaskEncoder(AuxLoading, DefaultTaskEncoder):
        pass

    return ReadingTaskEncoder()


def iter_prepared(dataset: Path, *, split: str = "train", processor: Any = None, limit: int | None = None) -> Iterator[Any]:
    """Yield ``(raw sample, prepared sample)`` for one pass over ``dataset`` (main process, no workers)."""
    from megatron.energon import WorkerConfig, get_loader, get_val_dataset
    from tqdm import tqdm

    from energon_pack.runtime.pinning import pin_only_with_accelerator

    check_dataset_path(dataset, split=split)
    encoder = _wide_encoder(processor)
    with reading_formats():
        samples = get_val_dataset(
            dataset, split_part=split, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0), batch_size=None,
            task_encoder=_reading_task_encoder(),
        )
    for index, sample in enumerate(tqdm(pin_only_with_accelerator(get_loader(samples)), desc="preencode", unit="sample")):
        if limit is not None and index >= limit:
            return
        yield sample, encoder.preencode_sample(sample)


def prepared_samples(
    dataset: str | Path, *, split: str = "train", processor: Any = None, limit: int | None = None, facts: bool = True
) -> tuple[list[Any], str]:
    """Every sample of ``split`` as preencode measures it (``plan.build.FactSample``: skip
    reason, tokens, media geometry, image / video counts, media bytes), read from prepare's facts
    when ``facts`` and they are fresh for ``processor``, else by preencoding (main process); and
    one line saying which. For the default processor (``processor`` None) with a filed processor
    card (``qwen.card``) the facts are read without loading the processor.
    Example: -> ``([FactSample(...), ...], "measured from facts (...)")``.
    """
    from energon_pack.plan.build import FactSample, iter_fact_samples
    from energon_pack.identity import processor_fingerprint
    from energon_pack.plan.facts import fresh_facts
    from energon_pack.qwen.fit import MediaGeometry

    from energon_pack.plan.accounting import card_facts

    check_dataset_path(dataset, split=split)
    with_card = card_facts(dataset, None, _WIDE) if processor is None and facts else None
    if with_card is not None:
        samples = list(iter_fact_samples(dataset, with_card.accounting, with_card.facts, with_card.tokens, split=split))
        return samples[:limit], with_card.line()
    encoder = _wide_encoder(processor)
    found = fresh_facts(dataset, processor_fingerprint(encoder.processor)) if facts else "--measure"
    if not isinstance(found, str):
        samples = list(iter_fact_samples(dataset, encoder, *found, split=split))
        return samples[:limit], "measured from facts (.nv-meta/energon_pack.facts.npz, fresh)"
    measured = []
    for index, (raw, prepared) in enumerate(iter_prepared(dataset, split=split, processor=encoder.processor, limit=limit)):
        geometry = None
        if prepared.skip_reason is None:
            geometry = MediaGeometry(
                image_grid_thw=None if prepared.image_grid_thw is None else prepared.image_grid_thw.numpy(),
                video_grid_thw=None if prepared.video_grid_thw is None else prepared.video_grid_thw.numpy(),
                timings=tuple(prepared.video_timings or ()),
                second_per_grid_ts=tuple(prepared.second_per_grid_ts or ()),
            )
        measured.append(FactSample(
            index=index, reason=prepared.skip_reason, tokens=prepared.num_tokens, geometry=geometry,
            images=len(raw.images), videos=len(raw.videos), media_bytes=sum(map(media_nbytes, raw.images)) + sum(map(media_nbytes, raw.videos)),
        ))
    return measured, f"measured by preencoding every sample ({found})"


def summarize(dataset: str | Path, *, split: str = "train", processor: Any = None, limit: int | None = None, facts: bool = True) -> list[dict[str, Any]]:
    """Report rows: sample and media counts, compressed bytes, token length percentiles, skips."""
    return summarize_with_source(dataset, split=split, processor=processor, limit=limit, facts=facts)[0]


def summarize_with_source(
    dataset: str | Path, *, split: str = "train", processor: Any = None, limit: int | None = None, facts: bool = True
) -> tuple[list[dict[str, Any]], str]:
    """:func:`summarize`'s rows and the line saying how the samples were measured (facts or preencode)."""
    samples, source = prepared_samples(dataset, split=split, processor=processor, limit=limit, facts=facts)
    lengths = [sample.tokens for sample in samples if sample.reason is None]
    skipped = Counter(sample.reason for sample in samples if sample.reason is not None)
    rows: list[dict[str, Any]] = [
        {"metric": "samples", "value": len(samples)},
        {"metric": "images", "value": sum(sample.images for sample in samples)},
        {"metric": "videos", "value": sum(sample.videos for sample in samples)},
        {"metric": "compressed media (MiB)", "value": f"{sum(sample.media_bytes for sample in samples) / 2**20:.1f}"},
    ]
    if lengths:
        p50, p90, p99 = np.percentile(lengths, [50, 90, 99])
        rows += [
            {"metric": "tokens: mean", "value": f"{np.mean(lengths):.0f}"},
            {"metric": "tokens: p50 / p90 / p99", "value": f"{p50:.0f} / {p90:.0f} / {p99:.0f}"},
            {"metric": "tokens: max", "value": max(lengths)},
        ]
    rows.append({"metric": "bad samples (skipped)", "value": sum(skipped.values())})
    rows += [{"metric": f"  skipped: {reason}", "value": count} for reason, count in sorted(skipped.items())]
    return rows, source


def render_conversation(messages: list[dict[str, Any]]) -> list[str]:
    """Typed messages as one line per message, media parts as ``[image]`` / ``[video]``.

    Example: ``[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}]``
    -> ``["  user: [image] Hi"]``.
    """
    lines = []
    for message in messages:
        parts = [part["text"] if part["type"] == "text" else f"[{part['type']}]" for part in message["content"]]
        lines.append(f"  {message['role']}: " + " ".join(parts).replace("\n", "\\n"))
    return lines


def format_lines(dataset: str | Path, *, split: str = "train") -> list[str]:
    """For a dataset read in place (not written by ``energon-pack prepare``): what it is, how it
    is read (``formats.dispatch.describe_format``) and its first sample as a conversation; for ours
    and for metadatasets, nothing."""
    from megatron.energon import WorkerConfig, get_loader, get_val_dataset

    from energon_pack.formats.dispatch import describe_format, read_dataset_yaml
    from energon_pack.plan.build import read_in_place
    from energon_pack.runtime.pinning import pin_only_with_accelerator

    if not read_in_place(dataset):
        return []
    lines = describe_format(read_dataset_yaml(dataset), dataset=dataset)
    with reading_formats():
        samples = get_val_dataset(
            dataset, split_part=split, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0), batch_size=None,
            task_encoder=_reading_task_encoder(),
        )
    for sample in pin_only_with_accelerator(get_loader(samples)):
        if sample.invalid_reason is not None:
            lines.append(f"first sample ({sample.__key__}): skipped, {sample.invalid_reason}: {sample.invalid_detail}")
        else:
            media = f"{len(sample.images)} image(s), {len(sample.videos)} video(s)"
            lines += [f"first sample ({sample.__key__}, {media}) as a conversation:", *render_conversation(sample.conversation)]
        break
    return lines


def run_inspect(dataset: Path, *, split: str = "train", limit: int | None = None, processor: Any = None) -> int:
    """Print what a dataset read in place is (:func:`format_lines`), then the dataset summary table
    (token counts for ``processor``; None: the offline Qwen2.5-VL one)."""
    check_dataset_path(dataset, split=split)
    for line in format_lines(dataset, split=split):
        print(line)
    rows, source = summarize_with_source(dataset, split=split, limit=limit, processor=processor)
    print(format_table(rows))
    print(source)
    return 0
