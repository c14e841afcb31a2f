"""The default tier's guard (tests/conftest.py uses it; a unique module name, as every tests/
folder has a conftest.py): which processes a default-tier test may not start, and the thread
that watches for them."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

TEST_ENV = "HOROVOD_FLEET_DEFAULT_TIER_TEST"
# What a default-tier test may not start: a Horovod launch (the installed horovodrun; a stub of
# that name in a test's own directory is fine), or a process that loaded TensorFlow (its native
# library shows in the process's memory map).
HOROVODRUN = (Path(sys.executable).parent / "horovodrun").resolve()
TENSORFLOW_LIBRARY = "libtensorflow_framework.so"
SCAN_EVERY_S = 0.25  # TensorFlow takes seconds to import: no such process comes and goes unseen


def offence(pid: str, mark: bytes) -> str | None:
    """What process `pid` does that the default tier may not, or None (also when it is gone)."""
    proc = Path("/proc", pid)
    try:
        if mark not in (proc / "environ").read_bytes().split(b"\0"):
            return None
        argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        command = " ".join(argv)
        # Its script, run by Python (python .../horovodrun ...) or as itself.
        if any(arg.endswith("horovodrun") and Path(arg).resolve() == HOROVODRUN for arg in argv):
            return f"horovodrun (pid {pid}: {command.strip()[:200]})"
        if TENSORFLOW_LIBRARY in (proc / "maps").read_text(errors="replace"):
            return f"a process that loaded TensorFlow (pid {pid}: {command.strip()[:200]})"
    except OSError:
        return None
    return None


def pids() -> list[str]:
    return [entry.name for entry in os.scandir("/proc") if entry.name.isdigit()]


class ProcessWatcher(threading.Thread):
    """Reads /proc every SCAN_EVERY_S for processes marked `TEST_ENV=token`; keeps what each
    one did that the default tier may not."""

    def __init__(self, token: str):
        super().__init__(daemon=True, name="tier-guard")
        self.mark = f"{TEST_ENV}={token}".encode()
        # A process that ran before the test began cannot carry its token: only the others are
        # read, so the scans of a test that starts no process read no process's files (the
        # guard's cost per test fell from about 5 ms to 1.5 ms).
        self.before = set(pids())
        self.found: dict[str, str] = {}
        self.stopped = threading.Event()

    def scan(self) -> None:
        for pid in pids():
            if (
                pid not in self.before
                and pid not in self.found
                and (what := offence(pid, self.mark))
            ):
                self.found[pid] = what

    def run(self) -> None:
        while not self.stopped.wait(SCAN_EVERY_S):
            self.scan()

    def stop(self) -> list[str]:
        self.stopped.set()
        self.join()
        self.scan()
        return list(self.found.values())
