"""The reader dispatch (``energon_pack.formats.dispatch``): the reader comes from dataset.yaml alone.

Our format under every module name it has had, a user's registered format, and refusals (an
unknown dataset class, an unknown sample type) that name the type and the fix on one line, before
any sample is read and without importing the named module.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from energon_pack.core.samples import QwenVLChatSample
from energon_pack.formats import dispatch
from energon_pack.runtime.pinning import pin_only_with_accelerator
from energon_pack.formats.dispatch import DatasetFormat, UnreadableDatasetError, reader_config, reading_formats


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory) -> Path:
    from energon_pack.data.synthetic import SyntheticSpec, make_synthetic_dataset

    root = tmp_path_factory.mktemp("dispatch")
    spec = SyntheticSpec(max_image_side=64, max_video_seconds=1.0, max_video_side=32)
    make_synthetic_dataset(root, 6, seed=3, spec=spec, samples_per_shard=6)
    return root / "dataset"


def _with_yaml(source: Path, target: Path, text: str) -> Path:
    shutil.copytree(source, target)
    (target / ".nv-meta" / "dataset.yaml").write_text(text, encoding="utf-8")
    return target


def _keys(path: Path) -> list[str]:
    from megatron.energon import WorkerConfig, get_loader, get_val_dataset

    with reading_formats():
        dataset = get_val_dataset(path, split_part="train", worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0), batch_size=None)
    samples = list(pin_only_with_accelerator(get_loader(dataset)))
    assert all(isinstance(sample, QwenVLChatSample) for sample in samples)
    return sorted(sample.__key__ for sample in samples)


@pytest.mark.parametrize("module", ["energon_pack", "energon_pack.core.samples", "energon_pack.formats.qwen_chat"])
def test_our_dataset_reads_under_every_module_name_it_has_had(small_dataset, tmp_path, module):
    renamed = _with_yaml(small_dataset, tmp_path / "ds", f"__module__: {module}\n__class__: QwenVLChatWebdataset\n")
    assert len(_keys(renamed)) == 6
    assert reader_config({"__module__": module, "__class__": "QwenVLChatWebdataset"})["__module__"] == (
        "energon_pack.formats.qwen_chat"
    )


def test_energon_builds_the_class_named_in_dataset_yaml_outside_the_dispatch(small_dataset, tmp_path):
    """Without ``reading_formats`` Energon imports what dataset.yaml names (the hook is what changes it)."""
    from megatron.energon import WorkerConfig, get_val_dataset

    unknown = _with_yaml(small_dataset, tmp_path / "ds", "__module__: not_a_module_anywhere\n__class__: Chat\n")
    with pytest.raises(ModuleNotFoundError):
        get_val_dataset(unknown, split_part="train", worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0), batch_size=None)


@pytest.mark.parametrize(
    ("yaml_text", "named"),
    [
        ("__module__: my_project.readers\n__class__: SecretChat\n", "my_project.readers.SecretChat"),
        ("sample_type:\n  __module__: my_project.samples\n  __class__: MySample\nfield_map: {a: b}\n",
         "a StandardWebdatasetFactory of my_project.samples.MySample"),
    ],
)
def test_an_unreadable_dataset_is_refused_at_start_in_one_line(small_dataset, tmp_path, processor, yaml_text, named):
    from energon_pack import PackingConfig, get_packing_loader

    dataset = _with_yaml(small_dataset, tmp_path / "ds", yaml_text)
    with pytest.raises(UnreadableDatasetError) as caught:
        get_packing_loader(dataset, PackingConfig(seq_length=1024, num_workers=0, repeat=False), processor)
    message = str(caught.value)
    assert "\n" not in message and named in message and "fix: convert it with `energon-pack prepare`" in message
    assert "my_project" not in sys.modules


def test_a_registered_format_is_tried_first(small_dataset, tmp_path, monkeypatch):
    monkeypatch.setattr(dispatch, "_USER_FORMATS", [])
    dataset = _with_yaml(small_dataset, tmp_path / "ds", "__module__: team.formats\n__class__: TeamChat\n")
    with pytest.raises(UnreadableDatasetError):
        _keys(dataset)
    dispatch.register_format(DatasetFormat(
        name="team-chat", recognises=lambda config: config.get("__class__") == "TeamChat",
        reader="energon_pack.formats.qwen_chat:QwenVLChatWebdataset", how_read="as ours",
    ))
    assert len(_keys(dataset)) == 6
    assert dispatch.format_of({"__class__": "TeamChat"}).name == "team-chat"


def test_the_dispatch_is_undone_on_exit():
    import megatron.energon.dataset_config as energon_dataset_config

    before = energon_dataset_config.load_config
    with reading_formats():
        with reading_formats():
            assert energon_dataset_config.load_config is not before
        assert energon_dataset_config.load_config is not before
    assert energon_dataset_config.load_config is before


def test_an_unreadable_leaf_of_a_metadataset_is_refused_in_one_line(small_dataset, tmp_path, processor):
    from energon_pack import PackingConfig, get_packing_loader

    leaf = _with_yaml(small_dataset, tmp_path / "leaf", "__module__: my_project.readers\n__class__: SecretChat\n")
    blend = tmp_path / "blend.yaml"
    blend.write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend_epochized:\n"
        f"      - repetitions: 1\n        path: {small_dataset}\n      - repetitions: 1\n        path: {leaf}\n",
        encoding="utf-8",
    )
    with pytest.raises(UnreadableDatasetError, match="my_project.readers.SecretChat") as caught:
        get_packing_loader(blend, PackingConfig(seq_length=1024, num_workers=0, repeat=False), processor)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("command", [["inspect"], ["plan", "--config", "CONFIG", "--out", "OUT"]])
def test_the_cli_refuses_an_unreadable_dataset_with_exit_2_and_one_line(small_dataset, tmp_path, capsys, command):
    from energon_pack.cli import main

    dataset = _with_yaml(small_dataset, tmp_path / "ds", "__module__: my_project.readers\n__class__: SecretChat\n")
    (tmp_path / "packing.yaml").write_text("seq_length: 1024\n", encoding="utf-8")
    argv = [part.replace("CONFIG", str(tmp_path / "packing.yaml")).replace("OUT", str(tmp_path / "a.plan")) for part in command]
    assert main([argv[0], str(dataset), *argv[1:]]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "my_project.readers.SecretChat" in err and "fix:" in err
