"""A Megatron-Bridge-format dataset in real Energon loaders: every sample once or counted by reason,
exact resume with 2 workers, a metadataset blending it with one of ours, and ``msc://``.

The Bridge dataset (tests/support/bridge_datasets.py, pickled layout) has 24 samples in 4 shards: good ones
(text, one image, several images, a frame-list video, both message styles), one whose pickle would
run code, one with a truncated pickle and one frame list of mixed frame sizes: 3 counted skips.
"""

from __future__ import annotations

import pickle
from collections import Counter
from pathlib import Path

import pytest

from energon_pack.loader import get_packing_loader
from tests.support.bridge_datasets import PICKLED_YAML, frame_list, pickled_samples, write_bridge_dataset
from tests.support.loader_runs import EAGER, full_run, make_config, rows_after_resume

# Slow: real Energon loaders (worker processes).
pytestmark = pytest.mark.slow

SKIPS = {"unsafe_pickle": 1, "truncated_pickle": 1, "mixed_frame_sizes": 1}


class _Touch:
    """A pickle payload that would create ``path`` when loaded by plain ``pickle.loads``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def _bridge_samples(marker: Path) -> list[dict[str, bytes]]:
    base = pickled_samples(with_video=False)
    samples = []
    for copy in range(5):
        for sample in base:
            samples.append({**sample, "__key__": f"bridge{copy}-{sample['__key__'].split('-')[1]}"})
    video = pickled_samples(with_video=True)[-1]
    samples.append({**video, "__key__": "bridgeV-video"})
    samples.append({**base[1], "__key__": "bridgeX-unsafe", "jpgs": pickle.dumps([_Touch(marker)])})
    samples.append({**base[1], "__key__": "bridgeX-truncated", "jpgs": base[1]["jpgs"][:-5]})
    mixed = frame_list(16, 2, 64, 48) + frame_list(17, 2, 48, 64)
    samples.append({**video, "__key__": "bridgeX-mixed", "videos": pickle.dumps([mixed])})
    samples.append({**base[2], "__key__": "bridgeY-last"})
    return samples


@pytest.fixture(scope="module")
def bridge_dataset(tmp_path_factory) -> tuple[Path, list[str], Path]:
    root = tmp_path_factory.mktemp("bridge_loading")
    marker = root / "pickle_ran"
    samples = _bridge_samples(marker)
    path = write_bridge_dataset(root / "bridge", samples, PICKLED_YAML, samples_per_shard=6)
    return path, sorted(sample["__key__"] for sample in samples), marker


def test_every_sample_arrives_once_or_is_counted_by_reason(bridge_dataset, processor):
    path, keys, marker = bridge_dataset
    rows, stats = full_run(path, processor, make_config(2))
    arrived = [key for row_keys, _ in rows for key in row_keys]
    assert len(arrived) == len(set(arrived))
    assert stats["skipped"] == SKIPS
    assert sorted(arrived) == sorted(set(keys) - {"bridgeX-mixed", "bridgeX-unsafe", "bridgeX-truncated"})
    assert stats["samples_in"] == len(keys)
    assert not marker.exists()


def test_restore_continues_with_identical_rows_on_a_bridge_dataset(bridge_dataset, processor):
    """Workers checkpoint after every sample (``EAGER``): the non-eager path's replay from an older
    checkpoint is tested on our format (``tests/loader/test_loader_resume.py``)."""
    path, _, _ = bridge_dataset
    config = make_config(2, buffer_size=3, seq_length=160)
    reference, _ = full_run(path, processor, config, **EAGER)
    assert len(reference) >= 3
    for save_after in (1, len(reference) - 1):
        rows = rows_after_resume(path, processor, config, save_after, **EAGER)
        assert rows == reference[save_after:], f"save after row {save_after}"


def test_a_metadataset_blends_ours_and_a_bridge_dataset(bridge_dataset, synthetic_dataset, processor, tmp_path):
    path, keys, _ = bridge_dataset
    ours = synthetic_dataset.out_dir
    blend = tmp_path / "blend.yaml"
    blend.write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend_epochized:\n"
        f"      - repetitions: 1\n        path: {ours}\n        subflavors: {{source: ours}}\n"
        f"      - repetitions: 1\n        path: {path}\n        subflavors: {{source: bridge}}\n",
        encoding="utf-8",
    )
    loader = get_packing_loader(blend, make_config(2), processor)
    sources: Counter[str] = Counter()
    for row in loader:
        flavors = [f["source"] for f in row["__subflavors__"]]
        assert flavors == ["bridge" if key.startswith("bridge") else "ours" for key in row["__keys__"]]
        sources.update(flavors)
    stats = loader.stats()
    assert sources["bridge"] == len(keys) - sum(SKIPS.values())
    assert sources["ours"] + stats["skipped_total"] - sum(SKIPS.values()) == synthetic_dataset.written
    assert all(stats["skipped"].get(reason, 0) >= count for reason, count in SKIPS.items())


def test_the_readme_lines_read_a_bridge_dataset_in_place(bridge_dataset, processor):
    import re

    from tests.support.paths import README

    text = README.read_text(encoding="utf-8")
    block = re.search(r"```python\n(with get_packing_loader\(\"path/to/bridge_dataset\".*?)```", text, flags=re.DOTALL).group(1)
    assert len(block.strip().splitlines()) == 3
    path, keys, _ = bridge_dataset
    namespace = {"get_packing_loader": get_packing_loader, "config": make_config(0), "processor": processor}
    exec(compile(block.replace('"path/to/bridge_dataset"', repr(str(path))), "README.md", "exec"), namespace)  # noqa: S102
    assert sum(len(row["__keys__"]) for row in namespace["rows"]) == len(keys) - sum(SKIPS.values())
