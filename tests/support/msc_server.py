"""A moto S3 server for the ``msc://`` tests: its client, the MSC profile naming it, uploads, and
rows read through it. Needs the ``test`` extra's ``moto[server]`` and ``boto3`` (importing this
module skips the importing test module without them)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

SKIP = "the object-storage test needs moto[server] and boto3: pip install -e '.[test]' -c constraints/py311.txt"
moto_server = pytest.importorskip("moto.server", reason=SKIP)
boto3 = pytest.importorskip("boto3", reason=SKIP)

BUCKET, PROFILE, PREFIX = "data", "s3local", "ds"
REMOTE = f"msc://{PROFILE}/{PREFIX}"


def s3_client(endpoint: str):
    return boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="test", aws_secret_access_key="test"
    )


def forget_msc_clients() -> None:
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
    client = s3_client(endpoint)
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
    forget_msc_clients()
    try:
        yield client
    finally:
        forget_msc_clients()
        if before is None:
            os.environ.pop("MSC_CONFIG", None)
        else:
            os.environ["MSC_CONFIG"] = before
        server.stop()


def upload_dataset(client, local: Path, prefix: str) -> str:
    """Upload the dataset folder ``local`` under ``prefix``; returns its ``msc://`` URL."""
    for file in sorted(local.rglob("*")):
        if file.is_file():
            client.upload_file(str(file), BUCKET, f"{prefix}/{file.relative_to(local).as_posix()}")
    return f"msc://{PROFILE}/{prefix}"


def loaded_row_digests(dataset, config, processor, **kwargs) -> list[str]:
    from energon_pack import get_packing_loader
    from tests.support.row_digests import digest

    with get_packing_loader(dataset, config, processor, split="train", **kwargs) as loader:
        return [digest(row) for row in loader]


def small_config():
    from energon_pack import PackingConfig

    return PackingConfig(seq_length=2048, buffer_size=6, num_workers=0, repeat=False)
