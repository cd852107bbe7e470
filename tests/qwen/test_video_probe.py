"""Video frame counts from demuxing equal a full decode for every container/codec of the real corpus;
VP8/VP9 hidden frames, AVI drop chunks, cut files, audio, variable frame rate, and the rotation rule
(frames as stored, as ``transformers.video_utils.load_video`` with its default pyav backend)."""

from __future__ import annotations

import io
import tempfile
from collections.abc import Callable, Iterable

import av
import numpy as np
import pytest
from transformers.video_utils import load_video

from energon_pack.qwen.media import BadMediaError, probe_video, vp8_shown, vp9_shown
from energon_pack.qwen.pixels import decode_video_frames
from tests.support.real_corpus import CORPUS, encode_clip

VIDEOS = {item.name: item for item in CORPUS if item.kind == "video"}


@pytest.fixture(scope="module")
def clips() -> dict[str, bytes]:
    return {name: item.make() for name, item in VIDEOS.items()}


def decoded_frames(data: bytes) -> np.ndarray:
    with av.open(io.BytesIO(data)) as container:
        return np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)])


def remux(data: bytes, container_format: str, edit: Callable[[int, av.Packet], Iterable[av.Packet]]) -> bytes:
    """Stream-copy the first video stream into ``container_format``, packet i replaced by ``edit(i, packet)``."""
    out = io.BytesIO()
    with av.open(io.BytesIO(data)) as source, av.open(out, "w", format=container_format) as target:
        stream = source.streams.video[0]
        copy = target.add_stream_from_template(stream)
        for index, packet in enumerate(p for p in source.demux(stream) if p.size):
            for piece in edit(index, packet):
                piece.stream = copy
                target.mux(piece)
    return out.getvalue()


@pytest.mark.parametrize("name", sorted(VIDEOS))
def test_frame_count_equals_full_decode(name: str, clips: dict[str, bytes]) -> None:
    header = probe_video(clips[name])
    frames = decoded_frames(clips[name])
    assert header.num_frames == len(frames) == 24
    assert (header.width, header.height) == (frames.shape[2], frames.shape[1])
    # postencode's decoder agrees (it checks the count against the header's: no media_mismatch)
    np.testing.assert_array_equal(decode_video_frames(clips[name], [0, 23], header.num_frames), frames[[0, 23]])


def test_vfr_rate_is_average_rate(clips: dict[str, bytes]) -> None:
    """The VFR clip: fps is stream.average_rate (HF's pyav loader uses the same), not the muxer's 12."""
    header = probe_video(clips["vfr.mp4"])
    with av.open(io.BytesIO(clips["vfr.mp4"])) as container:
        assert header.fps == float(container.streams.video[0].average_rate)
    assert header.fps != 12.0


def test_audio_track_ignored(clips: dict[str, bytes]) -> None:
    header = probe_video(clips["aac.mp4"])
    assert header.has_audio and header.num_frames == 24


def test_vp8_hidden_frame_not_counted(clips: dict[str, bytes]) -> None:
    """A VP8 packet with show_frame=0 (an alt-ref frame muxed on its own) decodes to no frame."""

    def hide_sixth(index: int, packet: av.Packet) -> list[av.Packet]:
        if index != 5:
            return [packet]
        payload = bytearray(bytes(packet))
        payload[0] &= ~0x10
        hidden = av.Packet(bytes(payload))
        hidden.pts, hidden.dts, hidden.time_base = packet.pts, packet.dts, packet.time_base
        return [hidden]

    data = remux(clips["vp8.webm"], "webm", hide_sixth)
    assert probe_video(data).num_frames == len(decoded_frames(data)) == 23


def test_avi_drop_chunk_is_not_truncation(clips: dict[str, bytes]) -> None:
    """An AVI with a zero-size (drop) chunk lists 25 frames in its header, decodes 24: not cut short."""

    def drop_after_sixth(index: int, packet: av.Packet) -> list[av.Packet]:
        shift = 1 if index > 5 else 0
        packet.pts, packet.dts = packet.pts + shift, packet.dts + shift
        if index != 5:
            return [packet]
        drop = av.Packet(0)
        drop.pts = drop.dts = packet.dts + 1
        drop.time_base = packet.time_base
        return [packet, drop]

    data = remux(clips["mpeg4.avi"], "avi", drop_after_sixth)
    with av.open(io.BytesIO(data)) as container:
        assert container.streams.video[0].frames == 25
    assert probe_video(data).num_frames == len(decoded_frames(data)) == 24


def test_cut_mp4_is_corrupt() -> None:
    data = encode_clip("mp4", "libx264", num_frames=48, options={"movflags": "faststart"})
    with pytest.raises(BadMediaError) as error:
        probe_video(data[: len(data) * 2 // 3])
    assert error.value.reason == "corrupt_video"


def test_vpx_show_bits() -> None:
    assert vp8_shown(b"\x10\x02\x00") == 1 and vp8_shown(b"\x00\x02\x00") == 0
    shown = bytes([0b10_0_0_0_0_1_0, 0])  # marker 2, profile 0, show_existing 0, frame_type 0, show_frame 1
    hidden = bytes([0b10_0_0_0_0_0_0, 0])
    existing = bytes([0b10_0_0_1_000])  # show_existing_frame
    assert (vp9_shown(shown), vp9_shown(hidden), vp9_shown(existing)) == (1, 0, 1)
    marker = 0b110_00_001  # superframe, 1-byte sizes, 2 frames
    superframe = hidden + shown + bytes([marker, len(hidden), len(shown), marker])
    assert vp9_shown(superframe) == 1


def first_frame_rotation(data: bytes) -> int:
    """Display rotation (degrees counter-clockwise) of the first decoded frame's display matrix."""
    with av.open(io.BytesIO(data)) as container:
        return int(next(container.decode(video=0)).rotation)


def test_rotation_rule_matches_transformers_load_video(clips: dict[str, bytes]) -> None:
    """HF's load_video (default backend pyav, 5.12.1 and 5.24) returns frames as stored: no rotation."""
    data = clips["rotated.mp4"]
    assert first_frame_rotation(data) == 90
    with tempfile.NamedTemporaryFile(suffix=".mp4") as file:
        file.write(data)
        file.flush()
        video, metadata = load_video(file.name)
    stored = decoded_frames(data)
    np.testing.assert_array_equal(video, stored)
    header = probe_video(data)
    assert (metadata.width, metadata.height) == (header.width, header.height) == (96, 64)
    assert stored[0, 2, 2].tolist()[0] > 200  # red corner mark still top-left: not rotated
    ours = decode_video_frames(data, list(range(header.num_frames)), header.num_frames)
    np.testing.assert_array_equal(ours, video)


def test_no_video_stream() -> None:
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as container:
        stream = container.add_stream("aac", rate=8000)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
        frame.sample_rate, frame.pts = 8000, 0
        container.mux(stream.encode(frame))
        container.mux(stream.encode())
    with pytest.raises(BadMediaError) as error:
        probe_video(buffer.getvalue())
    assert error.value.reason == "no_video_stream"
