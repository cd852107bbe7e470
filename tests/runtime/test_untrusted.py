"""Untrusted shards and media paths: shard content is never unpickled; prepare keeps media under --media-root.

* Energon's default sample decoder unpickles ``.pyd``/``.pickle`` members (the canary test shows
  the payload would run); our task encoder sets no decoder and our dataset reads only the
  ``.json`` conversation and media parts, as bytes. A shard whose ``.json`` is a pickle, or whose
  conversation is a ``.pyd`` pickle, yields bad samples, counted; a ``.pyd`` beside a good
  ``.json`` is never read. The payload never runs.
* ``prepare`` rejects media paths that leave ``--media-root``: absolute, ``..``, and symlinks
  pointing out (a symlink that stays inside is fine).
"""

from __future__ import annotations

import json
import pickle
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from megatron.energon.flavors.webdataset.sample_decoder import SampleDecoder

from energon_pack.config import PackingConfig
from energon_pack.loader import get_packing_loader
from energon_pack.data.prepare import prepare_dataset
from energon_pack.data.synthetic import encode_image
from energon_pack.runtime.task_encoder import QwenVLPackingTaskEncoder
from tests.support.bad_corpus import DIRECT_SHARD, PickleExploit, raw_sample, untrusted_kinds, write_direct_shard


def test_the_payload_runs_when_unpickled_by_energons_default_decoder(tmp_path):
    """Canary: the malicious member is live, so the tests below would see it run."""
    marker = tmp_path / "ran"
    SampleDecoder()({"__key__": "x", "pyd": pickle.dumps(PickleExploit(marker))})
    assert marker.exists()
    assert QwenVLPackingTaskEncoder.decoder is None


def test_pickled_shard_members_are_bad_samples_and_never_run(tmp_path, processor):
    marker = tmp_path / "pickle-was-executed"
    rng = np.random.default_rng(0)
    expected_skips, expected_keys, samples = Counter(), Counter(), []
    for kind in untrusted_kinds(marker):
        samples.append(raw_sample(kind.name, kind.build(rng, 4096)))
        if kind.load_reason is None:
            expected_keys[kind.name] += 1
        else:
            expected_skips[kind.load_reason] += 1
    dataset = write_direct_shard(tmp_path / "dataset", DIRECT_SHARD, samples)
    loader = get_packing_loader(dataset, PackingConfig(seq_length=4096, num_workers=0, repeat=False), processor)
    delivered = Counter(key for row in loader for key in row["__keys__"])
    assert delivered == expected_keys
    assert Counter(loader.stats()["skipped"]) == expected_skips
    assert not marker.exists()


@pytest.fixture()
def media_tree(tmp_path: Path) -> Path:
    """``root/media`` with ``a.jpg`` and an inside symlink; ``root/outside.jpg`` and a symlink pointing to it."""
    media = tmp_path / "media"
    (media / "sub").mkdir(parents=True)
    image = encode_image(np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8), "JPEG", "RGB")
    (media / "a.jpg").write_bytes(image)
    (tmp_path / "outside.jpg").write_bytes(image)
    (media / "sub" / "inside_link.jpg").symlink_to(media / "a.jpg")
    (media / "out_link.jpg").symlink_to(tmp_path / "outside.jpg")
    (media / "sub" / "dir_link").symlink_to(tmp_path, target_is_directory=True)
    return tmp_path


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("a.jpg", None),
        ("sub/inside_link.jpg", None),
        ("sub/../a.jpg", None),
        ("../outside.jpg", "path_escape"),
        ("sub/../../outside.jpg", "path_escape"),
        ("ABSOLUTE_OUTSIDE", "path_escape"),
        ("out_link.jpg", "path_escape"),
        ("sub/dir_link/outside.jpg", "path_escape"),
    ],
)
def test_prepare_keeps_media_paths_under_the_media_root(media_tree: Path, path: str, reason: str | None):
    path = str(media_tree / "outside.jpg") if path == "ABSOLUTE_OUTSIDE" else path
    chat = [{"role": "user", "content": "<image>What?"}, {"role": "assistant", "content": "A gradient."}]
    records = [{"id": "probe", "messages": chat, "images": [path]},
               {"id": "text", "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]}]
    (media_tree / "r.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    report = prepare_dataset(media_tree / "r.jsonl", media_tree / "media", media_tree / "out", progress=False)
    assert [p.reason for p in report.problems] == ([] if reason is None else [reason])
    assert report.written == (2 if reason is None else 1)
