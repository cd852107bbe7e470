"""Bad-data corpus: good chat samples mixed with every kind of bad one, in known numbers.

``make_bad_corpus(root, seq_length=W)`` writes

* ``root/raw/records.jsonl`` + media: good synthetic records and every kind of ``BAD_KINDS`` as an
  input record, prepared by ``energon-pack prepare`` (whose report counts what it rejects);
* one more shard holding every kind written directly as WebDataset samples (bypassing prepare's
  checks), plus the ``UNTRUSTED_KINDS`` (malicious pickles), so the loader's skip path meets each;

and indexes all shards as one Energon dataset at ``root/dataset``. ``BadCorpus`` says which keys
must be delivered and how many skips each stage must report per reason.

Each kind is ``BadKind(name, prepare_reason, load_reason, build)``; a reason of None means the
sample is accepted there (``prepare``: written; loader: delivered in a row). ``prepare`` reports
every media header problem as ``unreadable_media``, its detail naming the loader's reason.
"""

from __future__ import annotations

import builtins
import io
import json
import pickle
import struct
import tempfile
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from energon_pack.data.prepare import PrepareReport, prepare_dataset, write_energon_metadata
from energon_pack.data.synthetic import SyntheticSpec, encode_image, encode_video, make_records

#: Marker text replaced by invalid UTF-8 bytes in the stored conversation.
_NOT_UTF8 = "@@not-utf8@@"


@dataclass(frozen=True)
class Planted:
    """One planted sample: messages (any accepted form), image files ``(extension, bytes)``, videos.

    ``raw_parts`` are extra WebDataset parts of the directly written copy (part name -> bytes);
    ``conversation_part`` replaces its ``.json`` bytes (None: no ``.json`` part at all).
    """

    messages: list[dict[str, Any]]
    images: list[tuple[str, bytes]] = field(default_factory=list)
    videos: list[bytes] = field(default_factory=list)
    raw_parts: dict[str, bytes] = field(default_factory=dict)
    conversation_part: bytes | None | str = "default"


@dataclass(frozen=True)
class BadKind:
    """A kind of bad (or unusual) sample and the skip reason each stage must report (None: accepted)."""

    name: str
    prepare_reason: str | None
    load_reason: str | None
    build: Callable[[np.random.Generator, int], Planted]


def _chat(user: str, assistant: str = "It shows a gradient.") -> list[dict[str, Any]]:
    return [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]


def _pixels(rng: np.random.Generator, height: int = 48, width: int = 64) -> np.ndarray:
    return rng.integers(0, 255, (height, width, 3), dtype=np.uint8)


def _pil_bytes(image: Any, image_format: str, **options: Any) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=image_format, **options)
    return buffer.getvalue()


def png_with_size(width: int, height: int) -> bytes:
    """A tiny PNG whose header claims ``width`` x ``height`` RGB pixels (a decompression bomb header).

    Example: ``png_with_size(100_000, 100_000)`` -> ~60 bytes that announce 10^10 pixels.
    """

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 16)) + chunk(b"IEND", b"")


def _video_frames(rng: np.random.Generator, count: int = 12) -> np.ndarray:
    return np.repeat(_pixels(rng)[None], count, axis=0)


def mp4_cut_after_header(rng: np.random.Generator) -> bytes:
    """An MP4 with its header (``moov``) first, cut 100 bytes into the frame data."""
    import av

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "video.mp4"
        with av.open(str(path), mode="w", format="mp4", options={"movflags": "faststart"}) as container:
            stream = container.add_stream("libx264", rate=Fraction(10))
            stream.height, stream.width, stream.pix_fmt = 48, 64, "yuv420p"
            for frame in _video_frames(rng):
                container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
            container.mux(stream.encode())
        data = path.read_bytes()
    return data[: data.index(b"mdat") + 100]


def mp4_with_zero_frames(rng: np.random.Generator) -> bytes:
    """A well-formed MP4 whose video track lists no samples (sample tables emptied)."""
    data = bytearray(encode_video(_video_frames(rng, 4), fps=10))
    # Entry counts: stsz after version/flags and sample_size; stts/stsc/stco after version/flags.
    for box, offset in ((b"stsz", 12), (b"stts", 8), (b"stsc", 8), (b"stco", 8)):
        struct.pack_into(">I", data, data.index(box) + offset, 0)
    return bytes(data)


def mp4_with_unknown_codec(rng: np.random.Generator) -> bytes:
    """An H.264 MP4 whose sample entry is renamed to the unknown codec ``zzzz``."""
    data = encode_video(_video_frames(rng, 4), fps=10)
    return data.replace(b"avc1", b"zzzz")


def _image_kind(make: Callable[[np.random.Generator], tuple[str, bytes]]) -> Callable[[np.random.Generator, int], Planted]:
    return lambda rng, _width: Planted(_chat("<image>\nWhat is this?"), images=[make(rng)])


def _video_kind(make: Callable[[np.random.Generator], bytes]) -> Callable[[np.random.Generator, int], Planted]:
    return lambda rng, _width: Planted(_chat("<video>\nWhat happens?"), videos=[make(rng)])


def _truncated_jpeg(rng: np.random.Generator) -> tuple[str, bytes]:
    data = encode_image(_pixels(rng), "JPEG", "RGB")
    return "jpg", data[: len(data) // 2]


def _cmyk_jpeg(rng: np.random.Generator) -> tuple[str, bytes]:
    from PIL import Image

    return "jpg", _pil_bytes(Image.fromarray(_pixels(rng)).convert("CMYK"), "JPEG")


def _png_16bit(rng: np.random.Generator) -> tuple[str, bytes]:
    from PIL import Image

    return "png", _pil_bytes(Image.fromarray(_pixels(rng)[..., 0].astype(np.uint16) * 257), "PNG")


def _animated(image_format: str, extension: str) -> Callable[[np.random.Generator], tuple[str, bytes]]:
    def make(rng: np.random.Generator) -> tuple[str, bytes]:
        from PIL import Image

        frames = [Image.fromarray(_pixels(rng)) for _ in range(3)]
        return extension, _pil_bytes(frames[0], image_format, save_all=True, append_images=frames[1:], duration=100)

    return make


def _longer_than(rng: np.random.Generator, width: int) -> Planted:
    words = " ".join(rng.choice(["red", "blue", "cat", "tree", "sky"], size=2 * width))
    return Planted(_chat("Describe everything.", words))


def _media_count_mismatch(placeholders: int, images: int) -> Callable[[np.random.Generator, int], Planted]:
    def build(rng: np.random.Generator, _width: int) -> Planted:
        files = [("jpg", encode_image(_pixels(rng), "JPEG", "RGB")) for _ in range(images)]
        return Planted(_chat("<image>\n" * placeholders + "Compare."), images=files)

    return build


BAD_KINDS: tuple[BadKind, ...] = (
    BadKind("truncated_jpeg", None, "corrupt_image", _image_kind(_truncated_jpeg)),
    BadKind("garbage_png", "unreadable_media", "corrupt_image", _image_kind(lambda rng: ("png", rng.bytes(300)))),
    BadKind("zero_byte_image", "unreadable_media", "corrupt_image", _image_kind(lambda rng: ("jpg", b""))),
    BadKind("pixel_bomb_header", "unreadable_media", "pixel_bomb", _image_kind(lambda rng: ("png", png_with_size(100_000, 100_000)))),
    # Accepted as the Hugging Face processor accepts them: converted to RGB (first frame of an animation).
    BadKind("cmyk_jpeg", None, None, _image_kind(_cmyk_jpeg)),
    BadKind("png_16bit", None, None, _image_kind(_png_16bit)),
    BadKind("animated_webp", None, None, _image_kind(_animated("WEBP", "webp"))),
    BadKind("animated_png", None, None, _image_kind(_animated("PNG", "png"))),
    BadKind("unsupported_codec", "unreadable_media", "unsupported_codec", _video_kind(mp4_with_unknown_codec)),
    BadKind("mp4_cut_after_header", "unreadable_media", "corrupt_video", _video_kind(mp4_cut_after_header)),
    BadKind("zero_frame_video", "unreadable_media", "corrupt_video", _video_kind(mp4_with_zero_frames)),
    BadKind("more_placeholders", "placeholder_mismatch", "placeholder_mismatch", _media_count_mismatch(2, 1)),
    BadKind("fewer_placeholders", "placeholder_mismatch", "placeholder_mismatch", _media_count_mismatch(1, 2)),
    BadKind("empty_conversation", "empty_conversation", "empty_conversation", lambda rng, _w: Planted([])),
    BadKind("no_assistant_turn", "no_assistant_turn", "no_assistant_turn",
            lambda rng, _w: Planted([{"role": "user", "content": "Anyone there?"}])),
    BadKind("invalid_utf8_json", "non_utf8_text", "non_utf8_text", lambda rng, _w: Planted(_chat(f"Hi {_NOT_UTF8}"))),
    BadKind("longer_than_w", None, "overlong", _longer_than),
    # Vision tokens never carry loss; prepare reports such records unless --allow-assistant-media.
    BadKind("media_in_assistant_turn", "media_in_assistant_turn", None,
            lambda rng, _w: Planted(_chat("Show me one.", "<image>\nHere it is."),
                                    images=[("jpg", encode_image(_pixels(rng), "JPEG", "RGB"))])),
)


class PickleExploit:
    """Unpickling this creates the file ``marker``: proof that shard content was executed."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return builtins.open, (str(self.marker), "w")


def untrusted_kinds(marker: Path) -> tuple[BadKind, ...]:
    """Shards carrying malicious pickles: a loader that unpickles them creates ``marker``."""
    binary, text = pickle.dumps(PickleExploit(marker), protocol=4), pickle.dumps(PickleExploit(marker), protocol=0)
    good = _chat("Hello.")
    return (
        BadKind("pickle_as_json", None, "non_utf8_text", lambda rng, _w: Planted(good, conversation_part=binary)),
        BadKind("text_pickle_as_json", None, "malformed_conversation", lambda rng, _w: Planted(good, conversation_part=text)),
        BadKind("pickle_pyd_only", None, "malformed_conversation",
                lambda rng, _w: Planted(good, conversation_part=None, raw_parts={"pyd": binary})),
        # A .pyd member next to a good conversation is never read: the sample is delivered.
        BadKind("pickle_pyd_beside_json", None, None,
                lambda rng, _w: Planted(good, raw_parts={"pyd": binary, "pickle": binary, "0.pyd": binary})),
    )


@dataclass
class BadCorpus:
    """A prepared corpus of good and bad samples, and what each stage must report."""

    dataset: Path
    prepare_report: PrepareReport
    #: Skips ``prepare`` must report, by reason.
    planted_prepare: Counter[str]
    #: Skips the loader must report over one epoch, by reason.
    planted_load: Counter[str]
    #: Keys the loader must deliver, each exactly once per epoch.
    good_keys: Counter[str]
    #: Key -> the loader's skip reason, for every sample the loader must skip.
    load_reasons: dict[str, str]
    #: Unpickling any shard content would create this file.
    pickle_marker: Path


def _conversation_bytes(planted: Planted) -> bytes:
    text = json.dumps(planted.messages, ensure_ascii=False).encode("utf-8")
    return text.replace(_NOT_UTF8.encode(), b"\xff\xfe invalid \xc3")


def _write_record(raw: Path, key: str, planted: Planted) -> bytes:
    """Media files under ``raw`` and the JSON Lines record (bytes: it may hold invalid UTF-8)."""
    names: dict[str, list[str]] = {"images": [], "videos": []}
    for index, (extension, data) in enumerate(planted.images):
        names["images"].append(f"{key}_{index}.{extension}")
        (raw / names["images"][-1]).write_bytes(data)
    for index, data in enumerate(planted.videos):
        names["videos"].append(f"{key}_{index}.mp4")
        (raw / names["videos"][-1]).write_bytes(data)
    record = json.dumps({"id": key, "messages": planted.messages, **names}, ensure_ascii=False).encode("utf-8")
    return record.replace(_NOT_UTF8.encode(), b"\xff\xfe invalid \xc3")


def raw_sample(key: str, planted: Planted) -> dict[str, Any]:
    """The WebDataset sample of ``planted`` as prepare would write it, without prepare's checks."""
    sample: dict[str, Any] = {"__key__": key}
    if planted.conversation_part == "default":
        sample["json"] = _conversation_bytes(planted)
    elif planted.conversation_part is not None:
        sample["json"] = planted.conversation_part
    sample.update({f"{index}.{extension}": data for index, (extension, data) in enumerate(planted.images)})
    sample.update({f"{index}.mp4": data for index, data in enumerate(planted.videos)})
    sample.update(planted.raw_parts)
    return sample


def make_bad_corpus(root: Path, *, seq_length: int, num_good: int = 24, copies: int = 2, seed: int = 0) -> BadCorpus:
    """Write the corpus under ``root`` (see the module docstring): ``copies`` samples of each kind per path."""
    rng = np.random.default_rng(seed)
    raw = root / "raw"
    spec = SyntheticSpec(max_image_side=96, max_video_side=64, max_video_seconds=1.5, max_images_per_sample=2)
    records = make_records(raw, num_good, seed=seed, spec=spec)
    good_keys = Counter(f"sample{index:05d}" for index in range(num_good))
    planted_prepare: Counter[str] = Counter()
    load_reasons: dict[str, str] = {}
    marker = root / "pickle-was-executed"
    direct: list[dict[str, Any]] = []
    with records.open("ab") as out:
        for kind in BAD_KINDS:
            for copy in range(copies):
                key = f"{kind.name}_{copy}"
                out.write(_write_record(raw, key, kind.build(rng, seq_length)) + b"\n")
                if kind.prepare_reason is not None:
                    planted_prepare[kind.prepare_reason] += 1
                elif kind.load_reason is not None:
                    load_reasons[key] = kind.load_reason
                else:
                    good_keys[key] += 1
    for kind in BAD_KINDS + untrusted_kinds(marker):
        for copy in range(copies):
            key = f"raw_{kind.name}_{copy}"
            direct.append(raw_sample(key, kind.build(rng, seq_length)))
            if kind.load_reason is None:
                good_keys[key] += 1
            else:
                load_reasons[key] = kind.load_reason
    dataset = root / "dataset"
    report = prepare_dataset(records, raw, dataset, samples_per_shard=16, progress=False)
    write_direct_shard(dataset, DIRECT_SHARD, direct, also=report.shards)
    return BadCorpus(
        dataset=dataset,
        prepare_report=report,
        planted_prepare=planted_prepare,
        planted_load=Counter(load_reasons.values()),
        good_keys=good_keys,
        load_reasons=load_reasons,
        pickle_marker=marker,
    )


#: The train-split shard written without prepare's checks (prepare numbers its shards from 0).
DIRECT_SHARD = "shards/train-900000.tar"


def write_direct_shard(dataset: Path, shard: str, samples: list[dict[str, Any]], *, also: list[str] = ()) -> Path:
    """Write ``samples`` (WebDataset dicts) as ``dataset/shard`` (a ``shards/train-N.tar`` name) without
    any check, then index the dataset (that shard plus the shards ``also`` names) as its train split.
    Returns ``dataset``."""
    import webdataset as wds

    (dataset / shard).parent.mkdir(parents=True, exist_ok=True)
    with wds.TarWriter(str(dataset / shard)) as writer:
        for sample in samples:
            writer.write(sample)
    write_energon_metadata(dataset, [*also, shard])
    return dataset


def make_bad_run(root: Path, *, bad: int, good: int) -> Path:
    """A dataset of ``bad`` consecutive bad samples (invalid conversations) followed by ``good`` good ones.

    One shard, written directly: read in order by a single worker without shuffling.
    """
    conversation = json.dumps(_chat("Hi.", "Hello.")).encode()
    samples = [{"__key__": f"bad{index:04d}", "json": b"{not json"} for index in range(bad)]
    samples += [{"__key__": f"good{index:04d}", "json": conversation} for index in range(good)]
    return write_direct_shard(root, DIRECT_SHARD, samples)
