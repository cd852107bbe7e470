"""Golden: Qwen2.5-Omni and Qwen3-Omni samples (audio, audio + text turns, several audios, image +
audio, video with and without its sound; a tool call and thinking about a clip, with their trained
tokens) prepared and encoded by energon_pack equal the Hugging
Face processor's outputs for the sample alone (called with the waveform we decode): token ids,
audio features on the real frames (within 1e-5), feature lengths, pixels and grids, and the
thinker's ``get_rope_index`` positions (exact).

Every container/codec runs once, with Qwen2.5-Omni: decoding is the same for both families (the
waveform does not depend on the model); what differs (padding to the sample's longest clip, the
token rule, the interleave) is covered by the family-parametrised cases."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from energon_pack.errors import BadSampleError
from energon_pack.qwen.audio import decode_audio
from energon_pack.qwen.encode import QwenChatEncoder
from energon_pack.qwen.processor import load_processor
from tests.support.audio_media import CODECS
from tests.support.hf_reference import expected_targets
from tests.support.omni_reference import (
    OmniCase,
    Sound,
    chat_message,
    make_omni_media,
    reference_omni_inputs,
    reference_rope,
    typed_conversation,
)
from tests.support.tiny_omni import tiny_qwen25_omni_config, tiny_qwen3_omni_config

# Slow: a Hugging Face processor call per case (the 300-s feature padding alone takes ~0.5 s).
pytestmark = pytest.mark.slow

AUDIO, IMAGE, VIDEO = {"type": "audio"}, {"type": "image"}, {"type": "video"}


CASES = [
    OmniCase("audio_only", [chat_message("user", AUDIO), chat_message("assistant", "A chirp.")], audios=[Sound("wav_s16", 1.37)]),
    OmniCase(
        "audio_text_turns",
        [chat_message("system", "Listen."), chat_message("user", "Hear this:", AUDIO), chat_message("assistant", "Heard."),
         chat_message("user", "Again?"), chat_message("assistant", "Yes.")],
        audios=[Sound("mp3", 2.2, 44100, 2)],
    ),
    OmniCase(
        "several_audios",
        [chat_message("user", AUDIO, "and", AUDIO, "then", AUDIO), chat_message("assistant", "Three.")],
        audios=[Sound("flac", 0.5037), Sound("m4a_aac", 3.1, 22050), Sound("wav_f32", 0.0513, 8000)],
    ),
    OmniCase("image_audio", [chat_message("user", IMAGE, AUDIO, "Match?"), chat_message("assistant", "No.")],
             images=[(56, 84)], audios=[Sound("ogg_opus", 1.0, 48000, 2)]),
    OmniCase("video_sound_off", [chat_message("user", VIDEO, AUDIO, "Same?"), chat_message("assistant", "Maybe.")],
             videos=[(12, 56, 56, 4, 3.0)], audios=[Sound("wav_s24", 0.8)]),
    OmniCase("video_sound_on", [chat_message("user", AUDIO, VIDEO, "What is heard?"), chat_message("assistant", "A chirp.")],
             videos=[(20, 56, 84, 4, 5.0)], audios=[Sound("webm_opus", 1.5, 48000)], use_audio_in_video=True),
    OmniCase("video_sound_outlasts", [chat_message("user", VIDEO, "Longer sound?"), chat_message("assistant", "Yes.")],
             videos=[(8, 56, 112, 4, 3.3)], use_audio_in_video=True),
]
#: Each codec once, at a rate and channel count its encoder takes.
CODEC_SOUNDS = {
    "wav_s16": Sound("wav_s16", 1.01, 16000, 2), "wav_s24": Sound("wav_s24", 0.7, 48000), "wav_f32": Sound("wav_f32", 0.9, 16000),
    "flac": Sound("flac", 1.2, 44100, 2), "mp3": Sound("mp3", 1.1, 16000), "m4a_aac": Sound("m4a_aac", 1.3, 44100, 2),
    "ogg_opus": Sound("ogg_opus", 0.6, 16000), "ogg_vorbis": Sound("ogg_vorbis", 1.0, 44100, 2),
    "webm_opus": Sound("webm_opus", 0.75, 48000, 2),
}
assert set(CODEC_SOUNDS) == set(CODECS)


FAMILIES = ("qwen2.5-omni", "qwen3-omni")
THINKER_CONFIGS = {"qwen2.5-omni": tiny_qwen25_omni_config, "qwen3-omni": tiny_qwen3_omni_config}


@pytest.fixture(scope="module", params=FAMILIES)
def family(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def processor(family) -> Any:
    return load_processor(family=family, min_pixels=56 * 56, max_pixels=112 * 112)


@pytest.fixture(scope="module")
def encoder(processor) -> QwenChatEncoder:
    return QwenChatEncoder(processor)


def _check_against_hf(
    encoder: QwenChatEncoder, processor: Any, case: OmniCase, family: str, *, fits: Any = None
) -> Any:
    """Prepare and encode ``case`` (shrunk to ``fits`` when given) and compare with the processor; returns the prepared chat."""
    media = make_omni_media(case)
    prepared = encoder.prepare(
        typed_conversation(case, media), media.images, media.videos, audios=media.audios,
        use_audio_in_video=case.use_audio_in_video, tools=case.tools, fits=fits,
    )
    encoded = encoder.encode(prepared, media.images, media.videos, audios=media.audios)
    sources = [media.audios[s] if s >= 0 else media.videos[-1 - s] for s in prepared.audio_sources or []]
    waveforms = [decode_audio(data) for data in sources]
    ref = reference_omni_inputs(processor, case, media, prepared, waveforms)

    assert prepared.input_ids.tolist() == ref["input_ids"][0].tolist(), case.key
    if waveforms:
        mask = ref["feature_attention_mask"].bool()
        assert encoded.audio.audio_feature_lengths.tolist() == mask.sum(-1).tolist()
        assert prepared.audio_frames == int(mask.sum()), case.key  # what the row budget and row_cost count
        expected = torch.cat([ref["input_features"][i][:, mask[i]] for i in range(len(waveforms))], dim=1)
        torch.testing.assert_close(encoded.audio.input_features, expected, atol=1e-5, rtol=0)
    else:
        assert encoded.audio is None
    for ours, theirs in (("pixel_values", "pixel_values"), ("image_grid_thw", "image_grid_thw"),
                         ("pixel_values_videos", "pixel_values_videos"), ("video_grid_thw", "video_grid_thw")):
        value = getattr(encoded.visual, ours)
        assert (value is None) == (theirs not in ref), (case.key, ours)
        if value is not None:
            assert torch.equal(value, ref[theirs]), (case.key, ours)
    expected_rope = reference_rope(THINKER_CONFIGS[family](), ref, case.use_audio_in_video)
    assert torch.equal(encoded.mrope_position_ids, expected_rope), case.key
    return prepared


@pytest.mark.parametrize("case", CASES, ids=[c.key for c in CASES])
def test_omni_sample_equals_hf(encoder, processor, family, case):
    _check_against_hf(encoder, processor, case, family)


TOOLS = [{"type": "function", "function": {
    "name": "identify", "description": "Name a sound's source.",
    "parameters": {"type": "object", "properties": {"kind": {"type": "string"}}, "required": ["kind"]}}}]
#: A tool call about a clip, and thinking (the released Qwen3-Omni templates render the reasoning of
#: the answers after the last text query: "It sweeps up." but not "A single chirp.").
TEMPLATE_CASES = [
    OmniCase("audio_tool_call", [
        chat_message("system", "You listen and call tools."),
        chat_message("user", "What is this sound?", AUDIO),
        chat_message("assistant", "", tool_calls=[{"type": "function", "function": {"name": "identify", "arguments": {"kind": "chirp"}}}]),
        chat_message("tool", "a bird"),
        chat_message("assistant", "A bird's chirp."),
    ], audios=[Sound("wav_s16", 1.2)], tools=TOOLS),
    OmniCase("audio_thinking", [
        chat_message("user", AUDIO, "How many tones?"),
        chat_message("assistant", "One.", reasoning_content="A single chirp."),
        chat_message("user", "And its pitch?"),
        chat_message("assistant", "Rising.", reasoning_content="It sweeps up."),
    ], audios=[Sound("flac", 0.9)]),
]


@pytest.mark.parametrize("case", TEMPLATE_CASES, ids=[c.key for c in TEMPLATE_CASES])
def test_tool_use_and_thinking_equal_hf(encoder, processor, family, case):
    """A tool call and thinking about a clip equal the processor on the record (Qwen3-Omni: its
    released template), and the trained tokens are each assistant turn after its header, its
    ``<tool_call>`` and ``<think>`` blocks included; the tool result (in a user turn) never."""
    if case.tools and family == "qwen2.5-omni":  # its template renders no tools: a counted skip
        media = make_omni_media(case)
        with pytest.raises(BadSampleError) as bad:
            encoder.prepare(typed_conversation(case, media), media.images, media.videos, audios=media.audios, tools=case.tools)
        assert bad.value.reason == "template_cannot_render_tools"
        return
    prepared = _check_against_hf(encoder, processor, case, family)
    ids = prepared.input_ids.tolist()
    target = expected_targets(ids, processor.tokenizer)
    np.testing.assert_array_equal(prepared.loss_mask.numpy()[:-1], target[1:].astype(np.float32))
    text = processor.tokenizer.decode(ids)
    if family == "qwen3-omni" and case.tools:
        assert "<|im_start|>user\n<tool_response>\na bird\n</tool_response><|im_end|>" in text
        call = processor.tokenizer.convert_tokens_to_ids("<tool_call>")
        assert [bool(target[i]) for i, token in enumerate(ids) if token == call] == [False, False, True]  # prompt, call
    if family == "qwen3-omni" and not case.tools:
        assert "<think>\nIt sweeps up.\n</think>\n\nRising." in text and "A single chirp." not in text


@pytest.fixture(scope="module")
def qwen25() -> tuple[QwenChatEncoder, Any]:
    processor = load_processor(family="qwen2.5-omni")
    return QwenChatEncoder(processor), processor


@pytest.mark.parametrize("codec", sorted(CODEC_SOUNDS))
def test_every_codec_equals_hf(qwen25, codec):
    case = OmniCase(codec, [chat_message("user", AUDIO, "Say?"), chat_message("assistant", "Tone.")], audios=[CODEC_SOUNDS[codec]])
    _check_against_hf(*qwen25, case, "qwen2.5-omni")


def test_video_sound_interleaves_by_two_second_chunks(encoder, family):
    """A 5-s video heard with its sound: Qwen2.5-Omni's video and audio tokens alternate in 2-s
    chunks inside one span (1 s per grid step); Qwen3-Omni's merge by time: 2 s per grid step (26
    positions), each step then the audio tokens up to the next (26, 26, 13 of a 5-s sound), then
    the last two steps together."""
    case = CASES[-2]
    media = make_omni_media(case)
    prepared = encoder.prepare(typed_conversation(case, media), media.images, media.videos, audios=media.audios,
                               use_audio_in_video=True)
    ids = prepared.input_ids.numpy()
    spec = encoder.hearing.rope
    kinds = np.where(ids == spec.vision.video_token_id, 1, np.where(ids == spec.audio_token_id, 2, 0))
    runs = [int(k) for i, k in enumerate(kinds) if k and (i == 0 or kinds[i - 1] != k)]
    if family == "qwen2.5-omni":
        assert runs[:1] == [2] and runs[1:] == [1, 2] * (len(runs[1:]) // 2) and len(runs) >= 5
    else:
        assert runs == [2, 1, 2, 1, 2, 1, 2, 1]


SHRINK_CASES = [
    OmniCase("shrink_image_audio", [chat_message("user", IMAGE, AUDIO, "Match?"), chat_message("assistant", "No.")],
             images=[(224, 336)], audios=[Sound("wav_s16", 2.0)]),
    OmniCase("shrink_image_heard_video", [chat_message("user", IMAGE, VIDEO, "Same scene?"), chat_message("assistant", "Yes.")],
             images=[(224, 336)], videos=[(16, 56, 84, 4, 4.0)], use_audio_in_video=True),
    OmniCase("shrink_silent_video_audio", [chat_message("user", VIDEO, AUDIO, "Same?"), chat_message("assistant", "No.")],
             videos=[(40, 56, 56, 4, None)], audios=[Sound("flac", 1.5)]),
]


@pytest.mark.parametrize("case", SHRINK_CASES, ids=[c.key for c in SHRINK_CASES])
def test_shrink_keeps_the_sound_and_equals_hf(encoder, processor, family, case):
    """``on_overlong="shrink"`` with sound: the sample is shrunk to fit a row 6 tokens narrower
    than its full length, its sounds whole (same audio tokens and frames), the frames of a video
    heard with its sound kept; and it equals the processor called with the lowered limits."""
    full = _check_against_hf(encoder, processor, case, family)
    width = len(full.input_ids) - 6
    shrunk = _check_against_hf(encoder, processor, case, family, fits=lambda tokens, geometry: tokens <= width)
    assert len(shrunk.input_ids) <= width and shrunk.tokens_before_shrink == len(full.input_ids)
    assert (shrunk.audio_samples, shrunk.audio_frames) == (full.audio_samples, full.audio_frames)
    audio_id = processor.tokenizer.convert_tokens_to_ids(processor.audio_token)
    assert int((shrunk.input_ids == audio_id).sum()) == int((full.input_ids == audio_id).sum())
    if case.images:
        assert shrunk.image_max_pixels is not None
    if case.use_audio_in_video:
        assert shrunk.video_max_frames == encoder.vision.max_frames
        assert torch.equal(shrunk.video_grid_thw, full.video_grid_thw)
    elif case.videos:
        assert shrunk.video_grid_thw[0, 0] < full.video_grid_thw[0, 0]


def test_shrink_never_lowers_a_heard_video(encoder, processor):
    """A sample whose heard video alone is too long for the row is left as it is (then skipped as overlong)."""
    case = SHRINK_CASES[1]
    media = make_omni_media(case)
    kwargs = dict(audios=media.audios, use_audio_in_video=True)
    conversation = typed_conversation(case, media)
    full = encoder.prepare(conversation, media.images, media.videos, **kwargs)
    video_tokens = int(full.video_grid_thw.prod()) // 4
    narrow = encoder.prepare(conversation, media.images, media.videos, **kwargs,
                             fits=lambda tokens, geometry: tokens <= video_tokens)
    assert narrow.tokens_before_shrink is None and narrow.video_max_frames is None
    assert torch.equal(narrow.input_ids, full.input_ids)
