"""Megatron-Bridge-format datasets written the way Bridge's writers write them, without Bridge.

Two layouts (Bridge 0.6.2's tutorials/examples):
- ``tutorial`` (tutorials/data/energon/prepare_example_data.py): members ``image.png`` and
  ``conversation.json``, typed ``role``/``content`` turns; field_map ``imgs: image.png``,
  ``conversation: conversation.json``;
- ``pickled`` (examples/.../prepare_mantis_energon.py, convert_to_qwenvl_wds.py): members ``jpgs``
  (a pickled list of encoded images), ``videos`` (a pickled list of videos, each a list of encoded
  frames) and ``json`` (``from``/``value`` turns with ``<image>`` / ``<video>`` placeholders); text-only
  samples carry empty pickled lists.
- ``audio`` (Bridge's ``ChatMLSample.audio``, decoded by its ``audiohandler``): members ``jpgs``,
  ``audio`` (one audio file, any container) and ``json`` (`audio_samples`, each with its record in
  our own format for the golden against our record path).

Shards are indexed with Energon's own prepare API, then ``.nv-meta/dataset.yaml`` names Bridge's class.
"""

from __future__ import annotations

import io
import json
import pickle
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

BRIDGE_MODULE = "megatron.bridge.data.energon.task_encoder_utils"
TUTORIAL_YAML = f"""\
__module__: {BRIDGE_MODULE}
__class__: ChatMLWebdataset
field_map:
  imgs: image.png
  conversation: conversation.json
subflavors: {{}}
"""
PICKLED_YAML = f"""\
__module__: {BRIDGE_MODULE}
__class__: ChatMLWebdataset
field_map:
  imgs: jpgs
  videos: videos
  conversation: json
subflavors: {{}}
"""


def encoded_image(seed: int, width: int, height: int, fmt: str = "JPEG") -> bytes:
    """A small noisy RGB image, encoded (JPEG or PNG)."""
    pixels = np.random.default_rng(seed).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buffer.getvalue()


def frame_list(seed: int, num_frames: int, width: int, height: int) -> list[bytes]:
    """A video as a list of JPEG frames of one size."""
    return [encoded_image(seed * 100 + index, width, height) for index in range(num_frames)]


def tutorial_samples() -> list[dict[str, bytes]]:
    """Members of tutorial-layout samples: one PNG each, typed role/content turns."""
    samples = []
    for index, (width, height) in enumerate([(64, 48), (96, 64), (56, 80), (72, 72)]):
        conversation = [
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": f"What is in picture {index}?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": f"Noise number {index}."}]},
        ]
        samples.append({
            "__key__": f"tutorial-{index:06d}",
            "image.png": encoded_image(index, width, height, "PNG"),
            "conversation.json": json.dumps(conversation).encode(),
        })
    return samples


def pickled_samples(*, with_video: bool = True) -> list[dict[str, bytes]]:
    """Members of pickled-layout samples: text only, one image, several images, a frame-list video,
    in ``from``/``value`` and ``role``/``content`` turns."""
    records: list[tuple[list[dict[str, Any]], list[bytes], list[list[bytes]]]] = [
        ([{"from": "human", "value": "Say hello."}, {"from": "gpt", "value": "Hello!"}], [], []),
        ([{"from": "human", "value": "<image>\nWhat colour dominates?"}, {"from": "gpt", "value": "Grey noise."}],
         [encoded_image(11, 64, 48)], []),
        ([{"role": "user", "content": "Compare <image> and <image>."}, {"role": "assistant", "content": "Both noisy."}],
         [encoded_image(12, 48, 64), encoded_image(13, 80, 56)], []),
        ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "<image>Describe."},
          {"role": "assistant", "content": "Noise."}, {"role": "user", "content": "And now?"},
          {"role": "assistant", "content": "Still noise."}], [encoded_image(14, 40, 40)], []),
    ]
    if with_video:
        records.append((
            [{"from": "human", "value": "<video>\nWhat happens?"}, {"from": "gpt", "value": "Frames flicker."}],
            [], [frame_list(15, 4, 64, 48)],
        ))
    samples = []
    for index, (conversation, images, videos) in enumerate(records):
        samples.append({
            "__key__": f"bridge-{index:06d}",
            "jpgs": pickle.dumps(images),
            "videos": pickle.dumps(videos),
            "json": json.dumps(conversation).encode(),
        })
    return samples


def write_bridge_dataset(root: Path, samples: list[dict[str, bytes]], dataset_yaml: str, *, samples_per_shard: int = 4) -> Path:
    """Write ``samples`` as tar shards under ``root``, index them with Energon, name Bridge's class."""
    from megatron.energon.flavors.webdataset import BaseWebdatasetFactory

    root.mkdir(parents=True, exist_ok=True)
    shards = []
    for start in range(0, len(samples), samples_per_shard):
        name = f"train-shard-{start // samples_per_shard:06d}.tar"
        with tarfile.open(root / name, "w") as archive:
            for sample in samples[start : start + samples_per_shard]:
                for member, payload in sample.items():
                    if member in ("__key__", "record", "media"):  # our record form of the sample (audio_samples), not a member
                        continue
                    info = tarfile.TarInfo(name=f"{sample['__key__']}.{member}")
                    info.size = len(payload)
                    archive.addfile(info, io.BytesIO(payload))
        shards.append(name)
    BaseWebdatasetFactory.prepare_dataset(root, shards, split_parts_ratio=[("train", 1.0)], workers=1, shuffle_seed=None)
    (root / ".nv-meta" / "dataset.yaml").write_text(dataset_yaml, encoding="utf-8")
    return root


AUDIO_YAML = f"""\
__module__: {BRIDGE_MODULE}
__class__: ChatMLWebdataset
field_map:
  imgs: jpgs
  audio: audio
  conversation: json
subflavors: {{}}
"""


def audio_samples() -> list[dict[str, Any]]:
    """Bridge samples with sound (field_map ``audio: audio``: one audio file per sample, any
    container Bridge's soundfile reads), each with the record our own format holds for it
    (``record``: id, typed messages in Bridge's part order, and the media by file name).

    An ``<audio>`` placeholder in a ``from``/``value`` string (WAV, 16 kHz), a typed audio part after
    the text (FLAC, 44.1 kHz stereo: Bridge keeps a typed audio part where it is), an image and an
    audio (MP3, 22.05 kHz: media before the text), and a text-only sample with an empty audio member.
    """
    from tests.support.audio_media import encode_audio, tone

    wav = encode_audio(tone(1.2, 16000, seed=1), 16000, "wav_s16")
    flac = encode_audio(tone(0.9, 44100, 2, seed=2), 44100, "flac")
    mp3 = encode_audio(tone(1.6, 22050, seed=3), 22050, "mp3")
    image = encoded_image(21, 56, 84)
    user, assistant = "user", "assistant"

    def text(value: str) -> dict[str, str]:
        return {"type": "text", "text": value}

    rows: list[tuple[str, list[dict[str, Any]], list[bytes], bytes, list[dict[str, Any]]]] = [
        ("speech-0", [{"from": "human", "value": "<audio>\nWhat is said?"}, {"from": "gpt", "value": "A tone."}], [], wav,
         [{"role": user, "content": [{"type": "audio"}, text("\nWhat is said?")]}, {"role": assistant, "content": [text("A tone.")]}]),
        ("speech-1", [{"role": user, "content": [text("Listen:"), {"type": "audio"}]}, {"role": assistant, "content": "Two notes."}], [], flac,
         [{"role": user, "content": [text("Listen:"), {"type": "audio"}]}, {"role": assistant, "content": [text("Two notes.")]}]),
        ("speech-2", [{"role": user, "content": "Does <image> match <audio>?"}, {"role": assistant, "content": "No."}], [image], mp3,
         [{"role": user, "content": [{"type": "image"}, {"type": "audio"}, text("Does match?")]},
          {"role": assistant, "content": [text("No.")]}]),
        ("speech-3", [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello."}], [], b"",
         [{"role": user, "content": [text("Hi")]}, {"role": assistant, "content": [text("Hello.")]}]),
    ]
    samples = []
    for key, conversation, images, audio, messages in rows:
        extension = {wav: "wav", flac: "flac", mp3: "mp3"}.get(audio)
        record = {"id": key, "messages": messages, "images": [f"{key}.jpg"] if images else [],
                  "audios": [f"{key}.{extension}"] if audio else []}
        samples.append({
            "__key__": key, "jpgs": pickle.dumps(images), "audio": audio, "json": json.dumps(conversation).encode(),
            "record": record, "media": {**({f"{key}.jpg": images[0]} if images else {}), **({f"{key}.{extension}": audio} if audio else {})},
        })
    return samples
