"""A real-world media corpus: every image format, container and codec we accept, small.

``write_corpus(folder)`` writes one file per ``CorpusItem`` of ``CORPUS`` plus ``records.jsonl``
(one chat record per file, media paths relative to ``folder``), ready for ``energon-pack prepare``.
Each item is generated in memory with PyAV / Pillow in well under a second (the 108 MP JPEG:
about 1 s, a flat colour), so tests build the whole corpus per session (0.3 s without it).

Images carry a red top-left mark on a gradient (so a missed rotation or flip shows); videos a
moving bar as well (so frame order shows). Used by tests/golden/test_real_corpus.py (golden against
Hugging Face), tests/qwen/test_video_probe.py and tests/data/test_energon_tools.py.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
from PIL import Image


@dataclass(frozen=True, kw_only=True)
class CorpusItem:
    """One corpus file: ``name`` (file name with extension), ``kind`` ("image"/"video"), what it
    exercises (``about``) and ``make`` (no argument -> the file's bytes)."""

    name: str
    kind: str
    about: str
    make: Callable[[], bytes]


def _frame(index: int, width: int, height: int) -> np.ndarray:
    """RGB uint8 [height, width, 3]: gradient background plus a bright bar at column 3*index (mod width),
    and a red top-left corner mark (so a rotation or flip shows)."""
    frame = np.zeros((height, width, 3), np.uint8)
    frame[..., 1] = np.linspace(30, 200, width, dtype=np.uint8)[None, :]
    frame[..., 2] = np.linspace(30, 200, height, dtype=np.uint8)[:, None]
    column = (3 * index) % width
    frame[:, column : column + 4] = 255
    frame[: height // 4, : width // 4] = (255, 0, 0)
    return frame


def thread_scheduling() -> tuple[int, os.sched_param]:
    """The calling thread's scheduling policy and priority. Example: -> ``(os.SCHED_OTHER, sched_param(0))``."""
    return os.sched_getscheduler(0), os.sched_getparam(0)


def restore_scheduling(saved: tuple[int, os.sched_param]) -> tuple[int, os.sched_param] | None:
    """Put the calling thread back at ``saved`` (from :func:`thread_scheduling`); the policy it was
    at when that changed anything, else None. Example: after an AV1 encode as root ->
    ``(os.SCHED_FIFO, sched_param(99))``, and the thread is at ``saved`` again."""
    current = thread_scheduling()
    if current == saved:
        return None
    os.sched_setscheduler(0, *saved)
    return current


@contextmanager
def scheduling_kept() -> Iterator[None]:
    """Restore the calling thread's scheduling policy and priority afterwards.

    SVT-AV1 (``libsvtav1``) run as root leaves the thread that opened the encoder at real-time
    priority (SCHED_FIFO 99), and threads and processes started later inherit it. Two processes in
    that state encoding VP8 clips take both cores: neither finished 20 clips in 90 s (7.3 s at
    normal priority), and two test processes in that state stalled a whole run. Example:
    ``with scheduling_kept(): encode AV1`` -> ``os.sched_getscheduler(0)`` is SCHED_OTHER again.
    """
    saved = thread_scheduling()
    try:
        yield
    finally:
        restore_scheduling(saved)


def encode_clip(
    container_format: str,
    codec: str,
    *,
    num_frames: int = 24,
    fps: Fraction = Fraction(12),
    size: tuple[int, int] = (96, 64),
    options: dict[str, str] | None = None,
    audio: bool = False,
    pts_ms: list[int] | None = None,
    rotation: int | None = None,
) -> bytes:
    """Encode ``num_frames`` moving-bar frames of ``size`` (w, h) with PyAV.

    ``pts_ms``: per-frame presentation times in ms (a variable-frame-rate clip; time base 1/1000);
    ``audio``: add a silent-ish 8 kHz AAC track; ``rotation``: store a display matrix rotating by
    that many degrees counter-clockwise (the MP4/MOV ``tkhd`` matrix a phone writes; FFmpeg
    reports it as the stream's display-matrix side data).
    Example: ``encode_clip("webm", "libvpx-vp9")`` -> 2 s VP9 WebM bytes, 24 frames of 96x64.
    """
    width, height = size
    buffer = io.BytesIO()
    with scheduling_kept(), av.open(buffer, mode="w", format=container_format) as output:
        stream = output.add_stream(codec, rate=fps, options=options or {})
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        if pts_ms is not None:
            stream.time_base = Fraction(1, 1000)
            stream.codec_context.time_base = Fraction(1, 1000)
        if rotation is not None:  # PyAV writes coded side data, the MP4/MOV muxer a tkhd matrix
            stream.set_display_rotation(rotation)
        sound = output.add_stream("aac", rate=8000) if audio else None
        for index in range(num_frames):
            frame = av.VideoFrame.from_ndarray(_frame(index, width, height), format="rgb24")
            if pts_ms is not None:
                frame.pts, frame.time_base = pts_ms[index], Fraction(1, 1000)
            output.mux(stream.encode(frame))
        output.mux(stream.encode())
        if sound is not None:
            samples = int(8000 * num_frames / fps)
            tone = (0.1 * np.sin(np.arange(samples) * 0.05)).astype(np.float32)[None, :]
            chunk = sound.frame_size or 1024
            for start in range(0, samples, chunk):
                piece = av.AudioFrame.from_ndarray(
                    np.ascontiguousarray(tone[:, start : start + chunk]), format="fltp", layout="mono"
                )
                piece.sample_rate, piece.pts = 8000, start
                output.mux(sound.encode(piece))
            output.mux(sound.encode())
    return buffer.getvalue()


def _image(
    image_format: str, *, size: tuple[int, int] = (96, 64), mode: str = "RGB", orientation: int | None = None,
    **kwargs: object,
) -> Callable[[], bytes]:
    """A maker of one ``image_format`` image of ``size`` (w, h) in PIL ``mode``, its orientation stored
    as that format's writers store it (TIFF tag 274, else an EXIF block)."""

    def make() -> bytes:
        image = Image.fromarray(_frame(5, *size))
        if mode == "P":
            image = image.quantize(32)
        elif mode != "RGB":
            image = image.convert(mode)
        extra = dict(kwargs)
        if orientation is not None:
            if image_format == "TIFF":
                extra["tiffinfo"] = {274: orientation}
            else:
                exif = Image.Exif()
                exif[0x0112] = orientation
                extra["exif"] = exif.tobytes()
        buffer = io.BytesIO()
        image.save(buffer, format=image_format, **extra)
        return buffer.getvalue()

    return make


def _animated_gif() -> bytes:
    frames = [Image.fromarray(_frame(i, 96, 64)).quantize(32) for i in range(5)]
    buffer = io.BytesIO()
    frames[0].save(buffer, format="GIF", save_all=True, append_images=frames[1:], duration=80, loop=0)
    return buffer.getvalue()


def big_flat_jpeg(size: tuple[int, int] = (12000, 9000)) -> bytes:
    """A flat-colour JPEG of ``size`` (w, h); 108 MP by default, ~1 s to make, ~0.8 s to decode, 1.7 MB."""
    buffer = io.BytesIO()
    Image.new("RGB", size, (90, 140, 200)).save(buffer, format="JPEG", quality=75)
    return buffer.getvalue()


def _vfr_pts(num_frames: int = 24) -> list[int]:
    """Presentation times (ms) alternating 40 ms and 120 ms steps: a variable frame rate."""
    return [int(sum(40 if i % 2 else 120 for i in range(k))) for k in range(num_frames)]


_VP9_OPTIONS = {"auto-alt-ref": "1", "lag-in-frames": "16", "deadline": "realtime", "cpu-used": "8"}
#: File of the 108 MP JPEG (left out by ``write_corpus(include_huge=False)``).
HUGE = "huge.jpg"

CORPUS: tuple[CorpusItem, ...] = (
    *(CorpusItem(name=f"exif{o}.jpg", kind="image", about=f"JPEG, EXIF orientation {o}",
                 make=_image("JPEG", orientation=o, quality=90)) for o in range(1, 9)),
    CorpusItem(name="exif6.webp", kind="image", about="WebP, EXIF orientation 6", make=_image("WEBP", orientation=6)),
    CorpusItem(name="exif3.webp", kind="image", about="WebP, EXIF orientation 3", make=_image("WEBP", orientation=3)),
    CorpusItem(name="exif8.tif", kind="image", about="TIFF, orientation tag 8", make=_image("TIFF", orientation=8)),
    CorpusItem(name="exif5.png", kind="image", about="PNG, eXIf orientation 5", make=_image("PNG", orientation=5)),
    CorpusItem(name="anim.gif", kind="image", about="animated GIF (first frame)", make=_animated_gif),
    CorpusItem(name="scan.bmp", kind="image", about="BMP", make=_image("BMP")),
    CorpusItem(name="scan.tiff", kind="image", about="TIFF LZW", make=_image("TIFF", compression="tiff_lzw")),
    CorpusItem(name="cmyk.jpg", kind="image", about="CMYK JPEG", make=_image("JPEG", mode="CMYK")),
    CorpusItem(name="gray16.png", kind="image", about="16-bit grayscale PNG (I;16)", make=_image("PNG", mode="I;16")),
    CorpusItem(name=HUGE, kind="image", about="108 MP JPEG (12000x9000)", make=big_flat_jpeg),
    CorpusItem(name="vp8.webm", kind="video", about="WebM VP8 (alt-ref on)",
               make=lambda: encode_clip("webm", "libvpx", options={"auto-alt-ref": "1", "lag-in-frames": "16"})),
    CorpusItem(name="vp9.webm", kind="video", about="WebM VP9 (alt-ref superframes)",
               make=lambda: encode_clip("webm", "libvpx-vp9", options=_VP9_OPTIONS)),
    CorpusItem(name="h264.mkv", kind="video", about="Matroska H.264 with B-frames",
               make=lambda: encode_clip("matroska", "libx264", options={"bf": "3"})),
    CorpusItem(name="h264.mov", kind="video", about="QuickTime H.264", make=lambda: encode_clip("mov", "libx264")),
    CorpusItem(name="mpeg4.avi", kind="video", about="AVI MPEG-4 Part 2 with B-frames",
               make=lambda: encode_clip("avi", "mpeg4", options={"bf": "2"})),
    CorpusItem(name="hevc.mp4", kind="video", about="MP4 HEVC (libx265)",
               make=lambda: encode_clip("mp4", "libx265", options={"x265-params": "log-level=error"})),
    CorpusItem(name="aac.mp4", kind="video", about="MP4 H.264 + AAC audio track",
               make=lambda: encode_clip("mp4", "libx264", audio=True)),
    CorpusItem(name="vfr.mp4", kind="video", about="MP4 H.264, variable frame rate (40/120 ms)",
               make=lambda: encode_clip("mp4", "libx264", pts_ms=_vfr_pts())),
    CorpusItem(name="av1.mp4", kind="video", about="MP4 AV1 (libsvtav1)",
               make=lambda: encode_clip("mp4", "libsvtav1", size=(128, 64))),
    CorpusItem(name="rotated.mp4", kind="video", about="MP4 H.264, display matrix rotate 90 (phone)",
               make=lambda: encode_clip("mp4", "libx264", rotation=90)),
    CorpusItem(name="h264.m4v", kind="video", about="M4V (MP4) H.264", make=lambda: encode_clip("ipod", "libx264")),
)


def write_corpus(folder: str | Path, *, include_huge: bool = True) -> Path:
    """Write every ``CORPUS`` file into ``folder`` and one chat record per file into
    ``folder/records.jsonl``; return the records path. ``include_huge=False`` leaves the 108 MP JPEG out.

    Example: ``write_corpus(tmp)`` -> ``tmp/records.jsonl`` with one record per item (ids ``corpus_<stem>_<ext>``).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    records = folder / "records.jsonl"
    with records.open("w", encoding="utf-8") as out:
        for item in CORPUS:
            if item.name == HUGE and not include_huge:
                continue
            (folder / item.name).write_bytes(item.make())
            record = {
                "id": "corpus_" + item.name.replace(".", "_"),
                "messages": [
                    {"role": "user", "content": f"<{item.kind}>\nDescribe this {item.about}."},
                    {"role": "assistant", "content": "A moving bar on a gradient."},
                ],
                "images" if item.kind == "image" else "videos": [item.name],
            }
            out.write(json.dumps(record) + "\n")
    return records


def trimmed_mp4(source: bytes, trimmed: int) -> bytes:
    """``source`` (an MP4) remuxed so that an edit list hides its first ``trimmed`` frames, as a stream
    copy cut with ``ffmpeg -ss`` has: the demuxer marks their packets discard, decoders drop them."""
    buffer = io.BytesIO()
    with av.open(io.BytesIO(source)) as reader, av.open(buffer, "w", format="mp4", options={"use_editlist": "1"}) as writer:
        source_stream = reader.streams.video[0]
        stream = writer.add_stream_from_template(source_stream)
        shift = trimmed * int(1 / (source_stream.time_base * source_stream.average_rate))
        for packet in reader.demux(source_stream):
            if packet.dts is None:  # the demuxer's end-of-stream flush packet
                continue
            packet.pts, packet.dts, packet.stream = packet.pts - shift, packet.dts - shift, stream
            writer.mux(packet)
    return buffer.getvalue()


#: x264 / x265 with a keyframe every 8 frames, 3 B-frames and open GOPs (I-frames that are not IDR / CRA).
_OPEN_GOP_X264 = {"bf": "3", "x264-params": "keyint=8:min-keyint=8:open-gop=1:scenecut=0"}
_OPEN_GOP_X265 = {"x265-params": "log-level=error:keyint=8:min-keyint=8:open-gop=1:bframes=3:scenecut=0"}
#: x264 as web video is encoded (``veryfast``: CABAC, deblocking, 3 B-frames in a pyramid), closed GOPs of 8.
_WEB_X264 = {"preset": "veryfast", "crf": "23", "x264-params": "keyint=8:min-keyint=8:scenecut=0"}
#: Frames of each seek-corpus clip (keyframe every 8: sampled frames sparser than keyframes).
SEEK_FRAMES = 60

#: The corpus's containers and codecs with a keyframe every 8 frames (so sampled frames can be sparser
#: than keyframes), plus open GOPs (H.264 in MKV and MP4, HEVC CRA in MP4 and MKV), closed GOPs with
#: a B-pyramid in MP4 (web video; a keyframe's dts below its pts), variable frame
#: rate with B-frames and an MP4 edit list hiding the first frames. Used by tests/qwen/test_video_seek.py.
SEEK_CORPUS: tuple[CorpusItem, ...] = tuple(
    CorpusItem(name=name, kind="video", about=about, make=make) for name, about, make in (
        ("vp8.webm", "WebM VP8, alt-ref", lambda: encode_clip(
            "webm", "libvpx", num_frames=SEEK_FRAMES, options={"auto-alt-ref": "1", "lag-in-frames": "16", "g": "8"})),
        ("vp9.webm", "WebM VP9, alt-ref superframes", lambda: encode_clip(
            "webm", "libvpx-vp9", num_frames=SEEK_FRAMES, options={**_VP9_OPTIONS, "g": "8"})),
        ("h264.mkv", "Matroska H.264, B-frames", lambda: encode_clip(
            "matroska", "libx264", num_frames=SEEK_FRAMES, options={"bf": "3", "g": "8"})),
        ("h264open.mkv", "Matroska H.264, open GOP", lambda: encode_clip(
            "matroska", "libx264", num_frames=SEEK_FRAMES, options=_OPEN_GOP_X264)),
        ("h264open.mp4", "MP4 H.264, open GOP", lambda: encode_clip(
            "mp4", "libx264", num_frames=SEEK_FRAMES, options=_OPEN_GOP_X264)),
        ("h264web.mp4", "MP4 H.264 as web video: x264 veryfast (CABAC, B-pyramid), closed GOPs", lambda: encode_clip(
            "mp4", "libx264", num_frames=SEEK_FRAMES, options=_WEB_X264)),
        ("h264.mov", "QuickTime H.264", lambda: encode_clip("mov", "libx264", num_frames=SEEK_FRAMES, options={"g": "8"})),
        ("mpeg4.avi", "AVI MPEG-4 Part 2, B-frames", lambda: encode_clip(
            "avi", "mpeg4", num_frames=SEEK_FRAMES, options={"bf": "2", "g": "8"})),
        ("hevc.mp4", "MP4 HEVC, open GOP (CRA)", lambda: encode_clip(
            "mp4", "libx265", num_frames=SEEK_FRAMES, options=_OPEN_GOP_X265)),
        ("hevc.mkv", "Matroska HEVC, open GOP (CRA)", lambda: encode_clip(
            "matroska", "libx265", num_frames=SEEK_FRAMES, options=_OPEN_GOP_X265)),
        ("aac.mp4", "MP4 H.264 + AAC", lambda: encode_clip(
            "mp4", "libx264", num_frames=SEEK_FRAMES, audio=True, options={"g": "8"})),
        ("vfr.mp4", "MP4 H.264, variable frame rate, B-frames", lambda: encode_clip(
            "mp4", "libx264", num_frames=SEEK_FRAMES, pts_ms=_vfr_pts(SEEK_FRAMES), options={"g": "8", "bf": "2"})),
        ("av1.mp4", "MP4 AV1", lambda: encode_clip(
            "mp4", "libsvtav1", num_frames=SEEK_FRAMES, size=(128, 64), options={"g": "8", "svtav1-params": "log-level=0"})),
        ("h264.m4v", "M4V H.264", lambda: encode_clip("ipod", "libx264", num_frames=SEEK_FRAMES, options={"g": "8"})),
        ("editlist.mp4", "MP4 H.264, B-frames, edit list hiding 5 frames", lambda: trimmed_mp4(encode_clip(
            "mp4", "libx264", num_frames=SEEK_FRAMES, options={"g": "8", "bf": "2"}), 5)),
    )
)
