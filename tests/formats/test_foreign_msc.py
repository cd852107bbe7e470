"""A Megatron-Bridge-format dataset on object storage (``msc://``): the dispatch reads its
dataset.yaml through Energon's EPath; rows equal those of the local copy, and ``plan`` / ``inspect``
read it in place (plan's facts kept beside the plan, reused by the next plan)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.msc_server import SKIP, loaded_row_digests, s3, small_config, upload_dataset  # noqa: F401  (s3: the moto fixture)

pytest.importorskip("moto.server", reason=SKIP)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def remote_bridge(s3, tmp_path_factory) -> tuple[str, Path]:  # noqa: F811
    from tests.support.bridge_datasets import PICKLED_YAML, pickled_samples, write_bridge_dataset

    local = write_bridge_dataset(tmp_path_factory.mktemp("msc_bridge") / "bridge", pickled_samples(), PICKLED_YAML)
    return upload_dataset(s3, local, "bridge"), local


def test_bridge_rows_through_msc_equal_the_local_copy(remote_bridge, processor):
    remote, local = remote_bridge
    rows = loaded_row_digests(remote, small_config(), processor)
    assert rows and rows == loaded_row_digests(local, small_config(), processor)


def test_plan_and_inspect_read_a_remote_bridge_dataset_in_place(remote_bridge, tmp_path, capsys):
    from energon_pack.cli import main
    from energon_pack.plan.file import open_plan

    remote, local = remote_bridge
    (tmp_path / "packing.yaml").write_text(small_config().to_yaml())
    for name, expected in (("a.plan", "facts kept at"), ("b.plan", "measured from kept facts")):
        assert main(["plan", remote, "--config", str(tmp_path / "packing.yaml"), "--out", str(tmp_path / name)]) == 0
        assert expected in capsys.readouterr().out
    assert (tmp_path / "bridge.train.facts.npz").is_file()
    assert open_plan(tmp_path / "a.plan").digest == open_plan(tmp_path / "b.plan").digest
    assert main(["inspect", remote]) == 0
    remote_lines = capsys.readouterr().out.splitlines()
    assert main(["inspect", str(local)]) == 0
    assert remote_lines[0] == "format: megatron-bridge-chatml" and remote_lines == capsys.readouterr().out.splitlines()
