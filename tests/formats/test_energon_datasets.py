"""Datasets of Energon's built-in sample types and crude datasets, written as Energon's users write
them (``energon prepare``), read in place by ``get_packing_loader`` (docs/foreign_datasets.md)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from energon_pack import PackingConfig, get_packing_loader
from energon_pack.formats.energon_types import DESCRIBE_IMAGE
from energon_pack.formats.sample_mapping import SampleMappingError
from energon_pack.identity import ResumeMismatchError
from tests.support.energon_datasets import (
    VQA_SAMPLE_LOADER,
    aux_metadataset,
    captioning_samples,
    cook_qa,
    energon_prepare,
    epochized_blend,
    make_aux_datasets,
    make_captioning_dataset,
    make_crude_dataset,
    make_type_dataset,
    make_vqa_dataset,
    qa_crude_samples,
    vqa_samples,
    write_shards,
)
from tests.support.hf_reference import hf_reference

ENERGON_TYPES = (
    "CaptioningSample", "VQASample", "VidQASample", "MultiChoiceVQASample",
    "OCRSample", "TextSample", "InterleavedSample", "SimilarityInterleavedSample",
)


def _config(**overrides) -> PackingConfig:
    return PackingConfig(**{"seq_length": 4096, "num_workers": 0, "repeat": False, **overrides})


def _rows(path, processor, **kwargs) -> tuple[list[dict], dict]:
    with get_packing_loader(path, kwargs.pop("config", _config()), processor, **kwargs) as loader:
        rows = list(loader)
        return rows, loader.stats()


def _keys(rows: list[dict]) -> list[str]:
    return sorted(key for row in rows for key in row["__keys__"])


@pytest.fixture(scope="module")
def type_datasets(tmp_path_factory) -> dict[str, tuple[Path, list[dict]]]:
    root = tmp_path_factory.mktemp("energon_types")
    return {name: (root / name, make_type_dataset(root / name, name)) for name in ENERGON_TYPES}


@pytest.mark.parametrize("sample_type", ENERGON_TYPES)
def test_each_builtin_sample_type_loads_with_its_default(type_datasets, processor, sample_type):
    path, samples = type_datasets[sample_type]
    rows, stats = _rows(path, processor)
    assert _keys(rows) == sorted(sample["__key__"] for sample in samples)
    assert stats["skipped"] == {}
    trained = processor.tokenizer.decode(rows[0]["input_ids"][0][rows[0]["loss_mask"][0] > 0])
    assert trained.strip(), f"{sample_type}: nothing trained"


def _single_rows(path, processor) -> dict[str, dict]:
    """One row per sample (``max_segments=1``), float32 pixels, by key."""
    rows, stats = _rows(path, processor, config=_config(max_segments=1, pixel_dtype="float32"))
    assert stats["skipped"] == {}
    return {row["__keys__"][0]: row for row in rows}


def _assert_row_equals_hf(row: dict, reference, *, processor=None, answer: str | None = None) -> None:
    """Ids, grids and pixels of the row's first segment equal the HF processor's; with ``answer``,
    the targets carrying loss are the answer's tokens and ``<|im_end|>``."""
    length = int(row["cu_seqlens_q"][1])
    assert torch.equal(row["input_ids"][0, :length], reference["input_ids"][0])
    if answer is not None:
        trained = row["labels"][0, :length][row["loss_mask"][0, :length] > 0]
        assert processor.tokenizer.decode(trained) == answer + "<|im_end|>"
    visual = row["visual_inputs"]
    assert torch.equal(visual.image_grid_thw, reference["image_grid_thw"])
    assert torch.allclose(visual.pixel_values, reference["pixel_values"], atol=1e-6)


def _user_image_turns(prompt: str, answer: str) -> list[dict]:
    """The documented conversation, written out here independently of the code under test."""
    return [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]},
        {"role": "assistant", "content": [{"type": "text", "text": answer}]},
    ]


def test_captioning_rows_equal_the_hf_processor_on_the_documented_conversation(tmp_path, processor):
    samples = make_captioning_dataset(tmp_path / "cap", 4)
    rows = _single_rows(tmp_path / "cap", processor)
    for sample in samples:
        messages = _user_image_turns("Describe the image.", sample["txt"])
        reference = hf_reference(processor, messages, [sample["jpg"]], [])
        _assert_row_equals_hf(rows[sample["__key__"]], reference, processor=processor, answer=sample["txt"])
    assert DESCRIBE_IMAGE == "Describe the image."


def test_vqa_rows_equal_the_hf_processor_with_the_highest_weighted_answer(tmp_path, processor):
    samples = make_vqa_dataset(tmp_path / "vqa", 4)
    rows = _single_rows(tmp_path / "vqa", processor)
    for sample in samples:
        qa = sample["json"]
        weights = qa["weights"]
        answer = qa["answers"][weights.index(max(weights))]  # the first of the highest
        messages = _user_image_turns(qa["question"], answer)
        reference = hf_reference(processor, messages, [sample["jpg"]], [])
        _assert_row_equals_hf(rows[sample["__key__"]], reference, processor=processor, answer=answer)


def test_a_user_mapping_replaces_the_default_and_enters_the_fingerprint(type_datasets, processor):
    path, samples = type_datasets["CaptioningSample"]

    def caption_as_title(sample):
        return {"conversation": [{"role": "user", "content": "<image>Title?"},
                                 {"role": "assistant", "content": sample.caption.upper()}],
                "images": [sample.image]}

    with get_packing_loader(path, _config(), processor, sample_mapping=caption_as_title) as loader:
        rows = list(loader)
        assert loader.fingerprint["sample_mapping"].endswith(":test_a_user_mapping_replaces_the_default_and_enters_the_fingerprint.<locals>.caption_as_title")
    text = processor.tokenizer.decode(rows[0]["input_ids"][0])
    assert "Title?" in text and samples[0]["txt"].upper() in text and "Describe the image." not in text
    with get_packing_loader(path, _config(), processor) as plain:
        assert "sample_mapping" not in plain.fingerprint


def test_a_mapping_named_in_the_config_is_imported(type_datasets, processor):
    path, _ = type_datasets["TextSample"]
    rows, _ = _rows(path, processor, config=_config(sample_mapping="tests.support.energon_datasets:text_as_question"))
    assert "Repeat after me" in processor.tokenizer.decode(rows[0]["input_ids"][0])
    with pytest.raises(SampleMappingError, match="no_such_module"):
        get_packing_loader(path, _config(sample_mapping="no_such_module:f"), processor)


def test_an_unmappable_energon_type_is_refused_at_start_in_one_line(tmp_path, processor):
    write_shards(tmp_path / "cls", [{"__key__": "a", "jpg": b"x", "cls": "3"}])
    energon_prepare(tmp_path / "cls", sample_type="ImageClassificationSample", field_map={"image": "jpg", "label": "cls"})
    with pytest.raises(SampleMappingError) as caught:
        get_packing_loader(tmp_path / "cls", _config(), processor)
    message = str(caught.value)
    assert "\n" not in message and "ImageClassificationSample" in message and "fix: write a function" in message


def test_a_config_sample_mapping_must_name_module_and_function():
    with pytest.raises(ValueError, match="sample_mapping='my_pkg.maps': must be 'module:function'"):
        _config(sample_mapping="my_pkg.maps")


# --- crude datasets ---------------------------------------------------------------------------


def test_a_crude_dataset_loads_with_the_users_cooker(tmp_path, processor):
    samples = make_crude_dataset(tmp_path / "crude")
    rows, stats = _rows(tmp_path / "crude", processor, config=_config(max_segments=1, pixel_dtype="float32"),
                        sample_mapping="tests.support.energon_datasets:cook_qa")
    assert stats["skipped"] == {} and _keys(rows) == sorted(s["__key__"] for s in samples)
    by_key = {row["__keys__"][0]: row for row in rows}
    for sample in samples:
        messages = _user_image_turns(sample["json"]["q"], sample["json"]["a"])
        _assert_row_equals_hf(by_key[sample["__key__"]], hf_reference(processor, messages, [sample["jpg"]], []))


def test_a_crude_dataset_without_a_cooker_is_refused_at_start(tmp_path, processor):
    make_crude_dataset(tmp_path / "crude", 1)
    with pytest.raises(SampleMappingError) as caught:
        get_packing_loader(tmp_path / "crude", _config(), processor)
    assert "\n" not in str(caught.value) and "CrudeWebdataset" in str(caught.value)


@pytest.mark.slow
def test_a_crude_datasets_aux_datasets_reach_its_cooker_as_in_energon(tmp_path, processor):
    """A metadataset entry's ``aux:`` (an Energon dataset and a ``filesystem://`` folder): the cooker,
    in a worker process, gets them as keyword arguments, and ``primary`` as it asks
    (``@cooker(need_primary=True)``); the rows are the HF processor's."""
    samples = make_aux_datasets(tmp_path)
    (tmp_path / "aux.yaml").write_text(aux_metadataset("tests.support.energon_datasets:cook_with_primary"), encoding="utf-8")
    rows, stats = _rows(tmp_path / "aux.yaml", processor, config=_config(max_segments=1, pixel_dtype="float32", num_workers=1))
    assert stats["skipped"] == {} and _keys(rows) == [s["__key__"] for s in samples]
    by_key = {row["__keys__"][0]: row for row in rows}
    for sample in samples:
        qa = sample["json"]
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": qa["q"]}]},
                    {"role": "assistant", "content": [{"type": "text", "text": qa["a"]}]}]
        _assert_row_equals_hf(by_key[sample["__key__"]], hf_reference(processor, messages, sample["images"], []))
    from energon_pack.data.inspect_dataset import iter_prepared  # inspect and simulate read it the same way

    read = [(raw.__key__, raw.invalid_reason, len(raw.images)) for raw, _ in iter_prepared(tmp_path / "aux.yaml", processor=processor)]
    assert sorted(read) == [(s["__key__"], None, 2) for s in samples]


@pytest.mark.slow
def test_aux_datasets_are_refused_with_the_reason_where_energon_gives_them_to_no_cooker(tmp_path, processor):
    from energon_pack.errors import UsageError

    make_aux_datasets(tmp_path, 1)
    (tmp_path / "cache.yaml").write_text(aux_metadataset("tests.support.energon_datasets:cook_with_cache"), encoding="utf-8")
    with pytest.raises(SampleMappingError, match=r"need_cache=True; .*fix: drop need_cache"):
        get_packing_loader(tmp_path / "cache.yaml", _config(), processor)
    make_captioning_dataset(tmp_path / "captions", 2)
    (tmp_path / "captions.yaml").write_text(aux_metadataset(path="./captions"), encoding="utf-8")
    with pytest.raises(UsageError) as caught:
        get_packing_loader(tmp_path / "captions.yaml", _config(), processor)
    assert "\n" not in str(caught.value) and "only to a crude dataset (CrudeWebdataset)" in str(caught.value)
    assert "fix: remove aux: from its metadataset entry" in str(caught.value)


# --- lost samples are counted -------------------------------------------------------------------


def test_every_lost_foreign_sample_is_counted_by_reason(tmp_path, processor):
    captions = captioning_samples(3)
    captions[1]["txt"] = b"\xff\xfe not UTF-8"
    write_shards(tmp_path / "cap", captions)
    energon_prepare(tmp_path / "cap", sample_type="CaptioningSample", field_map={"image": "jpg", "caption": "txt"})
    questions = vqa_samples(3)
    del questions[0]["json"]["answers"]  # the dataset's own sample loader fails on it
    questions[2]["json"]["answers"] = []  # nothing to train on
    write_shards(tmp_path / "vqa", questions)
    energon_prepare(tmp_path / "vqa", sample_type="VQASample", sample_loader=VQA_SAMPLE_LOADER)
    crude = qa_crude_samples(2)
    crude[0]["json"] = {"q": "no answer"}  # the cooker raises KeyError
    write_shards(tmp_path / "crude", crude)
    energon_prepare(tmp_path / "crude", sample_type="CrudeWebdataset")

    rows, stats = _rows(tmp_path / "cap", processor)
    assert _keys(rows) == ["cap000", "cap002"] and stats["skipped"] == {"non_utf8_text": 1}
    rows, stats = _rows(tmp_path / "vqa", processor)
    assert _keys(rows) == ["vqa001"] and stats["skipped"] == {"malformed_sample": 1, "no_assistant_turn": 1}
    rows, stats = _rows(tmp_path / "crude", processor, sample_mapping=cook_qa)
    assert _keys(rows) == ["crude001"] and stats["skipped"] == {"sample_mapping_error": 1}


# --- metadatasets -------------------------------------------------------------------------------


def test_a_metadataset_blends_ours_bridge_captions_and_crude_in_one_loader(tmp_path, processor):
    from energon_pack.data.synthetic import SyntheticSpec, make_synthetic_dataset
    from tests.support.bridge_datasets import TUTORIAL_YAML, tutorial_samples, write_bridge_dataset

    spec = SyntheticSpec(max_image_side=96, max_video_seconds=1.0, max_video_side=32)
    ours = make_synthetic_dataset(tmp_path / "ours", 6, seed=5, spec=spec, samples_per_shard=6)
    bridge = tutorial_samples()
    write_bridge_dataset(tmp_path / "bridge", bridge, TUTORIAL_YAML)
    captions = make_captioning_dataset(tmp_path / "captions", 4)
    crude = make_crude_dataset(tmp_path / "crude", 3)
    (tmp_path / "blend.yaml").write_text(epochized_blend(
        ("./ours/dataset", {"source": "ours"}),
        ("./bridge", {"source": "bridge"}),
        ("./captions", {"source": "captions"}),
        ("./crude", {"source": "crude", "sample_mapping": "tests.support.energon_datasets:cook_qa"}),
    ), encoding="utf-8")

    rows, stats = _rows(tmp_path / "blend.yaml", processor, config=_config(buffer_size=4))
    sources = {key: flavors["source"] for row in rows for key, flavors in zip(row["__keys__"], row["__subflavors__"])}
    assert all(len(row["__keys__"]) == len(row["__subflavors__"]) for row in rows)
    expected = {**{s["__key__"]: "bridge" for s in bridge}, **{s["__key__"]: "captions" for s in captions},
                **{s["__key__"]: "crude" for s in crude}}
    assert {key: source for key, source in sources.items() if source != "ours"} == expected
    assert sum(source == "ours" for source in sources.values()) + stats["skipped_total"] == ours.written
    assert stats["samples_in"] == ours.written + len(bridge) + len(captions) + len(crude)


# --- exact resume -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def foreign_blend(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("foreign_blend")
    make_captioning_dataset(root / "captions", 10)
    make_vqa_dataset(root / "vqa", 8)
    make_crude_dataset(root / "crude", 6)
    (root / "blend.yaml").write_text(epochized_blend(
        ("./captions", None), ("./vqa", None), ("./crude", {"sample_mapping": "tests.support.energon_datasets:cook_qa"})
    ), encoding="utf-8")
    return root / "blend.yaml"


@pytest.mark.slow
def test_exact_resume_on_foreign_datasets_with_two_workers(foreign_blend, processor):
    from tests.support.loader_runs import row_digest

    config = _config(seq_length=256, buffer_size=4, max_wait_rounds=3, num_workers=2)
    eager = dict(checkpoint_every_sec=0, checkpoint_every_min_n_samples=1)
    with get_packing_loader(foreign_blend, config, processor, **eager) as loader:
        reference = [row_digest(row) for row in loader]
        assert loader.stats()["skipped"] == {}
    assert len({key for keys, _ in reference for key in keys}) == 10 + 8 + 6 and len(reference) >= 4
    for save_after in (1, len(reference) // 2, len(reference) - 1):
        with get_packing_loader(foreign_blend, config, processor, **eager) as loader:
            iterator = iter(loader)
            for _ in range(save_after):
                next(iterator)
            state = pickle.loads(pickle.dumps(loader.save_state_rank()))
            del iterator
        with get_packing_loader(foreign_blend, config, processor, **eager) as resumed:
            resumed.restore_state_rank(state)
            assert [row_digest(row) for row in resumed] == reference[save_after:], f"save after row {save_after}"


def test_a_state_saved_under_one_mapping_does_not_resume_under_another(type_datasets, processor):
    path, _ = type_datasets["CaptioningSample"]
    with get_packing_loader(path, _config(), processor, sample_mapping="tests.support.energon_datasets:caption_as_question") as loader:
        next(iter(loader))
        state = loader.save_state_rank()
    for other in ({}, {"sample_mapping": "tests.support.energon_datasets:text_as_question"}):
        with get_packing_loader(path, _config(), processor, **other) as resumed:
            with pytest.raises(ResumeMismatchError, match="sample_mapping"):
                resumed.restore_state_rank(state)


def test_a_foreign_row_is_rebuilt_from_its_restore_key(type_datasets, processor):
    path, _ = type_datasets["VQASample"]
    with get_packing_loader(path, _config(), processor) as loader:
        rows = list(loader)
        from tests.support.loader_runs import row_digest

        assert row_digest(loader.restore_sample(rows[0]["__restore_key__"])) == row_digest(rows[0])


@pytest.mark.parametrize("sample_type", ["CaptioningSample", "VQASample"])
def test_a_dataset_yaml_naming_a_deprecated_class_reads_as_its_sample_type(type_datasets, tmp_path, processor, sample_type):
    import shutil

    import yaml

    source, samples = type_datasets[sample_type]
    path = Path(shutil.copytree(source, tmp_path / "old"))
    meta = path / ".nv-meta" / "dataset.yaml"
    config = yaml.safe_load(meta.read_text(encoding="utf-8"))
    del config["sample_type"]
    deprecated = {"CaptioningSample": "CaptioningWebdataset", "VQASample": "VQAWebdataset"}[sample_type]
    meta.write_text(yaml.safe_dump({"__module__": "megatron.energon", "__class__": deprecated, **config}), encoding="utf-8")
    old_rows, old_stats = _rows(path, processor)
    new_rows, _ = _rows(source, processor)
    assert old_stats["skipped"] == {} and _keys(old_rows) == sorted(s["__key__"] for s in samples)
    assert [row["input_ids"].tolist() for row in old_rows] == [row["input_ids"].tolist() for row in new_rows]
