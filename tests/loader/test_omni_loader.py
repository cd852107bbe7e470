"""Real loaders on a prepared Qwen-Omni dataset (audio clips in four codecs, image + audio, a video
heard with its sound): rows carry unpadded audio features, and a state saved while audio samples
are pending restores to the byte-identical continuation (features included), for both Omni families."""

from __future__ import annotations

from pathlib import Path

import pytest

from energon_pack.data.prepare import prepare_dataset
from energon_pack.loader import get_packing_loader
from energon_pack.qwen.processor import load_processor
from tests.support.loader_runs import EAGER, full_run_with_pending, make_config, rows_after_resume
from tests.support.omni_dataset import write_omni_records

# Slow: worker processes decode audio and video.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def omni_dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("omni")
    prepare_dataset(write_omni_records(root, clips=10), root / "media", root / "out", progress=False, samples_per_shard=4)
    return root / "out"


@pytest.fixture(scope="module", params=["qwen2.5-omni", "qwen3-omni"])
def processor(request):
    return load_processor(family=request.param, min_pixels=56 * 56, max_pixels=112 * 112)


def test_exact_resume_with_audio_pending(omni_dataset, processor):
    config = make_config(2, seq_length=160, buffer_size=6)
    rows, pending, stats = full_run_with_pending(omni_dataset, processor, config, **EAGER)
    assert sum(len(keys) for keys, _ in rows) == 13 and not stats["skipped"]
    save_after = next(i for i in range(1, len(rows)) if pending[i - 1] > 0)
    assert rows_after_resume(omni_dataset, processor, config, save_after, **EAGER) == rows[save_after:]


def test_rows_keep_the_audio_budget(omni_dataset, processor):
    """``max_row_audio_frames``: no row carries more log-mel frames; a sample over it alone is counted."""
    config = make_config(0, seq_length=160, buffer_size=6, max_row_audio_frames=250)
    loader = get_packing_loader(omni_dataset, config, processor)
    rows = list(loader)
    stats = loader.stats()
    heard = [row for row in rows if "audio_inputs" in row]
    assert heard and all(row["row_cost"]["audio_frames"] == row["audio_inputs"].frames <= 250 for row in heard)
    # Clips of 0.5 + 0.3 i s give 50 + 30 i frames: clips 7, 8, 9 (260-320) and the 3-s video sound (300) are over.
    assert stats["skipped"] == {"over_audio_budget": 4}
    assert sum(len(row["__keys__"]) for row in rows) == 9
