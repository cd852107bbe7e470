"""Transient storage errors are retried with bounded exponential backoff, corrupt data never is.

Unit cases drive ``with_retries`` with a fake read; the end-to-end case serves a dataset from a
local moto S3 server behind a proxy on 127.0.0.1 that drops the connection of every 5th read of
a shard object (``msc://``, with MSC's and botocore's own retries turned off so that the drops
reach the loader): an epoch gives the rows of a clean run and the statistics count the retries.
"""

from __future__ import annotations

import http.client
import http.server
import json
import threading
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


# --- end to end: msc:// through a proxy that drops every 5th shard read -----------------------------

moto_server = pytest.importorskip("moto.server", reason="needs moto[server] and boto3 (the test extra)")
pytest.importorskip("boto3", reason="needs moto[server] and boto3 (the test extra)")

DROP_EVERY = 5


class _DroppingProxy(http.server.ThreadingHTTPServer):
    """Forwards HTTP requests to ``upstream``; on every ``DROP_EVERY``-th GET of a ``.tar`` object
    the connection breaks mid-transfer (half the body sent, then closed), as a flaky endpoint does.
    (A connection closed before the answer is retried inside botocore already.)"""

    daemon_threads = True

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream, self.tar_reads, self.dropped = upstream, 0, 0
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _ProxyHandler)


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def _forward(self) -> None:
        server: _DroppingProxy = self.server  # type: ignore[assignment]
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        drop = False
        if self.command == "GET" and self.path.split("?")[0].endswith(".tar"):
            with server.lock:
                server.tar_reads += 1
                drop = server.tar_reads % DROP_EVERY == 0
                server.dropped += drop
        upstream = http.client.HTTPConnection(*server.upstream)
        upstream.request(self.command, self.path, body=body or None, headers=dict(self.headers))
        answer = upstream.getresponse()
        data = answer.read()
        self.send_response(answer.status)
        for name, value in answer.getheaders():
            if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                self.send_header(name, value)
        # A HEAD answer keeps the object's size; others carry the body read.
        self.send_header("Content-Length", answer.getheader("Content-Length", "0") if self.command == "HEAD" else str(len(data)))
        self.end_headers()
        if drop:  # the connection breaks mid-transfer: half the body, then closed
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
        elif self.command != "HEAD":
            self.wfile.write(data)
        upstream.close()

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward


@pytest.fixture(scope="module")
def flaky_remote(tmp_path_factory):
    """``(msc URL, local folder, proxy)``: 16 synthetic samples in shards of 2 (MSC reads a small
    shard object in one GET: many shards make many reads) in a moto bucket, read through the
    dropping proxy, with MSC's and botocore's own retries off."""
    from energon_pack.data.synthetic import SyntheticSpec, make_synthetic_dataset
    from tests.test_msc import BUCKET, _client, _upload

    spec = SyntheticSpec(max_image_side=128, max_video_seconds=1.0, max_video_side=64)
    dataset = make_synthetic_dataset(tmp_path_factory.mktemp("flaky"), 16, seed=3, spec=spec, samples_per_shard=2)

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    client = _client(f"http://{host}:{port}")
    client.create_bucket(Bucket=BUCKET)
    local = Path(dataset.out_dir)
    _upload(client, local, "flaky")
    proxy = _DroppingProxy((host, port))
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    config = tmp_path_factory.mktemp("msc_flaky") / "msc.json"
    config.write_text(json.dumps({"profiles": {"flaky": {
        "storage_provider": {"type": "s3", "options": {
            "base_path": BUCKET, "endpoint_url": f"http://127.0.0.1:{proxy.server_address[1]}",
            "region_name": "us-east-1", "retries": {"max_attempts": 1, "mode": "standard"},
        }},
        "credentials_provider": {"type": "S3Credentials", "options": {"access_key": "test", "secret_key": "test"}},
        "retry": {"attempts": 1, "delay": 0},
    }}}))
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("MSC_CONFIG", str(config))
            yield "msc://flaky/flaky", local, proxy
    finally:
        proxy.shutdown()
        server.stop()


@pytest.mark.slow
@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_epoch_through_a_flaky_endpoint_equals_the_clean_run_and_counts_the_retries(flaky_remote, processor, num_workers):
    from energon_pack import PackingConfig, get_packing_loader
    from tests.row_digests import digest

    remote, local, proxy = flaky_remote
    config = PackingConfig(seq_length=2048, buffer_size=6, num_workers=num_workers, repeat=False, storage_retry_delay=0.01)
    with get_packing_loader(local, config, processor) as clean:
        expected = [digest(row) for row in clean]
    dropped = proxy.dropped
    with get_packing_loader(remote, config, processor) as loader:
        assert [digest(row) for row in loader] == expected
        retries = loader.stats()["storage_retries"]
    assert proxy.dropped > dropped and retries == proxy.dropped - dropped


@pytest.mark.slow
def test_a_plan_epoch_through_a_flaky_endpoint_equals_the_clean_run_and_counts_the_retries(flaky_remote, processor):
    from energon_pack import PackingConfig, get_packing_loader
    from energon_pack.plan.build import build_plan
    from tests.row_digests import digest

    remote, local, proxy = flaky_remote
    config = PackingConfig(seq_length=2048, num_workers=2, repeat=False, storage_retry_delay=0.01)
    plan = build_plan(local, config, processor, num_workers=0, progress=False)
    with get_packing_loader(local, config, processor, plan=plan) as clean:
        expected = [digest(row) for row in clean]
    dropped = proxy.dropped
    with get_packing_loader(remote, config, processor, plan=plan) as loader:
        assert [digest(row) for row in loader] == expected
        retries = loader.stats()["storage_retries"]
    assert proxy.dropped > dropped and retries == proxy.dropped - dropped
