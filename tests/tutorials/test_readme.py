"""The README's usage example runs as written (on a small dataset, on this machine's device)."""

from __future__ import annotations

import re

import pytest

from tests.support.paths import README



def usage_code() -> str:
    """The first Python block under '## Usage'."""
    text = README.read_text(encoding="utf-8")
    usage = text[text.index("## Usage") :]
    return re.search(r"```python\n(.*?)```", usage, flags=re.DOTALL).group(1)


@pytest.mark.slow
def test_usage_example_runs_saves_midway_and_resumes(synthetic_dataset):
    from energon_pack import PackingConfig, get_packing_loader, load_processor

    code = usage_code().replace('"path/to/dataset"', repr(str(synthetic_dataset.out_dir)))
    code = code.replace("seq_length=8192", "seq_length=1024")  # more rows from the small dataset
    assert code.count("seq_length=1024") == 1
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 - the documented example
    state = namespace["state"]
    assert state is not None, "the example saves the loader state midway through the epoch"
    full = get_packing_loader(synthetic_dataset.out_dir, namespace["config"], load_processor())
    keys = [row["__keys__"] for row in full]
    assert len(keys) > 4
    assert [row["__keys__"] for row in namespace["resumed"]] == keys[2:], "saved after row 2, resumed at row 3"


def test_readme_says_how_to_run_the_notebooks():
    text = README.read_text(encoding="utf-8")
    assert "make install-test" in text and "jupyter" in text


#: The README and the pages its reference material moved to (issue 50): their links must resolve.
MOVED_TO = ("docs/guide.md", "docs/bridge.md", "docs/development.md", "docs/README.md")


def test_the_readme_is_a_first_reading_whose_links_resolve():
    """The README keeps what a newcomer reads first (the two commands, the smallest example, where
    to go next) and points to the pages its reference moved to; every relative link there resolves."""
    text = README.read_text(encoding="utf-8")
    assert "make demo" in text and "make test" in text and "## Where to go next" in text
    assert all(f"({page})" in text for page in MOVED_TO)
    for page in (README, *(README.parent / name for name in MOVED_TO)):
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            assert (page.parent / target).exists(), f"{page.name} links {target}, which does not exist"
