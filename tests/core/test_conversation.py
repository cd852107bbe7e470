"""The three input forms normalise to typed messages; bad conversations are BadSampleErrors."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from energon_pack.core.conversation import (
    count_media_parts,
    decode_conversation_json,
    normalize_conversation,
    parse_record,
    split_placeholders,
)
from energon_pack.errors import BadSampleError

IMAGE, VIDEO = {"type": "image"}, {"type": "video"}


def text(value: str) -> dict[str, str]:
    return {"type": "text", "text": value}


def test_split_placeholders_keeps_text_verbatim():
    assert split_placeholders("<image>\nWhat?") == [IMAGE, text("\nWhat?")]
    assert split_placeholders("a<video>b<image><image>") == [text("a"), VIDEO, text("b"), IMAGE, IMAGE]
    assert split_placeholders("") == []
    assert split_placeholders("no media <imag>") == [text("no media <imag>")]


@given(st.lists(st.one_of(st.sampled_from(["<image>", "<video>"]), st.text(alphabet="ab \n<>ime", max_size=8)), max_size=8))
def test_split_placeholders_roundtrips(pieces):
    source = "".join(pieces)
    parts = split_placeholders(source)
    rebuilt = "".join(p["text"] if p["type"] == "text" else f"<{p['type']}>" for p in parts)
    assert rebuilt == source
    assert all(p["text"] for p in parts if p["type"] == "text")


MESSAGES_FORM = {
    "id": "a",
    "messages": [{"role": "user", "content": "<image>\nWhat is this?"}, {"role": "assistant", "content": "A cat."}],
    "images": ["rel/a.jpg"],
}
SHAREGPT_FORM = {
    "id": "a",
    "conversations": [{"from": "human", "value": "<image>\nWhat is this?"}, {"from": "gpt", "value": "A cat."}],
    "image": "rel/a.jpg",
}
TYPED_FORM = {
    "id": "a",
    "messages": [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "\nWhat is this?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]},
    ],
    "images": ["rel/a.jpg"],
}


@pytest.mark.parametrize("record", [MESSAGES_FORM, SHAREGPT_FORM, TYPED_FORM], ids=["messages", "sharegpt", "typed"])
def test_three_forms_normalise_to_the_same_typed_messages(record):
    parsed = parse_record(record)
    assert parsed.id == "a"
    assert parsed.images == ["rel/a.jpg"] and parsed.videos == []
    assert parsed.messages == [
        {"role": "user", "content": [IMAGE, text("\nWhat is this?")]},
        {"role": "assistant", "content": [text("A cat.")]},
    ]


def test_llava_video_and_system_prompt():
    record = {
        "conversations": [
            {"from": "system", "value": "Be brief."},
            {"from": "human", "value": "<video>Describe."},
            {"from": "gpt", "value": "Moving."},
        ],
        "video": ["v.mp4"],
    }
    parsed = parse_record(record)
    assert parsed.id is None and parsed.videos == ["v.mp4"]
    assert [m["role"] for m in parsed.messages] == ["system", "user", "assistant"]
    assert count_media_parts(parsed.messages) == {"image": 0, "video": 1, "audio": 0}


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        ({**MESSAGES_FORM, "images": []}, "placeholder_mismatch"),
        ({**MESSAGES_FORM, "images": ["a.jpg", "b.jpg"]}, "placeholder_mismatch"),
        ({**TYPED_FORM, "videos": ["v.mp4"]}, "placeholder_mismatch"),
        ({"messages": []}, "empty_conversation"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "no_assistant_turn"),
        ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}]}, "no_assistant_turn"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "malformed_conversation"),
        ({"messages": [{"role": "user", "content": 5}]}, "malformed_conversation"),
        ({"messages": [{"role": "user", "content": [{"type": "sound"}]}]}, "malformed_conversation"),
        ({"messages": "hello"}, "malformed_conversation"),
        ({"text": "no messages"}, "malformed_conversation"),
        (["not", "a", "mapping"], "malformed_conversation"),
        ({"messages": [{"role": "user", "content": "hi", "reasoning_content": "x"},
                       {"role": "assistant", "content": "ok"}]}, "malformed_conversation"),
        ({"messages": [{"role": "user", "content": "hi"},
                       {"role": "assistant", "content": "ok", "reasoning_content": ["x"]}]}, "malformed_conversation"),
    ],
)
def test_bad_conversations_are_bad_samples_with_a_reason(record, reason):
    with pytest.raises(BadSampleError) as err:
        parse_record(record)
    assert err.value.reason == reason


def test_decode_conversation_json_rejects_non_utf8_and_bad_json():
    messages = [{"role": "user", "content": "héllo"}, {"role": "assistant", "content": "ok"}]
    assert decode_conversation_json(json.dumps(messages).encode()) == messages
    with pytest.raises(BadSampleError) as err:
        decode_conversation_json(b'[{"role": "user", "content": "\xff\xfe"}]')
    assert err.value.reason == "non_utf8_text"
    with pytest.raises(BadSampleError) as err:
        decode_conversation_json(b"[{")
    assert err.value.reason == "malformed_conversation"


def test_typed_text_parts_are_not_split_and_empty_ones_dropped():
    typed = normalize_conversation(
        [{"role": "user", "content": [{"type": "text", "text": "<image> literal"}, {"type": "text", "text": ""}]},
         {"role": "assistant", "content": "ok"}],
        num_images=0,
        num_videos=0,
    )
    assert typed[0]["content"] == [text("<image> literal")]


def test_assistant_reasoning_content_is_kept_and_none_dropped():
    """``reasoning_content`` reaches the chat template (Qwen3.5 renders it in <think>); the prepared
    <key>.json keeps it, so it survives prepare -> loader."""
    record = {"messages": [
        {"role": "user", "content": "2+2?", "reasoning_content": None},
        {"from": "gpt", "value": "4", "reasoning_content": "two and two"},
    ]}
    parsed = parse_record(record)
    assert parsed.messages == [
        {"role": "user", "content": [text("2+2?")]},
        {"role": "assistant", "content": [text("4")], "reasoning_content": "two and two"},
    ]
    stored = decode_conversation_json(json.dumps(parsed.messages).encode())
    assert normalize_conversation(stored, num_images=0, num_videos=0) == parsed.messages
