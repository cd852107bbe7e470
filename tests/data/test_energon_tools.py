"""Energon's own tools read what ``energon-pack prepare`` writes: ``energon lint`` (every split part
checked, empty ones skipped), ``energon info`` (the sample type) and ``energon preview`` exit 0 on
the real-world corpus prepared with ``--split-ratio 1,0,0`` and ``8,2,0``; an empty split keeps our
one-line error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from energon_pack.config import PackingConfig
from energon_pack.errors import UsageError
from energon_pack.loader import get_packing_loader
from tests.support.real_corpus import CORPUS, HUGE, write_corpus

BIN = Path(sys.executable).parent  # .venv/bin


def _run(*args: str, answers: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([*args], input=answers, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus"), include_huge=False)


@pytest.mark.slow
@pytest.mark.parametrize("ratio", ["1,0,0", "8,2,0"])
def test_energon_lint_and_info_pass_on_a_prepared_dataset(ratio: str, records: Path, tmp_path: Path) -> None:
    dataset = tmp_path / "dataset"
    prepared = _run(str(BIN / "energon-pack"), "prepare", str(records), "--media-root", str(records.parent),
                    "--out", str(dataset), "--split-ratio", ratio)
    assert prepared.returncode == 0, prepared.stderr[-3000:]
    kept = len([item for item in CORPUS if item.name != HUGE])
    assert f"wrote {kept} samples" in prepared.stdout and "skipped" not in prepared.stdout, prepared.stdout
    assert "media written:" in prepared.stdout
    splits = yaml.safe_load((dataset / ".nv-meta" / "split.yaml").read_text())["split_parts"]
    assert list(splits) == ["train", "val", "test"] and splits["test"] == []
    assert (splits["val"] == []) == (ratio == "1,0,0")
    lint = _run(str(BIN / "energon"), "lint", str(dataset))
    assert lint.returncode == 0, (lint.stdout + lint.stderr)[-3000:]
    info = _run(str(BIN / "energon"), "info", str(dataset))
    assert info.returncode == 0, (info.stdout + info.stderr)[-3000:]
    assert "energon_pack.core.samples.QwenVLChatSample" in info.stdout
    preview = _run(str(BIN / "energon"), "preview", str(dataset), answers="n\n" * 3)  # one sample per split
    assert preview.returncode == 0 and "__key__" in preview.stdout and "corpus_" in preview.stdout, preview.stderr[-3000:]
    if ratio == "1,0,0":
        with pytest.raises(UsageError, match=r"has no 'val' split .*fix: .*--split-ratio"):
            get_packing_loader(dataset, PackingConfig(seq_length=4096, num_workers=0), split="val")
