"""Decoding only what the sampled frames need (``qwen.frames.sampled_frames``) gives exactly the frames
of a full sequential decode, on every container and codec of the real-world corpus with a keyframe
every 8 frames (tests/support/real_corpus.py ``SEEK_CORPUS``: B-frames, open and closed GOPs, variable
frame rate, an edit list), with and without decoder threads; on B-frame streams every seek lands on
the keyframe it aims at and the decoder skips non-reference pictures no sampled frame needs; streams
it cannot vouch for are decoded sequentially; a stream holding fewer frames than counted is a
``media_mismatch``."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from energon_pack.errors import BadSampleError
from energon_pack.qwen import frames as frames_module
from energon_pack.qwen.frames import StreamIndex, sampled_frames
from energon_pack.qwen.media import probe_video
from tests.support.hf_reference import decoded_video
from tests.support.real_corpus import SEEK_CORPUS, SEEK_FRAMES

#: Sampled frame sets: sparser than keyframes (seeks), dense (decode through), the last frame alone.
INDEX_SETS = ([0, 20, 40, 59], [0, 13, 26, 39, 52, 59], [59], [3, 12, 21, 30, 39, 48, 57], list(range(0, 60, 2)))


@pytest.fixture(scope="module")
def seek_corpus() -> dict[str, tuple[bytes, np.ndarray]]:
    """Name -> (bytes, every frame of a sequential PyAV decode)."""
    clips = {}
    for item in SEEK_CORPUS:
        data = item.make()
        clips[item.name] = (data, decoded_video(data)[0])
    return clips


def _decode(data: bytes, indices: list[int], total: int, **kwargs) -> tuple[np.ndarray, list[int]]:
    """(frames by position, positions in the order yielded)."""
    out, order = {}, []
    for position, frame in sampled_frames(data, indices, total, **kwargs):
        out[position] = frame.to_ndarray(format="rgb24")
        order.append(position)
    return np.stack([out[p] for p in range(len(indices))]), order


@pytest.mark.parametrize("item", [item.name for item in SEEK_CORPUS])
def test_seeking_gives_the_sequential_frames(seek_corpus, item, monkeypatch) -> None:
    data, every = seek_corpus[item]
    total = probe_video(data).num_frames
    assert total == len(every) == SEEK_FRAMES - (5 if item == "editlist.mp4" else 0)
    with av.open(io.BytesIO(data)) as container:
        index = StreamIndex.scan(container, container.streams.video[0], total)
    assert index.frame_pts is not None and len(index.keyframes) >= 7, item  # seekable, a keyframe every 8
    fallbacks = []
    sequential = frames_module._sequential
    monkeypatch.setattr(frames_module, "_sequential", lambda *a: fallbacks.append(a) or sequential(*a))
    for threads in (1, 3):
        with monkeypatch.context() as patched:
            if threads > 1:  # frame threads on every pass: exact with them too (the rule never picks them)
                patched.setattr(frames_module, "decoder_threading", lambda **decode: ("FRAME", decode["threads"]))
            for indices in INDEX_SETS:
                indices = sorted({min(i, total - 1) for i in indices})
                got, order = _decode(data, indices, total, threads=threads)
                np.testing.assert_array_equal(got, every[indices], err_msg=f"{item} {indices} threads={threads}")
                assert order == list(range(len(indices)))
    # Every corpus stream is sought exactly: none fell back to the sequential decode when seeking paid.
    assert not [a for a in fallbacks if StreamIndex.worth_seeking(index, a[1])], item


def test_sampled_frames_sparser_than_keyframes_are_sought(seek_corpus, monkeypatch) -> None:
    """With a keyframe every 8 frames and 4 sampled frames of 60, the decoder seeks for frames 20, 40
    and 59 (landing past what it decoded) instead of decoding through; dense frames never seek."""
    data, _ = seek_corpus["h264.mkv"]
    landings = []
    seek = frames_module._seek

    def recording(*args, **kwargs):
        demuxer, landing = seek(*args, **kwargs)
        landings.append((kwargs["after"], landing))
        return demuxer, landing

    monkeypatch.setattr(frames_module, "_seek", recording)
    list(sampled_frames(data, [0, 20, 40, 59], SEEK_FRAMES))
    assert len(landings) == 3 and all(after < landing for after, landing in landings)
    landings.clear()
    list(sampled_frames(data, list(range(0, 60, 2)), SEEK_FRAMES))
    assert landings == []


#: B-frame streams: H.264 closed GOPs (web video, MP4, where a keyframe's dts lies below its pts) and
#: open GOPs, HEVC open GOPs (CRA), an edit list.
B_FRAME_ITEMS = ("h264web.mp4", "h264.mkv", "h264open.mp4", "h264open.mkv", "hevc.mp4", "hevc.mkv", "editlist.mp4")


@pytest.mark.parametrize("item", B_FRAME_ITEMS)
def test_seeks_on_b_frame_streams_land_on_the_keyframe_aimed_at(seek_corpus, item, monkeypatch) -> None:
    """Each seek lands on its seek point, not on the keyframe before (which would decode two GOPs)."""
    data, _ = seek_corpus[item]
    total = probe_video(data).num_frames
    landings = []
    seek = frames_module._seek

    def recording(*args, **kwargs):
        demuxer, landing = seek(*args, **kwargs)
        landings.append((args[3], landing))
        return demuxer, landing

    monkeypatch.setattr(frames_module, "_seek", recording)
    for indices in ([0, 20, 40, total - 1], [7, 23, 39, 55], [3, 12, 21, 30, 39, 48, 57]):
        list(sampled_frames(data, [min(i, total - 1) for i in indices], total))
    assert landings and all(start == landing for start, landing in landings), (item, landings)


class _Counting:
    """A container and its video stream in one, counting the frames the decoder outputs."""

    def __init__(self, container, stream) -> None:
        self.container, self.stream, self.codec_context = container, stream, stream.codec_context
        self.output_pts: list[int] = []

    @property
    def frames(self) -> int:
        return len(self.output_pts)

    def demux(self, _stream):
        return self.container.demux(self.stream)

    def seek(self, timestamp, *, stream, **kwargs):
        self.container.seek(timestamp, stream=self.stream, **kwargs)

    def decode(self, packet):
        frames = self.stream.decode(packet)
        self.output_pts.extend(frame.pts for frame in frames)
        return frames


def _seeking_decode(data: bytes, indices: list[int], total: int, threads: int) -> tuple[np.ndarray, _Counting, StreamIndex]:
    """(the sampled frames of a seeking decode, the decoder's record of every frame it output, the scan);
    ``threads`` > 1: frame threads (exact with any threading, though the rule never picks them)."""
    with frames_module._opened(data, threads) as (container, stream):
        if threads > 1:
            stream.thread_type = "FRAME"
        index = StreamIndex.scan(container, stream, total)
        counting = _Counting(container, stream)
        got = [frame.to_ndarray(format="rgb24") for _, frame in frames_module._seeking(counting, counting, index, indices)]
    return np.stack(got), counting, index


def _seeking_output(data: bytes, indices: list[int], total: int, threads: int) -> tuple[np.ndarray, int]:
    """(the sampled frames of a seeking decode, frames the decoder output for them)."""
    got, counting, _ = _seeking_decode(data, indices, total, threads)
    return got, counting.frames


def _reference_pts(data: bytes) -> set[int]:
    """pts of the pictures other pictures may reference: what a whole decode with ``skip_frame =
    NONREF`` outputs."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        stream.codec_context.skip_frame = "NONREF"
        return {frame.pts for frame in container.decode(stream)}


@pytest.mark.parametrize("item", ["h264web.mp4", "h264open.mkv", "hevc.mp4"])
def test_non_reference_pictures_before_a_sampled_frame_are_skipped_exactly(seek_corpus, item, monkeypatch) -> None:
    """Sampled frames late in their GOP: with ``skip_frame = NONREF`` before each one's packet and
    the decoder drained before the next seek, it outputs fewer frames, and the sampled ones are the
    sequential decode's (with and without frame threads)."""
    data, every = seek_corpus[item]
    total = probe_video(data).num_frames
    indices = [7, 23, 39, 55]
    for threads in (1, 3):
        got, skipping = _seeking_output(data, indices, total, threads)
        np.testing.assert_array_equal(got, every[indices], err_msg=f"{item} threads={threads}")
        with monkeypatch.context() as patched:
            patched.setattr(frames_module, "SKIPS_PER_PACKET", frozenset())
            plain, decoding_all = _seeking_output(data, indices, total, threads)
        np.testing.assert_array_equal(plain, every[indices])
        assert skipping < decoding_all, (item, threads, skipping, decoding_all)


@pytest.mark.parametrize("item", ["h264web.mp4", "h264open.mkv", "hevc.mp4"])
def test_the_decoder_outputs_only_sampled_frames_and_reference_pictures(seek_corpus, item) -> None:
    """Every packet but a sampled frame's own is sent with ``skip_frame = NONREF``, those after a
    sampled frame's packet too (the reordering delay, while the decoder still holds the sampled
    frame): the decoder outputs the sampled frames and reference pictures, no other non-reference
    picture, and the sampled frames are the sequential decode's. Sampled frames that decode
    through (no seek), that seek, and non-reference pictures among them (odd frames of a B-pyramid)."""
    data, every = seek_corpus[item]
    total = probe_video(data).num_frames
    references = _reference_pts(data)
    assert 0 < len(references) < total, item  # a B-frame stream: some pictures are not references
    for indices in ([3, 5, 11, 13, 19, 21, 29, 37, 45, 53, 59], [1, 9, 17, 25, 33, 41, 49, 57], [7, 23, 39, 55]):
        for threads in (1, 3):
            got, counting, index = _seeking_decode(data, indices, total, threads)
            np.testing.assert_array_equal(got, every[indices], err_msg=f"{item} {indices} threads={threads}")
            assert index.frame_pts is not None
            sampled = {index.frame_pts[frame] for frame in indices}
            others = [pts for pts in counting.output_pts if pts not in references | sampled]
            assert not others, (item, indices, threads, others)


def test_a_stream_with_fewer_frames_than_counted_is_a_media_mismatch(seek_corpus) -> None:
    data, every = seek_corpus["h264.mkv"]
    with pytest.raises(BadSampleError) as error:
        list(sampled_frames(data, [0, 20, 40, 60], SEEK_FRAMES + 1))
    assert error.value.reason == "media_mismatch"
    cut = data[: len(data) * 2 // 3]  # the file ends early: later frames are missing
    with pytest.raises(BadSampleError) as error:
        list(sampled_frames(cut, [0, 20, 40, 59], SEEK_FRAMES))
    assert error.value.reason in ("media_mismatch", "corrupt_video")


def test_without_seeking_every_frame_is_decoded_and_counted(seek_corpus) -> None:
    data, every = seek_corpus["hevc.mp4"]
    got, _ = _decode(data, [0, 59], SEEK_FRAMES, seek=False)
    np.testing.assert_array_equal(got, every[[0, 59]])
    with pytest.raises(BadSampleError, match="media_mismatch"):
        list(sampled_frames(data, [0], SEEK_FRAMES + 1, seek=False))


@settings(max_examples=40, deadline=None)
@given(gop=st.integers(1, 12), frames=st.integers(2, 80), data=st.data())
def test_seek_point_is_the_last_keyframe_at_or_before_the_frame(gop, frames, data) -> None:
    """Without reordering (pts = decode order), the seek point of frame i is the keyframe i - i % gop."""
    packets = tuple((i * 10, i * 10, i % gop == 0, False) for i in range(frames))
    index = StreamIndex(packets=packets, frame_pts=tuple(p[0] for p in packets), frame_packet=tuple(range(frames)),
                        keyframes=tuple(i for i in range(frames) if i % gop == 0))
    frame = data.draw(st.integers(0, frames - 1))
    assert index.seek_point(frame) == frame - frame % gop
    assert index.worth_seeking([frame]) == (frame - frame % gop + 1 > frames_module.MIN_SKIPPED_PACKETS)
