"""A new user's mistakes end in one line naming the fix and exit code 2, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from energon_pack.cli import main
from energon_pack.core.token_rules import TOKEN_RULES_VERSION
from energon_pack.errors import UsageError


def one_line_error(capsys, argv: list[str]) -> str:
    """Run the CLI, expect exit code 2 and exactly one line on stderr; return that line."""
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse reports bad option values itself
        code = exit_.code
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2, captured.err
    assert len(lines) == 1, captured.err
    assert "fix" in lines[0] or "e.g." in lines[0]
    return lines[0]


@pytest.fixture()
def records(tmp_path: Path) -> Path:
    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps({"id": f"r{i}", "messages": chat}) + "\n" for i in range(4)))
    (tmp_path / "media").mkdir()
    return path


def test_prepare_a_missing_input_file(tmp_path, capsys):
    line = one_line_error(capsys, ["prepare", str(tmp_path / "nope.jsonl"), "--media-root", str(tmp_path), "--out", str(tmp_path / "ds")])
    assert "nope.jsonl" in line and "not found" in line
    assert not (tmp_path / "ds").exists()


def test_prepare_a_missing_media_root(records, capsys):
    line = one_line_error(capsys, ["prepare", str(records), "--media-root", str(records.parent / "nope"), "--out", str(records.parent / "ds")])
    assert "--media-root" in line and "nope" in line
    assert not (records.parent / "ds").exists()


def test_inspect_a_folder_that_is_not_a_dataset(tmp_path, capsys):
    (tmp_path / "some" / "dir").mkdir(parents=True)
    line = one_line_error(capsys, ["inspect", str(tmp_path / "some" / "dir")])
    assert "not a prepared dataset" in line and "energon-pack prepare" in line


def test_inspect_a_split_the_dataset_does_not_have(records, capsys):
    dataset = records.parent / "ds"
    assert main(["prepare", str(records), "--media-root", str(records.parent / "media"), "--out", str(dataset)]) == 0
    capsys.readouterr()
    line = one_line_error(capsys, ["inspect", str(dataset), "--split", "val"])
    assert "'val'" in line and "train" in line and "--split-ratio" in line


def test_simulate_widths_must_be_comma_separated(capsys):
    line = one_line_error(capsys, ["simulate", "--widths", "4096 8192"])
    assert "--widths" in line and "comma-separated" in line
    main_help = pytest.raises(SystemExit, main, ["simulate", "--help"])
    assert main_help.value.code == 0
    assert "comma-separated" in capsys.readouterr().out


def test_simulate_family_needs_a_dataset_and_a_known_name(capsys):
    line = one_line_error(capsys, ["simulate", "--family", "qwen3-omni"])
    assert "--family qwen3-omni" in line and "--dataset" in line
    line = one_line_error(capsys, ["simulate", "--family", "qwen4-omni", "--dataset", "x"])
    assert "qwen4-omni" in line and "qwen3-omni" in line  # argparse names the choices
    assert pytest.raises(SystemExit, main, ["simulate", "--help"]).value.code == 0
    assert "qwen3-omni" in capsys.readouterr().out


@pytest.mark.parametrize("spec", ["my_pkg.maps", "json:no_such_function", "no_such_module_xyz:f"])
def test_a_bad_sample_mapping_of_simulate_and_inspect_is_one_line(records, capsys, spec):
    for argv in (["simulate", "--sample-mapping", spec], ["inspect", str(records), "--sample-mapping", spec]):
        line = one_line_error(capsys, argv)
        assert "--sample-mapping" in line and spec in line


def test_get_packing_loader_on_a_records_file(records, processor):
    from energon_pack import PackingConfig, get_packing_loader

    with pytest.raises(UsageError, match=r"records\.jsonl.* is a file, not a prepared dataset.*energon-pack prepare"):
        get_packing_loader(records, PackingConfig(seq_length=1024, num_workers=0), processor)
    with pytest.raises(UsageError, match="does not exist"):
        get_packing_loader(records.parent / "missing", PackingConfig(seq_length=1024, num_workers=0), processor)


def test_plan_a_missing_folder(tmp_path, capsys):
    (tmp_path / "packing.yaml").write_text("seq_length: 1024\n")
    argv = ["plan", str(tmp_path / "nope"), "--config", str(tmp_path / "packing.yaml"), "--out", str(tmp_path / "p.plan")]
    line = one_line_error(capsys, argv)
    assert "nope" in line and "does not exist" in line and "energon-pack prepare" in line
    assert not (tmp_path / "p.plan").exists()


def test_plan_a_records_file(records, capsys):
    (records.parent / "packing.yaml").write_text("seq_length: 1024\n")
    argv = ["plan", str(records), "--config", str(records.parent / "packing.yaml"), "--out", str(records.parent / "p.plan")]
    line = one_line_error(capsys, argv)
    assert "records.jsonl" in line and "is a file, not a prepared dataset" in line


def test_plan_with_a_missing_or_invalid_config(records, capsys):
    dataset = records.parent / "ds"
    assert main(["prepare", str(records), "--media-root", str(records.parent / "media"), "--out", str(dataset)]) == 0
    capsys.readouterr()
    out = str(records.parent / "p.plan")
    line = one_line_error(capsys, ["plan", str(dataset), "--config", str(records.parent / "missing.yaml"), "--out", out])
    assert "--config" in line and "missing.yaml" in line and "does not exist" in line and "seq_length" in line
    (records.parent / "bad.yaml").write_text("seq_length: 1000\nnot_a_field: 3\n")
    line = one_line_error(capsys, ["plan", str(dataset), "--config", str(records.parent / "bad.yaml"), "--out", out])
    assert line.count("--config") == 1 and "not_a_field" in line
    assert not (records.parent / "p.plan").exists()


def test_a_missing_msc_dataset_is_one_line(tmp_path, capsys, monkeypatch):
    """An msc:// path whose profile is not configured: one line naming the path and MSC_CONFIG."""
    monkeypatch.setenv("MSC_CONFIG", str(tmp_path / "msc.json"))
    (tmp_path / "msc.json").write_text('{"profiles": {"local": {"storage_provider": {"type": "file", "options": {"base_path": "%s"}}}}}' % tmp_path)
    line = one_line_error(capsys, ["inspect", "msc://local/nope"])
    assert "msc://local/nope" in line and "does not exist" in line
    line = one_line_error(capsys, ["inspect", "msc://no_such_profile/ds"])
    assert "msc://no_such_profile/ds" in line and "MSC_CONFIG" in line


@pytest.mark.parametrize(
    "argv, fragments",
    [
        (["--dp", "8,x"], ["--dp", "comma-separated"]),
        (["--dp", "8", "--micro-batches", "0"], ["--micro-batches", "positive"]),
        (["--dp", "8", "--cost-model", "llama-7b"], ["--cost-model 'llama-7b'", "qwen2.5-vl-7b"]),
        (["--dp", "8", "--seq-length", "0"], ["--seq-length 0", "--seq-length 8192"]),
        (["--dp", "8", "--workers", "0"], ["--workers", "'0'", ">= 1"]),
        (["--dp", "8", "--window-rows", "0"], ["--window-rows", "'0'", ">= 1"]),
    ],
)
def test_simulate_step_table_bad_values(capsys, argv, fragments):
    line = one_line_error(capsys, ["simulate", "--samples", "50", *argv])
    assert all(fragment in line for fragment in fragments), line


@pytest.mark.parametrize(
    "option, fragments",
    [
        (["--workers", "0"], ["--workers 0", ">= 1"]),
        (["--workers", "-1"], ["--workers -1", ">= 1"]),
        (["--workers", "abc"], ["--workers", "'abc'"]),
        (["--part", "2/2"], ["--part '2/2'", "0/2"]),
        (["--part", "x"], ["--part 'x'", "I/N"]),
        (["--part", "1/0"], ["--part '1/0'", "N must be >= 1"]),
        (["--samples-per-shard", "0"], ["--samples-per-shard 0", ">= 1"]),
    ],
)
def test_prepare_bad_workers_part_and_shard_size(records, capsys, option, fragments):
    out = records.parent / "ds"
    line = one_line_error(capsys, ["prepare", str(records), "--media-root", str(records.parent / "media"), "--out", str(out), *option])
    assert all(fragment in line for fragment in fragments), line
    assert not out.exists()


def _parts(records: Path, out: Path, parts: int, *only: int, options: tuple[str, ...] = ()) -> None:
    for part in only or range(parts):
        argv = ["prepare", str(records), "--media-root", str(records.parent / "media"), "--out", str(out),
                "--samples-per-shard", "1", "--part", f"{part}/{parts}", *options]
        assert main(argv) == 0


def test_merge_missing_folder_msc_path_and_plain_dataset(records, capsys):
    line = one_line_error(capsys, ["merge", str(records.parent / "nope")])
    assert "nope" in line and "not a folder" in line and "--part I/N" in line
    line = one_line_error(capsys, ["merge", "msc://profile/ds"])
    assert "msc://profile/ds" in line and "local folder" in line
    line = one_line_error(capsys, ["merge", str(records.parent / "media")])
    assert "no part manifest" in line and "prepare ... --part I/N" in line
    plain = records.parent / "plain"
    assert main(["prepare", str(records), "--media-root", str(records.parent / "media"), "--out", str(plain)]) == 0
    capsys.readouterr()
    line = one_line_error(capsys, ["merge", str(plain)])
    assert "finished dataset" in line and "nothing to merge" in line
    line = one_line_error(capsys, ["prepare", str(records), "--media-root", str(records.parent / "media"), "--out",
                                   str(plain), "--part", "0/2"])
    assert "finished dataset" in line and "new folder" in line


def test_merge_twice_and_a_missing_part(records, capsys):
    out = records.parent / "parts"
    _parts(records, out, 3, 0, 2)
    capsys.readouterr()
    line = one_line_error(capsys, ["merge", str(out)])
    assert "part(s) 1/3 missing" in line and "--part 1/3" in line
    _parts(records, out, 3, 1)
    assert main(["merge", str(out)]) == 0
    capsys.readouterr()
    line = one_line_error(capsys, ["merge", str(out)])
    assert "finished dataset" in line and "merged already" in line


def test_merge_parts_of_different_runs(records, capsys):
    out = records.parent / "parts"
    _parts(records, out, 2, 0)
    _parts(records, out, 2, 1, options=("--split-ratio", "1,1,0"))
    capsys.readouterr()
    line = one_line_error(capsys, ["merge", str(out)])
    assert "part 1/2 and part 0/2 are parts of different runs (split_ratio: '1,1,0' vs '1,0,0')" in line
    assert "rerun prepare --part 1/2" in line
    _parts(records, out, 2, 1)
    _parts(records, out, 3, 1)
    capsys.readouterr()
    line = one_line_error(capsys, ["merge", str(out)])
    assert "different runs (N=3 and N=2)" in line
    records.write_text(records.read_text() + records.read_text().replace('"r', '"s'))
    (out / ".nv-meta" / "energon_pack.part-1-of-3.json").unlink()
    _parts(records, out, 2, 1)
    capsys.readouterr()
    line = one_line_error(capsys, ["merge", str(out)])
    assert "(records_sha256:" in line


def test_merge_refuses_a_part_of_other_token_rules(records, capsys):
    out = records.parent / "parts"
    _parts(records, out, 2)
    manifest = out / ".nv-meta" / "energon_pack.part-1-of-2.json"
    data = json.loads(manifest.read_text())
    assert data.pop("token_rules") == TOKEN_RULES_VERSION
    manifest.write_text(json.dumps(data))  # as the release before token rules wrote it
    capsys.readouterr()
    line = one_line_error(capsys, ["merge", str(out)])
    assert line.endswith(
        f"part manifest {str(manifest)!r} counted tokens under token rules unversioned, this energon_pack counts with "
        f"v{TOKEN_RULES_VERSION}; fix: rerun prepare --part 1/2 with this energon_pack"
    ), line


def test_merge_a_lost_or_a_stray_shard(records, capsys):
    out = records.parent / "parts"
    _parts(records, out, 2)
    shard = out / "shards" / "train-000003.tar"
    data = shard.read_bytes()
    shard.unlink()
    capsys.readouterr()
    line = one_line_error(capsys, ["merge", str(out)])
    assert "'shards/train-000003.tar' of part 1/2 is missing or changed" in line and "--part 1/2" in line
    shard.write_bytes(data)
    (out / "shards" / "train-000009.tar").write_bytes(data)
    line = one_line_error(capsys, ["merge", str(out)])
    assert "'shards/train-000009.tar' belongs to no part" in line and "delete it" in line


@pytest.mark.parametrize(
    ("media", "argv", "named"),
    [
        ("realistic", ["--mix-scale", "0"], "--mix-scale"),
        ("realistic", ["--mix-scale", "-0.5"], "--mix-scale"),
        ("realistic", ["--mix-scale", "nan"], "--mix-scale"),
        ("realistic", ["--mix-scale", "half"], "--mix-scale"),
        ("realistic", ["--photos", "-1"], "--photos"),
        ("realistic", ["--photos", "many"], "--photos"),
        ("realistic", ["--clips", "-2"], "--clips"),
        ("realistic", ["--max-frames", "1"], "--max-frames"),
        ("realistic", ["--max-frames", "6.5"], "--max-frames"),
        ("realistic", ["--gpu-tokens-per-s", "0"], "--gpu-tokens-per-s"),
        ("realistic", ["--gpu-tokens-per-s", "inf"], "--gpu-tokens-per-s"),
        ("realistic", ["--family", "qwen4"], "--family"),
        ("realistic", ["--media", "real"], "--media"),
        ("realistic", ["--seq-length", "0"], "--seq-length"),
        ("audio", ["--audio-clips", "-1"], "--audio-clips"),
        ("audio", ["--audio-clips", "some"], "--audio-clips"),
        ("audio", ["--sound-videos", "-3"], "--sound-videos"),
        ("audio", ["--sound-videos", "2.5"], "--sound-videos"),
        ("audio", ["--family", "qwen4-omni"], "--family"),
        ("audio", ["--media", "sound"], "--media"),
        ("audio", ["--seq-length", "0"], "--seq-length"),
    ],
)
def test_bench_media_option_values(media, argv, named, capsys):
    line = one_line_error(capsys, ["bench", "--media", media, *argv])
    assert named in line and argv[1] in line


def test_bench_realistic_runs_the_loader_stage_only(tmp_path, capsys):
    line = one_line_error(capsys, ["bench", "--media", "realistic", "--stage", "plan", "--out", str(tmp_path)])
    assert "--stage plan" in line and "--stage loader" in line
    assert not any(tmp_path.iterdir())  # nothing generated


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--stage", "plan"], "--stage loader"),
        (["--family", "qwen2.5-vl"], "--family one of qwen2.5-omni"),
    ],
)
def test_bench_audio_refuses_before_generating_anything(argv, named, tmp_path, capsys):
    line = one_line_error(capsys, ["bench", "--media", "audio", *argv, "--out", str(tmp_path)])
    assert named in line and argv[1] in line
    assert not any(tmp_path.iterdir())  # nothing generated
