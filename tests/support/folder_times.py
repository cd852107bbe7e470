"""``--folder-times``: seconds spent per test folder (setup, call and teardown of every test),
printed as a table after the run (``make test-profile``)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any


def folder_of(nodeid: str) -> str:
    """The test folder of a test id. Example: ``tests/qwen/test_rope.py::test_x`` -> ``tests/qwen``."""
    path = nodeid.split("::", 1)[0]
    return path.rsplit("/", 1)[0] if "/" in path else "."


class FolderTimes:
    """A pytest plugin summing report durations per folder (works with xdist: reports reach the controller)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.tests: dict[str, int] = defaultdict(int)

    def pytest_runtest_logreport(self, report: Any) -> None:
        folder = folder_of(report.nodeid)
        self.seconds[folder] += report.duration
        if report.when == "call" or (report.when == "setup" and report.skipped):
            self.tests[folder] += 1

    def table(self) -> list[str]:
        """Lines of the table, slowest folder first, with a total line.

        Example: ``{"tests/qwen": 12.0}`` -> ``["folder  tests  seconds  share", "tests/qwen  ...", "total ..."]``.
        """
        total = sum(self.seconds.values()) or 1.0
        width = max([len("total"), *map(len, self.seconds)])
        lines = [f"{'folder':<{width}}  {'tests':>5}  {'seconds':>8}  {'share':>6}"]
        for folder, seconds in sorted(self.seconds.items(), key=lambda item: -item[1]):
            lines.append(f"{folder:<{width}}  {self.tests[folder]:>5}  {seconds:>8.1f}  {seconds / total:>6.1%}")
        lines.append(f"{'total':<{width}}  {sum(self.tests.values()):>5}  {sum(self.seconds.values()):>8.1f}  {1:>6.1%}")
        return lines

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        terminalreporter.section("time per test folder (setup + call + teardown, summed over processes)")
        for line in self.table():
            terminalreporter.write_line(line)
