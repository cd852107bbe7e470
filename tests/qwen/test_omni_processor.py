"""The offline Qwen-Omni processors (energon_pack.qwen.processor, family.py): the released media
token ids and settings, and a real processor path told apart by its class or its config."""

from __future__ import annotations

import pytest

from energon_pack.qwen.audio import AudioSpec
from energon_pack.qwen.family import processor_family
from energon_pack.qwen.omni_rope import OmniRopeSpec
from energon_pack.qwen.processor import load_processor
from energon_pack.qwen.rope import RopeSpec

# Slow: building an offline Omni processor takes 4-11 s (its tokenizer and transformers' Omni modules).
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def qwen3_omni():
    return load_processor(family="qwen3-omni")


def test_qwen3_omni_offline_processor_is_the_released_one(qwen3_omni):
    p = qwen3_omni
    assert type(p).__name__ == "Qwen3OmniMoeProcessor" and processor_family(p) == "qwen3-omni"
    ids = p.tokenizer.convert_tokens_to_ids
    assert (p.image_token_id, p.video_token_id, p.audio_token_id) == (151655, 151656, 151675)
    assert [ids(t) for t in (p.vision_bos_token, p.audio_bos_token, p.audio_eos_token)] == [151652, 151669, 151670]
    assert ids("</think>") == 151668 and ids("<tts_pad>") == 151671
    assert (p.image_processor.patch_size, p.video_processor.patch_size) == (16, 16)
    assert list(p.image_processor.image_mean) == list(p.video_processor.image_std) == [0.5] * 3
    assert AudioSpec.from_processor(p) == AudioSpec(padded_samples=None)  # pads to the longest clip
    assert OmniRopeSpec.from_processor(p) == OmniRopeSpec.released("qwen3-omni")
    text = p.apply_chat_template([{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "Hi"}]}])
    assert text == "<|im_start|>user\n<|audio_start|><|audio_pad|><|audio_end|>Hi<|im_end|>\n"


def test_qwen25_omni_specs_are_the_released_ones():
    p = load_processor(family="qwen2.5-omni")
    assert AudioSpec.from_processor(p) == AudioSpec()  # pads every clip to 300 s
    assert OmniRopeSpec.from_processor(p) == OmniRopeSpec.released("qwen2.5-omni")


def test_a_real_qwen3_omni_processor_takes_its_constants_from_its_config(qwen3_omni):
    """``load_processor(path)`` keeps the config found beside the processor; the family and the rope
    constants then come from its ``model_type`` and ``thinker_config`` (here a distinct
    ``position_id_per_seconds`` shows where the value came from)."""
    from transformers import Qwen3OmniMoeConfig

    config = Qwen3OmniMoeConfig(
        thinker_config={"position_id_per_seconds": 7, "audio_token_id": 151675, "audio_start_token_id": 151669},
    )
    qwen3_omni.energon_pack_model_config = config
    try:
        assert processor_family(qwen3_omni) == "qwen3-omni"
        spec = OmniRopeSpec.from_processor(qwen3_omni)
        assert spec.position_id_per_seconds == 7 and spec.n_window == 50 and spec.audio_token_id == 151675
        assert RopeSpec.from_processor(qwen3_omni) == RopeSpec(family="qwen3-omni")
    finally:
        del qwen3_omni.energon_pack_model_config


def test_qwen3_omni_sound_tokens_follow_the_samples_padding(qwen3_omni):
    """A clip's frames depend on the sample's longest clip (the processor pads to it): 100 samples
    alone are no whole frame (``empty_audio``), beside a 1-s clip one frame (1 token)."""
    from energon_pack.errors import BadSampleError
    from energon_pack.qwen.encode import QwenChatEncoder

    hearing = QwenChatEncoder(qwen3_omni).hearing
    assert hearing.tokens([161]) == [1] and hearing.tokens([16000, 16001]) == [13, 13]
    assert hearing.tokens([100, 16000]) == [1, 13]
    with pytest.raises(BadSampleError) as bad:
        hearing.tokens([100])
    assert bad.value.reason == "empty_audio"


def test_qwen3_omni_thinking_variant_is_the_same_processor_with_its_template(qwen3_omni, processor_qwen3_omni_thinking):
    from energon_pack.qwen.chat_templates import official_chat_template

    thinking = processor_qwen3_omni_thinking
    assert thinking.chat_template == official_chat_template("qwen3-omni", "thinking") != qwen3_omni.chat_template
    assert qwen3_omni.chat_template == official_chat_template("qwen3-omni", "instruct")
    assert processor_family(thinking) == "qwen3-omni" and thinking.tokenizer.get_vocab() == qwen3_omni.tokenizer.get_vocab()
    assert load_processor(family="qwen3-omni", variant="instruct").tokenizer is qwen3_omni.tokenizer  # the default's


@pytest.mark.parametrize("kwargs,match", [
    ({"family": "qwen3-omni", "variant": "captioner"}, "'captioner' is not a released variant of 'qwen3-omni'.*instruct, thinking"),
    ({"family": "qwen3-vl", "variant": "thinking"}, "'thinking' is not a released variant of 'qwen3-vl'.*leave it out"),
    ({"path": "/models/qwen3-omni", "variant": "thinking"}, "both path=.* and variant='thinking'"),
])
def test_bad_variants_are_one_line_errors(kwargs, match):
    with pytest.raises(ValueError, match=match) as raised:
        load_processor(**kwargs)
    assert "\n" not in str(raised.value)
