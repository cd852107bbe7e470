"""A prepared dataset on object storage (``msc://profile/path``): loading, planning, inspecting and
simulating through it give exactly the local copy's rows and figures.

The S3 server is moto's, started by this module on 127.0.0.1 (an ephemeral port); the MSC config
naming it is written to a temporary file and passed as ``MSC_CONFIG``. Needs the ``test`` extra's
``moto[server]`` and ``boto3``; skipped without them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.msc_server import PREFIX, PROFILE, loaded_row_digests, s3, small_config, upload_dataset  # noqa: F401  (s3: the moto fixture)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def remote_dataset(s3, synthetic_dataset):
    """``(remote URL, local folder)``: the synthetic dataset uploaded to the moto S3 bucket."""
    local = Path(synthetic_dataset.out_dir)
    return upload_dataset(s3, local, PREFIX), local


@pytest.fixture(scope="module")
def remote_facts_dataset(s3, tmp_path_factory, processor):
    """``(remote URL, local folder)``: 24 synthetic samples prepared with the offline processor's
    text tokens (facts sidecar), uploaded to the moto S3 bucket."""
    from energon_pack.data.prepare import prepare_dataset
    from energon_pack.data.synthetic import SyntheticSpec, make_records

    root = tmp_path_factory.mktemp("msc_facts")
    spec = SyntheticSpec(max_image_side=320, max_video_seconds=2.0, max_video_side=96)
    records = make_records(root / "raw", 24, seed=9, spec=spec)
    prepare_dataset(records, root / "raw", root / "ds", samples_per_shard=8, progress=False, processor=processor)
    return upload_dataset(s3, root / "ds", "facts"), root / "ds"


def test_online_rows_through_msc_equal_the_local_copy(remote_dataset, processor):
    remote, local = remote_dataset
    assert loaded_row_digests(remote, small_config(), processor) == loaded_row_digests(local, small_config(), processor)


def test_plan_built_and_read_through_msc_equals_the_local_one(remote_dataset, processor, tmp_path, capsys):
    from energon_pack.cli import main
    from energon_pack.plan.build import build_plan
    from energon_pack.plan.file import open_plan

    remote, local = remote_dataset
    local_plan = build_plan(local, small_config(), processor, num_workers=0, progress=False)
    assert build_plan(remote, small_config(), processor, num_workers=0, progress=False).digest == local_plan.digest
    (tmp_path / "packing.yaml").write_text(small_config().to_yaml())
    assert main(["plan", remote, "--config", str(tmp_path / "packing.yaml"), "--workers", "0", "--out", str(tmp_path / "p.plan")]) == 0
    capsys.readouterr()
    assert open_plan(tmp_path / "p.plan").digest == local_plan.digest
    assert loaded_row_digests(remote, small_config(), processor, plan=tmp_path / "p.plan") == loaded_row_digests(local, small_config(), processor, plan=local_plan)


@pytest.mark.parametrize("command", [["inspect", "{}"], ["simulate", "--dataset", "{}", "--samples", "40", "--widths", "2048"]])
def test_inspect_and_simulate_through_msc_print_the_local_figures(remote_dataset, capsys, command):
    from energon_pack.cli import main

    remote, local = remote_dataset
    outputs = []
    for dataset in (remote, str(local)):
        assert main([part.format(dataset) for part in command]) == 0
        text = capsys.readouterr().out.replace(dataset, "DATASET")
        # the line saying how samples were measured differs: these facts hold no text tokens, and
        # with a processor card filed the local copy may read them without the processor
        outputs.append("\n".join(line for line in text.splitlines() if "measured " not in line))
    assert outputs[0] == outputs[1] and outputs[0].strip()


def test_a_missing_msc_path_is_a_usage_error(remote_dataset):
    from energon_pack import get_packing_loader
    from energon_pack.errors import UsageError

    with pytest.raises(UsageError, match=rf"msc://{PROFILE}/nope.*does not exist"):
        get_packing_loader(f"msc://{PROFILE}/nope", small_config(), None)


def test_plan_from_remote_facts_equals_the_local_measured_plan(remote_facts_dataset, processor, tmp_path, capsys):
    from energon_pack.cli import main
    from energon_pack.plan.build import build_plan
    from energon_pack.plan.file import open_plan

    remote, local = remote_facts_dataset
    measured = build_plan(local, small_config(), processor, num_workers=0, progress=False)
    (tmp_path / "packing.yaml").write_text(small_config().to_yaml())
    assert main(["plan", remote, "--config", str(tmp_path / "packing.yaml"), "--out", str(tmp_path / "p.plan")]) == 0
    assert "measured from facts (.nv-meta/energon_pack.facts.npz, fresh" in capsys.readouterr().out
    assert open_plan(tmp_path / "p.plan").digest == measured.digest


def test_inspect_reads_remote_facts(remote_facts_dataset, capsys):
    from energon_pack.cli import main

    remote, local = remote_facts_dataset
    outputs = []
    for dataset in (remote, str(local)):
        assert main(["inspect", dataset]) == 0
        outputs.append(capsys.readouterr().out.splitlines())
    assert outputs[0][-1].startswith("measured from facts (.nv-meta/energon_pack.facts.npz, fresh"), outputs[0][-1]
    assert outputs[0][:-1] == outputs[1][:-1] and outputs[0][:-1]
