"""The built wheel installs beside Megatron-Bridge 0.6.2 (compatibility run, Python 3.12).

pip resolves, in dry runs against the package index: our wheel with Bridge's own wheel (both
``Requires-Python`` accept this interpreter), and our wheel's whole dependency tree under every
requirement that Bridge and Megatron-Core (its ``dev`` and ``mlm`` extras, as Bridge asks) put on
the same distributions (transformers <= 5.12.1, torch, megatron-energon ~= 7.0, av, ...).
Bridge's complete tree is not resolved here: it includes CUDA extensions that are sdists needing
torch and a CUDA toolchain even to report their metadata, which no CPU machine resolves, with or
without energon-pack.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.paths import REPO

ROOT = REPO
BRIDGE = "megatron-bridge==0.6.2"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not any(d.metadata["Name"] == "megatron-bridge" for d in importlib.metadata.distributions()),
        reason="needs the compatibility environment (make test-compat)",
    ),
]


def pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=900)


def dry_run(*requirements: str, report: Path, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return pip("install", "--dry-run", "--quiet", "--report", str(report), *extra, *requirements)


def bridge_requirements_on(names: set[str]) -> list[str]:
    """Bridge's and Megatron-Core[dev,mlm]'s requirements on the distributions in ``names``."""
    wanted = []
    for dist, extras in (("megatron-bridge", ("",)), ("megatron-core", ("", "dev", "mlm"))):
        for text in importlib.metadata.requires(dist) or []:
            requirement = Requirement(text)
            if requirement.marker and not any(requirement.marker.evaluate({"extra": e}) for e in extras):
                continue
            if canonicalize_name(requirement.name) in names:
                requirement.marker = None
                wanted.append(str(requirement))
    return wanted


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    built = pip("wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(out), str(ROOT))
    assert built.returncode == 0, built.stderr[-3000:]
    assert "license" not in built.stderr.lower(), built.stderr[-3000:]  # no project.license deprecation
    (path,) = out.glob("energon_pack-*.whl")
    return path


def test_wheel_resolves_with_megatron_bridge(wheel, tmp_path):
    both = dry_run(str(wheel), BRIDGE, report=tmp_path / "both.json", extra=("--no-deps", "--ignore-installed"))
    assert both.returncode == 0, both.stderr[-3000:]
    names = {canonicalize_name(item["metadata"]["name"]) for item in json.loads((tmp_path / "both.json").read_text())["install"]}
    assert {"energon-pack", "megatron-bridge"} <= names

    ours = dry_run(str(wheel), report=tmp_path / "ours.json", extra=("--ignore-installed",))
    assert ours.returncode == 0, ours.stderr[-3000:]
    tree = {canonicalize_name(item["metadata"]["name"]) for item in json.loads((tmp_path / "ours.json").read_text())["install"]}
    shared = bridge_requirements_on(tree)
    assert any(r.startswith("transformers") and "<=5.12.1" in r for r in shared), shared
    together = dry_run(str(wheel), *shared, report=tmp_path / "together.json")
    assert together.returncode == 0, together.stderr[-3000:]

    # The same resolution with the transformers pin energon-pack had before (5.24.0) is impossible.
    pinned = dry_run(str(wheel), *shared, "transformers==5.24.0", report=tmp_path / "pinned.json")
    assert pinned.returncode != 0 and "conflict" in pinned.stderr.lower(), pinned.stderr[-3000:]
