"""Qwen2.5-Omni rope positions (energon_pack.qwen.omni_rope) on hand-worked samples."""

from __future__ import annotations

import torch

from energon_pack.qwen.omni_rope import OmniRopeSpec, audio_token_count, omni_position_ids

S = OmniRopeSpec()
T, B, E, A, I, V = 5, S.audio_start_token_id, 151648, S.audio_token_id, S.image_token_id, S.video_token_id
VB, VE = S.vision_start_token_id, 151653


def test_audio_token_count():
    """Two stride-2 steps; under 3 frames (30 ms) an audio gives no token at all."""
    assert [audio_token_count(n) for n in (1, 2, 3, 5, 7, 100, 3000, 30000)] == [0, 0, 1, 1, 2, 25, 750, 7500]


def test_audio_only_is_sequential():
    ids = torch.tensor([T, B, A, A, E, T])
    assert omni_position_ids(ids, spec=S, audio_feature_lengths=[9]).tolist() == [list(range(6))] * 3


def test_image_then_audio():
    """Image grid (1, 4, 4) -> 2x2 tokens at start 2; the next block starts one past their max."""
    ids = torch.tensor([T, VB, I, I, I, I, VE, B, A, E])
    got = omni_position_ids(ids, spec=S, image_grid_thw=torch.tensor([[1, 4, 4]]), audio_feature_lengths=[5])
    assert got.tolist() == [
        [0, 1, 2, 2, 2, 2, 4, 5, 6, 7],
        [0, 1, 2, 2, 3, 3, 4, 5, 6, 7],
        [0, 1, 2, 3, 2, 3, 4, 5, 6, 7],
    ]


def test_video_with_sound_interleaves_chunks():
    """Video grid (4, 2, 2): 4 steps of 1 token at t = 0, 25, 50, 75 past the span start (1 s per
    step); sound of 65 frames -> 16 tokens at 0..15 past it. Both markers before the span sit at 1,
    the span starts at 2; chunks of 50 positions: video [2, 27] + audio [2..17], then video [52, 77];
    the closing markers sit at 78, the text after at 79."""
    ids = torch.tensor([T, VB, B, V, V, *[A] * 16, V, V, E, VE, T])
    got = omni_position_ids(
        ids, spec=S, video_grid_thw=torch.tensor([[4, 2, 2]]), audio_feature_lengths=[65],
        video_second_per_grid=[1.0], use_audio_in_video=True,
    )
    start = 2
    temporal = [0, 1, 1, start, start + 25, *range(start, start + 16), start + 50, start + 75, 78, 78, 79]
    assert got[0].tolist() == temporal
    assert got[1].tolist()[3:6] == [start, start, start]
