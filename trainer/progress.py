"""<model-dir>/progress.json: where the run is, rewritten by rank 0 at each log step and evaluation.

The node's bootstrap reads it into runs/<run>/status.json (docs/contracts.md, "A run as it
goes"). Every figure comes from what the log step already read from the device: writing it costs
a small file rename, no device sync. No TensorFlow or Horovod here, so it is tested alone.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

PROGRESS_FILE = "progress.json"
# <model-dir>/node-steps.json: every node's local rank 0 rewrites it at each check step, so the
# node's bootstrap knows its ranks step while the head is silent (bootstrap/fleet/supervision.py
# HeadWatch mirrors the name; docs/contracts.md).
NODE_STEPS_FILE = "node-steps.json"


def utc_now() -> str:
    return utc_stamp(time.time())


def utc_stamp(seconds: float) -> str:
    """A wall time (time.time()) as docs/contracts.md writes times."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def eta_seconds(steps_left: int, global_batch: int, steady_images_per_s: float | None):
    """Seconds to the last epoch's end at the steady rate; None before there is one."""
    if not steady_images_per_s:
        return None
    return round(max(steps_left, 0) * global_batch / steady_images_per_s, 1)


class ProgressFile:
    """Rank 0's progress.json; on other ranks (enabled=False) every call does nothing."""

    def __init__(
        self,
        model_dir: Path,
        *,
        enabled: bool,
        epochs: int,
        steps_per_epoch: int,
        global_batch: int,
        ranks: int = 1,
    ) -> None:
        self.path = Path(model_dir) / PROGRESS_FILE
        self.enabled = enabled
        self.epochs = epochs
        self.document: dict = {
            "phase": "training",
            "epoch": 1,
            "epochs": epochs,
            "step": 0,
            "steps_per_epoch": steps_per_epoch,
            "ranks": ranks,
            "global_step": 0,
            "images_per_s": None,
            "loss": None,
            "top1": None,
            "eta_s": None,
            "updated_at": None,
        }
        self.set_world(
            enabled=enabled, ranks=ranks, steps_per_epoch=steps_per_epoch, global_batch=global_batch
        )

    def set_world(self, *, enabled: bool, ranks: int, steps_per_epoch: int, global_batch: int):
        """After an elastic reset: the new world's ranks (the watcher's "nodes 7 of 8") and step
        length; rank 0 alone writes, and it may be another process than before."""
        self.enabled = enabled
        self.global_batch = global_batch
        self.total_steps = self.epochs * steps_per_epoch
        self.document.update(ranks=ranks, steps_per_epoch=steps_per_epoch)

    def log_step(
        self,
        *,
        epoch: int,
        step: int,
        global_step: int,
        images_per_s: float,
        loss: float,
        steady_images_per_s: float | None,
    ) -> None:
        """At a log step: `step` is the 1-based step within `epoch`; `steady_images_per_s` the
        rate without the first (compiling) interval, or None while there is only that one."""
        eta = eta_seconds(self.total_steps - global_step, self.global_batch, steady_images_per_s)
        self._write(
            phase="training",
            epoch=epoch,
            step=step,
            global_step=global_step,
            images_per_s=round(float(images_per_s), 1),
            loss=round(float(loss), 4),
            eta_s=eta,
        )

    def evaluating(self) -> None:
        self._write(phase="evaluating")

    def evaluated(self, top1: float) -> None:
        self._write(phase="evaluating", top1=round(float(top1), 4))

    def _write(self, **changes) -> None:
        if not self.enabled:
            return
        self.document.update(changes, updated_at=utc_now())
        # Readers (the node's status thread) never see half a file: write, then rename.
        partial = self.path.with_name(f".{PROGRESS_FILE}.{os.getpid()}")
        partial.write_text(json.dumps(self.document) + "\n")
        partial.replace(self.path)


def write_node_steps(model_dir: Path, global_step: int) -> None:
    """node-steps.json: the global step this node's ranks have seen done, and when."""
    path = Path(model_dir) / NODE_STEPS_FILE
    partial = path.with_name(f".{NODE_STEPS_FILE}.{os.getpid()}")
    partial.write_text(json.dumps({"global_step": global_step, "at": utc_now()}) + "\n")
    partial.replace(path)
