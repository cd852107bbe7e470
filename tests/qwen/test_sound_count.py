"""``qwen.sound_count.SoundCount``: a sample's sound tokens from the sounds' lengths (the rule the
online path and plans from facts share), its cap and the order of its checks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from energon_pack.errors import BadSampleError
from energon_pack.qwen.audio import AudioSpec
from energon_pack.qwen.omni_rope import audio_token_count
from energon_pack.qwen.sound_count import SoundCount

QWEN25 = SoundCount.of(AudioSpec(), None, 1.0)
QWEN3 = SoundCount.of(AudioSpec(padded_samples=None), 50, 2.0)
lengths = st.lists(st.integers(min_value=16_000, max_value=6_000_000), max_size=4)


@settings(max_examples=60, deadline=None)
@given(audios=lengths, videos=st.lists(st.one_of(st.none(), st.integers(min_value=16_000, max_value=6_000_000)), max_size=3),
       qwen3=st.booleans(), cap=st.one_of(st.none(), st.floats(min_value=1.0, max_value=300.0)))
def test_sound_tokens_are_each_sounds_tokens_under_the_samples_padding(audios, videos, qwen3, cap):
    base = QWEN3 if qwen3 else QWEN25
    counting = SoundCount.of(base.spec, base.n_window, base.video_second_per_grid, max_audio_seconds=cap)
    heard = [n for n in videos if n is not None]
    sound = counting.sound_tokens(audios, videos)
    padded = counting.spec.padded_length([*audios, *heard])
    expected = [audio_token_count(counting.spec.feature_frames(n, padded), base.n_window) for n in [*audios, *heard]]
    assert [*sound.audios, *(t for t in sound.videos if t is not None)] == expected
    assert [t is None for t in sound.videos] == [n is None for n in videos]
    assert sound.video_second_per_grid == (base.video_second_per_grid,) * len(videos)
    # trimmed: a sound over the cap counts as the cap
    capped = [min(n, counting.spec.max_samples) for n in [*audios, *heard]]
    assert expected == counting.tokens(capped)


def test_length_is_checked_before_tokens_and_the_cap_is_validated():
    skip = SoundCount.of(AudioSpec(), None, 1.0, max_audio_seconds=1.0, trim=False)
    assert skip.sound_tokens([16_000], [None]).audios == (25,)
    for audios, videos in (([16_001], []), ([100], [32_000])):  # over the cap names the sample first, then empty clips
        with pytest.raises(BadSampleError) as bad:
            skip.sound_tokens(audios, videos)
        assert bad.value.reason == "audio_too_long"
    with pytest.raises(BadSampleError) as bad:
        QWEN25.sound_tokens([320], [])
    assert bad.value.reason == "empty_audio"
    with pytest.raises(ValueError, match=r"max_audio_seconds=301 must be in \(0, 300\]"):
        SoundCount.of(AudioSpec(), None, 1.0, max_audio_seconds=301)
    assert SoundCount.of_dict(QWEN3.to_dict()) == QWEN3 and SoundCount.of_dict(skip.to_dict()) == skip
