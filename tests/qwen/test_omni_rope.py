"""Qwen-Omni rope positions and audio token counts (energon_pack.qwen.omni_rope) on hand-worked samples."""

from __future__ import annotations

import torch

from energon_pack.qwen.omni_rope import OmniMedia, OmniRopeSpec, audio_token_count, omni_position_ids

S = OmniRopeSpec.released("qwen2.5-omni")
T, B, E, A, I, V = 5, S.audio_start_token_id, 151648, S.audio_token_id, S.vision.image_token_id, S.vision.video_token_id
VB, VE = S.vision_start_token_id, 151653


def test_audio_token_count():
    """Two stride-2 steps; under 3 frames (30 ms) an audio gives no token at all."""
    assert [audio_token_count(n) for n in (1, 2, 3, 5, 7, 100, 3000, 30000)] == [0, 0, 1, 1, 2, 25, 750, 7500]


def test_audio_only_is_sequential():
    ids = torch.tensor([T, B, A, A, E, T])
    assert omni_position_ids(ids, OmniMedia(audio_feature_lengths=[9]), spec=S).tolist() == [list(range(6))] * 3


def test_image_then_audio():
    """Image grid (1, 4, 4) -> 2x2 tokens at start 2; the next block starts one past their max."""
    ids = torch.tensor([T, VB, I, I, I, I, VE, B, A, E])
    got = omni_position_ids(ids, OmniMedia(image_grid_thw=torch.tensor([[1, 4, 4]]), audio_feature_lengths=[5]), spec=S)
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
    media = OmniMedia(
        video_grid_thw=torch.tensor([[4, 2, 2]]), audio_feature_lengths=[65], video_second_per_grid=[1.0],
        use_audio_in_video=True,
    )
    got = omni_position_ids(ids, media, spec=S)
    start = 2
    temporal = [0, 1, 1, start, start + 25, *range(start, start + 16), start + 50, start + 75, 78, 78, 79]
    assert got[0].tolist() == temporal
    assert got[1].tolist()[3:6] == [start, start, start]


Q3 = OmniRopeSpec.released("qwen3-omni")
QB, QE, QA = Q3.audio_start_token_id, 151670, Q3.audio_token_id


def test_qwen3_audio_token_count():
    """Chunks of 100 frames, 13 tokens each, then three stride-2 steps of the rest; 1 frame is 1 token."""
    counts = [audio_token_count(n, 50) for n in (0, 1, 2, 8, 9, 100, 101, 150, 300, 30000)]
    assert counts == [0, 1, 1, 1, 2, 13, 14, 20, 39, 3900]
    assert Q3.audio_tokens(100) == 13 and S.audio_tokens(100) == 25


def test_qwen3_video_with_sound_merges_by_position():
    """Video grid (3, 2, 2) at 2 s per step: 3 tokens at t = 0, 26, 52 past the span start; a sound
    of 300 frames -> 39 tokens at 0..38 past it. Qwen3-Omni: the two opening markers at 1, 2 (one
    each), the span from 3; video 0 first, audio 0..25, video 26 before audio 26, ..., audio 38,
    then the video rest 52 (55 past 0); the closing markers at 56, 57, the text at 58."""
    ids = torch.tensor([T, VB, QB, V, *[QA] * 26, V, *[QA] * 13, V, QE, VE, T])
    media = OmniMedia(
        video_grid_thw=torch.tensor([[3, 2, 2]]), audio_feature_lengths=[300], video_second_per_grid=[2.0],
        use_audio_in_video=True,
    )
    got = omni_position_ids(ids, media, spec=Q3)
    start = 3
    assert got[0].tolist() == [
        0, 1, 2, start, *range(start, start + 26), start + 26, *range(start + 26, start + 39), start + 52, 56, 57, 58,
    ]


def test_qwen3_closing_markers_follow_the_last_piece():
    """A one-step video (grid (1, 2, 16): 8 tokens, width positions 2..9) heard with a sound of 17
    frames (3 tokens at 2, 3, 4): the video comes first, the sound is the rest after the merge, and
    the markers after the span sit one past that rest's largest position (5, 6), not past the
    frame's width positions (get_rope_index takes the last piece's max)."""
    ids = torch.tensor([VB, QB, *[V] * 8, *[QA] * 3, QE, VE, T])
    media = OmniMedia(
        video_grid_thw=torch.tensor([[1, 2, 16]]), audio_feature_lengths=[17], video_second_per_grid=[2.0],
        use_audio_in_video=True,
    )
    got = omni_position_ids(ids, media, spec=Q3)
    assert got[0].tolist() == [0, 1, *[2] * 8, 2, 3, 4, 5, 6, 7]
    assert got[2].tolist() == [0, 1, *range(2, 10), 2, 3, 4, 5, 6, 7]
