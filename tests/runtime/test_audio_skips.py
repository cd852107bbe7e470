"""Bad Qwen-Omni audio input: each kind a counted skip with its own reason (docs/bad_input_policy.md),
and ``max_audio_seconds`` with ``on_overlong_audio`` trim / skip."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest

from energon_pack.config import PackingConfig
from energon_pack.core.samples import QwenVLChatSample
from energon_pack.errors import BadSampleError
from energon_pack.qwen.processor import load_processor
from energon_pack.runtime.task_encoder import QwenVLPackingTaskEncoder
from tests.support.audio_media import encode_audio, encode_video_with_sound, tone

# Slow: building the offline Qwen2.5-Omni and Qwen2.5-VL processors (~10 s); the tests themselves are quick.
pytestmark = pytest.mark.slow

AUDIO_CHAT = [{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "?"}]},
              {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}]
VIDEO_CHAT = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "?"}]},
              {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}]


@pytest.fixture(scope="module")
def processor() -> Any:
    return load_processor(family="qwen2.5-omni", min_pixels=56 * 56, max_pixels=112 * 112)


def _encoder(processor: Any, **row: Any) -> QwenVLPackingTaskEncoder:
    return QwenVLPackingTaskEncoder(PackingConfig(seq_length=4096, pixel_dtype="float32", **row), processor)


def _sample(conversation=AUDIO_CHAT, audios=(), videos=(), use_audio_in_video=False) -> QwenVLChatSample:
    return QwenVLChatSample(
        __key__="s", __restore_key__=(), __subflavors__=None, __sources__=None, conversation=conversation, images=[],
        videos=list(videos), audios=list(audios) or None, use_audio_in_video=use_audio_in_video,
    )


def _wav_with_tag(tag: int, data: bytes = b"\0" * 3200) -> bytes:
    fmt = struct.pack("<HHIIHH", tag, 1, 16000, 32000, 2, 16)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


SILENT_VIDEO = encode_video_with_sound(np.zeros((4, 56, 56, 3), np.uint8), 4, None)


@pytest.mark.parametrize(
    ("sample", "reason"),
    [
        (_sample(audios=[b"\x01corrupt" * 50]), "corrupt_audio"),
        (_sample(audios=[_wav_with_tag(0x1111)]), "undecodable_audio"),
        (_sample(audios=[encode_audio(tone(0.01, 16000), 16000, "wav_s16")]), "empty_audio"),
        (_sample(audios=[_wav_with_tag(1, b"")]), "empty_audio"),
        (_sample(audios=[]), "placeholder_mismatch"),
        (_sample(conversation=VIDEO_CHAT, videos=[SILENT_VIDEO], use_audio_in_video=True), "video_without_audio"),
    ],
    ids=["corrupt", "undecodable", "30ms", "empty", "placeholder_mismatch", "silent_video"],
)
def test_bad_audio_is_a_counted_skip(processor, sample, reason):
    prepared = _encoder(processor).preencode_sample(sample)
    assert prepared.skip_reason == reason, prepared.skip_detail


def test_truncated_audio_fails_at_postencode(processor):
    data = encode_audio(tone(2.0, 16000), 16000, "flac")
    encoder = _encoder(processor)
    prepared = encoder.preencode_sample(_sample(audios=[data[: len(data) // 2]]))
    assert prepared.skip_reason is None
    with pytest.raises(BadSampleError) as err:
        encoder.postencode_sample(prepared)
    assert err.value.reason == "corrupt_audio"


def test_vision_processor_refuses_audio():
    prepared = _encoder(load_processor()).preencode_sample(_sample(audios=[encode_audio(tone(1.0, 16000), 16000, "wav_s16")]))
    assert prepared.skip_reason == "audio_not_supported"


def test_overlong_audio_is_trimmed_or_skipped(processor):
    sample = _sample(audios=[encode_audio(tone(2.5, 16000), 16000, "wav_s16")])
    assert _encoder(processor, max_audio_seconds=1.0, on_overlong_audio="skip").preencode_sample(sample).skip_reason == "audio_too_long"
    trimmed = _encoder(processor, max_audio_seconds=1.0)
    prepared = trimmed.preencode_sample(sample)
    full = _encoder(processor).preencode_sample(sample)
    audio_id = processor.audio_token_id
    assert int((prepared.input_ids == audio_id).sum()) == 25 and int((full.input_ids == audio_id).sum()) == 62
    segment = trimmed.postencode_sample(prepared).segment
    assert segment.audio.audio_feature_lengths.tolist() == [100] and segment.audio.input_features.shape == (128, 100)
    with pytest.raises(ValueError, match="max_audio_seconds=400"):
        _encoder(processor, max_audio_seconds=400)
