"""The offline processor: real Qwen BPE ids, official special-token ids, ChatML template."""

from __future__ import annotations

import pytest

from energon_pack.qwen.family import processor_family
from energon_pack.qwen.processor import (
    FIRST_SPECIAL_ID,
    QWEN_ADDED_TOKENS,
    load_processor,
    qwen_rank_file,
    read_tiktoken_ranks,
)


@pytest.fixture(scope="module")
def ranks():
    return read_tiktoken_ranks(qwen_rank_file())


def test_special_tokens_have_the_official_ids(processor):
    tokenizer = processor.tokenizer
    expected = {
        "<|endoftext|>": 151643,
        "<|im_start|>": 151644,
        "<|im_end|>": 151645,
        "<|vision_start|>": 151652,
        "<|vision_end|>": 151653,
        "<|vision_pad|>": 151654,
        "<|image_pad|>": 151655,
        "<|video_pad|>": 151656,
    }
    for token, token_id in expected.items():
        assert tokenizer.convert_tokens_to_ids(token) == token_id
    assert [tokenizer.convert_tokens_to_ids(t) for t, _ in QWEN_ADDED_TOKENS] == list(
        range(FIRST_SPECIAL_ID, FIRST_SPECIAL_ID + len(QWEN_ADDED_TOKENS))
    )
    assert processor.image_token_id == 151655 and processor.video_token_id == 151656


def test_ids_match_the_rank_file(processor, ranks):
    """Single-piece strings encode to their rank in qwen.tiktoken (the Qwen2 vocabulary)."""
    tokenizer = processor.tokenizer
    for piece in ["Hello", " world", "!", " the", "\n", " ", "assistant", "user", "system"]:
        assert tokenizer.encode(piece) == [ranks[piece.encode("utf-8")]], piece
    # Known Qwen2 ids: "Hello world!" -> [9707, 1879, 0]; digits are split one by one.
    assert tokenizer.encode("Hello world!") == [9707, 1879, 0]
    assert tokenizer.encode("12345") == [ranks[d.encode()] for d in "12345"]
    assert tokenizer.encode("你好") == [ranks["你好".encode("utf-8")]]
    assert tokenizer.decode(tokenizer.encode("Grüße, 世界! 123")) == "Grüße, 世界! 123"


def test_chat_template_renders_chatml_with_vision_markers(processor):
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "\nWhat?"}, {"type": "video"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]},
    ]
    assert processor.apply_chat_template(messages, tokenize=False) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>\nWhat?"
        "<|vision_start|><|video_pad|><|vision_end|><|im_end|>\n"
        "<|im_start|>assistant\nA cat.<|im_end|>\n"
    )
    with_system = [{"role": "system", "content": "Be brief."}, *messages[1:]]
    assert processor.apply_chat_template(with_system, tokenize=False).startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
    assert processor.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True).endswith(
        "<|im_start|>assistant\n"
    )


def test_families(processor, processor_qwen3):
    assert processor_family(processor) == "qwen2.5-vl"
    assert processor_family(processor_qwen3) == "qwen3-vl"
    assert processor.image_processor.patch_size == 14
    assert processor_qwen3.image_processor.patch_size == 16
    assert processor_qwen3.video_processor.patch_size == 16
    assert processor_family(load_processor(family="qwen2-vl")) == "qwen2-vl"
    assert not processor_qwen3.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False
    ).startswith("<|im_start|>system")


def test_pixel_limits_are_set_on_the_processor():
    limited = load_processor(min_pixels=200704, max_pixels=1003520, max_frames=64)
    for sub in (limited.image_processor, limited.video_processor):
        assert sub.size["shortest_edge"] == 200704 and sub.size["longest_edge"] == 1003520
    assert limited.video_processor.max_frames == 64


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="family='qwen9'"):
        load_processor(family="qwen9")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="both path"):
        load_processor("some/path", family="qwen3-vl")


def test_load_processor_from_a_saved_directory(processor, tmp_path):
    processor.save_pretrained(tmp_path)
    reloaded = load_processor(tmp_path)
    assert processor_family(reloaded) == "qwen2.5-vl"
    assert reloaded.tokenizer.encode("Hello world!") == [9707, 1879, 0]
    assert reloaded.tokenizer.convert_tokens_to_ids("<|video_pad|>") == 151656


@pytest.mark.slow  # more than ~3 s: make test runs it, make test-fast leaves it out
def test_rope_constants_come_from_the_model_config_next_to_the_processor(processor, tmp_path):
    from transformers import Qwen2_5_VLConfig

    from energon_pack.qwen.rope import RopeSpec

    assert RopeSpec.from_processor(processor).tokens_per_second == 2
    processor.save_pretrained(tmp_path)
    assert load_processor(tmp_path).energon_pack_model_config is None
    Qwen2_5_VLConfig(vision_config={"tokens_per_second": 4}).save_pretrained(tmp_path)
    spec = RopeSpec.from_processor(load_processor(tmp_path))
    assert spec.family == "qwen2.5-vl" and spec.tokens_per_second == 4


# --- a hub id without network fails fast, naming the fix -----------------------------------


@pytest.fixture()
def empty_hub_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    return tmp_path / "hub"


@pytest.mark.timeout(60)
def test_an_uncached_hub_id_offline_fails_fast_naming_the_fix(empty_hub_cache, monkeypatch):
    from huggingface_hub import constants

    from energon_pack.errors import UsageError

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(UsageError) as err:
        load_processor("Qwen/Qwen2.5-VL-7B-Instruct")
    message = str(err.value)
    assert "HF_HUB_OFFLINE=1" in message and str(empty_hub_cache) in message and "local folder" in message
    assert "\n" not in message


@pytest.mark.timeout(60)
def test_an_uncached_hub_id_without_network_fails_fast(empty_hub_cache, monkeypatch):
    from huggingface_hub import constants

    from energon_pack.errors import UsageError

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    with pytest.raises(UsageError, match=r"cannot be reached.*HF_HUB_OFFLINE=1"):
        load_processor("Qwen/Qwen2.5-VL-7B-Instruct")


def test_a_missing_local_path_says_it_does_not_exist(tmp_path):
    from energon_pack.errors import UsageError

    for missing in (tmp_path / "no" / "such" / "dir", "./no_such_processor", "~/no_such_processor"):
        with pytest.raises(UsageError, match="does not exist"):
            load_processor(missing)


def test_a_cached_hub_id_loads_without_network(processor, empty_hub_cache, monkeypatch):
    """A hub id in the local cache loads from it, without the network and without HF_HUB_OFFLINE."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    repo = empty_hub_cache / "models--Qwen--Tiny-VL"
    snapshot = repo / "snapshots" / ("0" * 40)
    processor.save_pretrained(snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    reloaded = load_processor("Qwen/Tiny-VL")
    assert processor_family(reloaded) == "qwen2.5-vl"
    assert reloaded.tokenizer.convert_tokens_to_ids("<|video_pad|>") == 151656
