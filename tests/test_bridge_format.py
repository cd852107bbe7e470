"""Megatron-Bridge-format datasets read in place, without Megatron-Bridge (``formats.bridge_chatml``).

Datasets are written the way Bridge's tutorial and examples write them (tests/bridge_datasets.py):
text only, one image, several images, a frame-list video, ``role``/``content`` and ``from``/``value``
turns. Our rows equal the Hugging Face processor on the conversation Bridge's normalisation gives
(media before the text of their turn); untrusted pickles run nothing and are counted skips.
"""

from __future__ import annotations

import importlib.util
import json
import pickle
from pathlib import Path

import pytest
import torch

from energon_pack import PackingConfig, get_packing_loader
from energon_pack.errors import BadSampleError, UsageError
from energon_pack.formats.bridge_chatml import bridge_fields, check_field_map, is_bridge_dataset_config
from energon_pack.formats.safe_pickle import load_plain_pickle
from tests.bridge_datasets import (
    PICKLED_YAML,
    TUTORIAL_YAML,
    encoded_image,
    pickled_samples,
    tutorial_samples,
    write_bridge_dataset,
)
from tests.hf_reference import hf_reference

PICKLED_MAP = {"imgs": "jpgs", "videos": "videos", "conversation": "json"}


class _Touch:
    """A pickle payload that would create ``path`` when loaded by plain ``pickle.loads``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def _fields(parts: dict, field_map: dict = PICKLED_MAP) -> dict:
    return bridge_fields(parts, field_map=field_map)


def test_megatron_bridge_is_not_installed_in_the_main_suite():
    assert importlib.util.find_spec("megatron.bridge") is None


@pytest.mark.parametrize(
    "module",
    ["megatron.bridge.data.energon.task_encoder_utils", "megatron.bridge.models.qwen_vl.data.energon",
     "megatron.bridge.recipes.qwen_vl.data.energon.task_encoder"],
)
def test_every_module_path_of_chatmlwebdataset_is_recognised(module):
    assert is_bridge_dataset_config({"__module__": module, "__class__": "ChatMLWebdataset", "field_map": {}})
    assert not is_bridge_dataset_config({"__module__": "other.module", "__class__": "ChatMLWebdataset"})


def test_the_worked_example_keeps_the_space_around_a_placeholder():
    image = encoded_image(1, 32, 32)
    fields = _fields({
        "jpgs": pickle.dumps([image]), "videos": pickle.dumps([]),
        "json": json.dumps([{"from": "human", "value": "What is <image> this?"}, {"from": "gpt", "value": "A cat."}]).encode(),
    })
    assert fields["invalid_reason"] is None
    assert fields["conversation"] == [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]},
    ]
    assert fields["images"] == [image] and fields["videos"] == []


def test_typed_content_puts_media_before_text_like_bridge():
    fields = _fields(
        {"image.png": encoded_image(2, 28, 28, "PNG"), "conversation.json": json.dumps({"messages": [
            {"role": "user", "content": [{"type": "text", "text": "Look:"}, {"type": "image"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Seen."}]},
        ]}).encode()},
        {"imgs": "image.png", "conversation": "conversation.json"},
    )
    assert [part["type"] for part in fields["conversation"][0]["content"]] == ["image", "text"]


def test_text_only_samples_carry_empty_pickled_lists():
    fields = _fields({"jpgs": pickle.dumps([]), "videos": pickle.dumps([]), "json": b'[{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo"}]'})
    assert fields["invalid_reason"] is None and fields["images"] == [] and fields["videos"] == []


def test_a_pickle_that_would_run_code_runs_nothing_and_is_unsafe(tmp_path):
    marker = tmp_path / "executed"
    payload = pickle.dumps([_Touch(marker)])
    fields = _fields({"jpgs": payload, "videos": pickle.dumps([]), "json": b'[{"from": "human", "value": "<image>"}, {"from": "gpt", "value": "x"}]'})
    assert fields["invalid_reason"] == "unsafe_pickle" and "pathlib" in fields["invalid_detail"]
    assert not marker.exists()


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (pickle.dumps([b"abc"])[:-3], "truncated_pickle"),
        (b"not a pickle at all", "truncated_pickle"),
        (pickle.dumps([b"x" * 400]), "member_too_large"),
        (pickle.dumps(__import__("numpy").zeros((2, 2), dtype="uint8")), "pickled_pixel_arrays"),
        (pickle.dumps({"not": "a list"}), "malformed_media_list"),
    ],
)
def test_bad_pickled_members_are_skips_with_their_own_reason(data, reason):
    fields = bridge_fields(
        {"jpgs": data, "videos": pickle.dumps([]), "json": b'[{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo"}]'},
        field_map=PICKLED_MAP, max_pickle_bytes=300,
    )
    assert fields["invalid_reason"] == reason, fields["invalid_detail"]


@pytest.mark.parametrize(
    ("parts", "reason"),
    [
        ({"jpgs": pickle.dumps([]), "json": b'[{"from": "human", "value": "<image>Hi"}, {"from": "gpt", "value": "Yo"}]'}, "placeholder_mismatch"),
        ({"jpgs": pickle.dumps([]), "json": b'[{"from": "human", "value": "Hi"}]'}, "no_assistant_turn"),
        ({"jpgs": pickle.dumps([]), "json": b"\xff\xfe"}, "non_utf8_text"),
        ({"jpgs": pickle.dumps([])}, "malformed_conversation"),
        ({"json": b'{"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo"}], "tools": [{"name": "f"}]}'}, "unsupported_tools"),
    ],
)
def test_bad_conversations_are_counted_reasons(parts, reason):
    assert _fields(parts)["invalid_reason"] == reason


def test_audio_is_a_counted_skip():
    field_map = {"conversation": "json", "audio": "audio.wav"}
    fields = bridge_fields({"json": b'[{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo"}]', "audio.wav": b"RIFF"}, field_map=field_map)
    assert fields["invalid_reason"] == "unsupported_audio"


def test_the_restricted_unpickler_admits_plain_values_of_every_protocol():
    value = [b"\xff\xd8", bytearray(b"ab"), "s", 1, 2.5, (1, 2), {"k": {1, 2}}, frozenset({3}), None, True, 1j]
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        assert load_plain_pickle(pickle.dumps(value, protocol=protocol), what="jpgs") == value


@pytest.mark.parametrize(
    ("field_map", "needle"),
    [
        ({"imgs": "jpgs"}, "no conversation"),
        ({"conversation": "json", "captions": "txt"}, "unknown fields ['captions']"),
        ({"conversation": "json", "videos": "jpgs"}, "one-frame video"),
        ({"conversation": "json", "imgs": "image.txt"}, "cannot read as imgs"),
    ],
)
def test_an_unreadable_field_map_is_refused_in_one_line(field_map, needle):
    with pytest.raises(UsageError) as caught:
        check_field_map(field_map)
    assert needle in str(caught.value) and "fix:" in str(caught.value) and "\n" not in str(caught.value)


def _rows(path: Path, processor, **config) -> tuple[list[dict], dict]:
    settings = {"seq_length": 2048, "buffer_size": 4, "num_workers": 0, "repeat": False, "pixel_dtype": "float32", **config}
    with get_packing_loader(path, PackingConfig(**settings), processor) as loader:
        rows = list(loader)
        return rows, loader.stats()


def row_segments(row: dict) -> dict[str, torch.Tensor]:
    """Each sample's real input ids in a THD row, by key (cu_seqlens_q: real lengths, _padded: starts)."""
    lengths = row["cu_seqlens_q"].diff().tolist()
    starts = row["cu_seqlens_q_padded"].tolist()
    return {key: row["input_ids"][0, start : start + length] for key, start, length in zip(row["__keys__"], starts, lengths)}


def test_bridge_datasets_load_with_rows_equal_to_the_hf_processor(tmp_path, processor):
    """Tutorial and pickled layouts; every sample's ids equal HF on Bridge's normalised conversation."""
    expected = {}
    for layout, samples in (("tutorial", tutorial_samples()), ("pickled", pickled_samples(with_video=False))):
        for sample in samples:
            images = [sample["image.png"]] if layout == "tutorial" else pickle.loads(sample["jpgs"])
            fields = bridge_fields(dict(sample), field_map=(
                {"imgs": "image.png", "conversation": "conversation.json"} if layout == "tutorial" else PICKLED_MAP))
            reference = hf_reference(processor, fields["conversation"], images, [])
            expected[sample["__key__"]] = reference["input_ids"][0]
    tutorial = write_bridge_dataset(tmp_path / "tutorial", tutorial_samples(), TUTORIAL_YAML)
    pickled = write_bridge_dataset(tmp_path / "pickled", pickled_samples(with_video=False), PICKLED_YAML)
    seen = {}
    for path in (tutorial, pickled):
        rows, stats = _rows(path, processor)
        assert stats["skipped"] == {}, stats["skipped"]
        for row in rows:
            for key, segment in row_segments(row).items():
                seen[key] = segment
    assert sorted(seen) == sorted(expected)
    for key, ids in expected.items():
        assert torch.equal(seen[key], ids), key
