"""Deterministic synthetic Qwen-VL chat data (images, videos, multi-turn text) for demo and tests.

``make_synthetic_dataset(out_dir, num_samples=64, seed=0)`` writes media files and a
``records.jsonl`` under ``out_dir/raw`` and prepares them with the same code path as
``energon-pack prepare`` into ``out_dir/dataset``.
"""

from __future__ import annotations

import io
import itertools
import json
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from energon_pack.data.prepare import PrepareReport, prepare_dataset

_WORDS = (
    "the a cat dog red blue small large image video shows scene person car tree sky river city "
    "left right top bottom next to behind moving slowly quickly bright dark detail object two three"
).split()
# (format, PIL mode) combinations the generator draws from; JPEG cannot store alpha or palette.
IMAGE_KINDS = (("JPEG", "RGB"), ("JPEG", "L"), ("PNG", "RGB"), ("PNG", "RGBA"), ("PNG", "L"), ("PNG", "P"),
               ("WEBP", "RGB"), ("WEBP", "RGBA"))
#: What ``SyntheticSpec.real_world_fraction`` draws from instead: (format, PIL mode, EXIF
#: orientation or None): phone photos stored sideways, animated-format first frames, scans.
REAL_WORLD_IMAGE_KINDS = (("JPEG", "RGB", 6), ("JPEG", "RGB", 8), ("JPEG", "RGB", 3), ("WEBP", "RGB", 6),
                          ("GIF", "P", None), ("BMP", "RGB", None), ("TIFF", "RGB", None))
#: Video (container format, file extension, encoder, encoder options) drawn with
#: ``real_world_fraction``; the other videos are H.264 MP4.
REAL_WORLD_VIDEO_KINDS = (
    ("webm", "webm", "libvpx-vp9", {"deadline": "realtime", "cpu-used": "8"}),
    ("matroska", "mkv", "libx264", {}),
    ("mov", "mov", "libx264", {}),
    ("avi", "avi", "mpeg4", {}),
)
_EXTENSION = {"JPEG": "jpg", "PNG": "png", "WEBP": "webp", "GIF": "gif", "BMP": "bmp", "TIFF": "tif"}


@dataclass(frozen=True, kw_only=True)
class SyntheticSpec:
    """Size knobs of the synthetic mix (pixels are per image side; seconds per video)."""

    min_image_side: int = 28
    max_image_side: int = 1024
    min_video_seconds: float = 1.0
    max_video_seconds: float = 4.0
    video_fps_choices: tuple[int, ...] = (10, 24, 30)
    max_video_side: int = 192
    max_images_per_sample: int = 4
    #: Videos pan across the first frame (realistic motion) instead of fading it to white.
    panning_video: bool = False
    #: x264 preset of the generated videos (None: PyAV's default; "ultrafast" for long clips).
    video_preset: str | None = None
    #: Fraction of images written as PNGs cut in half: the header reads, decoding fails.
    corrupt_fraction: float = 0.0
    #: Fraction of images and videos drawn from ``REAL_WORLD_IMAGE_KINDS`` / ``REAL_WORLD_VIDEO_KINDS``
    #: (EXIF-turned JPEG/WebP, GIF, BMP, TIFF; WebM VP9, MKV, MOV, AVI) instead of the plain kinds.
    real_world_fraction: float = 0.0


def encode_image(pixels: np.ndarray, image_format: str, mode: str, *, orientation: int | None = None) -> bytes:
    """Encode an RGB uint8 array [H, W, 3] as ``image_format`` bytes in PIL ``mode``, with an EXIF
    ``orientation`` (1-8: the loader turns the image upright by it) when given.

    Example: ``encode_image(np.zeros((22, 64, 3), np.uint8), "JPEG", "RGB", orientation=6)`` -> a
    JPEG stored 64x22 that loads as 22x64.
    """
    from PIL import Image

    image = Image.fromarray(pixels, mode="RGB")
    if mode == "P":
        image = image.quantize(colors=64)
    elif mode != "RGB":
        image = image.convert(mode)
    options: dict[str, Any] = {"quality": 90} if image_format in ("JPEG", "WEBP") else {}
    if orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = orientation  # EXIF Orientation
        options["exif"] = exif.tobytes()
    buffer = io.BytesIO()
    image.save(buffer, format=image_format, **options)
    return buffer.getvalue()


def encode_video(
    frames: np.ndarray | Iterable[np.ndarray],
    fps: int,
    *,
    codec: str = "libx264",
    preset: str | None = None,
    container_format: str = "mp4",
    options: dict[str, str] | None = None,
    input_format: str = "rgb24",
) -> bytes:
    """Encode RGB uint8 frames [T, H, W, 3] (H, W even; or an iterable of [H, W, 3] frames, encoded
    as they come) with PyAV as ``container_format`` (an FFmpeg muxer: "mp4", "webm", "matroska",
    "mov", "avi"); ``preset`` is the x264 preset (e.g. "ultrafast"), ``options`` other encoder options.
    ``input_format="yuv420p"``: frames are PyAV's yuv420p arrays [H * 3 / 2, W] (no colour conversion).

    Example: ``encode_video(np.zeros((20, 64, 96, 3), np.uint8), fps=10)`` -> 2 s MP4 bytes;
    ``codec="libvpx-vp9", container_format="webm"`` -> VP9 WebM bytes.
    """
    import av

    frames = iter(frames)
    first = next(frames)
    buffer = io.BytesIO()
    encoder_options = {**(options or {}), **({"preset": preset} if preset else {})}
    with av.open(buffer, mode="w", format=container_format) as container:
        extra = {"options": encoder_options} if encoder_options else {}
        stream = container.add_stream(codec, rate=Fraction(fps), **extra)
        rows = first.shape[0] * 2 // 3 if input_format == "yuv420p" else first.shape[0]
        stream.height, stream.width = rows, first.shape[1]
        stream.pix_fmt = "yuv420p"
        for frame in itertools.chain([first], frames):
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format=input_format)):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buffer.getvalue()


#: Audio codecs of the synthetic clips: name -> (container format, codec, sample format fed to the
#: encoder, file extension); the containers and codecs Qwen-Omni users ship (docs/omni.md).
AUDIO_CODECS: dict[str, tuple[str, str, str, str]] = {
    "wav_s16": ("wav", "pcm_s16le", "s16", "wav"),
    "wav_s24": ("wav", "pcm_s24le", "s32", "wav"),
    "wav_f32": ("wav", "pcm_f32le", "flt", "wav"),
    "flac": ("flac", "flac", "s16", "flac"),
    "mp3": ("mp3", "libmp3lame", "fltp", "mp3"),
    "m4a_aac": ("ipod", "aac", "fltp", "m4a"),
    "ogg_opus": ("ogg", "libopus", "s16", "ogg"),
    "ogg_vorbis": ("ogg", "vorbis", "fltp", "ogg"),
    "webm_opus": ("webm", "libopus", "s16", "webm"),
}


def audio_tone(seconds: float, rate: int, channels: int = 1, seed: int = 0) -> np.ndarray:
    """A float32 [channels, n] signal of ``seconds`` at ``rate`` Hz: a chirp plus a little noise
    (channel c at 1 - 0.2 c of the chirp). Example: ``audio_tone(1.0, 16000).shape`` -> ``(1, 16000)``."""
    n = int(round(seconds * rate))
    t = np.arange(n) / rate
    rng = np.random.default_rng(seed)
    base = 0.3 * np.sin(2 * np.pi * (220 + 400 * t) * t)
    return np.stack([base * (1 - 0.2 * c) + 0.05 * rng.standard_normal(n) for c in range(channels)]).astype(np.float32)


def audio_frames(signal: np.ndarray, rate: int, sample_format: str, frame_size: int) -> list[Any]:
    """``signal`` float32 [channels, n] as PyAV audio frames of ``frame_size`` samples in
    ``sample_format`` (``s16``/``s32`` scaled to integers; planar when it ends in ``p``), timestamped."""
    import av

    channels = signal.shape[0]
    layout = "mono" if channels == 1 else "stereo"
    planar = sample_format.endswith("p")
    frames, pts = [], 0
    for start in range(0, signal.shape[1], frame_size):
        block = signal[:, start : start + frame_size]
        if sample_format.startswith("s16"):
            block = np.clip(np.round(block * 32767), -32768, 32767).astype(np.int16)
        elif sample_format.startswith("s32"):
            block = np.round(block * 2147483647.0 * 0.99).astype(np.int32)
        data = block if planar else block.T.reshape(1, -1)
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(data), format=sample_format, layout=layout)
        frame.sample_rate, frame.pts, frame.time_base = rate, pts, Fraction(1, rate)
        pts += block.shape[1]
        frames.append(frame)
    return frames


def encode_audio(signal: np.ndarray, rate: int, codec: str) -> bytes:
    """The file bytes of ``signal`` (float32 [channels, n], mono or stereo) at ``rate`` Hz encoded as
    ``AUDIO_CODECS[codec]`` with PyAV. Example: ``encode_audio(audio_tone(1.0, 16000), 16000, "flac")``
    -> a FLAC file of 16000 samples."""
    import av

    container_format, codec_name, sample_format, _ = AUDIO_CODECS[codec]
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=container_format) as container:
        stream = container.add_stream(codec_name, rate=rate, layout="mono" if signal.shape[0] == 1 else "stereo")
        if codec_name == "vorbis":
            stream.codec_context.options = {"strict": "-2"}
        frame_size = stream.codec_context.frame_size or 1024
        for frame in audio_frames(signal, rate, sample_format, frame_size):
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buffer.getvalue()


def speech_like(seconds: float, rate: int, channels: int = 1, seed: int = 0) -> np.ndarray:
    """A float32 [channels, n] speech-like signal of ``seconds`` at ``rate`` Hz: voiced syllables of
    0.12-0.35 s (a gliding 90-260 Hz pitch with 12 harmonics falling off as 1/k, a smooth onset and
    decay) with short noise bursts between some of them (fricatives) and pauses of 0.05-0.5 s
    (channel c at 1 - 0.2 c). Cheap to make and to encode, with a speech clip's spectrum and silences.

    Example: ``speech_like(2.0, 16000).shape`` -> ``(1, 32000)``.
    """
    n = int(round(seconds * rate))
    rng = np.random.default_rng(seed)
    signal = np.zeros(n, dtype=np.float64)
    start = int(rng.uniform(0.0, 0.2) * rate)
    while start < n:
        length = min(int(rng.uniform(0.12, 0.35) * rate), n - start)
        t = np.arange(length) / rate
        pitch = rng.uniform(90, 260) * (1 + rng.uniform(-0.15, 0.15) * t / max(t[-1], 1e-3)) if length else 0.0
        phase = 2 * np.pi * np.cumsum(np.broadcast_to(pitch, t.shape)) / rate
        voiced = sum(np.sin(k * phase) / k for k in range(1, 13))
        envelope = np.sin(np.pi * np.arange(length) / max(length, 1)) ** 2
        signal[start : start + length] = 0.25 * rng.uniform(0.5, 1.0) * envelope * voiced
        start += length
        if rng.random() < 0.3:  # a fricative: a short burst of noise
            burst = min(int(rng.uniform(0.04, 0.1) * rate), max(n - start, 0))
            signal[start : start + burst] = 0.05 * rng.standard_normal(burst)
            start += burst
        start += int(rng.uniform(0.05, 0.5 if rng.random() < 0.2 else 0.12) * rate)
    noise = 0.003 * rng.standard_normal((channels, n))
    return np.stack([signal * (1 - 0.2 * c) for c in range(channels)]).astype(np.float32) + noise.astype(np.float32)


def encode_video_with_sound(frames: np.ndarray, fps: int, signal: np.ndarray | None, rate: int = 16000) -> bytes:
    """MP4: ``frames`` uint8 [T, H, W, 3] as H.264 at ``fps`` and, unless None, ``signal``
    float32 [channels, n] as AAC at ``rate`` Hz (a video heard with its sound, Qwen-Omni).

    Example: ``encode_video_with_sound(np.zeros((8, 64, 64, 3), np.uint8), 4, audio_tone(2.0, 16000))``
    -> a 2 s MP4 with a video and an AAC audio stream.
    """
    import av

    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as container:
        video = container.add_stream("libx264", rate=fps)
        video.width, video.height, video.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        video.codec_context.options = {"threads": "1"}
        audio = None
        if signal is not None:
            audio = container.add_stream("aac", rate=rate, layout="mono" if signal.shape[0] == 1 else "stereo")
        for frame in frames:
            for packet in video.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in video.encode(None):
            container.mux(packet)
        if audio is not None:
            for frame in audio_frames(signal, rate, "fltp", audio.codec_context.frame_size or 1024):
                for packet in audio.encode(frame):
                    container.mux(packet)
            for packet in audio.encode(None):
                container.mux(packet)
    return buffer.getvalue()


def _smooth_pixels(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """Gradient plus mild noise: compresses like a photo, not like white noise."""
    ys = np.linspace(0, 1, height, dtype=np.float32)[:, None, None]
    xs = np.linspace(0, 1, width, dtype=np.float32)[None, :, None]
    base = rng.uniform(0, 255, size=(1, 1, 3)).astype(np.float32)
    slope = rng.uniform(-120, 120, size=(2, 3)).astype(np.float32)
    pixels = base + ys * slope[0] + xs * slope[1] + rng.normal(0, 8, size=(height, width, 3)).astype(np.float32)
    return np.clip(pixels, 0, 255).astype(np.uint8)


def _sentence(rng: np.random.Generator, min_words: int, max_words: int) -> str:
    words = rng.choice(_WORDS, size=int(rng.integers(min_words, max_words + 1)))
    return " ".join(words).capitalize() + "."


def _real_world(rng: np.random.Generator, spec: SyntheticSpec) -> bool:
    """Whether the next medium is drawn from the real-world kinds (no random draw at fraction 0, so
    the plain mix stays the same)."""
    return spec.real_world_fraction > 0 and rng.random() < spec.real_world_fraction


def _write_image(rng: np.random.Generator, spec: SyntheticSpec, path: Path) -> str:
    image_format, mode = IMAGE_KINDS[int(rng.integers(len(IMAGE_KINDS)))]
    orientation = None
    if _real_world(rng, spec):
        image_format, mode, orientation = REAL_WORLD_IMAGE_KINDS[int(rng.integers(len(REAL_WORLD_IMAGE_KINDS)))]
    corrupt = spec.corrupt_fraction > 0 and rng.random() < spec.corrupt_fraction
    if corrupt:
        image_format, mode, orientation = "PNG", "RGB", None
    side = int(rng.integers(spec.min_image_side, spec.max_image_side + 1))
    aspect = float(np.exp(rng.uniform(np.log(1 / 3), np.log(3))))
    height = max(spec.min_image_side, min(spec.max_image_side, int(side / np.sqrt(aspect))))
    width = max(spec.min_image_side, min(spec.max_image_side, int(side * np.sqrt(aspect))))
    name = f"{path.name}.{_EXTENSION[image_format]}"
    data = encode_image(_smooth_pixels(rng, height, width), image_format, mode, orientation=orientation)
    path.with_name(name).write_bytes(data[: len(data) // 2] if corrupt else data)
    return name


def _write_video(rng: np.random.Generator, spec: SyntheticSpec, path: Path) -> str:
    fps = int(rng.choice(spec.video_fps_choices))
    seconds = float(rng.uniform(spec.min_video_seconds, spec.max_video_seconds))
    height = 2 * int(rng.integers(16, spec.max_video_side // 2 + 1))
    width = 2 * int(rng.integers(16, spec.max_video_side // 2 + 1))
    num_frames = max(2, int(round(seconds * fps)))
    first = _smooth_pixels(rng, height, width)
    if spec.panning_video:
        # A camera pan (4 px per frame), generated frame by frame: long clips never sit in memory.
        frames: Any = (np.roll(first, 4 * index, axis=1) for index in range(num_frames))
    else:
        shifts = np.arange(num_frames, dtype=np.int16)[:, None, None, None] * 3
        frames = np.clip(first.astype(np.int16)[None] + shifts, 0, 255).astype(np.uint8)
    if _real_world(rng, spec):
        kind = REAL_WORLD_VIDEO_KINDS[int(rng.integers(len(REAL_WORLD_VIDEO_KINDS)))]
        container_format, extension, codec, options = kind
        data = encode_video(frames, fps, codec=codec, container_format=container_format, options=options)
    else:
        extension, data = "mp4", encode_video(frames, fps, preset=spec.video_preset)
    name = f"{path.name}.{extension}"
    path.with_name(name).write_bytes(data)
    return name


def make_records(raw_dir: Path, num_samples: int, *, seed: int = 0, spec: SyntheticSpec = SyntheticSpec()) -> Path:
    """Write ``num_samples`` chat records and their media under ``raw_dir``; return the JSONL path.

    Mix (per sample): 25% text only, 40% one image, 15% several images, 20% one video; a third
    of samples have a system prompt, a third have two question/answer rounds.
    """
    raw_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    records_path = raw_dir / "records.jsonl"
    with records_path.open("w", encoding="utf-8") as records:
        for index in range(num_samples):
            kind = rng.choice(["text", "image", "images", "video"], p=[0.25, 0.40, 0.15, 0.20])
            stem = raw_dir / f"s{index:05d}"
            images: list[str] = []
            videos: list[str] = []
            if kind == "image":
                images = [_write_image(rng, spec, stem.with_name(f"{stem.name}_0"))]
            elif kind == "images":
                count = int(rng.integers(2, spec.max_images_per_sample + 1))
                images = [_write_image(rng, spec, stem.with_name(f"{stem.name}_{i}")) for i in range(count)]
            elif kind == "video":
                videos = [_write_video(rng, spec, stem)]
            messages: list[dict[str, Any]] = []
            if rng.random() < 1 / 3:
                messages.append({"role": "system", "content": _sentence(rng, 4, 12)})
            media = "".join("<image>\n" for _ in images) + "".join("<video>\n" for _ in videos)
            messages.append({"role": "user", "content": media + _sentence(rng, 3, 20)})
            messages.append({"role": "assistant", "content": " ".join(_sentence(rng, 3, 25) for _ in range(int(rng.integers(1, 12))))})
            if rng.random() < 1 / 3:
                messages.append({"role": "user", "content": _sentence(rng, 3, 15)})
                messages.append({"role": "assistant", "content": _sentence(rng, 3, 40)})
            record = {"id": f"sample{index:05d}", "messages": messages, "images": images, "videos": videos}
            records.write(json.dumps(record) + "\n")
    return records_path


def make_synthetic_dataset(
    out_dir: str | Path,
    num_samples: int = 64,
    *,
    seed: int = 0,
    spec: SyntheticSpec = SyntheticSpec(),
    samples_per_shard: int = 32,
    split_ratio: str = "1,0,0",
    progress: bool = False,
) -> PrepareReport:
    """Generate records + media under ``out_dir/raw`` and prepare them into ``out_dir/dataset``."""
    out = Path(out_dir)
    records = make_records(out / "raw", num_samples, seed=seed, spec=spec)
    return prepare_dataset(
        records, out / "raw", out / "dataset",
        split_ratio=split_ratio, samples_per_shard=samples_per_shard, progress=progress,
    )


def make_jpeg_records(raw_dir: Path, num_samples: int, *, seed: int = 0, side: int = 128) -> Path:
    """Write ``num_samples`` one-JPEG chat records (``side`` x ``side`` photo-like images) and their
    files under ``raw_dir``; return the JSONL path. The many-rows input of ``bench --stage prepare``.

    Example: ``make_jpeg_records(tmp, 2)`` -> ``tmp/records.jsonl`` with records ``j00000``,
    ``j00001``, each ``{"messages": [user "<image>...", assistant "..."], "images": ["j0000i.jpg"]}``.
    """
    raw_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    records_path = raw_dir / "records.jsonl"
    with records_path.open("w", encoding="utf-8") as records:
        for index in range(num_samples):
            name = f"j{index:05d}.jpg"
            (raw_dir / name).write_bytes(encode_image(_smooth_pixels(rng, side, side), "JPEG", "RGB"))
            messages = [{"role": "user", "content": "<image>\n" + _sentence(rng, 3, 20)},
                        {"role": "assistant", "content": _sentence(rng, 3, 40)}]
            records.write(json.dumps({"id": f"j{index:05d}", "messages": messages, "images": [name]}) + "\n")
    return records_path


def records_to_parquet(
    records_path: Path, media_root: Path, out_path: Path, *, row_group_rows: int = 100, keep_paths: bool = True
) -> Path:
    """Write the JSONL records of ``make_records`` / ``make_jpeg_records`` as one Parquet file the
    way the Hub ships such data: ``id``, ``messages`` (role, content strings), and ``images`` /
    ``videos`` lists of ``{"bytes", "path"}`` structs holding each file's bytes (``path``: its name,
    None without ``keep_paths``), ``row_group_rows`` rows per row group (written group by group).

    Example: 3 records, ``row_group_rows=2`` -> a file of 2 row groups whose rows prepare into
    the shards the JSON records prepare into.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    media = pa.list_(pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    schema = pa.schema([("id", pa.string()), ("messages", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
                        ("images", media), ("videos", media)])

    def row(record: dict[str, Any]) -> dict[str, Any]:
        items = {kind: [{"bytes": (media_root / name).read_bytes(), "path": name if keep_paths else None}
                        for name in record.get(kind, [])] for kind in ("images", "videos")}
        return {"id": record["id"], "messages": record["messages"], **items}

    lines = records_path.read_text(encoding="utf-8").splitlines()
    with pq.ParquetWriter(out_path, schema) as writer:
        for start in range(0, len(lines), row_group_rows):
            rows = [row(json.loads(line)) for line in lines[start:start + row_group_rows]]
            writer.write_table(pa.Table.from_pylist(rows, schema=schema), row_group_size=row_group_rows)
    return out_path
