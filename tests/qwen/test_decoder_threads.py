"""Decoder threading (``qwen.decoder_threads.decoder_threading``): slice threads for pictures of
720p and more, one thread below, never frame threads; ``sampled_frames`` opens its seeking pass and
its sequential decode with the rule's choice, and the frames are the same."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from energon_pack.qwen import decoder_threads
from energon_pack.qwen import frames as frames_module
from energon_pack.qwen.decoder_threads import MIN_THREADED_PIXELS, decoder_threading
from energon_pack.qwen.frames import sampled_frames
from tests.support.hf_reference import decoded_video
from tests.support.real_corpus import SEEK_CORPUS, SEEK_FRAMES


@pytest.mark.parametrize(("picture", "threads", "expected"), [
    ((1920, 1080), 4, ("SLICE", 4)),
    ((1280, 720), 2, ("SLICE", 2)),
    ((1280, 719), 4, ("SLICE", 1)),  # under 720p: one thread
    ((320, 240), 4, ("SLICE", 1)),
    ((0, 0), 2, ("SLICE", 1)),  # no size in the header
    ((3840, 2160), 1, ("SLICE", 1)),
])
def test_slice_threads_from_720p_one_thread_below(picture, threads, expected) -> None:
    assert decoder_threading(width=picture[0], height=picture[1], threads=threads) == expected


@given(width=st.integers(0, 8192), height=st.integers(0, 8192), threads=st.integers(1, 64))
def test_never_frame_threads_and_never_more_threads_than_available(width, height, threads) -> None:
    kind, count = decoder_threading(width=width, height=height, threads=threads)
    assert kind == "SLICE" and count == (threads if width * height >= MIN_THREADED_PIXELS else 1)


def test_no_threads_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match=r"threads=0: .*fix: pass decode_threads >= 1"):
        decoder_threading(width=64, height=64, threads=0)


def test_sampled_frames_opens_each_pass_with_the_rules_threading(monkeypatch) -> None:
    """A seeking pass and a dense (sequential) decode of this small clip get one thread; with the
    threshold lowered to it, slice threads, and the frames are still a plain sequential decode's."""
    item = next(item for item in SEEK_CORPUS if item.name == "h264web.mp4")
    data = item.make()
    every = decoded_video(data)[0]
    opened: list[tuple[str, int]] = []

    def recording(**picture):
        opened.append(decoder_threading(**picture))
        return opened[-1]

    monkeypatch.setattr(frames_module, "decoder_threading", recording)
    sparse, dense = [0, 20, 40, 59], list(range(0, SEEK_FRAMES, 2))
    for threshold, expected in ((MIN_THREADED_PIXELS, ("SLICE", 1)), (1, ("SLICE", 3))):
        monkeypatch.setattr(decoder_threads, "MIN_THREADED_PIXELS", threshold)
        for indices in (sparse, dense):
            opened.clear()
            got = [frame.to_ndarray(format="rgb24") for _, frame in sampled_frames(data, indices, SEEK_FRAMES, threads=3)]
            np.testing.assert_array_equal(np.stack(got), every[indices])
            assert opened == [expected], (threshold, indices, opened)
