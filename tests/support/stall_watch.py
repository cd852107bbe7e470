"""A run that stops finishing tests fails with its stacks, instead of sitting until CI's limit.

pytest-timeout ends a test that runs too long, but not a run in which no test runs: a stopped
process, a test process stuck in native code holding the GIL (where the timeout's signal is never
handled), or a controller that no longer hands out work. ``StallWatch`` runs in the process that
reports (the xdist controller, or the only process): when no test has finished for ``stall_s``
seconds it prints every process of the run (state, CPU seconds, command) and the Python stacks of
each test process (``faulthandler`` on SIGUSR1, which dumps even without the GIL, into a file per
process under ``ENERGON_PACK_STACKS_DIR``), and ends the run with exit status 3.
``ENERGON_PACK_STALL_S`` sets the limit (0: off).
"""

from __future__ import annotations

import faulthandler
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

#: Default seconds without a finished test before the run counts as stalled: longer than
#: pytest-timeout's 900 s, so a slow test fails by its own timeout first.
DEFAULT_STALL_S = 1200.0
#: Exit status of a stalled run.
STALL_EXIT = 3
#: Seconds the test processes get to write their stacks before the run ends.
DUMP_GRACE_S = 20.0


def stall_seconds(environ: dict[str, str] | os._Environ = os.environ) -> float:
    """``ENERGON_PACK_STALL_S`` as seconds (``DEFAULT_STALL_S`` when unset; 0 or less: off).

    Example: ``{"ENERGON_PACK_STALL_S": "90"}`` -> 90.0; ``{}`` -> 1200.0.
    """
    text = environ.get("ENERGON_PACK_STALL_S", "")
    try:
        return float(text) if text else DEFAULT_STALL_S
    except ValueError:
        raise ValueError(f"ENERGON_PACK_STALL_S={text!r} is not a number of seconds; fix: e.g. 1200, or 0 for off") from None


#: Where test processes write their stacks (set by the reporting process, inherited by the others).
STACKS_DIR_VARIABLE = "ENERGON_PACK_STACKS_DIR"
#: The test processes' command line under pytest-xdist (execnet); their forked children share it.
XDIST_WORKER_COMMAND = "exec(eval(sys.stdin.readline()))"


def dump_stacks_on_sigusr1(stacks_dir: Path) -> None:
    """In a test process: on SIGUSR1, write every thread's Python stack to ``stacks_dir/<pid>.txt``
    (a file, not stderr: pytest captures stderr while a test runs)."""
    stream = open(stacks_dir / f"{os.getpid()}.txt", "w")  # open for the life of the process
    faulthandler.register(signal.SIGUSR1, file=stream, all_threads=True)


def process_table(root_pid: int) -> list[str]:
    """One line per process of the run under ``root_pid`` (itself included): pid, state, CPU s, command."""
    import psutil

    root = psutil.Process(root_pid)
    lines = []
    for process in [root, *root.children(recursive=True)]:
        try:
            with process.oneshot():
                cpu = process.cpu_times()
                command = " ".join(process.cmdline())[:160]
                lines.append(f"{process.pid:>7} {process.status():<10} {cpu.user + cpu.system:>8.1f} s  {command}")
        except psutil.Error:
            continue
    return lines


class StallWatch:
    """Ends a run in which no test has finished for ``stall_s`` seconds (see the module docstring)."""

    def __init__(
        self, stall_s: float, stacks_dir: Path, stream: TextIO = sys.stderr, exit: Any = os._exit,
        grace_s: float = DUMP_GRACE_S,
    ) -> None:
        self.stall_s = stall_s
        self.stacks_dir = stacks_dir
        self.grace_s = grace_s
        self._stream = stream
        self._exit = exit
        self._last = time.monotonic()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="stall-watch", daemon=True)

    def pytest_sessionstart(self, session: Any) -> None:
        self._last = time.monotonic()
        self._thread.start()

    def pytest_runtest_logreport(self, report: Any) -> None:
        self._last = time.monotonic()

    def pytest_sessionfinish(self, session: Any) -> None:
        self._done.set()
        shutil.rmtree(self.stacks_dir, ignore_errors=True)

    def stalled_for(self) -> float:
        """Seconds since the last finished test (or the session's start)."""
        return time.monotonic() - self._last

    def _watch(self) -> None:
        while not self._done.wait(min(30.0, self.stall_s / 4)):
            if self.stalled_for() >= self.stall_s:
                self.report_and_end()
                return

    def report_and_end(self) -> None:
        """Print the run's processes and their stacks, then end the run with ``STALL_EXIT``."""
        write = self._stream.write
        write(f"\n==== no test finished for {self.stalled_for():.0f} s (limit {self.stall_s:.0f} s, "
              "ENERGON_PACK_STALL_S): the run is stalled ====\n")
        table = process_table(os.getpid())
        write("    pid state        CPU       command\n" + "\n".join(table) + "\n")
        write("==== Python stacks of the reporting process ====\n")
        self._stream.flush()
        faulthandler.dump_traceback(file=self._stream, all_threads=True)
        for line in table[1:]:
            if XDIST_WORKER_COMMAND in line:  # they (and their forked children) dump on SIGUSR1
                try:
                    os.kill(int(line.split()[0]), signal.SIGUSR1)
                except OSError:
                    continue
        time.sleep(self.grace_s)
        for path in sorted(self.stacks_dir.glob("*.txt")):
            stacks = path.read_text(errors="replace").strip()
            if stacks:
                write(f"==== Python stacks of test process {path.stem} ====\n{stacks}\n")
        write(f"==== ended: stalled run (exit {STALL_EXIT}) ====\n")
        self._stream.flush()
        self._exit(STALL_EXIT)
