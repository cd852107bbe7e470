"""``energon-pack plan`` and the plan loader on a Megatron-Bridge-format dataset read in place:
nothing is written into the dataset (its folder stays byte-identical), facts are kept beside the plan
(or in ``--facts-dir``) and reused by the next plan, and the plan covers every sample once."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from energon_pack.cli import main
from energon_pack.plan.file import open_plan
from tests.support.bridge_datasets import PICKLED_YAML, pickled_samples, write_bridge_dataset

# Slow: preencodes a dataset twice through the CLI.
pytestmark = pytest.mark.slow


def _tree_digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture()
def bridge(tmp_path) -> Path:
    samples = pickled_samples() * 1
    many = [{**sample, "__key__": f"c{copy}-{sample['__key__']}"} for copy in range(3) for sample in samples]
    return write_bridge_dataset(tmp_path / "bridge", many, PICKLED_YAML, samples_per_shard=5)


def test_plan_leaves_the_dataset_untouched_keeps_facts_beside_the_plan_and_covers_every_sample_once(bridge, tmp_path, capsys):
    (tmp_path / "packing.yaml").write_text("seq_length: 512\nnum_workers: 0\n", encoding="utf-8")
    before = _tree_digest(bridge)
    out = tmp_path / "plans"
    out.mkdir()
    assert main(["plan", str(bridge), "--config", str(tmp_path / "packing.yaml"), "--out", str(out / "a.plan")]) == 0
    first = capsys.readouterr().out
    assert "none written into the dataset" in first and (out / "bridge.train.facts.npz").is_file()
    assert main(["plan", str(bridge), "--config", str(tmp_path / "packing.yaml"), "--out", str(out / "b.plan")]) == 0
    assert "measured from kept facts" in capsys.readouterr().out
    assert _tree_digest(bridge) == before
    plan = open_plan(out / "b.plan")
    planned = [index for row in range(plan.num_rows) for index in plan.global_indices(row)]
    assert len(planned) == len(set(planned))
    assert plan.skipped == {} and sorted(planned) == list(range(15))
    assert open_plan(out / "a.plan").digest == plan.digest


def test_facts_dir_holds_the_kept_facts_and_a_file_there_is_a_usage_error(bridge, tmp_path, capsys):
    (tmp_path / "packing.yaml").write_text("seq_length: 512\nnum_workers: 0\n", encoding="utf-8")
    facts = tmp_path / "facts"
    args = ["plan", str(bridge), "--config", str(tmp_path / "packing.yaml"), "--out", str(tmp_path / "a.plan")]
    assert main([*args, "--facts-dir", str(facts)]) == 0
    assert (facts / "bridge.train.facts.npz").is_file() and not (tmp_path / "bridge.train.facts.npz").exists()
    capsys.readouterr()
    assert main([*args, "--facts-dir", str(tmp_path / "packing.yaml")]) == 2
    assert "--facts-dir" in capsys.readouterr().err


def test_the_plan_loader_reads_the_bridge_dataset(bridge, tmp_path, processor):
    from energon_pack import PackingConfig, get_packing_loader

    (tmp_path / "packing.yaml").write_text("seq_length: 512\nnum_workers: 0\n", encoding="utf-8")
    assert main(["plan", str(bridge), "--config", str(tmp_path / "packing.yaml"), "--out", str(tmp_path / "a.plan")]) == 0
    config = PackingConfig(seq_length=512, num_workers=0, repeat=False)
    with get_packing_loader(bridge, config, processor, plan=tmp_path / "a.plan") as loader:
        keys = [key for row in loader for key in row["__keys__"]]
    assert len(keys) == len(set(keys)) == 15


def test_inspect_says_what_a_bridge_dataset_is_and_renders_its_first_sample(tmp_path, capsys):
    from tests.support.bridge_datasets import TUTORIAL_YAML, tutorial_samples

    dataset = write_bridge_dataset(tmp_path / "tutorial", tutorial_samples(), TUTORIAL_YAML)
    capsys.readouterr()
    assert main(["inspect", str(dataset)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:5] == [
        "format: megatron-bridge-chatml",
        "dataset class: megatron.bridge.data.energon.task_encoder_utils.ChatMLWebdataset (not imported; read by "
        "energon_pack.formats.bridge_chatml:BridgeChatMLWebdataset)",
        "field map: imgs: image.png, conversation: conversation.json",
        lines[3],
        "first sample (tutorial-000000, 1 image(s), 0 video(s)) as a conversation:",
    ]
    assert lines[3].startswith("read as: conversation JSON normalised as Bridge 0.6.2 does")
    assert lines[5:7] == ["  user: [image] What is in picture 0?", "  assistant: Noise number 0."]
    assert any(line.split() == ["samples", "4"] for line in lines)


def test_inspect_of_our_dataset_prints_no_format_block(synthetic_dataset, capsys):
    assert main(["inspect", str(synthetic_dataset.out_dir), "--limit", "2"]) == 0
    assert not capsys.readouterr().out.startswith("format:")


def test_simulate_reads_a_bridge_dataset(bridge, capsys):
    capsys.readouterr()
    assert main(["simulate", "--dataset", str(bridge), "--widths", "512", "--buffers", "4"]) == 0
    table = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("512")]
    assert len(table) == 4 and all(float(row[2].rstrip("%")) > 50 for row in table)


def _cook_differently(crude: dict) -> dict:
    from tests.support.energon_datasets import cook_qa

    record = cook_qa(crude)
    record["conversation"][1]["content"] += " Certainly."
    return record


def test_a_crude_dataset_plans_loads_and_inspects_under_the_configured_mapping(tmp_path, processor, capsys):
    from energon_pack import PackingConfig, get_packing_loader
    from energon_pack.identity import ResumeMismatchError
    from tests.support.energon_datasets import make_crude_dataset

    crude = tmp_path / "crude"
    samples = make_crude_dataset(crude, n=6)
    (tmp_path / "packing.yaml").write_text(
        "seq_length: 512\nnum_workers: 0\nsample_mapping: tests.support.energon_datasets:cook_qa\n", encoding="utf-8"
    )
    assert main(["plan", str(crude), "--config", str(tmp_path / "packing.yaml"), "--out", str(tmp_path / "a.plan")]) == 0
    plan = open_plan(tmp_path / "a.plan")
    planned = [index for row in range(plan.num_rows) for index in plan.global_indices(row)]
    assert plan.skipped == {} and sorted(planned) == list(range(len(samples)))
    assert plan.fingerprint["packing"]["sample_mapping"] == "tests.support.energon_datasets:cook_qa"

    config = PackingConfig.from_dict(
        {"seq_length": 512, "num_workers": 0, "repeat": False, "sample_mapping": "tests.support.energon_datasets:cook_qa"}
    )
    with get_packing_loader(crude, config, processor, plan=tmp_path / "a.plan") as loader:
        keys = sorted(key for row in loader for key in row["__keys__"])
    assert len(keys) == len(samples) and all("crude" in key for key in keys)
    with pytest.raises(ResumeMismatchError, match="sample_mapping"):
        get_packing_loader(crude, config, processor, plan=tmp_path / "a.plan", sample_mapping=_cook_differently)

    capsys.readouterr()
    assert main(["inspect", str(crude), "--sample-mapping", "tests.support.energon_datasets:cook_qa", "--limit", "2"]) == 0
    assert "Shade 0?" in capsys.readouterr().out
    assert main(["inspect", str(crude), "--sample-mapping", "tests.support.energon_datasets"]) == 2
    assert "--sample-mapping" in capsys.readouterr().err
