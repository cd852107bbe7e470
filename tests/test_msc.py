"""A prepared dataset on object storage (``msc://profile/path``): loading, planning, inspecting and
simulating through it give exactly the local copy's rows and figures.

The S3 server is moto's, started by this module on 127.0.0.1 (an ephemeral port); the MSC config
naming it is written to a temporary file and passed as ``MSC_CONFIG``. Needs the ``test`` extra's
``moto[server]`` and ``boto3``; skipped without them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

SKIP = "the object-storage test needs moto[server] and boto3: pip install -e '.[test]' -c constraints/py311.txt"
moto_server = pytest.importorskip("moto.server", reason=SKIP)
boto3 = pytest.importorskip("boto3", reason=SKIP)

pytestmark = pytest.mark.slow

BUCKET, PROFILE, PREFIX = "data", "s3local", "ds"
REMOTE = f"msc://{PROFILE}/{PREFIX}"


def _client(endpoint: str):
    return boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="test", aws_secret_access_key="test"
    )


def _forget_msc_clients() -> None:
    """Drop MSC's per-process clients: another module's server may have served profile ``s3local``
    at another port (MSC caches a client per profile name for the process's life)."""
    from multistorageclient import shortcuts

    shortcuts._STORAGE_CLIENT_CACHE.clear()
    shortcuts._PATH_MAPPING_CACHE.clear()


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A boto3 client of a moto S3 server holding bucket ``data``, with ``MSC_CONFIG`` naming it
    as profile ``s3local`` set for the module."""
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    client = _client(endpoint)
    client.create_bucket(Bucket=BUCKET)
    config = tmp_path_factory.mktemp("msc") / "msc.json"
    config.write_text(json.dumps({"profiles": {PROFILE: {
        "storage_provider": {
            "type": "s3", "options": {"base_path": BUCKET, "endpoint_url": endpoint, "region_name": "us-east-1"},
        },
        "credentials_provider": {"type": "S3Credentials", "options": {"access_key": "test", "secret_key": "test"}},
    }}}))
    before = os.environ.get("MSC_CONFIG")
    os.environ["MSC_CONFIG"] = str(config)
    _forget_msc_clients()
    try:
        yield client
    finally:
        _forget_msc_clients()
        if before is None:
            os.environ.pop("MSC_CONFIG", None)
        else:
            os.environ["MSC_CONFIG"] = before
        server.stop()


def _upload(client, local: Path, prefix: str) -> str:
    """Upload the dataset folder ``local`` under ``prefix``; returns its ``msc://`` URL."""
    for file in sorted(local.rglob("*")):
        if file.is_file():
            client.upload_file(str(file), BUCKET, f"{prefix}/{file.relative_to(local).as_posix()}")
    return f"msc://{PROFILE}/{prefix}"


@pytest.fixture(scope="module")
def remote_dataset(s3, synthetic_dataset):
    """``(remote URL, local folder)``: the synthetic dataset uploaded to the moto S3 bucket."""
    local = Path(synthetic_dataset.out_dir)
    return _upload(s3, local, PREFIX), local


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
    return _upload(s3, root / "ds", "facts"), root / "ds"


def _rows(dataset, config, processor, **kwargs) -> list[str]:
    from energon_pack import get_packing_loader
    from tests.row_digests import digest

    with get_packing_loader(dataset, config, processor, split="train", **kwargs) as loader:
        return [digest(row) for row in loader]


def _config():
    from energon_pack import PackingConfig

    return PackingConfig(seq_length=2048, buffer_size=6, num_workers=0, repeat=False)


def test_online_rows_through_msc_equal_the_local_copy(remote_dataset, processor):
    remote, local = remote_dataset
    assert _rows(remote, _config(), processor) == _rows(local, _config(), processor)


def test_plan_built_and_read_through_msc_equals_the_local_one(remote_dataset, processor, tmp_path, capsys):
    from energon_pack.cli import main
    from energon_pack.plan.build import build_plan
    from energon_pack.plan.file import open_plan

    remote, local = remote_dataset
    local_plan = build_plan(local, _config(), processor, num_workers=0, progress=False)
    assert build_plan(remote, _config(), processor, num_workers=0, progress=False).digest == local_plan.digest
    (tmp_path / "packing.yaml").write_text(_config().to_yaml())
    assert main(["plan", remote, "--config", str(tmp_path / "packing.yaml"), "--workers", "0", "--out", str(tmp_path / "p.plan")]) == 0
    capsys.readouterr()
    assert open_plan(tmp_path / "p.plan").digest == local_plan.digest
    assert _rows(remote, _config(), processor, plan=tmp_path / "p.plan") == _rows(local, _config(), processor, plan=local_plan)


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
        get_packing_loader(f"msc://{PROFILE}/nope", _config(), None)


def test_plan_from_remote_facts_equals_the_local_measured_plan(remote_facts_dataset, processor, tmp_path, capsys):
    from energon_pack.cli import main
    from energon_pack.plan.build import build_plan
    from energon_pack.plan.file import open_plan

    remote, local = remote_facts_dataset
    measured = build_plan(local, _config(), processor, num_workers=0, progress=False)
    (tmp_path / "packing.yaml").write_text(_config().to_yaml())
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
