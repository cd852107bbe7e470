"""``energon-pack prepare``: per-record problems reported by line, byte-exact media, Energon loading."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from energon_pack.cli import main as cli_main
from energon_pack.data.prepare import PrepareError, format_report, prepare_dataset
from energon_pack.core.samples import QwenVLChatSample
from energon_pack.data.synthetic import encode_image, encode_video
from energon_pack.errors import UsageError
from tests.support.prepared_reads import load_all, split_keys


def _chat(media: str = "") -> list[dict]:
    return [{"role": "user", "content": f"{media}Describe."}, {"role": "assistant", "content": "Fine."}]


@pytest.fixture()
def raw(tmp_path: Path) -> Path:
    media = tmp_path / "media"
    (media / "sub").mkdir(parents=True)
    rng = np.random.default_rng(0)
    (media / "a.jpg").write_bytes(encode_image(rng.integers(0, 255, (40, 60, 3), dtype=np.uint8), "JPEG", "RGB"))
    (media / "sub" / "b.png").write_bytes(encode_image(rng.integers(0, 255, (50, 30, 3), dtype=np.uint8), "PNG", "P"))
    (media / "c.webp").write_bytes(encode_image(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8), "WEBP", "RGBA"))
    (media / "v.mp4").write_bytes(encode_video(rng.integers(0, 255, (12, 32, 48, 3), dtype=np.uint8), fps=6))
    (tmp_path / "secret.jpg").write_bytes((media / "a.jpg").read_bytes())
    lines = [
        json.dumps({"id": "good1", "messages": _chat("<image>"), "images": ["a.jpg"]}),
        '{"id": "broken", "messages": [',  # line 2: bad JSON
        json.dumps({"id": "missing", "messages": _chat("<image>"), "images": ["nope.jpg"]}),  # line 3
        json.dumps({"id": "escape", "messages": _chat("<image>"), "images": ["../secret.jpg"]}),  # line 4
        json.dumps({"conversations": [{"from": "human", "value": "<image><image>Two?"}, {"from": "gpt", "value": "Yes."}],
                    "images": ["sub/b.png", "c.webp"]}),  # line 5: no id -> key "_line5"
        "",
        json.dumps({"id": "vid", "messages": _chat("<video>"), "videos": ["v.mp4"]}),  # line 7
        json.dumps({"id": "text", "messages": _chat()}),  # line 8
    ]
    (tmp_path / "records.jsonl").write_text("\n".join(lines) + "\n")
    return tmp_path



def test_problems_are_reported_by_line_and_skipped(raw: Path):
    report = prepare_dataset(raw / "records.jsonl", raw / "media", raw / "out", progress=False)
    problems = {p.line: p.reason.split(":")[0] for p in report.problems}
    assert problems == {2: "bad_json", 3: "missing_media", 4: "path_escape"}
    assert report.written == 4 and report.images == 3 and report.videos == 1
    assert yaml.safe_load((raw / "out" / ".nv-meta" / "dataset.yaml").read_text()) == {
        "__module__": "energon_pack",
        "__class__": "QwenVLChatWebdataset",
        "sample_type": {"__module__": "energon_pack.core.samples", "__class__": "QwenVLChatSample"},
    }
    splits = yaml.safe_load((raw / "out" / ".nv-meta" / "split.yaml").read_text())["split_parts"]
    assert list(splits) == ["train", "val", "test"] and splits["val"] == splits["test"] == []
    assert report.media_kinds == {("image", "JPEG", "-"): 1, ("image", "PNG", "-"): 1, ("image", "WEBP", "-"): 1,
                                  ("video", "mp4", "h264"): 1}
    table = format_report(report).split("media written:\n")[1].split("\nskipped")[0].splitlines()
    assert table[0].split() == ["kind", "format", "codec", "files"]
    assert [line.split() for line in table[2:]] == [
        ["image", "JPEG", "-", "1"], ["image", "PNG", "-", "1"], ["image", "WEBP", "-", "1"], ["video", "mp4", "h264", "1"]
    ]


def test_a_dataset_prepared_before_sample_type_still_loads(raw: Path):
    """dataset.yaml written before it named the sample type (``__module__``/``__class__`` only)."""
    prepare_dataset(raw / "records.jsonl", raw / "media", raw / "out", progress=False)
    (raw / "out" / ".nv-meta" / "dataset.yaml").write_text("__module__: energon_pack\n__class__: QwenVLChatWebdataset\n")
    assert sorted(load_all(raw / "out", 0)) == ["_line5", "good1", "text", "vid"]


def test_another_sample_type_is_refused(raw: Path):
    """Energon's parser refuses a type that is no QwenVLChatSample (from the annotation); ours refuses
    a subclass, naming the fix."""
    from energon_pack.formats.qwen_chat import QwenVLChatWebdataset

    prepare_dataset(raw / "records.jsonl", raw / "media", raw / "out", progress=False)
    meta = raw / "out" / ".nv-meta" / "dataset.yaml"
    meta.write_text(meta.read_text().replace("QwenVLChatSample", "CaptioningSample").replace(
        "energon_pack.core.samples", "megatron.energon"))
    with pytest.raises(ValueError, match="Expected Type.*QwenVLChatSample.*got.*CaptioningSample"):
        load_all(raw / "out", 0)

    class Subclass(QwenVLChatSample):
        pass

    with pytest.raises(ValueError, match="reads only energon_pack.core.samples.QwenVLChatSample; fix: rewrite"):
        QwenVLChatWebdataset(raw / "out", sample_type=Subclass)


def test_no_good_record_lists_every_problem(tmp_path: Path):
    (tmp_path / "r.jsonl").write_text("{oops\n" + json.dumps({"id": "m", "messages": _chat("<image>"),
                                                               "images": ["nope.jpg"]}) + "\n")
    with pytest.raises(PrepareError) as caught:
        prepare_dataset(tmp_path / "r.jsonl", tmp_path, tmp_path / "out", progress=False)
    message = str(caught.value)
    assert "no good record" in message and "(2 problems)" in message
    assert "line 1: bad_json" in message and "line 2 (id 'm'): missing_media" in message


def test_max_image_pixels_skips_larger_images_naming_the_knob(raw: Path):
    report = prepare_dataset(raw / "records.jsonl", raw / "media", raw / "out", progress=False, max_image_pixels=100)
    bombs = [p for p in report.problems if "pixel_bomb" in p.detail]
    assert bombs and all(p.reason == "unreadable_media" and "max_image_pixels=100" in p.detail for p in bombs)
    with pytest.raises(UsageError, match="--max-image-pixels 0 must be an integer >= 1"):
        prepare_dataset(raw / "records.jsonl", raw / "media", raw / "out", progress=False, max_image_pixels=0)


@pytest.mark.parametrize("num_workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_dataset_loads_with_energon_and_media_bytes_are_exact(raw: Path, num_workers: int):
    prepare_dataset(raw / "records.jsonl", raw / "media", raw / "out", progress=False, samples_per_shard=2)
    samples = load_all(raw / "out", num_workers)
    assert sorted(samples) == ["_line5", "good1", "text", "vid"]
    media = raw / "media"
    assert samples["good1"].images == [(media / "a.jpg").read_bytes()]
    assert samples["_line5"].images == [(media / "sub" / "b.png").read_bytes(), (media / "c.webp").read_bytes()]
    assert samples["vid"].videos == [(media / "v.mp4").read_bytes()] and samples["vid"].images == []
    assert samples["text"].images == [] and samples["text"].videos == []
    assert samples["_line5"].conversation[0]["content"][:2] == [{"type": "image"}, {"type": "image"}]
    assert all(s.invalid_reason is None for s in samples.values())


def test_on_error_fail_stops_with_the_line(raw: Path):
    with pytest.raises(PrepareError, match="line 2"):
        prepare_dataset(raw / "records.jsonl", raw / "media", raw / "out", on_error="fail", progress=False)


def test_cli_prepare_reports_and_exit_codes(raw: Path, capsys):
    args = ["prepare", str(raw / "records.jsonl"), "--media-root", str(raw / "media"), "--out", str(raw / "out")]
    assert cli_main(args) == 0
    out = capsys.readouterr().out
    assert "wrote 4 samples" in out and "line 2" in out and "line 3" in out and "line 4" in out
    assert "media written:" in out and "WEBP" in out
    assert cli_main([*args, "--on-error", "fail"]) == 1


def test_duplicate_and_invalid_ids_and_placeholder_mismatch(tmp_path: Path):
    lines = [
        json.dumps({"id": "x", "messages": _chat()}),
        json.dumps({"id": "x", "messages": _chat()}),
        json.dumps({"id": "a.b", "messages": _chat()}),
        json.dumps({"id": "m", "messages": _chat("<image>")}),
    ]
    (tmp_path / "r.jsonl").write_text("\n".join(lines))
    report = prepare_dataset(tmp_path / "r.jsonl", tmp_path, tmp_path / "out", progress=False)
    assert {p.line: p.reason.split(":")[0] for p in report.problems} == {
        2: "duplicate_id", 3: "bad_id", 4: "placeholder_mismatch"
    }
    assert report.written == 1


def test_unreadable_media_header_is_reported(tmp_path: Path):
    (tmp_path / "bad.jpg").write_bytes(b"not an image at all")
    (tmp_path / "r.jsonl").write_text(
        json.dumps({"id": "ok", "messages": _chat()}) + "\n"
        + json.dumps({"id": "bad", "messages": _chat("<image>"), "images": ["bad.jpg"]}) + "\n"
    )
    report = prepare_dataset(tmp_path / "r.jsonl", tmp_path, tmp_path / "out", progress=False)
    assert [(p.line, p.reason.split(":")[0]) for p in report.problems] == [(2, "unreadable_media")]


def test_json_list_input_and_split_ratio(tmp_path: Path):
    records = [{"id": f"s{i}", "messages": _chat()} for i in range(6)]
    (tmp_path / "r.json").write_text(json.dumps(records))
    report = prepare_dataset(tmp_path / "r.json", tmp_path, tmp_path / "out", progress=False, samples_per_shard=2,
                             split_ratio="2,1,0")
    assert report.written == 6 and len(report.shards) == 3
    split = (tmp_path / "out" / ".nv-meta" / "split.yaml").read_text()
    assert "train" in split and "val" in split
    with pytest.raises(ValueError, match="split ratio"):
        prepare_dataset(tmp_path / "r.json", tmp_path, tmp_path / "out", split_ratio="0,0,0", progress=False)


def _text_records(path: Path, count: int) -> Path:
    path.write_text("".join(json.dumps({"id": f"r{i}", "messages": _chat()}) + "\n" for i in range(count)))
    return path



def test_a_small_dataset_splits_by_samples_not_shards(tmp_path: Path):
    """26 records, ratio 8,2,0, one shard's worth: train and val both get their share of samples."""
    records = _text_records(tmp_path / "r.jsonl", 26)
    report = prepare_dataset(records, tmp_path, tmp_path / "ds", split_ratio="8,2,0", progress=False)
    assert report.split_counts == {"train": 21, "val": 5}
    train, val = split_keys(tmp_path / "ds", "train"), split_keys(tmp_path / "ds", "val")
    assert len(train) == 21 and len(val) == 5
    assert sorted(train + val) == sorted(f"r{i}" for i in range(26))
    assert "train: 21" in format_report(report) and "val: 5" in format_report(report)


def test_a_requested_split_that_comes_out_empty_is_an_error(tmp_path: Path):
    records = _text_records(tmp_path / "r.jsonl", 1)
    with pytest.raises(PrepareError, match=r"split 'val'.*--split-ratio"):
        prepare_dataset(records, tmp_path, tmp_path / "ds", split_ratio="8,2,0", progress=False)
    assert not (tmp_path / "ds").exists()


def test_generated_ids_cannot_collide_with_user_ids(tmp_path: Path):
    """Line 7 has no id, line 8 has the id 7: both are written under different keys."""
    lines = [json.dumps({"id": i, "messages": _chat()}) for i in range(1, 7)]
    lines += [json.dumps({"messages": _chat()}), json.dumps({"id": 7, "messages": _chat()})]
    (tmp_path / "r.jsonl").write_text("\n".join(lines) + "\n")
    report = prepare_dataset(tmp_path / "r.jsonl", tmp_path, tmp_path / "ds", progress=False)
    assert report.problems == [] and report.written == 8 and report.generated_ids == 1
    keys = split_keys(tmp_path / "ds", "train")
    assert "7" in keys and len(set(keys)) == 8
    assert "1 record(s) without an id" in format_report(report)


def test_a_user_id_in_the_generated_id_form_is_rejected(tmp_path: Path):
    from energon_pack.data.prepare import GENERATED_ID_PREFIX

    lines = [json.dumps({"messages": _chat()}), json.dumps({"id": f"{GENERATED_ID_PREFIX}1", "messages": _chat()})]
    (tmp_path / "r.jsonl").write_text("\n".join(lines) + "\n")
    report = prepare_dataset(tmp_path / "r.jsonl", tmp_path, tmp_path / "ds", progress=False)
    assert [(p.line, p.reason.split(":")[0]) for p in report.problems] == [(2, "bad_id")]


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_failed_prepare_leaves_nothing_at_out(raw: Path):
    before = sorted(p.name for p in raw.iterdir())
    with pytest.raises(PrepareError):
        prepare_dataset(raw / "records.jsonl", raw / "media", raw / "out", on_error="fail", progress=False)
    assert sorted(p.name for p in raw.iterdir()) == before, "no dataset and no staging folder may be left"


def test_a_failed_prepare_keeps_the_existing_dataset(raw: Path):
    prepare_dataset(raw / "records.jsonl", raw / "media", raw / "out", progress=False)
    dataset = _tree(raw / "out")
    with pytest.raises(PrepareError):
        prepare_dataset(raw / "records.jsonl", raw / "media", raw / "out", on_error="fail", progress=False)
    assert _tree(raw / "out") == dataset
    assert sorted(p.name for p in raw.iterdir()) == ["media", "out", "records.jsonl", "secret.jpg"]


def test_media_in_an_assistant_turn_is_reported_unless_allowed(raw: Path):
    drawn = {"id": "drawn", "images": ["a.jpg"],
             "messages": [{"role": "user", "content": "Draw a cat."}, {"role": "assistant", "content": "<image>"}]}
    (raw / "assistant.jsonl").write_text(json.dumps({"id": "t", "messages": _chat()}) + "\n" + json.dumps(drawn) + "\n")
    report = prepare_dataset(raw / "assistant.jsonl", raw / "media", raw / "ds", progress=False)
    assert [(p.line, p.reason.split(":")[0]) for p in report.problems] == [(2, "media_in_assistant_turn")]
    assert "--allow-assistant-media" in report.problems[0].detail
    report = prepare_dataset(raw / "assistant.jsonl", raw / "media", raw / "ds", progress=False, allow_assistant_media=True)
    assert report.problems == [] and report.written == 2
    args = ["prepare", str(raw / "assistant.jsonl"), "--media-root", str(raw / "media"), "--out", str(raw / "cli")]
    assert cli_main([*args, "--allow-assistant-media"]) == 0
    assert sorted(split_keys(raw / "cli", "train")) == ["drawn", "t"]


def test_reasoning_content_survives_prepare_and_loading(tmp_path: Path):
    """An assistant's ``reasoning_content`` is stored in ``<key>.json`` and reaches the loaded
    sample's conversation (where the Qwen3.5 template renders it, docs/qwen35.md)."""
    messages = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4", "reasoning_content": "2 and 2"}]
    (tmp_path / "r.jsonl").write_text(json.dumps({"id": "think", "messages": messages}) + "\n")
    report = prepare_dataset(tmp_path / "r.jsonl", tmp_path, tmp_path / "out", progress=False)
    assert report.written == 1
    (sample,) = load_all(tmp_path / "out", num_workers=0).values()
    assert sample.conversation[1]["reasoning_content"] == "2 and 2"


def test_synthetic_real_world_media_go_through_prepare(tmp_path: Path):
    """SyntheticSpec.real_world_fraction draws EXIF-turned JPEG/WebP, GIF, BMP, TIFF and WebM/MKV/MOV/AVI
    videos (the demo's mix); the default mix is unchanged (no extra random draws)."""
    from energon_pack.data.synthetic import SyntheticSpec, make_records, make_synthetic_dataset

    spec = SyntheticSpec(max_image_side=96, max_video_seconds=1.0, max_video_side=64, real_world_fraction=1.0)
    report = make_synthetic_dataset(tmp_path / "real", 24, seed=1, spec=spec)
    assert report.problems == [] and report.oriented_images > 0
    formats = {fmt for _, fmt, _ in report.media_kinds}
    assert {"GIF", "BMP", "TIFF"} & formats and {"webm", "mkv", "mov", "avi"} & formats, report.media_kinds
    assert not {"PNG", "mp4"} & formats
    plain = make_records(tmp_path / "plain", 12, seed=1).read_text()
    assert plain == make_records(tmp_path / "zero", 12, seed=1, spec=SyntheticSpec(real_world_fraction=0.0)).read_text()
