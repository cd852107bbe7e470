"""Dirty data: every kind of bad sample is caught, skipped with its reason and counted; good ones arrive once.

The corpus (``tests/support/bad_corpus.py``) plants each kind twice through ``prepare`` and twice
straight into a shard. ``prepare`` must report exactly what it rejects; the loader, over one
epoch with two workers, must deliver every good key exactly once and count every planted skip
under its reason. A run of bad samples longer than Energon's default failure tolerance (100
in a row) is not fatal unless ``max_consecutive_skips`` says so.
"""

from __future__ import annotations

import logging
import re
import resource
from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch

from energon_pack.config import PackingConfig
from energon_pack.core.conversation import normalize_conversation
from energon_pack.errors import BadSampleError, TooManyBadSamplesError
from energon_pack.loader import get_packing_loader
from energon_pack.data.prepare import prepare_dataset
from energon_pack.qwen.media import probe_image
from energon_pack.runtime.task_encoder import QwenVLPackingTaskEncoder
from tests.support.bad_corpus import BAD_KINDS, make_bad_corpus, make_bad_run, png_with_size
from tests.support.golden_media import GoldenSample, chat_sample
from tests.support.hf_reference import hf_reference

W = 2048
#: Seconds a test may wait for one row before the loader raises instead of hanging.
ROW_TIMEOUT = 120
_SKIP_WARNING = re.compile(r"skipping sample '([^']+)': (\w+)")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_bad_corpus(tmp_path_factory.mktemp("bad_corpus"), seq_length=W)


def _config(num_workers: int, **overrides: Any) -> PackingConfig:
    timeout = {"timeout": ROW_TIMEOUT} if num_workers else {}
    return PackingConfig(**{"seq_length": W, "buffer_size": 8, "num_workers": num_workers, "repeat": False,
                            **timeout, **overrides})


def test_prepare_reports_each_rejected_kind(corpus):
    assert corpus.prepare_report.problem_counts() == corpus.planted_prepare
    by_id = {p.record_id: p for p in corpus.prepare_report.problems if p.record_id is not None}
    for kind in BAD_KINDS:
        for copy in range(2):
            problem = by_id.get(f"{kind.name}_{copy}")
            if kind.prepare_reason is None:
                assert problem is None, f"{kind.name}: prepare rejected it: {problem}"
            elif kind.prepare_reason == "unreadable_media":  # the detail names the loader's reason
                assert problem.reason == "unreadable_media" and f": {kind.load_reason}: " in problem.detail, problem
            elif kind.prepare_reason != "non_utf8_text":  # a line that is not UTF-8 has no readable id
                assert problem.reason == kind.prepare_reason, problem


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_epoch_over_dirty_data_delivers_every_good_sample_once(corpus, processor):
    loader = get_packing_loader(corpus.dataset, _config(2), processor)
    delivered = Counter(key for row in loader for key in row["__keys__"])
    stats = loader.stats()
    assert delivered == corpus.good_keys
    assert Counter(stats["skipped"]) == corpus.planted_load
    assert stats["samples_in"] == sum(corpus.good_keys.values()) + len(corpus.load_reasons)
    assert not corpus.pickle_marker.exists(), "shard content was unpickled"


@pytest.mark.slow
def test_each_bad_sample_is_skipped_under_its_own_reason(corpus, processor, caplog):
    loader = get_packing_loader(corpus.dataset, _config(0), processor)
    with caplog.at_level(logging.WARNING, logger="energon_pack"):
        delivered = Counter(key for row in loader for key in row["__keys__"])
    reasons = dict(_SKIP_WARNING.search(record.getMessage()).groups() for record in caplog.records
                   if _SKIP_WARNING.search(record.getMessage()))
    assert reasons == corpus.load_reasons
    assert delivered == corpus.good_keys


def _prepared(processor: Any, kind_name: str) -> tuple[Any, GoldenSample]:
    """One planted sample of ``kind_name`` (one image) through preencode, and its golden form."""
    kind = next(k for k in BAD_KINDS if k.name == kind_name)
    planted = kind.build(np.random.default_rng(1), W)
    messages = normalize_conversation(planted.messages, num_images=len(planted.images), num_videos=0)
    golden = GoldenSample(messages, [data for _, data in planted.images], [])
    encoder = QwenVLPackingTaskEncoder(_config(0, pixel_dtype="float32"), processor)
    return encoder.preencode_sample(chat_sample(golden, kind_name)), golden


@pytest.mark.parametrize("kind_name", ["cmyk_jpeg", "png_16bit", "animated_webp", "animated_png"])
def test_unusual_images_are_accepted_as_the_hf_processor_accepts_them(processor, kind_name):
    """CMYK, 16-bit and animated images: tokens and pixels equal the HF processor's (first frame, RGB)."""
    prepared, golden = _prepared(processor, kind_name)
    assert prepared.skip_reason is None
    visual = QwenVLPackingTaskEncoder(_config(0, pixel_dtype="float32"), processor).postencode_sample(prepared).segment.visual
    reference = hf_reference(processor, golden.messages, golden.images, [])
    assert torch.equal(prepared.input_ids, reference["input_ids"][0])
    assert torch.equal(visual.image_grid_thw, reference["image_grid_thw"])
    assert torch.equal(visual.pixel_values, reference["pixel_values"])


def test_a_decompression_bomb_header_is_rejected_before_any_pixel_is_allocated():
    bomb = png_with_size(100_000, 100_000)  # 10^10 pixels: 30 GB if decoded
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(BadSampleError) as caught:
        probe_image(bomb)
    assert caught.value.reason == "pixel_bomb" and len(bomb) < 100
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before < 64 * 1024  # KiB: < 64 MiB


# --- failure tolerance ------------------------------------------------------------------------

RUN_OF_BAD = 150  # longer than Energon's default failure tolerance of 100 failures in a row


@pytest.fixture(scope="module")
def bad_run(tmp_path_factory):
    return make_bad_run(tmp_path_factory.mktemp("bad_run"), bad=RUN_OF_BAD, good=10)


def _keys_and_skips(path, processor, config) -> tuple[list[str], dict[str, int]]:
    loader = get_packing_loader(path, config, processor)
    keys = [key for row in loader for key in row["__keys__"]]
    return keys, loader.stats()["skipped"]


@pytest.mark.parametrize("limit", [None, RUN_OF_BAD])
def test_a_run_of_bad_samples_is_not_fatal_unless_a_limit_says_so(bad_run, processor, limit):
    keys, skipped = _keys_and_skips(bad_run, processor, _config(0, max_consecutive_skips=limit))
    assert sorted(keys) == [f"good{index:04d}" for index in range(10)]
    assert skipped == {"malformed_conversation": RUN_OF_BAD}


def test_max_consecutive_skips_stops_a_run_longer_than_the_limit(bad_run, processor):
    with pytest.raises(TooManyBadSamplesError, match=r"101 bad samples in a row.*max_consecutive_skips=100"):
        _keys_and_skips(bad_run, processor, _config(0, max_consecutive_skips=100))


@pytest.mark.slow
def test_max_consecutive_skips_error_reaches_the_main_process_from_a_worker(bad_run, processor):
    with pytest.raises(TooManyBadSamplesError, match="max_consecutive_skips=20"):
        _keys_and_skips(bad_run, processor, _config(1, max_consecutive_skips=20))


@pytest.mark.parametrize("value", [0, -1, 2.5, True])
def test_max_consecutive_skips_must_be_a_positive_integer_or_none(value):
    with pytest.raises(ValueError, match="max_consecutive_skips"):
        _config(0, max_consecutive_skips=value)


def test_an_unreadable_records_line_is_a_counted_problem_not_a_crash(tmp_path):
    good = b'{"id": "a", "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]}'
    (tmp_path / "r.jsonl").write_bytes(good + b"\n" + good.replace(b'"a"', b'"b"').replace(b"Yo", b"\xff\xfe") + b"\n")
    report = prepare_dataset(tmp_path / "r.jsonl", tmp_path, tmp_path / "out", progress=False)
    assert report.written == 1 and [(p.line, p.reason) for p in report.problems] == [(2, "non_utf8_text")]
