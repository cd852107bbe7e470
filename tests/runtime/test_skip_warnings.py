"""A bad sample is logged once per worker, counted every time; prepare --verify-media catches it up front."""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from energon_pack import PackingConfig, get_packing_loader
from energon_pack.cli import main as cli_main
from energon_pack.data.prepare import prepare_dataset
from energon_pack.data.synthetic import encode_image


def test_warn_skip_logs_a_key_once_per_process(monkeypatch, caplog):
    from energon_pack.runtime import skip_log

    monkeypatch.setattr(skip_log, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="energon_pack"):
        assert skip_log.warn_skip("a", "corrupt_image: cut") is True
        assert skip_log.warn_skip("a", "corrupt_image: cut") is False
        assert skip_log.warn_skip("b", "overlong: long") is True
        monkeypatch.setattr(skip_log.os, "getpid", lambda: -1)  # a forked worker starts afresh
        assert skip_log.warn_skip("a", "corrupt_image: cut") is True
    assert [r.getMessage().split(":")[1].strip() for r in caplog.records] == ["skipping sample 'a'", "skipping sample 'b'", "skipping sample 'a'"]


@pytest.fixture()
def truncated(tmp_path: Path) -> Path:
    """Records whose image is cut after its header (passes the header check, fails to decode)."""
    rng = np.random.default_rng(0)
    good = encode_image(rng.integers(0, 255, (64, 96, 3), dtype=np.uint8), "PNG", "RGB")
    (tmp_path / "good.png").write_bytes(good)
    (tmp_path / "cut.png").write_bytes(good[: len(good) // 2])
    chat = [{"role": "user", "content": "<image>What?"}, {"role": "assistant", "content": "A picture."}]
    records = [{"id": f"good{i}", "messages": chat, "images": ["good.png"]} for i in range(5)]
    records.append({"id": "cut", "messages": chat, "images": ["cut.png"]})
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return tmp_path


def test_a_bad_sample_is_counted_every_epoch_but_logged_once(truncated, processor, caplog):
    prepare_dataset(truncated / "records.jsonl", truncated, truncated / "ds", progress=False)
    config = PackingConfig(seq_length=2048, buffer_size=2, num_workers=0, repeat=False)
    loader = get_packing_loader(truncated / "ds", config, processor)
    with caplog.at_level(logging.WARNING, logger="energon_pack"):
        for _ in range(3):  # three epochs
            assert sum(1 for _ in loader) > 0
    assert loader.stats()["skipped"] == {"corrupt_image": 3}
    warned = Counter(r.getMessage().split("'")[1] for r in caplog.records if "skipping sample" in r.getMessage())
    assert warned == {"cut": 1}


def test_prepare_verify_media_decodes_everything(truncated, capsys):
    report = prepare_dataset(truncated / "records.jsonl", truncated, truncated / "ds", progress=False)
    assert report.written == 6 and report.problems == []  # the header check passes the cut image
    report = prepare_dataset(truncated / "records.jsonl", truncated, truncated / "ds", progress=False, verify_media=True)
    assert report.written == 5
    assert [(p.line, p.reason) for p in report.problems] == [(6, "unreadable_media")]
    assert "does not decode" in report.problems[0].detail
    args = ["prepare", str(truncated / "records.jsonl"), "--media-root", str(truncated), "--out", str(truncated / "cli")]
    assert cli_main([*args, "--verify-media"]) == 0
    captured = capsys.readouterr()
    assert "wrote 5 samples" in captured.out and "line 6" in captured.out
    assert "prepare (decoding media)" in captured.err, "a progress bar shows the decoding"
