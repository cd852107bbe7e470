"""Energon metadatasets (v2) of energon_pack datasets load through ``get_packing_loader`` unchanged.

Two small synthetic datasets with distinct key prefixes sit next to a copy of
``configs/blend_metadataset.yaml`` (whose relative paths resolve against the yaml's folder):
``image_chat`` (16 samples, weight 2) and ``video_chat`` (24 samples, weight 1). The sizes run
against the weights, so a blend that sampled by dataset size (40% image_chat) instead of by
weight (67%) fails the ratio check.
"""

from __future__ import annotations

import itertools
import json
import math
import shutil
from collections import Counter
from pathlib import Path

import pytest
import yaml

from energon_pack import PackingConfig, get_packing_loader
from energon_pack.data.prepare import DATASET_YAML, prepare_dataset
from energon_pack.data.synthetic import SyntheticSpec, make_records
from tests.support.paths import CONFIGS

# Slow: real Energon loaders with worker processes.
pytestmark = pytest.mark.slow

SPEC = SyntheticSpec(max_image_side=256, max_video_seconds=2.0, max_video_side=64)
#: name -> (samples, record seed, blend weight); names match configs/blend_metadataset.yaml.
DATASETS = {"image_chat": (16, 11, 2), "video_chat": (24, 12, 1)}
EPOCHIZED_YAML = """\
__module__: megatron.energon
__class__: MetadatasetV2
splits:
  train:
    blend_epochized:
      - repetitions: 2
        path: ./image_chat
        subflavors: {source: image_chat}
      - repetitions: 1
        path: ./video_chat
        subflavors: {source: video_chat}
"""
REPETITIONS = {"image_chat": 2, "video_chat": 1}


def _make_dataset(root: Path, name: str, num_samples: int, seed: int) -> set[str]:
    """Prepare ``num_samples`` synthetic records as dataset ``root/name``, keys ``<name>-<id>``."""
    raw = root / f"{name}_raw"
    records_path = make_records(raw, num_samples, seed=seed, spec=SPEC)
    records = [json.loads(line) for line in records_path.read_text(encoding="utf-8").splitlines()]
    for record in records:
        record["id"] = f"{name}-{record['id']}"
    records_path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    report = prepare_dataset(records_path, raw, root / name, samples_per_shard=8, progress=False)
    assert report.written == num_samples, report.problems
    return {record["id"] for record in records}


@pytest.fixture(scope="module")
def blend_root(tmp_path_factory) -> tuple[Path, dict[str, set[str]]]:
    """Folder with both datasets, the example blend yaml and the epochized yaml; keys per dataset."""
    root = tmp_path_factory.mktemp("metadataset")
    keys = {name: _make_dataset(root, name, n, seed) for name, (n, seed, _) in DATASETS.items()}
    shutil.copy(CONFIGS / "blend_metadataset.yaml", root / "blend_metadataset.yaml")
    (root / "epochized.yaml").write_text(EPOCHIZED_YAML, encoding="utf-8")
    return root, keys


def _source(key: str) -> str:
    return key.split("-", 1)[0]


def test_dataset_yaml_example_names_the_class_prepare_writes(blend_root):
    root, _ = blend_root
    example = yaml.safe_load((CONFIGS / "dataset.yaml.example").read_text(encoding="utf-8"))
    assert example == {
        "__module__": "energon_pack", "__class__": "QwenVLChatWebdataset",
        "sample_type": {"__module__": "energon_pack.core.samples", "__class__": "QwenVLChatSample"},
    }
    assert example == yaml.safe_load(DATASET_YAML)
    assert example == yaml.safe_load((root / "image_chat" / ".nv-meta" / "dataset.yaml").read_text(encoding="utf-8"))


def test_blend_yaml_resolves_paths_next_to_itself_with_weights_and_subflavors(blend_root):
    from megatron.energon import WorkerConfig
    from megatron.energon.metadataset import load_dataset
    from megatron.energon.metadataset.loader_interface import DatasetBlendMode

    root, keys = blend_root
    loaded = load_dataset(root / "blend_metadataset.yaml").get_datasets(
        training=True, split_part="train", worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0)
    )
    assert loaded.blend_mode == DatasetBlendMode.DATASET_WEIGHT
    total_weight = sum(weight for _, _, weight in DATASETS.values())
    found = {}
    for entry in loaded.datasets:
        path = str(entry.dataset.path)
        found[Path(path).name] = (path, entry.weight, entry.dataset.subflavors, len(entry.dataset))
    assert found == {
        name: (str(root / name), pytest.approx(weight / total_weight), {"source": name}, len(keys[name]))
        for name, (_, _, weight) in DATASETS.items()
    }


def test_weighted_blend_packs_rows_from_both_datasets_in_weight_ratio(blend_root, processor):
    root, keys = blend_root
    config = PackingConfig(seq_length=4096, buffer_size=8, num_workers=2, repeat=True)
    loader = get_packing_loader(root / "blend_metadataset.yaml", config, processor)
    names = [source.name for source in loader.sources()]  # metadataset order, named by subflavor `source`
    assert names == list(DATASETS) and [s.weight for s in loader.sources()] == [pytest.approx(2 / 3), pytest.approx(1 / 3)]
    counts: Counter[str] = Counter()
    for rows, row in enumerate(loader, start=1):
        assert set(row["__keys__"]) <= keys["image_chat"] | keys["video_chat"]
        sources = [_source(key) for key in row["__keys__"]]
        assert [flavors["source"] for flavors in row["__subflavors__"]] == sources  # subflavors reach the row
        assert [names[index] for index in row["segment_source"].tolist()] == sources
        counts.update(sources)
        if rows == 20:
            break
    drawn = sum(counts.values())
    assert counts["image_chat"] > 0 and counts["video_chat"] > 0
    # Each draw picks image_chat with probability 2/3: allow 4 standard errors.
    share, expected = counts["image_chat"] / drawn, 2 / 3
    assert abs(share - expected) < 4 * math.sqrt(expected * (1 - expected) / drawn), counts


def test_weighted_blend_refuses_a_single_epoch(blend_root, processor):
    root, _ = blend_root
    config = PackingConfig(seq_length=4096, buffer_size=8, num_workers=2, repeat=False)
    with pytest.raises(ValueError, match="blend_epochized"):
        get_packing_loader(root / "blend_metadataset.yaml", config, processor)


def test_epochized_blend_epoch_yields_each_sample_its_repetitions_minus_skips(blend_root, processor):
    root, keys = blend_root
    config = PackingConfig(seq_length=4096, buffer_size=8, num_workers=2, repeat=False)
    loader = get_packing_loader(root / "epochized.yaml", config, processor)
    counts = Counter(key for row in loader for key in row["__keys__"])
    expected = Counter({key: REPETITIONS[name] for name, names in keys.items() for key in names})
    assert set(counts) <= set(expected)
    assert all(counts[key] <= expected[key] for key in counts), counts - expected
    stats = loader.stats()
    assert stats["samples_in"] == sum(expected.values())
    assert sum((expected - counts).values()) == stats["skipped_total"]


def test_in_batch_rows_of_a_blend_name_each_segments_source(blend_root, processor):
    root, _ = blend_root
    config = PackingConfig(seq_length=8192, num_workers=0, repeat=True, mode="in_batch", micro_batch_size=4,
                           fixed_width=False, width_multiple=64)
    with get_packing_loader(root / "blend_metadataset.yaml", config, processor) as loader:
        names = [source.name for source in loader.sources()]
        for row in itertools.islice(loader, 3):
            assert [names[index] for index in row["segment_source"].tolist()] == [_source(key) for key in row["__keys__"]]
