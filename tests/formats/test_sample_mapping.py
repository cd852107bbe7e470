"""Our record form (``formats.record``), sample mappings (``formats.sample_mapping``) and foreign
members (``formats.parts``): pure, no loader."""

from __future__ import annotations

import json
import os.path

import pytest
import torch

from energon_pack.core.samples import QwenVLChatSample
from energon_pack.errors import BadSampleError
from energon_pack.formats.parts import decode_part, decode_parts
from energon_pack.formats.record import chat_fields, record_fields
from energon_pack.formats.sample_mapping import (
    SampleMappingError,
    current_loader_mapping,
    dataset_mapping,
    loader_sample_mapping,
    mapping_name,
    resolve_mapping,
)

IMG = b"\xff\xd8jpeg"


def test_record_fields_accept_every_conversation_form():
    record = {"messages": [{"from": "human", "value": "<image>What?"}, {"from": "gpt", "value": "A cat."}], "images": [IMG]}
    assert record_fields(record) == {
        "conversation": [
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]},
        ],
        "images": [IMG],
        "videos": [],
    }
    sample = QwenVLChatSample(__key__="k", __restore_key__=(), conversation=record_fields(record)["conversation"],
                              images=[IMG], videos=[])
    assert record_fields(sample) == record_fields(record)


@pytest.mark.parametrize(
    "record, reason, words",
    [
        ("not a record", "malformed_sample", "returned a str"),
        ({"conversation": [{"role": "assistant", "content": "x"}], "image": [IMG]}, "malformed_sample", "['image']"),
        ({"conversation": [{"role": "assistant", "content": "x"}], "images": IMG}, "malformed_sample", "list of file bytes"),
        ({"images": []}, "malformed_sample", "neither 'conversation' nor 'messages'"),
        ({"conversation": [{"role": "user", "content": "<image>"}, {"role": "assistant", "content": "x"}],
          "images": [torch.zeros(3, 2, 2)]}, "decoded_media", "torch.Tensor"),
        ({"conversation": [{"role": "user", "content": "<image>"}, {"role": "assistant", "content": "x"}]},
         "placeholder_mismatch", "1 image placeholder(s) but 0"),
    ],
)
def test_a_bad_record_is_a_skip_with_its_reason(record, reason, words):
    with pytest.raises(BadSampleError) as err:
        record_fields(record)
    assert err.value.reason == reason and words in str(err.value)
    fields = chat_fields(record)
    assert fields["invalid_reason"] == reason and fields["conversation"] == []


def test_members_are_decoded_by_extension_and_media_stay_bytes():
    parts = {"__key__": "a", "jpg": IMG, "0.png": b"\x89PNG", "txt": "Ä".encode(), "json": b'{"n": [1, 2]}',
             "cls": b"7", "pyd": b"\x80\x04K\x01.", "mp4": b"\x00\x00\x00\x18ftyp"}
    assert decode_parts(parts) == {"__key__": "a", "jpg": IMG, "0.png": b"\x89PNG", "txt": "Ä", "json": {"n": [1, 2]},
                                   "cls": 7, "pyd": b"\x80\x04K\x01.", "mp4": b"\x00\x00\x00\x18ftyp"}


@pytest.mark.parametrize("name, data, reason", [("txt", b"\xff", "non_utf8_text"), ("json", b"{", "malformed_sample"),
                                                ("0.cls", b"x", "malformed_sample")])
def test_a_member_that_does_not_parse_is_a_skip(name, data, reason):
    with pytest.raises(BadSampleError) as err:
        decode_part(name, data)
    assert err.value.reason == reason and repr(name) in str(err.value)


def test_resolve_mapping_imports_module_function_and_names_it_back():
    assert resolve_mapping("os.path:join") is os.path.join
    assert resolve_mapping("json:JSONDecoder.decode") is json.JSONDecoder.decode
    assert resolve_mapping(len) is len and resolve_mapping(None) is None
    assert mapping_name(json.loads) == "json:loads"
    assert mapping_name("pkg.mod:fn") == "pkg.mod:fn"

    def local(sample):
        return sample

    assert mapping_name(local).endswith(":test_resolve_mapping_imports_module_function_and_names_it_back.<locals>.local")


@pytest.mark.parametrize("spec, words", [("json.loads", "not a callable nor 'module:function'"),
                                         ("no_such_module_x:f", "ModuleNotFoundError"),
                                         ("json:no_such_function", "AttributeError"),
                                         ("json:__doc__", "not a function")])
def test_a_bad_mapping_spec_is_one_line_naming_it(spec, words):
    with pytest.raises(SampleMappingError) as err:
        resolve_mapping(spec)
    assert words in str(err.value) and repr(spec) in str(err.value) and "\n" not in str(err.value)


def test_the_most_specific_mapping_wins():
    def loader(sample):
        return "loader"

    def default(sample):
        return "default"

    kwargs = dict(dataset="d", what="samples of type X", fix="write one")
    assert dataset_mapping({"sample_mapping": "json:loads"}, loader, default, **kwargs) is json.loads
    assert dataset_mapping({"source": "a"}, loader, default, **kwargs) is loader
    assert dataset_mapping(None, None, default, **kwargs) is default
    with pytest.raises(SampleMappingError) as err:
        dataset_mapping({}, None, None, **kwargs)
    assert "'d' holds samples of type X, which has no default conversation; fix: write one" in str(err.value)


def test_the_loader_mapping_is_set_only_inside_its_block():
    assert current_loader_mapping() is None
    with loader_sample_mapping(len):
        assert current_loader_mapping() is len
        with loader_sample_mapping(None):
            assert current_loader_mapping() is None
        assert current_loader_mapping() is len
    assert current_loader_mapping() is None
