"""Order and units of work for the two-process test run (``make test``: pytest-xdist).

A unit runs whole in one process, so the module-scoped fixtures of a test file are built once.
Units are handed out in collection order, and ``collection_order`` puts the long ones first (the
golden mixes, the notebooks, the real loaders, prepare) so that no process is left alone with one
at the end. The preencode and postencode golden tests are one unit, postencode first: preencode
then reuses the Hugging Face references postencode ran (``GoldenReferences``).
"""

from __future__ import annotations

from typing import Any

#: Test folders collected first, longest work first.
FIRST_FOLDERS = ("golden", "tutorials", "loader", "data")
#: Test files that share one process, in this order (the first fills the second's references).
SHARED_UNITS = {"golden-mix": ("tests/golden/test_postencode.py", "tests/golden/test_preencode.py")}
#: Files whose tests are each a unit of their own (long, independent: the notebooks).
TEST_PER_UNIT = ("tests/tutorials/test_notebooks.py",)


def unit_of(nodeid: str) -> str:
    """The unit of work of a test id: its file, a shared unit's name, or the test itself.

    Example: ``tests/qwen/test_rope.py::test_x[a]`` -> ``tests/qwen/test_rope.py``;
    ``tests/golden/test_preencode.py::test_y`` -> ``golden-mix``.
    """
    path = nodeid.split("::", 1)[0]
    for name, files in SHARED_UNITS.items():
        if path in files:
            return name
    return nodeid if path in TEST_PER_UNIT else path


def collection_order(nodeid: str) -> tuple[int, int]:
    """Sort key of a test id: ``FIRST_FOLDERS`` in order, then the rest; within a shared unit,
    its files in the listed order (a stable sort keeps the order inside each file).

    Example: ``tests/golden/test_preencode.py::t`` -> ``(0, 1)``; ``tests/qwen/test_rope.py::t`` -> ``(4, 0)``.
    """
    path = nodeid.split("::", 1)[0]
    parts = path.split("/")
    folder = parts[1] if len(parts) > 2 else ""
    rank = FIRST_FOLDERS.index(folder) if folder in FIRST_FOLDERS else len(FIRST_FOLDERS)
    within = next((files.index(path) for files in SHARED_UNITS.values() if path in files), 0)
    return rank, within


def make_scheduler(config: Any, log: Any) -> Any:
    """pytest-xdist's scope scheduler with ``unit_of`` as its scopes, in collection order."""
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    config.option.loadscopereorder = False
    return UnitScheduling(config, log)
