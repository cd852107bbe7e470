"""Parquet footers are checked before pyarrow opens them in ``prepare`` (``data.parquet_footer``):
damage is named, what pyarrow does not survive ends a child process, not the job, and a fuzz of
300 footer mutations ends in counted ``unreadable_file`` skips, never an abort or a hang."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from energon_pack.data import parquet_footer
from energon_pack.data.parquet_footer import CorruptFooter, check_footer, check_metadata, footer_problems
from tests.support.parquet_footer_fuzz import MUTATIONS, ROWS, base_file
from tests.support.paths import REPO


@pytest.fixture(scope="module")
def base() -> bytes:
    return base_file()


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda data: data[:-10], r"does not end with the Parquet magic b'PAR1'"),
        (lambda data: b"PAR0" + data[4:], r"does not start with the Parquet magic"),
        (lambda data: data[:-8] + (0).to_bytes(4, "little") + b"PAR1", r"^footer length 0 is outside 1\.\.\d+"),
        (lambda data: data[:-8] + (2**32 - 1).to_bytes(4, "little") + b"PAR1", r"^footer length 4294967295 is outside"),
        (lambda data: data[:-9] + b"\x0f" + data[-8:], r"FileMetaData does not parse"),
        (lambda data: b"PAR1" + data[-8:], r"holds 12 bytes|footer length \d+ is outside"),
    ],
    ids=["truncated", "head-magic", "length-0", "length-huge", "metadata-cut", "no-data"],
)
def test_damage_is_named_before_pyarrow_sees_it(base, tmp_path, damage, message):
    path = tmp_path / "bad.parquet"
    check_footer(_write(path, base))
    with pytest.raises(CorruptFooter, match=message):
        check_footer(_write(path, damage(base)))


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


def _metadata(*, rows=(2,), total=2, offset=4, size=10, leaves=1, chunk_type=6) -> dict:
    """A parsed FileMetaData: a root with ``leaves`` BYTE_ARRAY leaves, a row group per ``rows``."""
    schema = [{4: b"schema", 5: leaves}] + [{1: 6, 3: 1, 4: f"c{i}".encode()} for i in range(leaves)]
    chunk = {2: 0, 3: {1: chunk_type, 2: [0], 3: [b"c0"], 4: 1, 5: 2, 6: size, 7: size, 9: offset}}
    return {1: 2, 2: schema, 3: total, 4: [{1: [chunk], 2: size, 3: n} for n in rows]}


@pytest.mark.parametrize(
    "metadata, message",
    [
        (_metadata(total=3), "the row groups hold 2 rows, the footer's num_rows says 3"),
        (_metadata(offset=2), r"spans bytes 2\.\.12, outside the data's 4\.\.100"),
        (_metadata(size=200), r"spans bytes 4\.\.204, outside"),
        (_metadata(leaves=2), "row group 0 has 1 column chunks for 2 schema leaves"),
        (_metadata(chunk_type=1), "has type 1 and codec 1 \\(schema type 6\\)"),
        ({**_metadata(), 2: [{4: b"schema", 5: 3}, {1: 6, 4: b"c0"}]}, "the schema tree needs more than its 2 elements"),
        ({**_metadata(), 2: [{4: b"schema", 5: 1}, {1: 6, 4: b"c0"}, {1: 6, 4: b"c1"}]}, "holds 2 of its 3 elements"),
        ({**_metadata(), 2: [{4: b"schema", 5: 1}, {1: 11, 4: b"c0"}]}, "no known physical type"),
        ({**_metadata(), 3: -1}, "num_rows is -1, not a count"),
    ],
    ids=["rows", "chunk-before-data", "chunk-into-footer", "chunks", "type", "tree-short", "tree-long", "leaf-type", "negative"],
)
def test_metadata_that_does_not_describe_its_file_is_refused(metadata, message):
    check_metadata(_metadata(), data_end=100)
    with pytest.raises(CorruptFooter, match=message):
        check_metadata(metadata, data_end=100)


_FAKE_PYARROW = r"""
import json, os, sys, time
for line in sys.stdin:
    path = os.path.basename(json.loads(line))
    if "abort" in path:
        os.abort()
    if "hang" in path:
        time.sleep(60)
    print(json.dumps("ok" if "good" in path else "pyarrow: ArrowInvalid: no"), flush=True)
"""


def test_an_abort_or_a_hang_in_pyarrow_counts_that_file_and_the_rest_are_opened(base, tmp_path, monkeypatch):
    """The child that opens footers with pyarrow is started again after a file that ends it or
    hangs; every file gets its verdict; the child is kept for the next files."""
    monkeypatch.setattr(parquet_footer, "_PROBE_CHILD", _FAKE_PYARROW)
    prober = parquet_footer._Prober()
    monkeypatch.setattr(parquet_footer, "_PROBER", prober)
    names = ["1-good", "2-abort", "3-good", "4-error", "5-hang", "6-good"]
    paths = [_write(tmp_path / f"{name}.parquet", base) for name in names]
    try:
        problems = footer_problems(paths, timeout_s=3.0)
        child = prober._child.pid
        assert footer_problems(paths[:1]) == {} and prober._child.pid == child
    finally:
        prober.close()
    assert {path.stem: why for path, why in problems.items()} == {
        "2-abort": f"pyarrow ended the process opening its footer (exit status {-6 if os.name == 'posix' else 3})",
        "4-error": "pyarrow: ArrowInvalid: no",
        "5-hang": "pyarrow did not finish opening its footer in 3 s (stopped)",
    }
    assert prober._child is None


@pytest.mark.slow  # 301 files prepared in a child process: more than ~5 s on a loaded machine
def test_a_fuzz_of_300_footer_mutations_ends_in_counted_skips(tmp_path):
    """Every mutated file is read or one counted ``unreadable_file`` skip; every row is written
    or a counted skip; the fuzz process exits normally (no abort, no hang)."""
    done = subprocess.run([sys.executable, "-m", "tests.support.parquet_footer_fuzz", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["files"] == 1 + sum(MUTATIONS.values()) == 301
    unreadable = len(found["unreadable_files"])
    assert found["named_unreadable"] == found["unreadable_files"] and "000-good.parquet" not in found["unreadable_files"]
    assert found["reasons"].get("unreadable_file") == unreadable >= 150
    lines = found["lines"]
    assert lines == list(range(1, len(lines) + 1))  # every row and every unreadable file one numbered line
    assert len(lines) >= unreadable + ROWS * (found["files"] - unreadable)
    assert found["written"] + found["problems"] == len(lines) and found["written"] >= ROWS
