"""Decoder threading by what the decode does (``qwen.decoder_threads.decoder_threading``): one
thread for small pictures, slice threads for seeking decodes and short ones, frame threads only for
a sequential decode of a large clip; ``sampled_frames`` opens each pass with the rule's choice, and
the frames are the same."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from energon_pack.qwen import decoder_threads
from energon_pack.qwen import frames as frames_module
from energon_pack.qwen.decoder_threads import FRAME_THREADS_MIN_FRAMES, MIN_THREADED_PIXELS, decoder_threading
from energon_pack.qwen.frames import sampled_frames
from tests.support.hf_reference import decoded_video
from tests.support.real_corpus import SEEK_CORPUS, SEEK_FRAMES


@pytest.mark.parametrize(("decode", "expected"), [
    (dict(seeking=False, frames=3600, width=1920, height=1080, threads=4), ("FRAME", 4)),
    (dict(seeking=True, frames=64, width=1920, height=1080, threads=4), ("SLICE", 4)),  # seeks flush frame threads
    (dict(seeking=False, frames=300, width=320, height=240, threads=4), ("SLICE", 1)),  # small pictures
    (dict(seeking=True, frames=64, width=1280, height=719, threads=4), ("SLICE", 1)),
    (dict(seeking=False, frames=FRAME_THREADS_MIN_FRAMES - 1, width=1920, height=1080, threads=2), ("SLICE", 2)),
    (dict(seeking=False, frames=FRAME_THREADS_MIN_FRAMES, width=1280, height=720, threads=2), ("FRAME", 2)),
    (dict(seeking=False, frames=3600, width=1920, height=1080, threads=1), ("SLICE", 1)),
    (dict(seeking=False, frames=3600, width=0, height=0, threads=2), ("SLICE", 1)),  # no size in the header
])
def test_threading_follows_what_the_decode_does(decode, expected) -> None:
    assert decoder_threading(**decode) == expected


@given(seeking=st.booleans(), frames=st.integers(0, 10**5), width=st.integers(0, 8192), height=st.integers(0, 8192),
       threads=st.integers(1, 64))
def test_frame_threads_only_for_a_sequential_decode_of_a_large_clip(seeking, frames, width, height, threads) -> None:
    kind, count = decoder_threading(seeking=seeking, frames=frames, width=width, height=height, threads=threads)
    large_pictures = width * height >= MIN_THREADED_PIXELS
    assert count == (threads if large_pictures else 1) and kind in ("SLICE", "FRAME")
    assert (kind == "FRAME") == (not seeking and large_pictures and frames >= FRAME_THREADS_MIN_FRAMES and threads > 1)


def test_no_threads_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match=r"threads=0: .*fix: pass decode_threads >= 1"):
        decoder_threading(seeking=False, frames=10, width=64, height=64, threads=0)


def test_sampled_frames_opens_each_pass_with_the_rules_threading(monkeypatch) -> None:
    """A seeking pass and a dense (sequential) decode of this small 60-frame clip get one thread;
    with the thresholds lowered to it, the seeking pass gets slice threads, the sequential decode
    frame threads, and the frames are still those of a plain sequential decode."""
    item = next(item for item in SEEK_CORPUS if item.name == "h264web.mp4")
    data = item.make()
    every = decoded_video(data)[0]
    opened: list[tuple[bool, int, tuple[str, int]]] = []

    def recording(**decode):
        choice = decoder_threading(**decode)
        opened.append((decode["seeking"], decode["frames"], choice))
        return choice

    monkeypatch.setattr(frames_module, "decoder_threading", recording)
    sparse, dense = [0, 20, 40, 59], list(range(0, SEEK_FRAMES, 2))
    for indices in (sparse, dense):
        opened.clear()
        list(sampled_frames(data, indices, SEEK_FRAMES, threads=3))
        assert opened == [(indices is sparse, 4 if indices is sparse else SEEK_FRAMES, ("SLICE", 1))]
    monkeypatch.setattr(decoder_threads, "MIN_THREADED_PIXELS", 1)
    monkeypatch.setattr(decoder_threads, "FRAME_THREADS_MIN_FRAMES", 1)
    for indices in (sparse, dense):
        opened.clear()
        got = np.stack([frame.to_ndarray(format="rgb24") for _, frame in sampled_frames(data, indices, SEEK_FRAMES, threads=3)])
        np.testing.assert_array_equal(got, every[indices])
        assert opened == [(indices is sparse, 4 if indices is sparse else SEEK_FRAMES,
                           ("SLICE", 3) if indices is sparse else ("FRAME", 3))], opened
