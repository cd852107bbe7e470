"""Nothing a user cannot act on is printed: no pinned-memory warning on CPU, no Qwen3-VL frame-cap
notice; the repository cites no file it does not hold."""

from __future__ import annotations

import logging
import re
import warnings
from fractions import Fraction

import numpy as np
import pytest
import torch

from energon_pack import PackingConfig, get_packing_loader
from tests.support.paths import REPO

ROOT = REPO


@pytest.mark.skipif(torch.accelerator.is_available(), reason="pinned memory is used where an accelerator exists")
def test_no_pinned_memory_warning_without_an_accelerator(synthetic_dataset, processor):
    config = PackingConfig(seq_length=4096, num_workers=0, repeat=False)  # torch warns with or without workers
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = get_packing_loader(synthetic_dataset.out_dir, config, processor)
        assert sum(1 for _ in loader) > 0
    assert loader.pin_memory is False
    assert not [w for w in caught if "pin_memory" in str(w.message)]


def test_qwen3_vl_video_processing_states_its_frame_cap(processor_qwen3):
    """The offline Qwen3-VL processor says how it treats the per-frame pixel cap, so transformers
    does not log its notice on the first video; tokens and pixels follow the uncapped default."""
    from energon_pack.runtime.task_encoder import QwenVLPackingTaskEncoder
    from tests.support.golden_media import GoldenSample, chat_sample, make_video

    assert processor_qwen3.video_processor.cap_pixels_per_frame is False
    logging.Logger.warning_once.cache_clear()  # transformers logs its notice once per process
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    transformers_logger = logging.getLogger("transformers")
    transformers_logger.addHandler(handler)
    try:
        video = make_video(np.random.default_rng(0), num_frames=8, rate=Fraction(4), size=(64, 64))
        messages = [{"role": "user", "content": [{"type": "video"}]}, {"role": "assistant", "content": "A clip."}]
        encoder = QwenVLPackingTaskEncoder(PackingConfig(seq_length=65536), processor_qwen3)
        prepared = encoder.preencode_sample(chat_sample(GoldenSample(messages, [], [video]), "clip"))
        assert prepared.skip_reason is None
        encoder.postencode_sample(prepared)
    finally:
        transformers_logger.removeHandler(handler)
    assert not [r for r in records if "cap_pixels_per_frame" in r.getMessage()]


def test_the_repository_cites_only_files_it_holds():
    """Makefile and README name no markdown file outside the repository; the licence is an SPDX string."""
    for name in ("Makefile", "README.md", "pyproject.toml"):
        text = (ROOT / name).read_text(encoding="utf-8")
        for cited in re.findall(r"[\w./-]+\.md\b", text):
            assert (ROOT / cited).exists() or (ROOT / "docs" / cited).exists(), f"{name} cites {cited}, not in the repository"
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert isinstance(project["license"], str), "project.license as a table is deprecated by setuptools; use an SPDX string"
