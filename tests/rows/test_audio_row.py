"""Qwen-Omni audio in rows: segments' features concatenated along time without padding, the key only
on rows with sound, row_cost audio keys, and the payload carried by ``to_device_batch``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from energon_pack.core.audio_inputs import AudioInputs
from energon_pack.core.visual import VisualInputs
from energon_pack.rows.encoded import PackedRow, PackedSegment
from energon_pack.rows.step import to_device_batch
from energon_pack.rows.thd import build_thd_row


def _segment(key: str, length: int, frames: list[int]) -> PackedSegment:
    audio = None
    if frames:
        features = [np.full((128, n), float(n), dtype=np.float32) for n in frames]
        audio = AudioInputs.of(features)
    ids = torch.arange(length, dtype=torch.int64) + 10
    return PackedSegment(
        key=key, input_ids=ids, labels=ids.clone(), loss_mask=torch.ones(length), visual=VisualInputs(),
        mrope_position_ids=torch.arange(length).expand(3, -1).clone(), audio=audio,
    )


def test_row_concatenates_sounds_in_row_order():
    segments = [_segment("a", 5, [100, 37]), _segment("t", 3, []), _segment("b", 4, [12])]
    row = build_thd_row(segments, seq_length=16, pad_multiple=1, pad_token_id=0)
    audio = row["audio_inputs"]
    assert audio.audio_feature_lengths.tolist() == [100, 37, 12] and audio.input_features.shape == (128, 149)
    assert audio.input_features[0, :100].eq(100).all() and audio.input_features[0, 100:137].eq(37).all()
    assert audio.input_features[0, 137:].eq(12).all()
    cost = PackedRow(__key__="r", __restore_key__=(), __subflavors__=None, __sources__=None, segments=segments, stats={}).row_cost
    assert (cost["audios"], cost["audio_frames"]) == (3, 149)


def test_rows_without_sound_have_no_audio_key():
    segments = [_segment("t", 3, [])]
    row = build_thd_row(segments, seq_length=8, pad_multiple=1, pad_token_id=0)
    assert "audio_inputs" not in row
    cost = PackedRow(__key__="r", __restore_key__=(), __subflavors__=None, __sources__=None, segments=segments, stats={}).row_cost
    assert "audios" not in cost and "audio_frames" not in cost


def test_to_device_batch_carries_the_audio_payload():
    row = build_thd_row([_segment("a", 5, [9])], seq_length=8, pad_multiple=1, pad_token_id=0)
    out = to_device_batch(row, "cpu")
    assert torch.equal(out["audio_inputs"].input_features, row["audio_inputs"].input_features)
    assert "audio_inputs" not in to_device_batch(build_thd_row([_segment("t", 3, [])], seq_length=8, pad_multiple=1,
                                                               pad_token_id=0), "cpu")


def test_features_and_lengths_must_agree():
    with pytest.raises(ValueError, match="sum to 5"):
        AudioInputs(input_features=torch.zeros(128, 4), audio_feature_lengths=torch.tensor([5]))
