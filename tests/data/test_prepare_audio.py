"""``prepare`` with Qwen-Omni records: audio members (by extension), ``use_audio_in_video`` kept, read back exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from energon_pack.cli import main as cli_main
from energon_pack.data.prepare import prepare_dataset
from tests.support.omni_dataset import write_omni_records
from tests.support.prepared_reads import load_all


def test_audio_records_prepare_and_read_back(tmp_path: Path):
    records = write_omni_records(tmp_path, clips=4)
    report = prepare_dataset(records, tmp_path / "media", tmp_path / "out", progress=False, samples_per_shard=3)
    assert report.written == 7 and not report.problems, report.problems
    assert ("audio", "weba", "opus") in report.media_kinds and ("audio", "mp3", "mp3float") in report.media_kinds
    samples = load_all(tmp_path / "out", 0)
    media = tmp_path / "media"
    assert samples["a1"].audios == [(media / "clip1.mp3").read_bytes()]
    assert samples["a3"].audios == [(media / "clip3.webm").read_bytes()] and samples["a3"].videos == []
    assert samples["img"].audios == [(media / "clip0.wav").read_bytes()] and len(samples["img"].images) == 1
    assert samples["img"].conversation[0]["content"][:2] == [{"type": "image"}, {"type": "audio"}]
    assert samples["vid"].use_audio_in_video and samples["vid"].audios is None
    assert samples["txt"].audios is None and not samples["txt"].use_audio_in_video
    assert all(s.invalid_reason is None for s in samples.values())


def test_audio_placeholder_mismatch_is_reported(tmp_path: Path):
    records = tmp_path / "r.jsonl"
    records.write_text('{"id": "x", "messages": [{"role": "user", "content": "<audio><audio>?"}, '
                       '{"role": "assistant", "content": "ok"}], "audios": ["a.wav"]}\n'
                       '{"id": "y", "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "ok"}]}\n')
    report = prepare_dataset(records, tmp_path, tmp_path / "out", progress=False)
    assert report.written == 1 and report.problem_counts() == {"placeholder_mismatch": 1}


@pytest.mark.slow  # builds the offline Qwen2.5-Omni processor
def test_inspect_counts_audio_samples_with_the_omni_family(tmp_path: Path, capsys):
    records = write_omni_records(tmp_path, clips=2)
    prepare_dataset(records, tmp_path / "media", tmp_path / "out", progress=False)
    assert cli_main(["inspect", str(tmp_path / "out"), "--family", "qwen2.5-omni"]) == 0
    table = capsys.readouterr().out
    assert "bad samples (skipped)" in table and "audio_not_supported" not in table
    assert cli_main(["inspect", str(tmp_path / "out")]) == 0  # the default Qwen2.5-VL processor hears nothing
    line = next(line for line in capsys.readouterr().out.splitlines() if "skipped: audio_not_supported" in line)
    assert line.split()[-1] == "4"  # the two clips, the image + audio chat and the video heard with its sound


def test_parquet_audio_column_as_the_datasets_audio_feature(tmp_path: Path):
    """A Parquet ``audio`` column of ``{"bytes", "path"}`` structs (the Hub's Audio feature): embedded
    bytes become audio members, named by their path's extension or else by their container."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.support.audio_media import encode_audio, tone

    flac = encode_audio(tone(0.5, 16000), 16000, "flac")
    opus = encode_audio(tone(0.4, 48000), 48000, "ogg_opus")
    chat = lambda n: json.dumps([{"role": "user", "content": "<audio>" * n + "What?"}, {"role": "assistant", "content": "A."}])  # noqa: E731
    table = pa.table({
        "id": ["one", "two"],
        "messages": [chat(1), chat(2)],
        "audio": [[{"bytes": flac, "path": "clip.flac"}], [{"bytes": opus, "path": None}, {"bytes": flac, "path": None}]],
    })
    pq.write_table(table, tmp_path / "t.parquet")
    report = prepare_dataset(tmp_path / "t.parquet", tmp_path, tmp_path / "out", progress=False)
    assert report.written == 2 and not report.problems, report.problems
    assert ("audio", "ogg", "opus") in report.media_kinds and ("audio", "flac", "flac") in report.media_kinds
    samples = load_all(tmp_path / "out", 0)
    assert samples["one"].audios == [flac] and samples["two"].audios == [opus, flac]
