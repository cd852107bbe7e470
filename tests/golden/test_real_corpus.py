"""Golden: the real-world corpus (tests/support/real_corpus.py: every image format, EXIF orientation,
container and codec we accept) goes through ``prepare`` without losing a record, and every
sample's row segment equals the Hugging Face reference (tests/support/hf_reference.py: images upright as
``load_image`` turns them, videos decoded with PyAV and sampled by our rule): input ids, grids,
``second_per_grid_ts``, float32 pixels exactly, the uint8 payload normalised within 1e-6.

Runs in the compatibility run too (Makefile ``COMPAT_TESTS``: transformers 5.12.1). The 108 MP
JPEG is the slow part.
"""

from __future__ import annotations

import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from megatron.energon import WorkerConfig, get_loader, get_train_dataset

from energon_pack.config import PackingConfig
from energon_pack.core.samples import QwenVLChatSample
from energon_pack.data.prepare import prepare_dataset
from energon_pack.runtime.pinning import pin_only_with_accelerator
from energon_pack.runtime.task_encoder import QwenVLPackingTaskEncoder
from tests.support.hf_reference import hf_reference
from tests.support.real_corpus import CORPUS, HUGE, write_corpus
from tests.support.tensor_checks import max_abs_difference

TOLERANCE = 1e-6
ROW_WIDTH = 1 << 16  # every corpus sample fits: nothing is overlong
PIXEL_FIELDS = ("pixel_values", "pixel_values_videos")
GRID_FIELDS = ("image_grid_thw", "video_grid_thw")


def _prepared_corpus(folder: Path, *, include_huge: bool) -> tuple[Any, dict[str, QwenVLChatSample]]:
    """(prepare report, samples by key) of the corpus written into ``folder``."""
    records = write_corpus(folder / "raw", include_huge=include_huge)
    report = prepare_dataset(records, folder / "raw", folder / "dataset", progress=False)
    dataset = get_train_dataset(
        folder / "dataset", worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0), batch_size=None,
        shuffle_buffer_size=None, max_samples_per_sequence=None, repeat=False,
    )
    return report, {sample.__key__: sample for sample in pin_only_with_accelerator(get_loader(dataset))}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict[str, QwenVLChatSample]]:
    return _prepared_corpus(tmp_path_factory.mktemp("real_corpus"), include_huge=False)


def test_prepare_keeps_every_record_and_reports_each_format(corpus) -> None:
    report, samples = corpus
    items = [item for item in CORPUS if item.name != HUGE]
    assert report.problems == [] and report.written == len(items) == len(samples)
    kinds = Counter(kind for kind, _, _ in report.media_kinds.elements())
    assert kinds == Counter(item.kind for item in items)
    assert {fmt for kind, fmt, _ in report.media_kinds if kind == "image"} == {"JPEG", "WEBP", "TIFF", "PNG", "GIF", "BMP"}
    assert {(fmt, codec) for kind, fmt, codec in report.media_kinds if kind == "video"} == {
        ("webm", "vp8"), ("webm", "vp9"), ("mkv", "h264"), ("mov", "h264"), ("avi", "mpeg4"), ("mp4", "hevc"),
        ("mp4", "h264"), ("mp4", "libdav1d"), ("m4v", "h264"),
    }
    assert report.oriented_images == 7 + 2 + 1 + 1  # exif2-8.jpg, two WebPs, the TIFF, the PNG


def check_segments_equal_hf(processor: Any, samples: dict[str, QwenVLChatSample]) -> int:
    """Compare every sample's segment (float32 and uint8 payloads) with ``hf_reference``; return
    how many media were compared."""
    float_encoder = QwenVLPackingTaskEncoder(PackingConfig(seq_length=ROW_WIDTH, pixel_dtype="float32"), processor)
    uint8_encoder = QwenVLPackingTaskEncoder(PackingConfig(seq_length=ROW_WIDTH, pixel_dtype="uint8"), processor)
    media = 0
    for key, sample in sorted(samples.items()):
        prepared = float_encoder.preencode_sample(sample)
        assert prepared.skip_reason is None, (key, prepared.skip_reason)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # DecompressionBombWarning for the 108 MP JPEG
            reference = hf_reference(processor, sample.conversation, sample.images, sample.videos)
            segment = float_encoder.postencode_sample(prepared).segment
            small = uint8_encoder.postencode_sample(uint8_encoder.preencode_sample(sample)).segment
        assert torch.equal(prepared.input_ids, reference["input_ids"][0]), key
        visual, normalised = segment.visual, small.visual.normalized_for_model()
        for name in GRID_FIELDS:
            ours, theirs = getattr(visual, name), reference.get(name)
            assert (ours is None) == (theirs is None) and (ours is None or torch.equal(ours, theirs)), (key, name)
        for name in PIXEL_FIELDS:
            ours, theirs = getattr(visual, name), reference.get(name)
            assert (ours is None) == (theirs is None), (key, name)
            if ours is None:
                continue
            assert ours.dtype == torch.float32 and torch.equal(ours, theirs), (key, name)
            assert max_abs_difference(normalised[name], theirs) <= TOLERANCE, (key, name)
        if "second_per_grid_ts" in reference:  # Qwen2.5-VL only
            seconds = torch.tensor(prepared.second_per_grid_ts, dtype=reference["second_per_grid_ts"].dtype)
            assert torch.equal(seconds, reference["second_per_grid_ts"]), key
        media += len(sample.images) + len(sample.videos)
    return media


@pytest.mark.slow  # more than ~3 s: make test runs it, make test-fast leaves it out
@pytest.mark.parametrize("family", ["qwen2.5-vl", "qwen3-vl", "qwen3.5"])
def test_every_segment_equals_the_hf_reference(corpus, family: str, request: pytest.FixtureRequest) -> None:
    """Videos go through the streaming path (frames resized one by one as decoded, ``VideoPatcher``)
    for every family, float32 and uint8: the equality below proves it per family."""
    from energon_pack.qwen.pixels import VideoPatcher
    from tests.support.hf_reference import PROCESSOR_FIXTURES

    processor = request.getfixturevalue(PROCESSOR_FIXTURES[family])
    assert VideoPatcher.for_processor(processor) is not None
    _, samples = corpus
    assert check_segments_equal_hf(processor, samples) == len(samples)


@pytest.mark.slow
def test_a_108_megapixel_jpeg_is_accepted_and_equals_hf(tmp_path: Path, processor: Any) -> None:
    """Above PIL's warning (89.5 MP), below its refusal (179 MP): prepared, and its segment equals HF's."""
    huge = next(item for item in CORPUS if item.name == HUGE)
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / HUGE).write_bytes(huge.make())
    records = tmp_path / "raw" / "records.jsonl"
    records.write_text(
        '{"id": "huge", "messages": [{"role": "user", "content": "<image>Describe."}, '
        '{"role": "assistant", "content": "Flat blue."}], "images": ["huge.jpg"]}\n'
    )
    report = prepare_dataset(records, tmp_path / "raw", tmp_path / "dataset", progress=False)
    assert report.problems == [] and report.written == 1
    dataset = get_train_dataset(
        tmp_path / "dataset", worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0), batch_size=None,
        shuffle_buffer_size=None, max_samples_per_sequence=None, repeat=False,
    )
    samples = {sample.__key__: sample for sample in pin_only_with_accelerator(get_loader(dataset))}
    assert check_segments_equal_hf(processor, samples) == 1


def test_without_the_orientation_a_turned_photo_comes_out_sideways(corpus, processor: Any) -> None:
    """The comparison above would catch a missed turn: with apply_exif_orientation=False the EXIF-6
    JPEG gets the stored (sideways) grid, not HF's."""
    _, samples = corpus
    sample = samples["corpus_exif6_jpg"]
    stored = QwenVLPackingTaskEncoder(
        PackingConfig(seq_length=ROW_WIDTH, apply_exif_orientation=False), processor
    ).preencode_sample(sample)
    upright = hf_reference(processor, sample.conversation, sample.images, sample.videos)["image_grid_thw"]
    assert stored.image_grid_thw[0, 1:].tolist() == upright[0, 1:].flip(0).tolist() != upright[0, 1:].tolist()
