"""Sampled video frames decoded with PyAV, one at a time, seeking past stretches no sampled frame needs.

`sampled_frames` yields ``(position, frame)`` for each sampled frame index, in order, as the
decoder outputs it (a PyAV ``VideoFrame``, never a stack of frames): the caller converts and
resizes each frame before the next is decoded, so a video never costs more than one source frame
at a time (plus the decoder's own reference frames).

Frame index i is the i-th frame a full sequential decode outputs (what preencode counted,
``qwen.media.probe_video``). Seeking must give exactly those frames, or it is not used:

- When some sampled frame lies more than `MIN_SKIPPED_PACKETS` frames after the previous one, a
  first pass demuxes the stream (no decoding; `StreamIndex.scan`): per packet in decode order its
  pts, dts, keyframe and discard flags and the frames it shows. The stream is *seekable* when every
  shown packet shows one frame and has a pts, no two share one, and they number exactly
  ``total_frames``: frame i then has the i-th smallest pts.
- For a sampled frame, the seek point is the last keyframe before its packet (decode order) with a
  pts at most its pts (`StreamIndex.seek_point`). The decoder seeks there only when that skips
  packets not yet sent (sampled frames sparser than keyframes); otherwise it decodes through. The
  seek tries the keyframe's pts, its dts and a time just before the next keyframe, and takes the
  one that lands on it (B-frames put a keyframe's dts below its pts: a backward seek to the dts of
  an MP4 keyframe finds the keyframe before, and two GOPs are decoded instead of one).
- Every packet but the sampled frames' own goes to H.264 / HEVC decoders with
  ``skip_frame = "NONREF"``: pictures no other picture references (most B-frames) are not decoded,
  whether they come before a sampled frame's packet or after it (the packets of a B-frame stream's
  reordering delay, sent while the decoder still holds a sampled frame). Once a sampled frame's
  packet is sent and the next sampled frame will be sought, the decoder is drained instead of fed
  the packets its reordering delay would want (the seek flushes it anyway).
- After a seek, the first demuxed packet must be a scanned keyframe at or before that one (an MP4
  edit list may land the demuxer earlier) and past what was decoded, every later packet must be
  the scanned one (pts and flags; Matroska leaves dts unset after a seek), frames showing before
  the landing keyframe's pts are ignored (leading pictures of an open GOP) and every other
  output frame must carry a later pts than the last, the frames between being ones the decoder
  was allowed to skip or, in a drain, whose packets were not sent. Any
  difference (a frame without pts, one dropped or out of order, a seek landing elsewhere) stops the
  seeking decode; the video is then decoded again from its start, sequentially, counting frames.
- The sequential decode (`decode_threads` aside, today's behaviour) counts the frames it outputs
  and checks the count against ``total_frames`` at the end of the stream (``media_mismatch``).

A stream that holds fewer frames than its header (preencode) said: the sequential decode ends
early and the sample is a ``media_mismatch`` skip; a seeking decode finds a sampled frame missing
(the last sampled frame is always the last frame) or out of place and falls back to the
sequential decode, which skips it the same way. A frame the decoder drops inside a stretch that
was sought past goes unnoticed by the loader: ``energon-pack prepare --verify-media`` decodes every
frame and rejects such files (docs/worker_memory.md).

``threads`` is the FFmpeg decoder threads available; `qwen.decoder_threads.decoder_threading`
picks how many and of which kind (slice threads for pictures of 720p and more, one thread below:
frame threads, delayed and flushed at every seek, were measured slower). The frames are the same
with any count and kind.
"""

from __future__ import annotations

import bisect
import io
import itertools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import av

from energon_pack.errors import BadSampleError
from energon_pack.qwen.decoder_threads import decoder_threading
from energon_pack.qwen.media import SHOWN_FRAMES

__all__ = ["StreamIndex", "sampled_frames"]

#: A seek is taken only when it skips at least this many packets (a seek and a decoder flush cost
#: about as much as decoding a few frames).
MIN_SKIPPED_PACKETS = 8


#: Decoders (FFmpeg's own) that apply ``skip_frame`` to each packet as it is sent, with or without
#: frame threads; others (libdav1d: at output, frames later) are never asked to skip.
SKIPS_PER_PACKET = frozenset({"h264", "hevc"})


class _NotExact(Exception):
    """The seeking decode cannot vouch for its frames; decode sequentially instead."""


@dataclass(frozen=True, kw_only=True)
class StreamIndex:
    """Demuxed facts of one video stream, packets in decode order (no frame decoded).

    ``packets``: (pts, dts, keyframe, discard) per non-empty packet; ``frame_pts``: pts of the
    shown frames in presentation order (frame i has ``frame_pts[i]``; hidden VP8/VP9 alt-ref frames
    and edit-list discards show none) when the stream is seekable, else None; ``frame_packet``:
    decode position of the packet showing each frame; ``keyframes``: decode positions of the
    keyframe packets (empty when not seekable).
    """

    packets: tuple[tuple[int | None, int | None, bool, bool], ...]
    frame_pts: tuple[int, ...] | None
    frame_packet: tuple[int, ...]
    keyframes: tuple[int, ...]

    @classmethod
    def scan(cls, container: Any, stream: Any, total_frames: int) -> StreamIndex:
        """Demux ``stream`` once (then seek the container back to its start).

        Example: a 40-frame H.264 MP4 with a keyframe every 10 frames -> ``keyframes`` (0, 10, 20,
        30), ``frame_pts`` the 40 pts sorted, when 40 == ``total_frames``."""
        shown_of = SHOWN_FRAMES.get(stream.codec_context.name)
        packets: list[tuple[int | None, int | None, bool, bool]] = []
        shown: list[int] = []
        for packet in container.demux(stream):
            if packet.size <= 0:
                continue
            packets.append(_facts(packet))
            shown.append(0 if packet.is_discard else 1 if shown_of is None else shown_of(memoryview(packet)))
        container.seek(0)
        showing = [position for position, count in enumerate(shown) if count]
        pts = [packets[position][0] for position in showing]
        seekable = (
            all(count <= 1 for count in shown) and None not in pts and len(set(pts)) == len(pts) == total_frames
        )
        if not seekable:
            return cls(packets=tuple(packets), frame_pts=None, frame_packet=(), keyframes=())
        order = sorted(range(len(pts)), key=lambda i: pts[i])
        keyframes = tuple(i for i, packet in enumerate(packets) if packet[2] and packet[0] is not None)
        return cls(
            packets=tuple(packets), frame_pts=tuple(pts[i] for i in order),
            frame_packet=tuple(showing[i] for i in order), keyframes=keyframes,
        )

    def seek_point(self, frame: int) -> int:
        """Decode position of the packet to start decoding at for ``frame``: the last keyframe at or
        before the frame's packet whose pts is at most the frame's; -1 when there is none.

        Example: keyframes at packets 0, 10, 20 (pts in display order), frame 15 -> 10."""
        assert self.frame_pts is not None
        target, pts = self.frame_packet[frame], self.frame_pts[frame]
        for position in reversed(self.keyframes[: bisect.bisect_right(self.keyframes, target)]):
            if self.packets[position][0] <= pts:
                return position
        return -1

    def worth_seeking(self, frame_indices: Sequence[int]) -> bool:
        """Whether some sampled frame's seek point lies more than `MIN_SKIPPED_PACKETS` packets
        past the previous sampled frame's packet (sampled frames sparser than keyframes)."""
        if self.frame_pts is None or not frame_indices:
            return False
        previous = -1
        for frame in frame_indices:
            if self.seek_point(frame) - previous > MIN_SKIPPED_PACKETS:
                return True
            previous = max(previous, self.frame_packet[frame])
        return False


def sampled_frames(
    data: bytes, frame_indices: Sequence[int], total_frames: int, *, threads: int = 1, seek: bool = True
) -> Iterator[tuple[int, Any]]:
    """``(position in frame_indices, av.VideoFrame)`` of each sampled frame of the first video stream.

    ``frame_indices`` must increase strictly (``sample_frame_indices`` gives such). With ``seek``
    and a seekable stream, stretches no sampled frame needs are sought past (module notes); when
    that cannot be vouched for, positions restart at 0 from a sequential decode (callers write by
    position, so a restart overwrites). Without it, every frame is decoded and counted. A stream
    that does not hold ``total_frames`` frames is ``BadSampleError("media_mismatch")``; a decoding
    failure ``BadSampleError("corrupt_video")``.
    Example: ``list(sampled_frames(data, [0, 29], 30))`` -> ``[(0, <frame 0>), (1, <frame 29>)]``.
    """
    gaps = (later - earlier for earlier, later in zip((-1, *frame_indices), frame_indices))
    if seek and max(gaps, default=0) > MIN_SKIPPED_PACKETS:  # denser frames: no seek could pay, no scan
        try:
            with _opened(data, threads) as (container, stream):
                index = StreamIndex.scan(container, stream, total_frames)
                if index.worth_seeking(frame_indices):
                    yield from _seeking(container, stream, index, frame_indices)
                    return
        except _NotExact:
            pass
        except BadSampleError:
            raise
        except Exception:  # a demuxer or decoder error while seeking: the sequential decode decides
            pass
    yield from _sequential(data, frame_indices, total_frames, threads)


@contextmanager
def _opened(data: bytes, threads: int) -> Iterator[tuple[Any, Any]]:
    """``(container, its first video stream)`` with the threading `decoder_threading` picks for
    ``threads`` decoder threads and the stream's picture size (the codec opens at the first
    decode, so the caller may still change it)."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        context = stream.codec_context
        stream.thread_type, stream.thread_count = decoder_threading(
            width=context.width or 0, height=context.height or 0, threads=threads
        )
        yield container, stream


def _sequential(data: bytes, frame_indices: Sequence[int], total_frames: int, threads: int) -> Iterator[tuple[int, Any]]:
    """Every frame decoded and counted; the sampled ones yielded; the count checked at the end."""
    wanted = {index: position for position, index in enumerate(frame_indices)}
    decoded = 0
    try:
        with _opened(data, threads) as (container, stream):
            for frame in container.decode(stream):
                if decoded in wanted:
                    yield wanted[decoded], frame
                decoded += 1
    except BadSampleError:
        raise
    except Exception as err:
        raise BadSampleError("corrupt_video", f"cannot decode video after {decoded} frames: {err}") from None
    if decoded != total_frames:
        raise BadSampleError("media_mismatch", f"video decodes to {decoded} frames but its header gave {total_frames}")


def _seeking(container: Any, stream: Any, index: StreamIndex, frame_indices: Sequence[int]) -> Iterator[tuple[int, Any]]:
    """The sampled frames, seeking to `StreamIndex.seek_point` where that skips packets; raises
    `_NotExact` at the first frame or packet that differs from the scan.

    Every packet but a sampled frame's own goes to the decoder with ``skip_frame = "NONREF"``
    (decoders in `SKIPS_PER_PACKET`): it skips the pictures no other picture references (H.264
    ``nal_ref_idc`` 0, HEVC sub-layer non-reference pictures: about half of a B-frame stream), whose
    frames may then be missing from the output, and no other; a sampled frame's packet is decoded
    whole, and the pictures it references were never skipped (they are references). When the next
    sampled frame will be sought, the decoder is drained (end of stream) once the current one's
    packet is sent, instead of decoding the packets its reordering delay would otherwise need (the
    seek flushes it anyway)."""
    frame_pts, packets = index.frame_pts, index.packets
    assert frame_pts is not None
    sampled_packets = {index.frame_packet[frame] for frame in frame_indices}
    context = stream.codec_context
    position = 0  # next sampled frame (position in frame_indices)
    sent = -1  # decode position of the last packet sent to the decoder
    cursor = 0  # frame index the next output frame must be at least
    floor = frame_pts[0]  # output frames with a smaller pts are ignored (leading pictures after a seek)
    skipped: set[int] = set()  # pts of packets sent with NONREF: their frames may be missing
    frame_at = {pts: frame for frame, pts in enumerate(frame_pts)}
    demuxer = container.demux(stream)
    sought = -1  # the sampled frame last sought for (one seek per sampled frame at most)
    order = [0, 1, 2]  # seek timestamps to try, the one that landed last first (`_seek`)
    try:
        while position < len(frame_indices):
            start = index.seek_point(frame_indices[position])
            if start - sent > MIN_SKIPPED_PACKETS and sought != position:
                demuxer, landing = _seek(container, stream, index, start, after=sent, order=order)
                sought, sent, floor = position, landing - 1, packets[landing][0]
                cursor = bisect.bisect_left(frame_pts, floor)
            if sent >= index.frame_packet[frame_indices[position]] and _sought_next(index, frame_indices, position, sent):
                packet = None  # drain: the current frame's packets are all sent, the next one is sought
            else:
                packet = next(demuxer, None)
                if packet is None:
                    raise _NotExact
            if packet is not None and packet.size > 0:
                sent += 1
                if sent >= len(packets) or not _same(packet, packets[sent]):
                    raise _NotExact  # the demuxer reads differently than the scan
                skipping = sent not in sampled_packets and context.name in SKIPS_PER_PACKET
                context.skip_frame = "NONREF" if skipping else "DEFAULT"
                if skipping:
                    skipped.add(packets[sent][0])
            target = position
            for frame in stream.decode(packet if packet is not None and packet.size > 0 else None):
                if frame.pts is None:
                    raise _NotExact
                if frame.pts < floor:
                    continue
                shown = frame_at.get(frame.pts, -1)
                if shown < cursor or not all(  # a drain outputs what it holds: frames not sent yet are missing
                    frame_pts[missing] in skipped or packet is None and index.frame_packet[missing] > sent
                    for missing in range(cursor, shown)
                ):
                    raise _NotExact  # a frame out of order, or one missing that was decoded
                cursor = shown
                if cursor == frame_indices[position]:
                    yield position, frame
                    position += 1
                    if position == len(frame_indices):
                        return
                cursor += 1
            if packet is not None and packet.size <= 0 or packet is None and position == target:
                raise _NotExact  # the stream (or a drain) ended before a sampled frame
    finally:
        context.skip_frame = "DEFAULT"


def _sought_next(index: StreamIndex, frame_indices: Sequence[int], position: int, sent: int) -> bool:
    """Whether the sampled frame after ``position`` will be sought (or there is none), once the
    packets up to decode position ``sent`` are sent."""
    following = position + 1
    return following == len(frame_indices) or index.seek_point(frame_indices[following]) - sent > MIN_SKIPPED_PACKETS


def _facts(packet: Any) -> tuple[int | None, int | None, bool, bool]:
    """What `StreamIndex` keeps of a packet: (pts, dts, keyframe, discard)."""
    return packet.pts, packet.dts, bool(packet.is_keyframe), bool(packet.is_discard)


def _same(packet: Any, facts: tuple[int | None, int | None, bool, bool]) -> bool:
    """Whether a demuxed packet is the scanned one: same pts, keyframe and discard flags (not dts:
    the Matroska demuxer leaves it unset after a seek)."""
    got = _facts(packet)
    return (got[0], got[2], got[3]) == (facts[0], facts[2], facts[3])


def _seek(
    container: Any, stream: Any, index: StreamIndex, start: int, *, after: int, order: list[int]
) -> tuple[Iterator[Any], int]:
    """(demuxer at the landing keyframe, its decode position) after seeking for the keyframe at decode
    position ``start``. Demuxers index either timestamp (with B-frames a keyframe's dts lies below
    its pts, and a backward seek to it can find the keyframe before; an MP4 edit list shifts both),
    so up to three are tried: its pts, its dts, and just below the next keyframe's smaller one
    (the last frame's pts after the last keyframe).
    ``order`` lists their numbers (0, 1, 2) in the order to try them; the one that lands on
    ``start`` goes first for the next seek (a stream indexes all its keyframes alike). Failing
    that, the latest scanned keyframe landed on past ``after`` (the last packet sent) is sought
    again; `_NotExact` when none lands so."""
    pts, dts = index.packets[start][0], index.packets[start][1]
    following = [index.packets[position] for position in index.keyframes if position > start][:1]
    assert index.frame_pts is not None
    before_next = min(v for v in following[0][:2] if v is not None) - 1 if following else index.frame_pts[-1]
    candidates = (pts, dts, before_next)
    keyframe_at = {index.packets[position][0]: position for position in index.keyframes}
    best: tuple[int, int] | None = None  # (landing, timestamp)
    tried = set()
    for number in list(order):
        timestamp = candidates[number]
        if timestamp is None or timestamp in tried:
            continue
        tried.add(timestamp)
        demuxer, packet = _sought(container, stream, timestamp)
        landing = keyframe_at.get(packet.pts, -1) if packet is not None else -1
        if not (after < landing <= start and _same(packet, index.packets[landing])):
            continue
        if landing == start:
            order.remove(number)
            order.insert(0, number)
            return itertools.chain([packet], demuxer), landing
        if best is None or landing > best[0]:
            best = (landing, timestamp)
    if best is None:
        raise _NotExact
    demuxer, packet = _sought(container, stream, best[1])
    if packet is None or keyframe_at.get(packet.pts) != best[0]:
        raise _NotExact
    return itertools.chain([packet], demuxer), best[0]


def _sought(container: Any, stream: Any, timestamp: int) -> tuple[Iterator[Any], Any]:
    """(demuxer, its first non-empty packet or None) after a backward keyframe seek to ``timestamp``."""
    container.seek(timestamp, stream=stream, backward=True, any_frame=False)
    demuxer = container.demux(stream)
    packet = next(demuxer, None)
    while packet is not None and packet.size <= 0:
        packet = next(demuxer, None)
    return demuxer, packet
