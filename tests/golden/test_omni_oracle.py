"""Oracle: a packed THD row of Qwen-Omni samples through a tiny random-weight HF thinker equals
each sample run alone (max abs logit difference <= 1e-5, float32), for both families: Qwen2.5-Omni
and Qwen3-Omni (a MoE thinker: routing is per token, so the row's padding and its other segments
change no segment's logits; deepstack visual features ride with the row's pixels).

One row holds an audio-only chat, image + audio, a video heard without its sound, a video heard
with it (``use_audio_in_video``) beside a standalone audio, and a text-only chat. The packed run
feeds the row's unpadded audio features through the thinker's audio tower with the row's
``audio_feature_lengths``, the row's pixels and explicit 3-D positions and a block-diagonal mask
from ``cu_seqlens``. The unpacked run gives each sample alone to ``Qwen2_5OmniProcessor`` (features
padded to 300 s with their mask) and to the same thinker with its own ``get_rope_index`` positions.
"""

from __future__ import annotations

import pytest
import torch

from energon_pack.qwen.processor import load_processor
from tests.support.omni_reference import (
    OmniCase,
    Sound,
    chat_message,
    pack_omni_cases,
    packed_omni_logits,
    unpacked_omni_logits,
)
from tests.support.model_oracle import split_logits
from tests.support.tiny_omni import tiny_qwen25_omni_thinker, tiny_qwen3_omni_thinker

# Slow: a tiny thinker forward per case and the HF processor's 300-s audio padding.
pytestmark = pytest.mark.slow

ATOL = 1e-5
AUDIO, IMAGE, VIDEO = {"type": "audio"}, {"type": "image"}, {"type": "video"}


CASES = [
    OmniCase("audio", [chat_message("user", AUDIO, "What is it?"), chat_message("assistant", "A chirp.")], audios=[Sound("wav_s16", 2.3)]),
    OmniCase("image_audio", [chat_message("user", IMAGE, AUDIO, "Same?"), chat_message("assistant", "No.")],
             images=[(56, 84)], audios=[Sound("mp3", 1.1, 44100, 2)]),
    OmniCase("video", [chat_message("user", VIDEO, "Describe."), chat_message("assistant", "Noise.")], videos=[(8, 56, 56, 4, 2.0)]),
    OmniCase("video_with_sound", [chat_message("user", AUDIO, VIDEO, "Heard?"), chat_message("assistant", "Yes.")],
             videos=[(18, 56, 56, 4, 4.5)], audios=[Sound("flac", 0.7)], use_audio_in_video=True),
    OmniCase("text", [chat_message("user", "2+2?"), chat_message("assistant", "4")]),
]


THINKERS = {"qwen2.5-omni": tiny_qwen25_omni_thinker, "qwen3-omni": tiny_qwen3_omni_thinker}


@pytest.fixture(scope="module", params=sorted(THINKERS))
def family(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def thinker(family) -> torch.nn.Module:
    return THINKERS[family](seed=0)


@pytest.fixture(scope="module")
def packed(family):
    processor = load_processor(family=family, min_pixels=56 * 56, max_pixels=112 * 112)
    return pack_omni_cases(processor, CASES, seq_length=512, pad_to_multiple_of=8)


def test_row_carries_unpadded_sounds(packed):
    """The row's features are the real frames of every sound in row order; lengths = HF mask sums."""
    row, refs = packed.row, packed.references
    audio = row["audio_inputs"]
    lengths = [n for ref in refs if "feature_attention_mask" in ref for n in ref["feature_attention_mask"].sum(-1).tolist()]
    assert audio.audio_feature_lengths.tolist() == lengths and audio.frames == sum(lengths)
    padded = [ref["input_features"].shape[-1] for ref in refs if "input_features" in ref]
    assert all(n == 30000 for n in padded) or max(padded) < 30000  # Qwen2.5-Omni pads to 300 s, Qwen3-Omni to the longest
    assert row["row_cost"]["audio_frames"] == sum(lengths) and row["row_cost"]["audios"] == len(lengths)


def test_packed_row_logits_equal_unpacked_logits(packed, thinker):
    row = packed.row
    segments = split_logits(packed_omni_logits(thinker, row), row)
    assert len(segments) == len(CASES)
    worst = 0.0
    for case, got, ref in zip(CASES, segments, packed.references):
        expected = unpacked_omni_logits(thinker, ref, case.use_audio_in_video)
        torch.testing.assert_close(got, expected, atol=ATOL, rtol=0, msg=lambda m, k=case.key: f"{k}: {m}")
        worst = max(worst, (got - expected).abs().max().item())
    print(f"omni oracle ({row['input_ids'].shape[1]} slots): max abs logit difference {worst:.2e}")


def test_oracle_sees_wrong_sounds(packed, thinker):
    """Control: the row's sounds in the wrong order change every segment that hears one."""
    row = dict(packed.row)
    audio = row["audio_inputs"]
    lengths = audio.audio_feature_lengths.flip(0)
    parts = torch.split(audio.input_features, audio.audio_feature_lengths.tolist(), dim=1)
    row["audio_inputs"] = type(audio)(input_features=torch.cat(parts[::-1], dim=1), audio_feature_lengths=lengths)
    segments = split_logits(packed_omni_logits(thinker, row), row)
    for case, got, ref in zip(CASES, segments, packed.references):
        if case.audios:
            assert (got - unpacked_omni_logits(thinker, ref, case.use_audio_in_video)).abs().max() > 100 * ATOL, case.key
