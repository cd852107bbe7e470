"""Energon's built-in sample types -> our record form: the documented defaults (pure, no loader)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from megatron.energon import (
    CaptioningSample,
    InterleavedSample,
    MultiChoiceVQASample,
    OCRSample,
    SimilarityInterleavedSample,
    TextSample,
    VidQASample,
    VQASample,
)

from energon_pack.errors import BadSampleError
from energon_pack.formats.energon_types import (
    DESCRIBE_IMAGE,
    MULTIPLE_CHOICE_INSTRUCTION,
    READ_TEXT,
    best_answer,
    captioning_record,
    default_conversion,
    interleaved_record,
    interleaved_turns,
    multichoice_vqa_record,
    ocr_record,
    similarity_interleaved_record,
    text_record,
    vidqa_record,
    vqa_record,
)

BASE = dict(__key__="k", __restore_key__=(), __subflavors__=None, __sources__=None)
IMG, IMG2, VID = b"\xff\xd8jpeg-1", b"\x89PNG-2", b"\x00\x00\x00\x18ftypmp42"


def text(value: str) -> dict:
    return {"type": "text", "text": value}


def turn(role: str, *parts: dict) -> dict:
    return {"role": role, "content": list(parts)}


IMAGE, VIDEO = {"type": "image"}, {"type": "video"}


def test_captioning_default():
    record = captioning_record(CaptioningSample(**BASE, image=IMG, caption="A cat."))
    assert record == {
        "conversation": [turn("user", IMAGE, text(DESCRIBE_IMAGE)), turn("assistant", text("A cat."))],
        "images": [IMG],
        "videos": [],
    }


def test_captioning_caption_bytes_are_decoded_and_bad_utf8_is_a_skip():
    assert captioning_record(CaptioningSample(**BASE, image=IMG, caption="Ä".encode()))["conversation"][1] == turn(
        "assistant", text("Ä")
    )
    with pytest.raises(BadSampleError) as err:
        captioning_record(CaptioningSample(**BASE, image=IMG, caption=b"\xff\xfe"))
    assert err.value.reason == "non_utf8_text" and "CaptioningSample.caption" in str(err.value)


@pytest.mark.parametrize("decoded", [torch.zeros(3, 4, 4), np.zeros((4, 4, 3), np.uint8)])
def test_decoded_pixels_are_refused(decoded):
    with pytest.raises(BadSampleError) as err:
        captioning_record(CaptioningSample(**BASE, image=decoded, caption="x"))
    assert err.value.reason == "decoded_media" and "CaptioningSample.image" in str(err.value)


def test_vqa_default_takes_the_highest_weight():
    sample = VQASample(**BASE, image=IMG, context="Color?", answers=["red", "blue", "green"],
                       answer_weights=torch.tensor([0.2, 0.7, 0.1]))
    assert vqa_record(sample) == {
        "conversation": [turn("user", IMAGE, text("Color?")), turn("assistant", text("blue"))],
        "images": [IMG],
        "videos": [],
    }


@pytest.mark.parametrize(
    "answers, weights, expected",
    [
        (["a", "b", "c"], [0.2, 0.5, 0.5], "b"),  # first on ties
        (["a", "b"], None, "a"),  # no weights: the first
        (["a", "b"], np.array([1, 3]), "b"),
        (["only"], torch.tensor([0.0]), "only"),
    ],
)
def test_best_answer(answers, weights, expected):
    assert best_answer(answers, weights, what="VQASample") == expected


@given(st.lists(st.floats(-10, 10, allow_nan=False), min_size=1, max_size=8))
@settings(max_examples=60, deadline=None)
def test_best_answer_is_the_first_maximum(weights):
    answers = [f"a{i}" for i in range(len(weights))]
    assert best_answer(answers, weights, what="VQASample") == answers[weights.index(max(weights))]


def test_vqa_without_answers_or_with_mismatched_weights_is_a_skip():
    with pytest.raises(BadSampleError) as err:
        vqa_record(VQASample(**BASE, image=IMG, context="Q?"))
    assert err.value.reason == "no_assistant_turn"
    with pytest.raises(BadSampleError) as err:
        vqa_record(VQASample(**BASE, image=IMG, context="Q?", answers=["a", "b"], answer_weights=[1.0]))
    assert err.value.reason == "malformed_sample" and "2 answers but 1 answer_weights" in str(err.value)


def test_vidqa_default():
    sample = VidQASample(**BASE, video=VID, context="What happens?", answers=["A ball rolls.", "x"],
                         answer_weights=[0.9, 0.1])
    assert vidqa_record(sample) == {
        "conversation": [turn("user", VIDEO, text("What happens?")), turn("assistant", text("A ball rolls."))],
        "images": [],
        "videos": [VID],
    }


def test_multichoice_default_answers_with_the_letter():
    sample = MultiChoiceVQASample(**BASE, image=IMG, context="Which animal?", choices=["cat", "dog", "eel"],
                                  correct_choice_idx=1)
    prompt = f"Which animal?\nA. cat\nB. dog\nC. eel\n{MULTIPLE_CHOICE_INSTRUCTION}"
    assert multichoice_vqa_record(sample)["conversation"] == [
        turn("user", IMAGE, text(prompt)), turn("assistant", text("B"))
    ]


@pytest.mark.parametrize("choices, index, reason", [(None, 0, "no_assistant_turn"), (["a"], 1, "malformed_sample"),
                                                     (["a", 3], 0, "malformed_sample")])
def test_multichoice_bad_choices_are_skips(choices, index, reason):
    sample = MultiChoiceVQASample(**BASE, image=IMG, context="Q", choices=choices, correct_choice_idx=index)
    with pytest.raises(BadSampleError) as err:
        multichoice_vqa_record(sample)
    assert err.value.reason == reason


def test_ocr_default():
    record = ocr_record(OCRSample(**BASE, image=IMG, text="STOP", lines_text=["STOP"]))
    assert record["conversation"] == [turn("user", IMAGE, text(READ_TEXT)), turn("assistant", text("STOP"))]
    assert record["images"] == [IMG]


def test_text_default_is_one_assistant_message():
    assert text_record(TextSample(**BASE, text="Once upon a time.")) == {
        "conversation": [turn("assistant", text("Once upon a time."))], "images": [], "videos": []
    }
    with pytest.raises(BadSampleError) as err:
        text_record(TextSample(**BASE, text=""))
    assert err.value.reason == "no_assistant_turn"


def test_interleaved_turns():
    record = interleaved_record(
        InterleavedSample(**BASE, sequence=["Look:", IMG, "A cat.", "It sleeps.", IMG2, "A dog."])
    )
    assert record["conversation"] == [
        turn("user", text("Look:"), IMAGE),
        turn("assistant", text("A cat.\nIt sleeps.")),
        turn("user", IMAGE),
        turn("assistant", text("A dog.")),
    ]
    assert record["images"] == [IMG, IMG2]


def test_interleaved_without_images_is_one_assistant_turn():
    record = interleaved_turns(["One.", "Two."], what="InterleavedSample")
    assert record["conversation"] == [turn("assistant", text("One.\nTwo."))]


@given(st.lists(st.one_of(st.sampled_from(["t1", "t2"]), st.sampled_from([IMG, IMG2])), min_size=1, max_size=10))
@settings(max_examples=80, deadline=None)
def test_interleaved_keeps_every_item_in_order(items):
    try:
        record = interleaved_turns(items, what="InterleavedSample")
    except BadSampleError as err:  # only when no text follows any image
        assert err.reason == "no_assistant_turn"
        return
    assert record["images"] == [item for item in items if isinstance(item, bytes)]
    flat = [part for message in record["conversation"] for part in message["content"]]
    rebuilt = []
    for part in flat:
        rebuilt.extend(part["text"].split("\n") if part["type"] == "text" else ["<image>"])
    assert rebuilt == [item if isinstance(item, str) else "<image>" for item in items]
    roles = [message["role"] for message in record["conversation"]]
    assert all(a != b for a, b in zip(roles, roles[1:]))  # turns alternate
    for message in record["conversation"]:
        assert message["role"] == "user" or all(part["type"] == "text" for part in message["content"])


def test_similarity_interleaved_places_images_before_their_text():
    sample = SimilarityInterleavedSample(**BASE, images=[IMG, IMG2], texts=["A cat.", "A dog."],
                                         matched_text_indices=[1, 0])
    record = similarity_interleaved_record(sample)
    assert record["conversation"] == [
        turn("user", IMAGE), turn("assistant", text("A cat.")), turn("user", IMAGE), turn("assistant", text("A dog."))
    ]
    assert record["images"] == [IMG2, IMG]


def test_similarity_interleaved_uses_the_similarity_matrix_then_all_images_first():
    by_similarity = SimilarityInterleavedSample(**BASE, images=[IMG, IMG2], texts=["A.", "B."],
                                                similarity_matrix=torch.tensor([[0.1, 0.9], [0.8, 0.2]]))
    assert similarity_interleaved_record(by_similarity)["images"] == [IMG2, IMG]
    unmatched = SimilarityInterleavedSample(**BASE, images=[IMG, IMG2], texts=["A.", "B."])
    assert similarity_interleaved_record(unmatched)["conversation"] == [
        turn("user", IMAGE, IMAGE), turn("assistant", text("A.\nB."))
    ]
    bad = SimilarityInterleavedSample(**BASE, images=[IMG], texts=["A."], matched_text_indices=[3])
    with pytest.raises(BadSampleError) as err:
        similarity_interleaved_record(bad)
    assert err.value.reason == "malformed_sample"


def test_default_conversion_by_type_and_subclass():
    class MyCaption(CaptioningSample):
        pass

    assert default_conversion(VQASample) is vqa_record
    assert default_conversion(MyCaption) is captioning_record
    assert default_conversion(dict) is None
