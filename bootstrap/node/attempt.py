"""Each training node's local record of the attempt it runs (its restarts in place), and what a
node reads back of the trainer's outputs: only what this attempt wrote counts."""

from __future__ import annotations

import contextlib
import shutil
import time
from pathlib import Path
from typing import Protocol

from bootstrap import aws
from bootstrap.fleet import supervision
from bootstrap.node_config import TrainConfig
from bootstrap.records import checkpoint_names
from bootstrap.records.files import read_json, save_json, this_attempts
from bootstrap.records.status import RunStatus
from contract.runs import parse_stamp_s, stamp_at

ATTEMPT_RECORD = "attempt.json"


class CheckpointUploads(Protocol):
    """The head's model store (bootstrap/head/checkpoints.py ModelStore), as the attempt's end
    uses it: one last upload of the checkpoints."""

    def upload(self, policy: aws.RetryPolicy | None = None) -> int: ...


class Attempt:
    """What this node's bootstrap knows of the attempt it runs, for its DONE.json: when it began,
    its model store (None until the restore step, and on members), and its restarts in place.

    The node keeps a record of the attempt in its state_dir, `attempt.json` = {"run", "attempt",
    "started_at", "restarts": [{"at", "resumed_from_step", "reached_step"}], "ended_at"}. A
    record of the same run and attempt that no bootstrap ended (`ended_at` absent) means
    systemd restarted this one in place after it was killed: the attempt keeps its first start
    and gains a restart, with the last step the previous process's trainer reached (its
    progress.json; null when it wrote none) and, once restored, the step the trainer resumes
    from. An ended record (a rerun of the run after a reboot) starts the attempt anew.

    A node that begins a new attempt over an earlier one's record came back in place (the run
    controller rebooted it: its disks kept): its model dir holds the earlier trainer's outputs
    (progress, checkpoints the head never committed, resets, start-up), which it must never
    train on or report. It empties the model dir before anything reads it; the head puts the
    restored checkpoints there. The head keeps its own: its restore reuses only checkpoint files
    whose sha256 S3 vouches for, and reads trainer outputs written since its attempt began."""

    def __init__(self) -> None:
        self.started = time.time()
        self.store: CheckpointUploads | None = None
        self.outputs_since: float | None = None
        self.heartbeat: supervision.Heartbeat | None = None  # the instance's, once registered
        self.status: RunStatus | None = None  # status.json (published by the head only)
        self.earlier: list[dict] = []  # the run controller's record of the attempts before
        self.record: Path | None = None
        self.restarts: list[dict] = []
        self.number = 1  # one more than `earlier`, once begun

    def begin(self, cfg: TrainConfig, model_dir: Path, log=aws.log) -> None:
        """Take up the attempt's record (its number: one more than `earlier`)."""
        self.record = Path(cfg.state_dir) / ATTEMPT_RECORD
        self.number = number = len(self.earlier) + 1
        record = read_json(self.record)
        left_open = "ended_at" not in record
        if left_open and (record.get("run"), record.get("attempt")) == (cfg.run, number):
            since = parse_stamp_s(record["started_at"])
            reached = this_attempts(model_dir / "progress.json", since).get("global_step")
            restart = {"at": stamp_at(self.started), "resumed_from_step": None,
                       "reached_step": reached}  # fmt: skip
            record["restarts"] = [*record.get("restarts", []), restart]
        else:
            if record and not cfg.is_head:
                left = forget_outputs(model_dir)
                if left:
                    log(f"came back in place from {record.get('run')} attempt "
                        f"{record.get('attempt')}: removed its trainer outputs ({left}) from "
                        f"{model_dir}")  # fmt: skip
            record = {"run": cfg.run, "attempt": number, "started_at": stamp_at(self.started),
                      "restarts": []}  # fmt: skip
        save_json(self.record, record)
        self.started, self.restarts = parse_stamp_s(record["started_at"]), record["restarts"]
        line = f"attempt {number} of run {cfg.run}"
        if self.restarts:
            line += (
                f", restarted in place (restart {len(self.restarts)}): the attempt began at "
                f"{record['started_at']}, its trainer had reached step "
                f"{self.restarts[-1]['reached_step']}"
            )
        log(line)

    def resumes_from(self, model_dir: Path) -> None:
        """Note the step a restarted attempt's trainer resumes from: the restored checkpoint's."""
        record = read_json(self.record) if self.record else {}
        restarts = record.get("restarts", [])
        if restarts and restarts[-1].get("resumed_from_step") is None:
            name = checkpoint_names.newest_named(model_dir)
            restarts[-1]["resumed_from_step"] = checkpoint_names.step_of(name) if name else None
            save_json(self.record, record)
            self.restarts = restarts

    def end(self) -> None:
        """Mark the record ended: only a bootstrap killed mid-attempt leaves it open."""
        if self.record is None:
            return
        record = read_json(self.record)
        with contextlib.suppress(OSError):  # a full disk must not hide the failure reported
            save_json(self.record, {**record, "ended_at": stamp_at(time.time())})


def forget_outputs(model_dir: Path) -> str:
    """Empty an earlier attempt's model dir; what it held, for the log ('' when nothing)."""
    try:
        names = sorted(p.name for p in Path(model_dir).iterdir())
    except OSError:
        return ""
    shutil.rmtree(model_dir, ignore_errors=True)
    shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
    return shown
