"""A watchdog on training progress: a run whose ranks stop advancing is ended with a reason.

A hung NCCL collective keeps every GPU at 100% (the idle alarm never fires) and NCCL has no
timeout of its own, so without this only the hard cap would end it. The trainer's rank 0
rewrites progress.json at each log step and evaluation (docs/contracts.md); the watchdog
trips when it stops changing for longer than the run's own pace allows:

- before the first update of this attempt: `startup_grace_s` (start-up, the data pipeline's
  first batches and XLA's compilation of the first step);
- after it: the longer of `min_stall_s` and `stall_factor` times the longest gap seen so far
  between two updates (an evaluation or a checkpoint save included).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

STARTUP_GRACE_S = 1800.0
MIN_STALL_S = 600.0
STALL_FACTOR = 10.0
POLL_S = 5.0


class ProgressWatchdog(threading.Thread):
    """Calls on_stall(reason) once when progress.json stops advancing; stop() ends it quietly."""

    def __init__(
        self,
        progress_path: Path,
        on_stall: Callable[[str], None],
        *,
        startup_grace_s: float = STARTUP_GRACE_S,
        min_stall_s: float = MIN_STALL_S,
        stall_factor: float = STALL_FACTOR,
        poll_s: float = POLL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(name="progress-watchdog", daemon=True)
        self.progress_path, self.on_stall = Path(progress_path), on_stall
        self.startup_grace_s, self.min_stall_s = startup_grace_s, min_stall_s
        self.stall_factor, self.poll_s, self.clock = stall_factor, poll_s, clock
        self.started = clock()
        self.seen: str | None = self._stamp()  # a previous attempt's file does not count
        self.last_change: float | None = None
        self.longest_gap = 0.0
        self.progress: dict = {}
        self.reason: str | None = None
        self.stopped = threading.Event()

    def _stamp(self) -> str | None:
        try:
            text = self.progress_path.read_text()
            progress = json.loads(text)
        except (OSError, ValueError):  # not written yet, or (never: it is renamed in) half
            return None
        self.progress = progress if isinstance(progress, dict) else {}
        return str(self.progress.get("updated_at"))

    def check(self) -> str | None:
        """One look: the stall's reason when it has stalled, else None."""
        now = self.clock()
        stamp = self._stamp()
        if stamp is not None and stamp != self.seen:
            if self.last_change is not None:
                self.longest_gap = max(self.longest_gap, now - self.last_change)
            self.seen, self.last_change = stamp, now
        if self.last_change is None:
            if now - self.started > self.startup_grace_s:
                return (
                    f"training stalled: no training step reported within "
                    f"{self.startup_grace_s:.0f} s of the trainer's start (progress.json)"
                )
            return None
        bound = max(self.min_stall_s, self.stall_factor * self.longest_gap)
        quiet = now - self.last_change
        if quiet <= bound:
            return None
        p = self.progress
        return (
            f"training stalled: no progress for {quiet:.0f} s (bound {bound:.0f} s) after "
            f"global step {p.get('global_step')} (epoch {p.get('epoch')}/{p.get('epochs')}, "
            f"step {p.get('step')}/{p.get('steps_per_epoch')}, {p.get('phase')}): a collective "
            "waits on a rank that stopped"
        )

    def run(self) -> None:
        while not self.stopped.wait(self.poll_s):
            reason = self.check()
            if reason:
                self.reason = reason
                self.on_stall(reason)
                return

    def stop(self) -> None:
        self.stopped.set()
