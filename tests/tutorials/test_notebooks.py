"""Every tutorial notebook runs top to bottom (offline, CPU), is stored without outputs and is linked from the README.

Each notebook runs in its own kernel with a private temporary folder as ``TMPDIR``; the
folder must be empty when the notebook ends (a tutorial removes what it creates), and it is
removed afterwards. The notebooks that ran are listed at the end of the test session.
"""

from __future__ import annotations

import re
import tempfile
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from traitlets.config import Config

from tests.support.paths import REPO

ROOT = REPO
NOTEBOOKS = sorted((ROOT / "tutorials").glob("*.ipynb"))


def test_tutorials_are_numbered_in_order():
    """``01_...`` to ``NN_...`` without gaps, the order the README presents them in."""
    assert NOTEBOOKS and [p.name[:3] for p in NOTEBOOKS] == [f"{i:02d}_" for i in range(1, len(NOTEBOOKS) + 1)]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_tutorial_is_stored_without_outputs(path: Path):
    notebook = nbformat.read(path, as_version=4)
    dirty = [i for i, cell in enumerate(notebook.cells) if cell.cell_type == "code" and (cell.outputs or cell.execution_count)]
    assert not dirty, (
        f"{path.name}: code cells {dirty} hold outputs; fix: strip them before committing "
        f"(jupyter nbconvert --clear-output --inplace {path.relative_to(ROOT)})"
    )


def test_readme_links_every_tutorial():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    missing = [p.name for p in NOTEBOOKS if f"(tutorials/{p.name})" not in readme]
    assert not missing, f"README.md does not link {missing}; fix: add a line per notebook under 'Tutorials'"


def test_byod_tutorial_explains_every_skip_reason():
    """Tutorial 02's table of skip reasons (meaning and fix) names every reason of docs/bad_input_policy.md."""
    policy = (ROOT / "docs" / "bad_input_policy.md").read_text(encoding="utf-8")
    reasons = set(re.findall(r"^\| `(\w+)` \|", policy, flags=re.MULTILINE))  # the table
    prepare_paragraph = policy[policy.index("`energon-pack prepare`") :].split("\n\n")[0]
    reasons |= set(re.findall(r"`([a-z0-9]+(?:_[a-z0-9]+)+)`", prepare_paragraph))  # its reasons in backticks
    notebook = nbformat.read(ROOT / "tutorials" / "02_bring_your_own_data.ipynb", as_version=4)
    text = "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "markdown")
    missing = sorted(reason for reason in reasons if f"`{reason}`" not in text)
    assert len(reasons) >= 15 and not missing, f"explain {missing} in tutorial 02's table of skip reasons"


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path: Path, monkeypatch, record_property):
    record_property("notebook", path.name)
    notebook = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory(prefix="energon_pack_notebook_") as root:
        scratch, cwd = Path(root) / "tmp", Path(root) / "cwd"
        scratch.mkdir()
        cwd.mkdir()
        monkeypatch.setenv("TMPDIR", str(scratch))
        # torch creates its (empty) compile cache in TMPDIR on import; keep it out of the check.
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(Path(root) / "torchinductor"))
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
        started = time.monotonic()
        # Let the kernel exit on its own (no kill after jupyter_client's 5 s), so that what a process
        # removes at exit (the statistics folders of loaders still alive) is removed.
        config = Config()
        config.KernelManager.shutdown_wait_time = 120.0
        client = NotebookClient(
            notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}, config=config
        )
        client.execute()  # raises on the first cell error
        record_property("notebook_seconds", round(time.monotonic() - started))
        # pymp-*: multiprocessing's folders of loader worker processes, left behind when torch's
        # DataLoader terminates a worker that has not exited in time (not the notebook's doing).
        left = sorted(p.name for p in scratch.iterdir() if not p.name.startswith("pymp-"))
        assert not left, (
            f"{path.name} left {left} in its temporary folder; fix: create files under a "
            "tempfile.TemporaryDirectory and call its cleanup() in the last cell"
        )
