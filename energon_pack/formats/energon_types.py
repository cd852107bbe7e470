"""Energon's built-in sample types, each turned into our record form by a documented default.

Our record form: ``{"conversation": [typed messages], "images": [bytes, ...], "videos": [bytes, ...]}``
(the fields of ``QwenVLChatSample``; typed messages as ``core.conversation`` defines them). Media
stay the compressed file bytes the shard holds: our task encoder reads Energon datasets with a
decoder that keeps media undecoded, so ``sample.image`` is JPEG/PNG/... bytes, not a tensor.

The defaults (docs/foreign_datasets.md, "Energon sample types"):

========================== ===================================================================
sample type                conversation
========================== ===================================================================
CaptioningSample           user [image, "Describe the image."], assistant caption
VQASample                  user [image, context], assistant the answer of highest weight
                           (the first on ties; the first answer without weights)
VidQASample                as VQASample with the video
MultiChoiceVQASample       user [image, context + lettered choices + instruction],
                           assistant the correct letter
OCRSample                  user [image, "Read the text in the image."], assistant text
TextSample                 assistant text (one message: the whole text is trained)
InterleavedSample          runs of images open user turns, runs of text after them are
                           assistant turns (``interleaved_turns``)
SimilarityInterleavedSample each image placed before the text it is matched to, then as
                           InterleavedSample
========================== ===================================================================

A field of the wrong kind is a ``BadSampleError`` (a counted skip): decoded pixels instead of
bytes ``decoded_media``, a text that is not a string ``malformed_sample``, no answer to train on
``no_assistant_turn``.

Example: ``captioning_record(CaptioningSample(image=b"\\xff\\xd8...", caption="A cat."))`` ->
``{"conversation": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text":
"Describe the image."}]}, {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]}],
"images": [b"\\xff\\xd8..."], "videos": []}``.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Sequence
from typing import Any

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

from energon_pack.core.conversation import Message, normalize_conversation
from energon_pack.errors import BadSampleError

#: The user's text of a captioning sample.
DESCRIBE_IMAGE = "Describe the image."
#: The user's text of an OCR sample.
READ_TEXT = "Read the text in the image."
#: The instruction closing a multiple-choice question (as LLaVA-style multiple-choice data phrases it).
MULTIPLE_CHOICE_INSTRUCTION = "Answer with the option's letter from the given choices directly."
#: Letters naming multiple-choice options, in order.
CHOICE_LETTERS = string.ascii_uppercase

Record = dict[str, Any]


def _type_name(sample: Any) -> str:
    return type(sample).__name__


def sample_text(sample: Any, field: str) -> str:
    """The text field ``field`` of ``sample`` as a string (UTF-8 bytes are decoded).

    Raises ``BadSampleError`` ``non_utf8_text`` or ``malformed_sample`` (not text).
    Example: a sample with ``caption=b"A cat."`` -> ``"A cat."``.
    """
    value = getattr(sample, field)
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError as err:
            raise BadSampleError(
                "non_utf8_text", f"{_type_name(sample)}.{field} is not valid UTF-8 ({err.reason} at byte {err.start})"
            ) from None
    if not isinstance(value, str):
        raise BadSampleError(
            "malformed_sample", f"{_type_name(sample)}.{field} is a {type(value).__name__}, not text"
        )
    return value


def media_bytes(value: Any, what: str) -> bytes:
    """The compressed file bytes of one media field; decoded pixels are refused.

    ``what`` names the field in the error (e.g. ``"VQASample.image"``).
    Example: ``media_bytes(b"\\x89PNG...", "CaptioningSample.image")`` -> ``b"\\x89PNG..."``;
    a ``torch.Tensor`` -> ``BadSampleError("decoded_media")``.
    """
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise BadSampleError(
        "decoded_media",
        f"{what} is a {type(value).__module__}.{type(value).__qualname__}, not the compressed file bytes; "
        "energon_pack measures media from their headers before decoding; fix: return the file's bytes from "
        "the dataset's sample_loader (or your sample mapping)",
    )


def best_answer(answers: Sequence[str] | None, weights: Sequence[Any] | None, *, what: str) -> str:
    """The answer of highest weight (the first on ties; the first answer when ``weights`` is None).

    ``weights``: one number per answer (a list, a tensor or an array). ``what`` names the sample type
    in errors. Raises ``BadSampleError`` ``no_assistant_turn`` (no answers) or ``malformed_sample``
    (as many weights as answers needed).
    Examples: ``(["a", "b", "c"], [0.2, 0.5, 0.5])`` -> ``"b"``; ``(["a", "b"], None)`` -> ``"a"``.
    """
    if not answers:
        raise BadSampleError(
            "no_assistant_turn",
            f"{what} has no answers ({answers!r}): nothing to train on; fix: fill answers, or pass a sample "
            "mapping that builds the conversation",
        )
    if weights is None:
        return answers[0]
    scores = [float(weight) for weight in weights]
    if len(scores) != len(answers):
        raise BadSampleError(
            "malformed_sample", f"{what} has {len(answers)} answers but {len(scores)} answer_weights; fix: one weight per answer"
        )
    return answers[max(range(len(scores)), key=lambda index: (scores[index], -index))]


def _record(messages: list[Message], images: Sequence[bytes] = (), videos: Sequence[bytes] = ()) -> Record:
    conversation = normalize_conversation(messages, num_images=len(images), num_videos=len(videos))
    return {"conversation": conversation, "images": list(images), "videos": list(videos)}


def _text_part(text: str) -> dict[str, str]:
    return {"type": "text", "text": text}


def _single_turn(media_kind: str, media: bytes, prompt: str, answer: str) -> Record:
    """user [media, prompt], assistant answer."""
    messages = [
        {"role": "user", "content": [{"type": media_kind}, _text_part(prompt)]},
        {"role": "assistant", "content": [_text_part(answer)]},
    ]
    return _record(messages, *(([media], []) if media_kind == "image" else ([], [media])))


def captioning_record(sample: Any) -> Record:
    """``CaptioningSample(image, caption)`` -> user [image, "Describe the image."], assistant caption.

    Example: ``caption="A cat."`` -> ``[user [image, text "Describe the image."], assistant [text "A cat."]]``.
    """
    image = media_bytes(sample.image, "CaptioningSample.image")
    return _single_turn("image", image, DESCRIBE_IMAGE, sample_text(sample, "caption"))


def _answers(sample: Any) -> tuple[list[str] | None, Any]:
    answers = sample.answers
    if isinstance(answers, str):
        answers = [answers]
    if answers is not None and not all(isinstance(answer, str) for answer in answers):
        raise BadSampleError("malformed_sample", f"{_type_name(sample)}.answers {answers!r} must be a list of strings")
    return (None if answers is None else list(answers)), sample.answer_weights


def vqa_record(sample: Any) -> Record:
    """``VQASample(image, context, answers, answer_weights)`` -> user [image, context], assistant
    the answer of highest weight (``best_answer``).

    Example: ``context="Color?", answers=["red", "blue"], answer_weights=[0.3, 0.7]`` ->
    ``[user [image, text "Color?"], assistant [text "blue"]]``.
    """
    image = media_bytes(sample.image, "VQASample.image")
    answer = best_answer(*_answers(sample), what="VQASample")
    return _single_turn("image", image, sample_text(sample, "context"), answer)


def vidqa_record(sample: Any) -> Record:
    """``VidQASample(video, context, answers, answer_weights)`` -> user [video, context], assistant
    the answer of highest weight (as ``vqa_record``).

    Example: ``context="What happens?", answers=["A ball rolls."]`` ->
    ``[user [video, text "What happens?"], assistant [text "A ball rolls."]]``.
    """
    video = media_bytes(sample.video, "VidQASample.video")
    answer = best_answer(*_answers(sample), what="VidQASample")
    return _single_turn("video", video, sample_text(sample, "context"), answer)


def multiple_choice_prompt(context: str, choices: Sequence[str]) -> str:
    """The question, one lettered line per choice, and ``MULTIPLE_CHOICE_INSTRUCTION``.

    Example: ``("Which animal?", ["cat", "dog"])`` ->
    ``"Which animal?\\nA. cat\\nB. dog\\nAnswer with the option's letter from the given choices directly."``.
    """
    lines = [f"{CHOICE_LETTERS[index]}. {choice}" for index, choice in enumerate(choices)]
    return "\n".join([context, *lines, MULTIPLE_CHOICE_INSTRUCTION])


def multichoice_vqa_record(sample: Any) -> Record:
    """``MultiChoiceVQASample(image, context, choices, correct_choice_idx)`` -> user [image,
    ``multiple_choice_prompt``], assistant the correct choice's letter.

    Example: ``context="Which animal?", choices=["cat", "dog"], correct_choice_idx=1`` ->
    ``[user [image, text "Which animal?\\nA. cat\\nB. dog\\nAnswer with ..."], assistant [text "B"]]``.
    """
    image = media_bytes(sample.image, "MultiChoiceVQASample.image")
    choices, index = sample.choices, sample.correct_choice_idx
    if not choices:
        raise BadSampleError(
            "no_assistant_turn", f"MultiChoiceVQASample has no choices ({choices!r}): nothing to train on"
        )
    if not all(isinstance(choice, str) for choice in choices) or len(choices) > len(CHOICE_LETTERS):
        raise BadSampleError(
            "malformed_sample",
            f"MultiChoiceVQASample.choices must be at most {len(CHOICE_LETTERS)} strings, got {choices!r}",
        )
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(choices):
        raise BadSampleError(
            "malformed_sample",
            f"MultiChoiceVQASample.correct_choice_idx={index!r} is not an index into its {len(choices)} choices",
        )
    prompt = multiple_choice_prompt(sample_text(sample, "context"), choices)
    return _single_turn("image", image, prompt, CHOICE_LETTERS[index])


def ocr_record(sample: Any) -> Record:
    """``OCRSample(image, text, ...)`` -> user [image, "Read the text in the image."], assistant
    text (boxes and per-block/line/word texts are not used).

    Example: ``text="STOP"`` -> ``[user [image, text "Read the text in the image."], assistant [text "STOP"]]``.
    """
    image = media_bytes(sample.image, "OCRSample.image")
    return _single_turn("image", image, READ_TEXT, sample_text(sample, "text"))


def text_record(sample: Any) -> Record:
    """``TextSample(text)`` -> one assistant message holding the text (all of it is trained).

    Example: ``text="Once upon a time."`` -> ``[assistant [text "Once upon a time."]]``.
    """
    return _record([{"role": "assistant", "content": [_text_part(sample_text(sample, "text"))]}])


def interleaved_turns(items: Sequence[str | bytes], *, what: str) -> Record:
    """A record of an interleaved sequence of texts (``str``) and images (compressed ``bytes``).

    Turns: text before the first image and the images that follow it form the first user turn;
    after that each run of texts is an assistant turn and each run of images opens a user turn.
    Consecutive texts in one turn are joined with a newline. A sequence without images is one
    assistant turn (like ``TextSample``). ``what`` names the sample type in errors.

    Example: ``["Look:", img1, "A cat.", "It sleeps.", img2, "A dog."]`` ->
    ``[user [text "Look:", image], assistant [text "A cat.\\nIt sleeps."], user [image],
    assistant [text "A dog."]]`` with images ``[img1, img2]``.
    """
    images = [media_bytes(item, f"{what}.sequence item") for item in items if not isinstance(item, str)]
    if not images:
        return _record([{"role": "assistant", "content": [_text_part("\n".join(items))]}])
    messages: list[Message] = [{"role": "user", "content": []}]
    seen_image = False
    for item in items:
        role = messages[-1]["role"]
        if isinstance(item, str):
            if role == "user" and seen_image:
                messages.append({"role": "assistant", "content": []})
            content = messages[-1]["content"]
            if content and content[-1]["type"] == "text":
                content[-1] = _text_part(content[-1]["text"] + "\n" + item)
            else:
                content.append(_text_part(item))
        else:
            if role == "assistant":
                messages.append({"role": "user", "content": []})
            messages[-1]["content"].append({"type": "image"})
            seen_image = True
    return _record(messages, images)


def interleaved_record(sample: Any) -> Record:
    """``InterleavedSample(sequence)`` -> ``interleaved_turns`` of its sequence.

    Example: ``sequence=[img, "A cat."]`` -> ``[user [image], assistant [text "A cat."]]``.
    """
    return interleaved_turns(list(sample.sequence), what="InterleavedSample")


def matched_texts(sample: Any) -> list[int] | None:
    """The text index each image belongs before: ``matched_text_indices``, else the most similar text
    of each image (argmax over a row of ``similarity_matrix``, images x texts), else None.

    Example: ``similarity_matrix=[[0.1, 0.9], [0.8, 0.2]]`` -> ``[1, 0]``.
    """
    if sample.matched_text_indices is not None:
        return [int(index) for index in sample.matched_text_indices]
    if sample.similarity_matrix is None:
        return None
    rows = [[float(value) for value in row] for row in sample.similarity_matrix]
    return [max(range(len(row)), key=lambda index: (row[index], -index)) for row in rows]


def similarity_interleaved_record(sample: Any) -> Record:
    """``SimilarityInterleavedSample(images, texts, ...)`` -> each image placed right before the text
    it is matched to (``matched_texts``; all images first when neither matches nor similarities are
    given), then ``interleaved_turns``. ``audio`` and ``video`` are not used.

    Example: ``images=[img1, img2], texts=["A cat.", "A dog."], matched_text_indices=[1, 0]`` ->
    ``[user [image], assistant [text "A cat."], user [image], assistant [text "A dog."]]`` with images
    ``[img2, img1]``.
    """
    images, texts = list(sample.images), list(sample.texts)
    if not all(isinstance(text, str) for text in texts):
        raise BadSampleError("malformed_sample", "SimilarityInterleavedSample.texts must be strings")
    matches = matched_texts(sample)
    if matches is None:
        return interleaved_turns([*images, *texts], what="SimilarityInterleavedSample")
    if len(matches) != len(images) or not all(0 <= index < len(texts) for index in matches):
        raise BadSampleError(
            "malformed_sample",
            f"SimilarityInterleavedSample matches {matches!r} do not give each of its {len(images)} images "
            f"one of its {len(texts)} texts",
        )
    sequence: list[str | bytes] = []
    for text_index, text in enumerate(texts):
        sequence.extend(image for image, match in zip(images, matches) if match == text_index)
        sequence.append(text)
    return interleaved_turns(sequence, what="SimilarityInterleavedSample")


#: Energon sample type -> its default conversion (a subclass uses its nearest listed base).
ENERGON_DEFAULTS: dict[type, Callable[[Any], Record]] = {
    CaptioningSample: captioning_record,
    VQASample: vqa_record,
    VidQASample: vidqa_record,
    MultiChoiceVQASample: multichoice_vqa_record,
    OCRSample: ocr_record,
    TextSample: text_record,
    InterleavedSample: interleaved_record,
    SimilarityInterleavedSample: similarity_interleaved_record,
}


def default_conversion(sample_type: type) -> Callable[[Any], Record] | None:
    """The default conversion of ``sample_type`` (or of its nearest base in ``ENERGON_DEFAULTS``), else None.

    Example: ``default_conversion(VQASample)`` -> ``vqa_record``; ``default_conversion(dict)`` -> None.
    """
    for cls in sample_type.__mro__:
        if cls in ENERGON_DEFAULTS:
            return ENERGON_DEFAULTS[cls]
    return None
