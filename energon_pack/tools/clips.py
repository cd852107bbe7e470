"""Long synthetic video clips, cheap to make: the sizes and lengths users train on (minutes of 1080p,
4K), for the video benchmarks and the worker-memory tests.

A clip is a unit of pictures encoded once and muxed again and again: the encoder (`ENCODINGS`:
libx264 ``ultrafast``, or web video: x264 / x265 ``veryfast`` with CABAC, deblocking and B-frames,
VP9 with alt-ref frames) encodes one unit of keyframe intervals, cycling through a few distinct
flat frames (a gradient with a bright bar at 8 positions), or with ``noise``, of a moving texture
with fresh noise on every frame (a camera clip's bitrate and decode cost), and its packets are
written as many times as the clip needs, each copy shifted in time. Making a 5-minute 1080p or a
1-minute 4K clip then costs one unit's encoding plus the muxing (seconds), and decoding it costs
what any stream of that codec, size and content costs. `cached_clip` keeps each one under a
folder, keyed by its parameters.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

#: Distinct frames a clip cycles through.
DISTINCT_FRAMES = 8


@dataclass(frozen=True, kw_only=True)
class Encoding:
    """How a clip is encoded: PyAV ``codec``, its ``options`` ({interval}: frames between keyframes),
    and ``intervals``, the keyframe intervals of the unit encoded once and repeated (two for an open
    GOP: an IDR interval, then a CRA one whose leading pictures reference the first)."""

    codec: str
    options: dict[str, str]
    intervals: int = 1

    def encoder_options(self, interval: int) -> dict[str, str]:
        """``options`` for a keyframe every ``interval`` frames.

        Example: ``ENCODINGS["h264-web"].encoder_options(30)["x264-params"]`` -> "keyint=30:min-keyint=30:scenecut=0"."""
        return {name: value.format(interval=interval) for name, value in self.options.items()}


#: Encodings by name. ``ultrafast``: x264 without CABAC or B-frames (cheap to decode; CRF 27, or
#: 40 for flat frames). ``h264-web``: x264 ``veryfast`` CRF 23 (CABAC, deblocking, 3 B-frames, closed
#: GOPs), what most downloaded video is. ``hevc-web``: x265 ``veryfast`` CRF 28 (B-frames, open GOPs:
#: every other keyframe a CRA). ``vp9-web``: libvpx-vp9 CRF 42 (alt-ref frames hidden in superframes).
ENCODINGS = {
    "ultrafast": Encoding(codec="libx264", options={
        "preset": "ultrafast", "g": "{interval}", "keyint_min": "{interval}", "sc_threshold": "0"}),
    "h264-web": Encoding(codec="libx264", options={
        "preset": "veryfast", "crf": "23", "x264-params": "keyint={interval}:min-keyint={interval}:scenecut=0"}),
    "hevc-web": Encoding(codec="libx265", intervals=2, options={
        "preset": "veryfast", "crf": "28",
        "x265-params": "log-level=error:keyint={interval}:min-keyint={interval}:scenecut=0:open-gop=1"}),
    "vp9-web": Encoding(codec="libvpx-vp9", options={
        "crf": "42", "b": "0", "deadline": "good", "cpu-used": "5", "row-mt": "1", "auto-alt-ref": "1",
        "lag-in-frames": "16", "g": "{interval}", "keyint_min": "{interval}"}),
}


@dataclass(frozen=True, kw_only=True)
class ClipSpec:
    """One H.264 MP4 clip: ``seconds`` long at ``fps`` frames/s, ``width`` x ``height`` pixels, a
    keyframe every ``keyframe_seconds`` (phones write one a second, web encodes every 2-10 s); the
    fields in that order. Example: ``ClipSpec(seconds=600, width=1280, height=720, keyframe_seconds=1)``
    -> 18000 frames."""

    seconds: float
    fps: int = 30
    width: int
    height: int
    keyframe_seconds: float = 2.0
    #: 0: a few distinct flat frames (decoding is nearly free); > 0: a moving texture with fresh noise
    #: of this amplitude on every frame of an interval (about 5 Mbit/s and a camera clip's decode cost at 720p, 20).
    noise: int = 0
    #: Side in pixels of the square blocks the noise comes in (1: per pixel; 4: coarse grain that
    #: an encoder keeps, so inter frames cost what a camera clip's do).
    grain: int = 1
    #: Name of its `ENCODINGS` entry.
    encoding: str = "ultrafast"

    @property
    def num_frames(self) -> int:
        """Frames in the clip: round(seconds * fps)."""
        return round(self.seconds * self.fps)

    @property
    def name(self) -> str:
        """File name carrying every parameter. Example: ``clip_1280x720_600s_30fps_key1.mp4``."""
        detail = f"_noise{self.noise}" if self.noise else ""
        detail += f"_grain{self.grain}" if self.grain != 1 else ""
        detail += f"_{self.encoding}" if self.encoding != "ultrafast" else ""
        return f"clip_{self.width}x{self.height}_{self.seconds:g}s_{self.fps}fps_key{self.keyframe_seconds:g}{detail}.mp4"

    @property
    def keyframe_interval(self) -> int:
        """Frames from one keyframe to the next: round(keyframe_seconds * fps), at least 1."""
        return max(1, round(self.keyframe_seconds * self.fps))


def _textured_frames(spec: ClipSpec, count: int) -> Iterator[av.VideoFrame]:
    """``count`` YUV 4:2:0 frames, made one at a time: an 8x8-block random texture moving 4 pixels
    a frame, plus fresh noise of amplitude ``spec.noise`` in ``spec.grain``-pixel blocks on every frame."""
    rng = np.random.default_rng(0)
    texture = rng.integers(0, 256, (spec.height // 8 + 1, spec.width // 8 + 1, 3), dtype=np.uint8)
    texture = texture.repeat(8, axis=0).repeat(8, axis=1)[: spec.height]
    for index in range(count):
        rgb = np.roll(texture, 4 * index, axis=1)[:, : spec.width].astype(np.int16)
        grain = spec.grain
        blocks = (-(-spec.height // grain), -(-spec.width // grain), 3)  # grain 1: one draw per pixel, as before
        noise = rng.integers(-spec.noise, spec.noise + 1, blocks, dtype=np.int16)
        rgb += noise.repeat(grain, axis=0).repeat(grain, axis=1)[: spec.height, : spec.width]
        yield av.VideoFrame.from_ndarray(rgb.clip(0, 255).astype(np.uint8), format="rgb24").reformat(format="yuv420p")


def _distinct_frames(spec: ClipSpec) -> list[av.VideoFrame]:
    """`DISTINCT_FRAMES` YUV 4:2:0 frames: a gradient, a bright bar at 8 positions, a red corner mark."""
    frames = []
    ramp = np.add.outer(np.linspace(20, 120, spec.height), np.linspace(0, 110, spec.width)).astype(np.uint8)
    for index in range(DISTINCT_FRAMES):
        rgb = np.stack([ramp, ramp[::-1], np.full_like(ramp, 90)], axis=-1)
        column = index * spec.width // DISTINCT_FRAMES
        rgb[:, column : column + max(4, spec.width // 64)] = 255
        rgb[: spec.height // 6, : spec.width // 6] = (230, 20, 20)
        frames.append(av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="yuv420p"))
    return frames


def make_clip(spec: ClipSpec) -> bytes:
    """The MP4 bytes of ``spec``: one unit of keyframe intervals encoded as ``spec.encoding`` says
    (a keyframe first), its packets muxed again for every unit, shifted in time."""
    encoding = ENCODINGS[spec.encoding]
    unit = spec.keyframe_interval * encoding.intervals
    count = min(unit, spec.num_frames)
    if spec.noise:
        frames: Iterator[av.VideoFrame] = _textured_frames(spec, count)
    else:
        flat, step = _distinct_frames(spec), max(1, spec.fps // 2)  # the flat frames' bar moves twice a second
        frames = (flat[(index // step) % DISTINCT_FRAMES] for index in range(count))
    buffer = io.BytesIO()
    options = encoding.encoder_options(spec.keyframe_interval)
    options.setdefault("crf", "27" if spec.noise else "40")
    with av.open(buffer, mode="w", format="mp4") as output:
        stream = output.add_stream(encoding.codec, rate=Fraction(spec.fps), options=options)
        stream.width, stream.height, stream.pix_fmt = spec.width, spec.height, "yuv420p"
        group = []
        for index, frame in enumerate(frames):
            frame.pts = index
            group.extend(stream.encode(frame))
        group.extend(stream.encode())
        first = min(packet.pts for packet in group)
        for start in range(0, spec.num_frames, unit):
            for packet in group:
                if packet.pts - first >= spec.num_frames - start:
                    continue  # the last unit is cut short
                copy = av.Packet(bytes(packet))
                copy.pts, copy.dts = packet.pts + start, packet.dts + start
                copy.time_base, copy.stream = packet.time_base, stream
                copy.is_keyframe = packet.is_keyframe
                output.mux(copy)
    return buffer.getvalue()


def cached_clip(folder: str | Path, spec: ClipSpec) -> Path:
    """The path of ``spec``'s clip under ``folder``, made once (written to a temporary name, then
    renamed, so a half-written clip is never read)."""
    path = Path(folder) / spec.name
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        partial.write_bytes(make_clip(spec))
        partial.rename(path)
    return path
