"""Datasets of Energon's own kinds, written the way a user of Energon writes them: WebDataset tar
shards of plain members (``<key>.jpg``, ``<key>.txt``, ``<key>.json``, ...), then Energon's own
``energon prepare`` command (non-interactive) for the index, the split and ``.nv-meta/dataset.yaml``
(``--sample-type`` with ``--field-map``, or a ``sample_loader.py``, or ``CrudeWebdataset``).
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from click.testing import CliRunner

from energon_pack.data.synthetic import encode_image, encode_video


def small_jpeg(seed: int, size: tuple[int, int] = (56, 84)) -> bytes:
    """A small JPEG of smooth random colours (height, width)."""
    rng = np.random.default_rng(seed)
    corners = rng.integers(0, 256, (2, 2, 3)).astype(np.float32)
    ys, xs = np.linspace(0, 1, size[0])[:, None, None], np.linspace(0, 1, size[1])[None, :, None]
    pixels = (corners[0, 0] * (1 - ys) * (1 - xs) + corners[0, 1] * (1 - ys) * xs
              + corners[1, 0] * ys * (1 - xs) + corners[1, 1] * ys * xs)
    return encode_image(pixels.astype(np.uint8), "JPEG", "RGB")


def small_mp4(seed: int, frames: int = 8, size: tuple[int, int] = (64, 96), fps: int = 4) -> bytes:
    """A short MP4 (H.264) of moving colours."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 200, (1, 1, 3))
    video = np.stack([np.broadcast_to(base + 6 * t, (*size, 3)) for t in range(frames)]).astype(np.uint8)
    return encode_video(video, fps, preset="ultrafast")


def member_bytes(value: Any) -> bytes:
    """A member's stored bytes: bytes as they are, text as UTF-8, anything else as JSON."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    return json.dumps(value).encode("utf-8")


def write_shards(root: Path, samples: Sequence[Mapping[str, Any]], *, per_shard: int = 4) -> None:
    """Write ``samples`` (``{"__key__": k, ext: value}``) as ``root/shard-NNNNNN.tar`` files of ``per_shard``."""
    root.mkdir(parents=True, exist_ok=True)
    for start in range(0, len(samples), per_shard):
        with tarfile.open(root / f"shard-{start // per_shard:06d}.tar", "w") as tar:
            for sample in samples[start : start + per_shard]:
                for extension, value in sample.items():
                    if extension == "__key__":
                        continue
                    data = member_bytes(value)
                    info = tarfile.TarInfo(f"{sample['__key__']}.{extension}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))


def energon_prepare(root: Path, *, sample_type: str, field_map: Mapping[str, str] | None = None,
                    sample_loader: str | None = None) -> None:
    """Run Energon's ``energon prepare`` on ``root`` as a user does (all samples in ``train``).

    ``field_map``: ``--field-map``; ``sample_loader``: the source of ``.nv-meta/sample_loader.py``
    (``energon prepare`` writes a template there when no field map is given; the user edits it).
    """
    from megatron.energon.tools.prepare import command

    args = [str(root), "--non-interactive", "--split-ratio", "1,0,0", "--sample-type", sample_type, "--no-progress"]
    if field_map is not None:
        args += ["--field-map", json.dumps(dict(field_map))]
    result = CliRunner().invoke(command, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    if sample_loader is not None:
        (root / ".nv-meta" / "sample_loader.py").write_text(sample_loader, encoding="utf-8")


def captioning_samples(n: int, *, seed: int = 0, prefix: str = "cap") -> list[dict[str, Any]]:
    """``n`` captioning samples: ``jpg`` + ``txt``."""
    return [{"__key__": f"{prefix}{i:03d}", "jpg": small_jpeg(seed + i), "txt": f"Caption number {i}: a smooth gradient."}
            for i in range(n)]


def make_captioning_dataset(root: Path, n: int = 6, *, seed: int = 0) -> list[dict[str, Any]]:
    """A ``CaptioningSample`` dataset (``field_map: {image: jpg, caption: txt}``); returns its samples."""
    samples = captioning_samples(n, seed=seed)
    write_shards(root, samples)
    energon_prepare(root, sample_type="CaptioningSample", field_map={"image": "jpg", "caption": "txt"})
    return samples


#: A VQA sample loader as a user writes it into the template ``energon prepare`` leaves.
VQA_SAMPLE_LOADER = '''
def sample_loader(raw: dict) -> dict:
    qa = raw["json"]
    return dict(
        __key__=raw["__key__"],
        image=raw["jpg"],
        context=qa["question"],
        answers=qa["answers"],
        answer_weights=qa.get("weights"),
    )


def part_filter(part: str) -> bool:
    return part in ("jpg", "json")
'''


def vqa_samples(n: int, *, seed: int = 100) -> list[dict[str, Any]]:
    """``n`` VQA samples (``jpg`` + ``json`` with question, answers and weights)."""
    return [
        {"__key__": f"vqa{i:03d}", "jpg": small_jpeg(seed + i),
         "json": {"question": f"What is in picture {i}?", "answers": ["colours", f"gradient {i}", "paint"],
                  "weights": [0.2, 0.5, 0.5] if i % 2 else [1.0, 0.0, 0.0]}}
        for i in range(n)
    ]


def make_vqa_dataset(root: Path, n: int = 6) -> list[dict[str, Any]]:
    """A ``VQASample`` dataset read by a ``sample_loader.py`` (``VQA_SAMPLE_LOADER``); returns its samples."""
    samples = vqa_samples(n)
    write_shards(root, samples)
    energon_prepare(root, sample_type="VQASample", sample_loader=VQA_SAMPLE_LOADER)
    return samples


#: Sample loaders as users write them for the sample types a field map cannot fill (lists of media).
INTERLEAVED_SAMPLE_LOADER = '''
def sample_loader(raw: dict) -> dict:
    sequence = [raw[f"{item['image']}.jpg"] if isinstance(item, dict) else item for item in raw["json"]["sequence"]]
    return dict(__key__=raw["__key__"], sequence=sequence)


def part_filter(part: str) -> bool:
    return part == "json" or part.endswith(".jpg")
'''

SIMILARITY_SAMPLE_LOADER = '''
def sample_loader(raw: dict) -> dict:
    doc = raw["json"]
    return dict(
        __key__=raw["__key__"],
        images=[raw[f"{index}.jpg"] for index in range(doc["num_images"])],
        texts=doc["texts"],
        matched_text_indices=doc["matched"],
    )


def part_filter(part: str) -> bool:
    return part == "json" or part.endswith(".jpg")
'''


def make_type_dataset(root: Path, sample_type: str, *, n: int = 2) -> list[dict[str, Any]]:
    """A dataset of ``n`` samples of Energon's ``sample_type`` (any of the eight built-in types we
    map), written and prepared as its users do; returns its samples (members by extension)."""
    field_map: dict[str, str] | None = None
    loader: str | None = None
    if sample_type == "CaptioningSample":
        samples = captioning_samples(n)
        field_map = {"image": "jpg", "caption": "txt"}
    elif sample_type == "VQASample":
        samples, loader = vqa_samples(n), VQA_SAMPLE_LOADER
    elif sample_type == "VidQASample":
        samples = [{"__key__": f"vid{i:03d}", "mp4": small_mp4(i),
                    "json": {"question": f"What moves in clip {i}?", "answers": [f"colour {i}"]}} for i in range(n)]
        field_map = {"video": "mp4", "context": "json[question]", "answers": "json[answers]"}
    elif sample_type == "MultiChoiceVQASample":
        samples = [{"__key__": f"mc{i:03d}", "jpg": small_jpeg(200 + i),
                    "json": {"question": "Which pattern?", "choices": ["stripes", "gradient", "dots"], "answer": 1}}
                   for i in range(n)]
        field_map = {"image": "jpg", "context": "json[question]", "choices": "json[choices]",
                     "correct_choice_idx": "json[answer]"}
    elif sample_type == "OCRSample":
        samples = [{"__key__": f"ocr{i:03d}", "jpg": small_jpeg(300 + i), "txt": f"SIGN {i}"} for i in range(n)]
        field_map = {"image": "jpg", "text": "txt"}
    elif sample_type == "TextSample":
        samples = [{"__key__": f"txt{i:03d}", "txt": f"Plain text number {i}, for language modelling."} for i in range(n)]
        field_map = {"text": "txt"}
    elif sample_type == "InterleavedSample":
        samples = [{"__key__": f"il{i:03d}", "0.jpg": small_jpeg(400 + i), "1.jpg": small_jpeg(500 + i),
                    "json": {"sequence": ["A page:", {"image": 0}, "the first picture.", {"image": 1}, "The second."]}}
                   for i in range(n)]
        loader = INTERLEAVED_SAMPLE_LOADER
    elif sample_type == "SimilarityInterleavedSample":
        samples = [{"__key__": f"sim{i:03d}", "0.jpg": small_jpeg(600 + i), "1.jpg": small_jpeg(700 + i),
                    "json": {"num_images": 2, "texts": ["First text.", "Second text."], "matched": [1, 0]}}
                   for i in range(n)]
        loader = SIMILARITY_SAMPLE_LOADER
    else:
        raise ValueError(f"no writer for sample type {sample_type!r}")
    write_shards(root, samples)
    energon_prepare(root, sample_type=sample_type, field_map=field_map, sample_loader=loader)
    return samples


def text_as_question(sample: Any) -> dict[str, Any]:
    """A user's mapping (named in a config as ``tests.support.energon_datasets:text_as_question``)."""
    return {"conversation": [{"role": "user", "content": "Repeat after me."}, {"role": "assistant", "content": sample.text}]}


def qa_crude_samples(n: int, *, seed: int = 800) -> list[dict[str, Any]]:
    """``n`` crude samples: ``jpg`` + ``json`` holding ``{"q": ..., "a": ...}``."""
    return [{"__key__": f"crude{i:03d}", "jpg": small_jpeg(seed + i), "json": {"q": f"Shade {i}?", "a": f"Shade {i}."}}
            for i in range(n)]


def make_crude_dataset(root: Path, n: int = 4) -> list[dict[str, Any]]:
    """A ``CrudeWebdataset`` (``energon prepare --sample-type CrudeWebdataset``); returns its samples."""
    samples = qa_crude_samples(n)
    write_shards(root, samples)
    energon_prepare(root, sample_type="CrudeWebdataset")
    return samples


def cook_qa(crude: dict) -> dict[str, Any]:
    """A user's cooker for ``make_crude_dataset``: the crude sample's members -> our record form."""
    qa = crude["json"]
    return {
        "conversation": [{"role": "user", "content": "<image>" + qa["q"]}, {"role": "assistant", "content": qa["a"]}],
        "images": [crude["jpg"]],
    }


def make_aux_datasets(root: Path, n: int = 3) -> list[dict[str, Any]]:
    """A crude dataset ``root/crude`` of questions only (``json``: ``q``, ``a`` and the names of its
    two images), an auxiliary Energon dataset ``root/photos`` holding the first image of each
    (``photoNNN.jpg``) and a folder ``root/media`` holding the second (``NNN.jpg``); returns the
    crude samples, each with its two images' bytes under ``"images"``."""
    samples = []
    for i in range(n):
        photo, picture = small_jpeg(900 + i), small_jpeg(950 + i)
        samples.append({"__key__": f"q{i:03d}", "json": {"q": f"Compare {i}?", "a": f"Alike {i}.",
                                                         "photo": f"photo{i:03d}.jpg", "file": f"{i:03d}.jpg"},
                        "images": [photo, picture]})
        (root / "media").mkdir(parents=True, exist_ok=True)
        (root / "media" / f"{i:03d}.jpg").write_bytes(picture)
    write_shards(root / "crude", [{"__key__": s["__key__"], "json": s["json"]} for s in samples])
    energon_prepare(root / "crude", sample_type="CrudeWebdataset")
    write_shards(root / "photos", [{"__key__": f"photo{i:03d}", "jpg": s["images"][0]} for i, s in enumerate(samples)])
    energon_prepare(root / "photos", sample_type="CrudeWebdataset")
    return samples


def cook_with_aux(crude: dict, *, photos: Any, files: Any) -> dict[str, Any]:
    """A user's cooker for ``make_aux_datasets``: its images from the aux datasets ``photos`` (an
    Energon dataset) and ``files`` (a folder), read as Energon's cookers read them."""
    qa = crude["json"]
    return {
        "conversation": [{"role": "user", "content": "<image><image>" + qa["q"]}, {"role": "assistant", "content": qa["a"]}],
        "images": [photos.get(qa["photo"], crude), files.get(qa["file"], crude)],
    }


def cook_with_primary(crude: dict, *, primary: Any, photos: Any, files: Any) -> dict[str, Any]:
    """``cook_with_aux``, its question read again from the crude dataset's own store (``primary``:
    ``".json"`` is the current sample's member); marked ``@cooker(need_primary=True)`` below."""
    record = cook_with_aux(crude, photos=photos, files=files)
    assert json.loads(primary.get(".json", crude)) == crude["json"], "primary gave another sample's member"
    return record


def cook_with_cache(crude: dict, *, cache: Any, photos: Any, files: Any) -> dict[str, Any]:
    """A cooker asking for Energon's cache pool (``@cooker(need_cache=True)`` below): refused."""
    return cook_with_aux(crude, photos=photos, files=files)


def _mark_cookers() -> None:
    from megatron.energon.task_encoder.cooking import cooker

    globals()["cook_with_primary"] = cooker(need_primary=True)(cook_with_primary)
    globals()["cook_with_cache"] = cooker(need_cache=True)(cook_with_cache)


_mark_cookers()


def aux_metadataset(cooker: str = "tests.support.energon_datasets:cook_with_aux", path: str = "./crude") -> str:
    """A metadataset (YAML text) reading ``path`` with the aux datasets ``photos`` and ``files``."""
    import yaml

    entry = {"path": path, "subflavors": {"sample_mapping": cooker},
             "aux": {"photos": "./photos", "files": "filesystem://./media"}}
    return yaml.safe_dump({"__module__": "megatron.energon", "__class__": "MetadatasetV2",
                           "splits": {"train": {"blend_epochized": [{"repetitions": 1, **entry}]}}}, sort_keys=False)


def caption_as_question(sample: Any) -> dict[str, Any]:
    """A user's mapping of a ``CaptioningSample``: the caption answers a question."""
    return {"conversation": [{"role": "user", "content": "<image>What is shown?"},
                             {"role": "assistant", "content": sample.caption}], "images": [sample.image]}


def epochized_blend(*entries: tuple[str, dict[str, Any] | None]) -> str:
    """An Energon metadataset (YAML text) reading each ``(path, subflavors)`` once per epoch."""
    import yaml

    blend = [{"repetitions": 1, "path": path, **({"subflavors": flavors} if flavors else {})} for path, flavors in entries]
    return yaml.safe_dump({"__module__": "megatron.energon", "__class__": "MetadatasetV2",
                           "splits": {"train": {"blend_epochized": blend}}}, sort_keys=False)
