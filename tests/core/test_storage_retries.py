"""Transient storage errors are retried with bounded exponential backoff, corrupt data never is.

Unit cases drive ``with_retries`` with a fake read; the end-to-end cases read a dataset from a
local moto S3 server through ``msc://`` with every 5th opening of a shard object failing as MSC
fails on a connection reset (``flaky_reads``): an epoch of the online loader (0 and 2 workers)
and of the plan loader gives the rows of a clean run, and the statistics count every retry.
"""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from energon_pack.core import storage_retries
from energon_pack.core.storage_retries import StorageReadError, is_transient, take_storage_retries, with_retries


class _ConnectionClosedError(Exception):
    """Stands in for botocore's class of that name (matched by name, as MSC wraps it)."""


_ConnectionClosedError.__name__ = "ConnectionClosedError"


def _wrapped(cause: BaseException) -> RuntimeError:
    """An error as MSC raises it for a dropped connection: a RuntimeError caused by botocore's."""
    try:
        raise RuntimeError("Failed to GET object(s) at data/ds/shards/x.tar") from cause
    except RuntimeError as error:
        return error


@pytest.mark.parametrize(("error", "transient"), [
    (ConnectionResetError("reset by peer"), True),
    (TimeoutError("read timed out"), True),
    (_wrapped(_ConnectionClosedError("closed")), True),
    (ValueError("Unexpected end of tar file: shards/x.tar"), False),
    (_wrapped(PermissionError("403")), False),
    (FileNotFoundError("no such object"), False),
])
def test_transient_errors_are_told_from_the_others(error, transient):
    assert is_transient(error) is transient


@pytest.fixture
def policy(monkeypatch):
    """No waiting in unit tests; 3 retries; the retry count starts at 0."""
    monkeypatch.setattr(storage_retries, "_POLICY", storage_retries._Policy(max_retries=3, delay=0.0))
    take_storage_retries()


def _flaky(failures: list[BaseException]):
    calls = []

    def read():
        calls.append(1)
        if failures:
            raise failures.pop(0)
        return "sample"

    return read, calls


def test_a_transient_error_is_retried_until_the_read_succeeds(policy):
    read, calls = _flaky([ConnectionResetError("reset"), TimeoutError("slow")])
    reopened = []
    assert with_retries(read, lambda: "shard x.tar", lambda: reopened.append(1)) == "sample"
    assert len(calls) == 3 and len(reopened) == 2 and take_storage_retries() == 2


def test_after_the_last_retry_the_error_names_the_object(policy):
    read, calls = _flaky([ConnectionResetError("reset")] * 10)
    with pytest.raises(StorageReadError, match=r"reading shard msc://p/ds/x\.tar failed .* after 3 retries.*max_storage_retries"):
        with_retries(read, lambda: "shard msc://p/ds/x.tar", lambda: None)
    assert len(calls) == 4


def test_corrupt_data_is_never_retried(policy):
    read, calls = _flaky([ValueError("Unexpected end of tar file")])
    with pytest.raises(ValueError, match="Unexpected end"):
        with_retries(read, lambda: "x", lambda: None)
    assert len(calls) == 1 and take_storage_retries() == 0


def test_the_backoff_doubles_and_is_bounded_by_the_retry_count(monkeypatch):
    monkeypatch.setattr(storage_retries, "_POLICY", storage_retries._Policy(max_retries=3, delay=0.25))
    waits = []
    monkeypatch.setattr(storage_retries.time, "sleep", waits.append)
    read, _ = _flaky([TimeoutError()] * 10)
    with pytest.raises(StorageReadError):
        with_retries(read, lambda: "x", lambda: None)
    assert waits == [0.25, 0.5, 1.0]
    take_storage_retries()


# --- end to end: msc:// with every 5th shard read failing transiently ----------------------------

moto_server = pytest.importorskip("moto.server", reason="needs moto[server] and boto3 (the test extra)")
pytest.importorskip("boto3", reason="needs moto[server] and boto3 (the test extra)")

FAIL_EVERY = 5


@pytest.fixture(scope="module")
def remote(tmp_path_factory):
    """``(msc URL, local folder)``: 16 synthetic samples in shards of 2 (MSC reads a small shard
    object in one GET: many shards make many reads) in a local moto S3 bucket."""
    from energon_pack.data.synthetic import SyntheticSpec, make_synthetic_dataset
    from tests.support.msc_server import BUCKET, s3_client, upload_dataset

    spec = SyntheticSpec(max_image_side=128, max_video_seconds=1.0, max_video_side=64)
    dataset = make_synthetic_dataset(tmp_path_factory.mktemp("flaky"), 16, seed=3, spec=spec, samples_per_shard=2)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    client = s3_client(f"http://{host}:{port}")
    client.create_bucket(Bucket=BUCKET)
    local = Path(dataset.out_dir)
    upload_dataset(client, local, "flaky")
    config = tmp_path_factory.mktemp("msc_flaky") / "msc.json"
    config.write_text(json.dumps({"profiles": {"flaky": {
        "storage_provider": {"type": "s3", "options": {
            "base_path": BUCKET, "endpoint_url": f"http://{host}:{port}", "region_name": "us-east-1",
        }},
        "credentials_provider": {"type": "S3Credentials", "options": {"access_key": "test", "secret_key": "test"}},
    }}}))
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("MSC_CONFIG", str(config))
            yield "msc://flaky/flaky", local
    finally:
        server.stop()


@pytest.fixture
def flaky_reads(monkeypatch):
    """Every ``FAIL_EVERY``-th opening of an ``msc://`` shard object (counted across forked workers) fails with
    the error MSC raises for a connection reset mid-download (an ``OSError`` caused by its
    ``RetryableError``) before any byte is read; returns the shared count of injected failures.
    (A real flaky endpoint behind a proxy is no deterministic fault: botocore and MSC retry some
    failures below the loader, and a body cut short can reach the reader as short data.)"""
    from megatron.energon.epathlib import EPath
    from multistorageclient.types import RetryableError

    opened, failed = multiprocessing.Value("i", 0), multiprocessing.Value("i", 0)
    energon_open = EPath.open

    def flaky_open(self, mode="r", block_size=None):
        if str(self).startswith("msc://") and str(self).endswith(".tar") and "r" in mode:
            with opened.get_lock():
                opened.value += 1
                fail = opened.value % FAIL_EVERY == 0
                failed.value += fail
            if fail:
                try:
                    raise RetryableError(f"Failed to GET object(s) at {self}: connection reset (injected)")
                except RetryableError as error:
                    raise OSError(f"Failed to download file {self}") from error
        return energon_open(self, mode, block_size)

    monkeypatch.setattr(EPath, "open", flaky_open)
    return failed


def _epoch(dataset, config, processor, **kwargs) -> tuple[list[str], int]:
    from energon_pack import get_packing_loader
    from tests.support.row_digests import digest

    with get_packing_loader(dataset, config, processor, **kwargs) as loader:
        return [digest(row) for row in loader], loader.stats()["storage_retries"]


@pytest.mark.slow
@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_epoch_with_every_5th_shard_read_failing_equals_the_clean_run_and_counts_the_retries(
    remote, processor, num_workers, flaky_reads
):
    from energon_pack import PackingConfig

    url, local = remote
    config = PackingConfig(seq_length=2048, buffer_size=6, num_workers=num_workers, repeat=False, storage_retry_delay=0.01)
    clean = _epoch(local, config, processor)
    assert flaky_reads.value == 0  # local reads are never failed
    rows, retries = _epoch(url, config, processor)
    assert rows == clean[0] and flaky_reads.value > 0 and retries == flaky_reads.value


@pytest.mark.slow
def test_a_plan_epoch_with_every_5th_shard_read_failing_equals_the_clean_run(remote, processor, flaky_reads):
    from energon_pack import PackingConfig
    from energon_pack.plan.build import build_plan

    url, local = remote
    config = PackingConfig(seq_length=2048, num_workers=2, repeat=False, storage_retry_delay=0.01)
    plan = build_plan(local, config, processor, num_workers=0, progress=False)
    clean = _epoch(local, config, processor, plan=plan)
    before = flaky_reads.value
    rows, retries = _epoch(url, config, processor, plan=plan)
    assert rows == clean[0] and flaky_reads.value > before and retries == flaky_reads.value - before
