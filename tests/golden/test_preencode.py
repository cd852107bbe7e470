"""Preencode: exact token accounting from media headers, checked against the Hugging Face processor.

The reference is ``tests.support.hf_reference.hf_reference`` (docs/batch_contract.md). Loss targets are
checked against assistant spans found here by decoding ChatML turns, a method independent of
``energon_pack.qwen.template``; for Qwen3.5 the expected span text follows the thinking rule of
docs/qwen35.md (``rendered_answer``), so the think block is checked to be supervised.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
import struct
import zlib
from collections import Counter
from collections.abc import Iterator
from fractions import Fraction

import av
import numpy as np
import pytest
import torch
from PIL import Image, ImageFile, WebPImagePlugin

from energon_pack.config import PackingConfig
from energon_pack.rows.encoded import PreparedSample
from energon_pack.qwen.pixels import decode_image, decode_video_frames
from energon_pack.qwen.template import IGNORE_INDEX
from energon_pack.core.samples import QwenVLChatSample
from energon_pack.formats.qwen_chat import chat_fields_from_parts
from energon_pack.runtime.task_encoder import QwenVLPackingTaskEncoder
from tests.support.golden_media import (
    GOLDEN_MIX_SEED,
    GoldenSample,
    chat_sample,
    golden_count,
    golden_samples,
    make_image,
    make_video,
)
from tests.support.hf_reference import PROCESSOR_FIXTURES, hf_reference

#: Golden runs: (family, processor fixture, samples compared with the HF processor; >= 500 in all).
#: Qwen3.5 shares Qwen3-VL's vision code, so a short mix covers its tokenizer and template, for
#: the offline processor and for a HF-saved folder (transformers' own Qwen3_5Tokenizer).
GOLDEN_RUNS = {
    "qwen2.5-vl": ("qwen2.5-vl", "processor", 300),
    "qwen3-vl": ("qwen3-vl", "processor_qwen3", 200),
    "qwen3.5": ("qwen3.5", "processor_qwen35", 24),
    "qwen3.5-saved": ("qwen3.5", "processor_qwen35_saved", 24),
}
#: Mixes at least this long are checked for coverage (sizes, formats, media kinds, rounds).
COVERAGE_MIN_SAMPLES = 200
ASSISTANT_HEADER = "<|im_start|>assistant\n"


def task_encoder(processor) -> QwenVLPackingTaskEncoder:
    return QwenVLPackingTaskEncoder(PackingConfig(seq_length=65536), processor)


@pytest.fixture(scope="module")
def encoder(processor) -> QwenVLPackingTaskEncoder:
    return task_encoder(processor)


@pytest.fixture(scope="module")
def small_mix() -> list[GoldenSample]:
    """The corner samples plus 22 random ones (Qwen2.5-VL sizes)."""
    return golden_samples(24, seed=7, family="qwen2.5-vl")


def text(words: str) -> list[dict]:
    """Typed content of one text part."""
    return [{"type": "text", "text": words}]


def chat(user_parts: list[dict], answer: str = "An answer.") -> list[dict]:
    return [
        {"role": "user", "content": user_parts},
        {"role": "assistant", "content": [{"type": "text", "text": answer}]},
    ]


def assistant_turns(ids: list[int], tokenizer) -> list[tuple[int, int, bool]]:
    """(first, stop, straddles) token ranges of each assistant turn's content plus ``<|im_end|>``.

    Found by decoding: the ids are cut at ``<|im_start|>``; a turn whose text starts with the
    assistant header has its content begin at the first token whose decoded prefix reaches past
    the header (``straddles``: that token also holds the header's newline, e.g. ``"\\n\\n"``) and
    end at its first ``<|im_end|>``.
    """
    im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    starts = [i for i, token in enumerate(ids) if token == im_start] + [len(ids)]
    turns = []
    for begin, following in zip(starts, starts[1:]):
        turn = ids[begin:following]
        if not tokenizer.decode(turn).startswith(ASSISTANT_HEADER):
            continue
        reach = next(k for k in range(1, len(turn) + 1) if len(tokenizer.decode(turn[:k])) >= len(ASSISTANT_HEADER))
        straddles = tokenizer.decode(turn[:reach]) != ASSISTANT_HEADER
        first = begin + (reach - 1 if straddles else reach)
        turns.append((first, begin + turn.index(im_end) + 1, straddles))
    return turns


def rendered_answer(message: dict, *, family: str, after_last_user: bool) -> str:
    """The text an assistant turn renders after its header, ``<|im_end|>`` excluded.

    ChatML families: the content. Qwen3.5 (the official Qwen3.6 template, docs/qwen35.md): the
    content trimmed of surrounding whitespace; after the last user turn preceded by
    ``<think>\\n{reasoning}\\n</think>\\n\\n`` (reasoning from ``reasoning_content``, trimmed;
    empty when there is none).
    """
    content = "".join(part["text"] for part in message["content"] if part["type"] == "text")
    if family != "qwen3.5":
        return content
    content = content.strip()
    if not after_last_user:
        return content
    reasoning = (message.get("reasoning_content") or "").strip()
    return f"<think>\n{reasoning}\n</think>\n\n{content}"


def check_targets(
    prepared: PreparedSample, hf_ids: torch.Tensor, messages: list[dict], tokenizer, *, family: str = "qwen2.5-vl"
) -> None:
    """labels/loss_mask follow docs/batch_contract.md for the assistant spans found by decoding:
    everything after each assistant header through its ``<|im_end|>`` (Qwen3.5: think block included)."""
    ids = hf_ids.tolist()
    turns = assistant_turns(ids, tokenizer)
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    answers = [(m, i > last_user) for i, m in enumerate(messages) if m["role"] == "assistant"]
    assert len(turns) == len(answers)
    target = np.zeros(len(ids), dtype=bool)
    for (first, stop, straddles), (message, after_last_user) in zip(turns, answers):
        answer = rendered_answer(message, family=family, after_last_user=after_last_user)
        assert tokenizer.decode(ids[first:stop]) == ("\n" if straddles else "") + answer + "<|im_end|>"
        target[first:stop] = True
    expected_mask = np.zeros(len(ids), dtype=np.float32)
    expected_mask[:-1] = target[1:]
    expected_labels = np.full(len(ids), IGNORE_INDEX, dtype=np.int64)
    expected_labels[:-1] = np.where(target[1:], np.asarray(ids[1:]), IGNORE_INDEX)
    np.testing.assert_array_equal(prepared.loss_mask.numpy(), expected_mask)
    np.testing.assert_array_equal(prepared.labels.numpy(), expected_labels)
    assert prepared.loss_mask.dtype == torch.float32 and prepared.labels.dtype == torch.int64


def image_size(data: bytes) -> tuple[int, int]:
    with Image.open(io.BytesIO(data)) as image:
        return image.height, image.width


def image_kind(data: bytes) -> tuple[str, str]:
    """(PIL format, PIL mode) from the header."""
    with Image.open(io.BytesIO(data)) as image:
        return image.format, image.mode


def image_format(data: bytes) -> str:
    return image_kind(data)[0]


# --- token-for-token agreement with the Hugging Face processor ------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("run", sorted(GOLDEN_RUNS))
def test_preencode_equals_hf_processor(run, request, golden_references):
    """Token for token on the golden mix (the postencode golden test's samples: they are generated
    and the HF processor runs once per sample for both, ``golden_references``)."""
    family, fixture, count = GOLDEN_RUNS[run]
    processor = request.getfixturevalue(fixture)
    encoder = task_encoder(processor)
    samples = golden_references.samples(golden_count(count), GOLDEN_MIX_SEED, family)
    for index, golden in enumerate(samples):
        prepared = encoder.preencode_sample(chat_sample(golden, f"golden{index}"))
        reference = golden_references.tokens(fixture, GOLDEN_MIX_SEED, index, processor, golden)
        assert prepared.skip_reason is None, (index, prepared.skip_reason)
        assert torch.equal(prepared.input_ids, reference["input_ids"][0]), index
        for name in ("image_grid_thw", "video_grid_thw"):
            ours = getattr(prepared, name)
            if name in reference:
                assert ours is not None and torch.equal(ours, reference[name]), (index, name)
            else:
                assert ours is None, (index, name)
        if family == "qwen2.5-vl" and golden.videos:
            seconds = torch.tensor(prepared.second_per_grid_ts, dtype=reference["second_per_grid_ts"].dtype)
            assert torch.equal(seconds, reference["second_per_grid_ts"]), index
        check_targets(prepared, reference["input_ids"][0], golden.messages, processor.tokenizer, family=family)

    if family == "qwen3.5" and len(samples) == count:  # the whole mix: some think blocks are not empty
        assert any("reasoning_content" in m for golden in samples for m in golden.messages)
    if len(samples) < COVERAGE_MIN_SAMPLES:  # a short mix, or a prefix (compatibility run): checked in the main run
        return
    # The mix really spans what it claims (a regression in golden_media would weaken this test).
    sides = [image_size(data) for golden in samples for data in golden.images]
    kinds = Counter(image_kind(data) for golden in samples for data in golden.images)
    assert min(min(s) for s in sides) == 28 and max(max(s) for s in sides) == 4000
    assert sum(max(s) >= 3000 for s in sides) >= 3 and max(max(s) / min(s) for s in sides) > 100
    assert {fmt for fmt, _ in kinds} == {"JPEG", "PNG", "WEBP"} and {"RGB", "RGBA", "L", "P"} <= {m for _, m in kinds}
    counts = Counter((bool(g.images), bool(g.videos)) for g in samples)
    assert min(counts.values()) >= 10 and len(counts) == 4
    assert sum(len(g.images) >= 3 for g in samples) >= 10
    assert sum(sum(m["role"] == "assistant" for m in g.messages) >= 3 for g in samples) >= 10


# --- no pixel is decoded -------------------------------------------------------------------


def pixel_data_offset(data: bytes) -> int:
    """Byte offset where the compressed pixels start: after the first IDAT chunk header (PNG)
    or after the start-of-scan segment (JPEG)."""
    if data.startswith(b"\x89PNG"):
        return data.index(b"IDAT") + 4
    scan = data.index(b"\xff\xda")
    (length,) = struct.unpack(">H", data[scan + 2 : scan + 4])
    return scan + 2 + length


@pytest.mark.parametrize(
    "image_format, mode", [("PNG", "RGB"), ("PNG", "P"), ("PNG", "RGBA"), ("JPEG", "RGB"), ("JPEG", "L")]
)
def test_image_bytes_cut_before_the_pixels_give_the_same_tokens(encoder, image_format, mode):
    rng = np.random.default_rng(3)
    data = make_image(rng, 28, size=(1234, 777), kind=(image_format, mode))
    cut = data[: pixel_data_offset(data)]
    assert len(cut) < len(data) // 10
    messages = chat([{"type": "image"}, {"type": "text", "text": "What is it?"}])
    full = encoder.preencode_sample(chat_sample(GoldenSample(messages, [data], []), "full"))
    header_only = encoder.preencode_sample(chat_sample(GoldenSample(messages, [cut], []), "cut"))
    assert full.skip_reason is None and header_only.skip_reason is None
    assert torch.equal(full.input_ids, header_only.input_ids)
    assert torch.equal(full.image_grid_thw, header_only.image_grid_thw)
    assert full.image_grid_thw.tolist() == [[1, 88, 56]]  # 1234x777 -> smart_resize (1232, 784) / 14


class PixelDecodeAttempted(AssertionError):
    """Raised by the patched decoders of `decoding_forbidden`."""


#: (owner, attribute) of every PIL / PyAV entry point that decodes pixels.
DECODERS = (
    (ImageFile.ImageFile, "load"),
    (WebPImagePlugin.WebPImageFile, "load"),  # overrides ImageFile.load
    (Image, "_getdecoder"),  # every tile decoder of ImageFile.load
    (av.container.InputContainer, "decode"),
    (av.packet.Packet, "decode"),
    (av.codec.context.CodecContext, "decode"),
    (av.video.frame.VideoFrame, "to_ndarray"),
)


@contextlib.contextmanager
def decoding_forbidden() -> Iterator[list[str]]:
    """Within the block every decoder in `DECODERS` records its name in the yielded list and raises."""
    calls: list[str] = []

    def forbidden(name: str):
        def call(*args, **kwargs):
            calls.append(name)
            raise PixelDecodeAttempted(name)

        return call

    with pytest.MonkeyPatch.context() as patch:
        for owner, attribute in DECODERS:
            patch.setattr(owner, attribute, forbidden(f"{owner.__name__}.{attribute}"))
        yield calls


def test_preencode_never_decodes_pixels(encoder, small_mix):
    plain = [encoder.preencode_sample(chat_sample(g, f"s{i}")) for i, g in enumerate(small_mix)]
    with decoding_forbidden() as calls:
        patched = [encoder.preencode_sample(chat_sample(g, f"s{i}")) for i, g in enumerate(small_mix)]
    assert calls == []
    assert all(p.skip_reason is None for p in patched), [p.skip_reason for p in patched]
    assert all(torch.equal(a.input_ids, b.input_ids) for a, b in zip(plain, patched))
    assert sum(len(g.videos) for g in small_mix) >= 3
    assert {image_format(d) for g in small_mix for d in g.images} == {"JPEG", "PNG", "WEBP"}


def test_patched_decoders_do_catch_decoding(small_mix):
    """Control for the test above: under the same patches the pixel path hits them."""
    images = {image_format(d): d for g in small_mix for d in g.images}
    video = next(d for g in small_mix for d in g.videos)
    with decoding_forbidden() as calls:
        for data in images.values():
            with pytest.raises(Exception):
                decode_image(data)
        with pytest.raises(Exception):
            decode_video_frames(video, [0, 1], 2)
    assert len(calls) >= len(images) + 1
    assert "WebPImageFile.load" in calls and "ImageFile.load" in calls
    assert any(call.split(".")[0] in ("InputContainer", "Packet", "CodecContext", "VideoFrame") for call in calls)


# --- loss targets -------------------------------------------------------------------------


def test_loss_targets_of_multi_turn_chats(encoder, processor):
    rng = np.random.default_rng(11)
    image = make_image(rng, 28, size=(100, 150))
    video = make_video(rng, num_frames=20, rate=Fraction(10), size=(32, 48))
    conversations = [
        GoldenSample(
            [
                {"role": "system", "content": text("Answer briefly.")},
                {"role": "user", "content": [{"type": "image"}, *text("\nWhat is this?")]},
                {"role": "assistant", "content": text("A gradient.")},
                {"role": "user", "content": [*text("And this one: "), {"type": "video"}]},
                {"role": "assistant", "content": text("\nA moving gradient,\nin two lines.\n")},
                {"role": "user", "content": text("Thanks! 東京?")},
                {"role": "assistant", "content": text(" You're welcome. 猫")},
            ],
            [image],
            [video],
        ),
        # No system prompt (Qwen2.5-VL adds its default one), an empty assistant turn, then "\n\n".
        GoldenSample(
            [
                {"role": "user", "content": [{"type": "image"}, {"type": "image"}]},
                {"role": "assistant", "content": []},
                {"role": "user", "content": text("Say more.")},
                {"role": "assistant", "content": text("\n\nTwo images, same gradient.")},
            ],
            [image, image],
            [],
        ),
    ]
    for index, golden in enumerate(conversations):
        prepared = encoder.preencode_sample(chat_sample(golden, f"chat{index}"))
        reference = hf_reference(processor, *golden)["input_ids"][0]
        assert prepared.skip_reason is None and torch.equal(prepared.input_ids, reference)
        check_targets(prepared, reference, golden.messages, processor.tokenizer)
        # Hand count: each assistant turn's content tokens plus <|im_end|> carry loss, nothing else.
        assert int(prepared.loss_mask.sum()) == sum(
            stop - first for first, stop, _ in assistant_turns(reference.tolist(), processor.tokenizer)
        )
    last_turns = assistant_turns(reference.tolist(), processor.tokenizer)  # the second conversation
    assert [straddles for *_, straddles in last_turns] == [False, True]


def test_loss_targets_golden_case(encoder, processor):
    """Hand-computed: system, user, assistant "Hi." -> loss on "Hi", "." and <|im_end|> only."""
    tokenizer = processor.tokenizer
    messages = [
        {"role": "system", "content": [{"type": "text", "text": "S"}]},
        {"role": "user", "content": [{"type": "text", "text": "Q"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Hi."}]},
    ]
    prepared = encoder.preencode_sample(chat_sample(GoldenSample(messages, [], []), "golden"))
    ids = prepared.input_ids.tolist()
    assert tokenizer.convert_ids_to_tokens(ids[-5:]) == ["Ċ", "Hi", ".", "<|im_end|>", "Ċ"]
    assert prepared.loss_mask.tolist() == [0.0] * (len(ids) - 5) + [1.0, 1.0, 1.0, 0.0, 0.0]
    assert prepared.labels.tolist()[-5:] == [ids[-4], ids[-3], ids[-2], IGNORE_INDEX, IGNORE_INDEX]


# --- bad samples become skip markers --------------------------------------------------------


def png_header(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims width x height (RGB, 8 bit), with an empty IDAT and IEND."""

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", b"") + chunk(b"IEND", b"")


def audio_only_mp4() -> bytes:
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = container.add_stream("aac", rate=16000)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 16000), dtype=np.float32), format="fltp", layout="mono")
        frame.sample_rate = 16000
        for packet in [*stream.encode(frame), *stream.encode()]:
            container.mux(packet)
    return buffer.getvalue()


def bad_cases() -> dict[str, tuple[str, GoldenSample]]:
    """name -> (expected skip reason, sample)."""
    rng = np.random.default_rng(5)
    good_image = make_image(rng, 28, size=(64, 64), kind=("PNG", "RGB"))
    good_video = make_video(rng, num_frames=20, rate=Fraction(10), size=(32, 32))
    one_image = chat([{"type": "image"}, {"type": "text", "text": "What?"}])
    two_images = chat([{"type": "image"}, {"type": "image"}])
    one_video = chat([{"type": "video"}, {"type": "text", "text": "What?"}])
    return {
        "garbage_image": ("corrupt_image", GoldenSample(one_image, [b"this is not an image"], [])),
        "cut_png_header": ("corrupt_image", GoldenSample(one_image, [good_image[:20]], [])),
        "corrupt_second_image": ("corrupt_image", GoldenSample(two_images, [good_image, b"\xff\xd8\xff garbage"], [])),
        "bomb_100000x100000": ("pixel_bomb", GoldenSample(one_image, [png_header(100_000, 100_000)], [])),
        # just above max_image_pixels' default 178,956,970 (100 MP images are accepted: test_media_probe.py)
        "bomb_13400x13400": ("pixel_bomb", GoldenSample(one_image, [png_header(13_400, 13_400)], [])),
        "aspect_214": ("extreme_aspect_ratio", GoldenSample(one_image, [png_header(6000, 28)], [])),
        "garbage_video": ("corrupt_video", GoldenSample(one_video, [], [b"\x00\x00\x00\x18ftypmp42 not a video"])),
        "cut_video": ("corrupt_video", GoldenSample(one_video, [], [good_video[: len(good_video) // 3]])),
        "audio_only_video": ("no_video_stream", GoldenSample(one_video, [], [audio_only_mp4()])),
        "one_frame_video": (
            "too_few_frames",
            GoldenSample(one_video, [], [make_video(rng, num_frames=1, rate=Fraction(10), size=(32, 32))]),
        ),
        "more_images_than_parts": ("placeholder_mismatch", GoldenSample(one_image, [good_image, good_image], [])),
        "fewer_images_than_parts": ("placeholder_mismatch", GoldenSample(two_images, [good_image], [])),
        "video_given_as_no_part": ("placeholder_mismatch", GoldenSample(one_image, [good_image], [good_video])),
    }


BAD_CASES = bad_cases()


@pytest.mark.parametrize("name", sorted(BAD_CASES))
def test_bad_samples_become_skip_markers(encoder, name):
    reason, golden = BAD_CASES[name]
    prepared = encoder.preencode_sample(chat_sample(golden, name))
    assert prepared.skip_reason is not None and prepared.skip_reason.partition(": ")[0] == reason, prepared.skip_reason
    assert prepared.__key__ == name and prepared.num_tokens == 0 and prepared.images == [] and prepared.videos == []


def test_stored_placeholder_mismatch_is_skipped_with_its_reason(encoder):
    """The dataset path: a stored conversation with 2 <image> but 1 image file."""
    image = make_image(np.random.default_rng(0), 28, size=(40, 40), kind=("JPEG", "RGB"))
    conversation = b'[{"role": "user", "content": "<image><image>Compare."}, {"role": "assistant", "content": "Same."}]'
    fields = chat_fields_from_parts({"json": conversation, "0.jpg": image})
    assert fields["invalid_reason"] == "placeholder_mismatch" and "placeholder" in fields["invalid_detail"]
    sample = QwenVLChatSample(__key__="stored", __restore_key__=(), __subflavors__=None, __sources__=None, **fields)
    prepared = encoder.preencode_sample(sample)
    assert prepared.skip_reason == fields["invalid_reason"] and prepared.num_tokens == 0


# --- what a prepared sample holds ------------------------------------------------------------


def nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def tensors_in(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in tensors_in(item)]
    return []


def test_prepared_sample_holds_compressed_media_and_tokens_only(encoder, small_mix):
    for index, golden in enumerate(small_mix):
        sample = chat_sample(golden, f"s{index}")
        prepared = encoder.preencode_sample(sample)
        media = sum(map(len, golden.images)) + sum(map(len, golden.videos))
        token_arrays = sum(nbytes(t) for t in (prepared.input_ids, prepared.labels, prepared.loss_mask))
        assert media + token_arrays <= prepared.nbytes() <= 1.2 * (media + token_arrays)
        assert all(a is b for a, b in zip(prepared.images + prepared.videos, sample.images + sample.videos))
        tensors = {f.name: tensors_in(getattr(prepared, f.name)) for f in dataclasses.fields(prepared)}
        floating = [name for name, found in tensors.items() for t in found if t.is_floating_point()]
        assert floating == ["loss_mask"]
        for field in dataclasses.fields(prepared):
            value = getattr(prepared, field.name)
            assert not isinstance(value, (np.ndarray, Image.Image)), field.name
        held = sum(nbytes(t) for found in tensors.values() for t in found)
        grids = [t for t in (prepared.image_grid_thw, prepared.video_grid_thw) if t is not None]
        assert held == token_arrays + sum(map(nbytes, grids))


# --- custom pixel limits and the benchmark ---------------------------------------------------


def test_preencode_equals_hf_processor_with_custom_limits(small_mix):
    """Limits set through load_processor reach both preencode and the processor (docs/batch_contract.md)."""
    from energon_pack.qwen.processor import load_processor

    processor = load_processor(min_pixels=28 * 28 * 16, max_pixels=28 * 28 * 256, max_frames=8)
    encoder = task_encoder(processor)
    for index, golden in enumerate(small_mix[:10]):
        prepared = encoder.preencode_sample(chat_sample(golden, f"s{index}"))
        reference = hf_reference(processor, *golden)
        assert torch.equal(prepared.input_ids, reference["input_ids"][0]), index
        if golden.videos:
            assert torch.equal(prepared.video_grid_thw, reference["video_grid_thw"])
            assert int(prepared.video_grid_thw[:, 0].max()) <= 4  # max_frames=8 -> at most 4 temporal patches
        if golden.images:
            assert torch.equal(prepared.image_grid_thw, reference["image_grid_thw"])
            assert int(prepared.image_grid_thw.prod(dim=1).max()) <= 256 * 4  # max_pixels / 14**2 patches


def test_bench_preencode_reports_side_by_side(tmp_path, monkeypatch, capsys):
    import argparse

    from energon_pack import tools
    from energon_pack.tools import common

    monkeypatch.setattr(common, "BENCH_SPEC_KWARGS", dict(max_image_side=256, max_video_seconds=2.0, max_video_side=64))
    monkeypatch.setattr(tools, "BENCHES", {"preencode": tools.bench_preencode})
    assert tools.run_bench(argparse.Namespace(stage="all", samples=6, out=tmp_path)) == 0
    out = capsys.readouterr().out
    assert re.search(r"samples with identical input_ids +6/6 ", out), out
    assert "samples/s (higher is better)" in out and "MiB held per sample, mean" in out
    assert "bench --stage postencode: not implemented yet" in out and "bench --stage loader: not implemented yet" in out


# --- vision tokens never carry loss -----------------------------------------------------------


@pytest.mark.slow  # more than ~3 s: make test runs it, make test-fast leaves it out
@pytest.mark.parametrize("family", sorted(PROCESSOR_FIXTURES))
def test_media_in_an_assistant_turn_carries_no_loss(family, request):
    """Image and video spans (pads, start/end markers, Qwen3-VL frame timestamps) in an assistant
    turn are not targets; the turn's text and closing ``<|im_end|>`` still are. The official
    Qwen3-VL template renders only the text of an assistant turn, so there such a sample is a
    ``placeholder_mismatch`` skip, as the Hugging Face processor would refuse it too."""
    processor = request.getfixturevalue(PROCESSOR_FIXTURES[family])
    rng = np.random.default_rng(3)
    image = make_image(rng, 32, size=(64, 96))
    video = make_video(rng, num_frames=8, rate=Fraction(4), size=(64, 64))
    messages = [
        {"role": "user", "content": text("Draw it.")},
        {"role": "assistant", "content": [{"type": "image"}, *text("Here."), {"type": "video"}]},
    ]
    prepared = task_encoder(processor).preencode_sample(chat_sample(GoldenSample(messages, [image], [video]), "drawn"))
    if family == "qwen3-vl":
        assert "<|vision_start|>" not in processor.apply_chat_template(messages)
        assert prepared.skip_reason == "placeholder_mismatch"
        return
    assert prepared.skip_reason is None
    tokenizer = processor.tokenizer
    targets = [int(t) for t in prepared.labels.tolist() if t != IGNORE_INDEX]
    answer = rendered_answer(messages[1], family=family, after_last_user=True)  # Qwen3.5: think block first
    assert tokenizer.decode(targets) == answer + "<|im_end|>"
    media_ids = set(tokenizer.convert_tokens_to_ids(["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]))
    assert not media_ids & set(targets)
    assert int(prepared.loss_mask.sum()) == len(targets)


def test_media_token_mask_covers_nested_spans_and_stray_pads():
    from energon_pack.qwen.template import ChatMarkers, media_token_mask

    markers = ChatMarkers(vision_start_id=1, vision_end_id=2, media_pad_ids=(3, 4))
    assert media_token_mask(np.array([7, 1, 3, 3, 2, 8, 4]), markers).tolist() == [0, 1, 1, 1, 1, 0, 1]
    # Qwen3-VL video: an outer span holding timestamp text (5, 6) and inner spans.
    assert media_token_mask(np.array([9, 1, 5, 1, 3, 2, 6, 1, 3, 2, 2, 9]), markers).tolist() == [0] + [1] * 10 + [0]
    assert media_token_mask(np.array([9, 2, 9, 1, 3]), markers).tolist() == [0, 0, 0, 1, 1]
