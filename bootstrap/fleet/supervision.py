"""The head's bootstrap supervises the run; this module keeps it from being a single point of
failure (docs/contracts.md, "A run as it goes").

- The training processes die with it: horovodrun runs under `python3 -m bootstrap.fleet.supervision
  PID -- COMMAND...`, which sets the kernel's parent-death signal (SIGKILL) and execs COMMAND, so
  a bootstrap killed outright takes horovodrun along; horovodrun's own middlemen then end the
  ranks they started (horovod 0.28.1 horovod/runner/common/util/safe_shell_exec.py,
  kill_executor_children_if_parent_dies). Every training process carries JOB_ENV, so the
  restarted bootstrap (systemd restarts the node service) ends whatever is left before it
  rendezvouses again and resumes from the newest checkpoint in S3.
- Heartbeats: the head rewrites runs/<run>/head.json every heartbeat_timeout_s / 4 until
  DONE.json is written, as every node rewrites its registration. A node whose head's heartbeat
  goes stale fails in one line naming it instead of waiting for DONE.json forever; but a stalled
  head is not a lost one: while the node's own ranks step (node-steps.json, which its local
  rank 0 rewrites at each check step), it waits for the head up to head_silence_bound_s.
- A failed training names a node whose heartbeat went stale (its network or its instance died)
  as `node <index> (<instance_id>, <ip>)`, before any rank on a surviving node is blamed.
- A heartbeat is only as fresh as S3 lets it be: while S3 did not answer, no node could rewrite
  its heartbeat or see another's. After an outage, staleness is counted from when S3 answered
  this node again (aws.s3_answered_again_at), so an outage longer than heartbeat_timeout_s
  never makes a node blame another.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from bootstrap import aws
from bootstrap.fleet.rendezvous import read_object
from bootstrap.lines import one_line
from bootstrap.node_config import TrainConfig
from contract import runs
from contract.runs import parse_stamp_s

JOB_ENV = "HOROVOD_FLEET_JOB"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>; prctl(2)


def job_id(cfg: TrainConfig) -> str:
    """What marks this run's training processes on this machine (the endpoint too: rehearsals
    of the same run name may share a machine, each with its own S3)."""
    return f"s3://{cfg.bucket}/{cfg.runs_prefix}@{os.environ.get('AWS_ENDPOINT_URL', '')}"


def guarded(command: list[str]) -> list[str]:
    """command, killed by the kernel when this process dies."""
    return ["python3", "-m", "bootstrap.fleet.supervision", str(os.getpid()), "--", *command]


def die_with_parent_and_exec(parent: int, command: list[str]) -> NoReturn:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # the parent died before the signal was armed
        sys.exit(f"bootstrap.fleet.supervision: parent {parent} is gone; not starting {command[0]}")
    os.execvp(command[0], command)


def processes_of(job: str, own: int | None = None) -> list[int]:
    """Processes whose environment carries JOB_ENV=job, this one and its ancestors excluded."""
    own = own if own is not None else os.getpid()
    entry = f"{JOB_ENV}={job}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == own:
            continue
        try:
            if entry in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except OSError:  # gone, or not ours to read
            continue
    return found


def end_leftovers(cfg: TrainConfig, log: Callable[[str], None] = aws.log) -> list[int]:
    """A restarted head first ends the training its dead predecessor left running: a second
    horovodrun would fight it for the GPUs and the model dir. Returns the pids it killed."""
    pids = processes_of(job_id(cfg))
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
    if pids:
        log(
            f"ended {len(pids)} training process(es) a previous bootstrap of this node left "
            f"running (pids {', '.join(map(str, pids[:8]))}): the run resumes from S3"
        )
    return pids


class Heartbeat(threading.Thread):
    """Calls beat() every interval_s until stopped; a failed beat is one line, the next retries."""

    def __init__(self, beat: Callable[[], object], interval_s: float, log=aws.log):
        super().__init__(daemon=True, name="heartbeat")
        self.beat, self.interval_s, self.log = beat, interval_s, log
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.interval_s):
            try:
                self.beat()
            except Exception as exc:
                self.log(f"heartbeat failed, retrying in {self.interval_s:.0f} s: {one_line(exc)}")

    def stop(self) -> None:
        self.stopped.set()


def heartbeat_interval(cfg: TrainConfig) -> float:
    return cfg.heartbeat_timeout_s / 4


def name_node(entry: dict) -> str:
    return f"node {entry['index']} ({entry.get('instance_id')}, {entry.get('ip')})"


def read_entry(s3, cfg: TrainConfig, index: int) -> dict | None:
    body = read_object(s3, cfg.bucket, f"{cfg.runs_prefix}{runs.NODES}{index}.json")
    return json.loads(body) if body else None


def stale_for(beat: float | None, now: float, s3_back_at: float | None) -> float:
    """How long a heartbeat has gone unrefreshed as far as this node can tell: since the beat,
    or since S3 answered this node again when that is later."""
    return now - max(beat or 0.0, s3_back_at or 0.0)


def since_s3_returned(beat: float | None, now: float, s3_back_at: float | None) -> str:
    """What a verdict adds when it counted from S3's return rather than from the beat."""
    if s3_back_at is None or s3_back_at <= (beat or 0.0):
        return ""
    return f"; counted from S3 answering this node again {now - s3_back_at:.0f} s ago"


def read_head(s3, cfg: TrainConfig) -> dict | None:
    body = read_object(s3, cfg.bucket, f"{cfg.runs_prefix}{runs.HEAD}")
    return json.loads(body) if body else None


def name_head(entry: dict | None) -> str:
    if entry is None:
        return "the head"
    return f"the head ({entry.get('instance_id')}, {entry.get('ip')})"


# The trainer's node-steps.json (trainer/progress.py NODE_STEPS_FILE, mirrored: bootstrap starts
# the trainer as a process and never imports it): in the node's model dir.
NODE_STEPS_FILE = "node-steps.json"
# The start-up phases a relaunch that keeps every node's data does not run again (issue 47: the
# nodes come back in place with their instance stores; stacks/startup_estimate.py's codes).
PULL_PHASES = ("own_shards", "data_pull")
# The ranks step while their last write of node-steps.json is younger than this many times the
# longest gap seen between two (a step of 30 s on a loaded CPU, a reset), or heartbeat_timeout_s.
STEP_GAPS = 3


def ranks_stepped_at(model_dir: Path) -> float | None:
    """When this node's ranks last had steps done (node-steps.json's modification, this node's
    clock), or None when they never wrote it."""
    try:
        return (Path(model_dir) / NODE_STEPS_FILE).stat().st_mtime
    except OSError:
        return None


def head_silence_bound_s(cfg: TrainConfig) -> float:
    """How long a node whose ranks still step waits for a silent head before it ends the
    attempt: what a relaunch takes to have the fleet stepping again, node.json's start-up budget
    without the data pull (the relaunch keeps every node's data; launch and boot count, as a
    lost head's instance is launched again). Past it a relaunch started when the head went
    silent would be training already, and the steps the ranks take without the head reach no
    S3 (the head is the only uploader): waiting longer only loses more. Without a budget (the
    rehearsal's node.json), rendezvous_timeout_s: the longest a start-up may take. Never less
    than heartbeat_timeout_s."""
    budget = cfg.startup_budget_s
    if budget:
        relaunch = sum(s for phase, s in budget.items() if phase not in PULL_PHASES)
    else:
        relaunch = cfg.rendezvous_timeout_s
    return max(float(cfg.heartbeat_timeout_s), float(relaunch))


class HeadWatch:
    """A node's view of the head's heartbeat: lost once it was seen alive and then went stale,
    or never seen alive within rendezvous_timeout_s of this node's start; never while S3
    answered this node again less than heartbeat_timeout_s ago.

    A stalled head is not a lost one: horovodrun's workers need its driver only at a reset
    (horovod/runner/elastic/driver.py v0.28.1: the driver notifies rank 0 of host changes and
    runs the rendezvous of a new world; a world's collectives run between the ranks), so the
    ranks train on through a head paused by a slow disk or a stuck thread. While this node's
    ranks step (`ranks_stepped_at()` within stepping_window_s: heartbeat_timeout_s, or
    STEP_GAPS times the longest gap this watch saw between two of their writes when that is
    longer, as on a loaded CPU) a stale head heartbeat ends nothing; the head is lost once
    they stop, or once it has been silent for head_silence_bound_s."""

    def __init__(
        self,
        cfg: TrainConfig,
        started: float,
        s3_back_at: Callable[[], float | None] = aws.s3_answered_again_at,
        ranks_stepped_at: Callable[[], float | None] = lambda: None,
        log: Callable[[str], None] = aws.log,
    ):
        self.cfg, self.started, self.s3_back_at = cfg, started, s3_back_at
        self.ranks_stepped_at, self.log = ranks_stepped_at, log
        self.seen_alive = False
        self.bound_s = head_silence_bound_s(cfg)
        self.waiting_since: float | None = None  # the beat of the silence this node waits out
        # This attempt's writes of node-steps.json as this watch saw them, and the longest gap.
        self.last_stepped: float | None = None
        self.longest_gap_s = 0.0

    def stepping_window_s(self) -> float:
        """How recent the ranks' last step must be for them to count as stepping."""
        return max(float(self.cfg.heartbeat_timeout_s), STEP_GAPS * self.longest_gap_s)

    def stepped(self) -> float | None:
        """When this attempt's ranks last stepped (a file left by an earlier attempt on a node
        kept in place does not count), learning the gaps between their writes."""
        stepped = self.ranks_stepped_at()
        if stepped is None or stepped < self.started:
            return None
        if self.last_stepped is not None and stepped > self.last_stepped:
            self.longest_gap_s = max(self.longest_gap_s, stepped - self.last_stepped)
        self.last_stepped = max(stepped, self.last_stepped or stepped)
        return stepped

    def lost(self, entry: dict | None, now: float) -> str | None:
        key = f"s3://{self.cfg.bucket}/{self.cfg.runs_prefix}{runs.HEAD}"
        timeout = self.cfg.heartbeat_timeout_s
        beat = parse_stamp_s(entry["registered_at"]) if entry else None
        stepped = self.stepped()
        if beat is not None and now - beat <= timeout:
            if self.waiting_since is not None:
                self.log(f"{name_head(entry)} beats again after {now - self.waiting_since:.0f} s")
                self.waiting_since = None
            self.seen_alive = True
            return None
        back = self.s3_back_at()
        silent = stale_for(beat, now, back)
        if silent <= timeout:
            return None  # S3 answered again too recently for the head to have beaten since
        who = name_head(entry)
        counted = since_s3_returned(beat, now, back)
        if self.seen_alive:
            stepping = stepped is not None and now - stepped <= self.stepping_window_s()
            if stepping and silent <= self.bound_s:
                if self.waiting_since != beat:
                    self.waiting_since = beat
                    self.log(
                        f"{who} is silent: its heartbeat {key} is {now - beat:.0f} s old, but "
                        f"this node's ranks stepped {now - stepped:.0f} s ago: a stalled head, "
                        f"waited for up to {self.bound_s:.0f} s of silence (a relaunch's "
                        "start-up) while they step"
                    )
                return None
            why = (
                f"silent for {silent:.0f} s, past the {self.bound_s:.0f} s a relaunch takes, "
                "though this node's ranks still step"
                if stepping
                else "and this node's ranks are not stepping"
                + (f" (their last step {now - stepped:.0f} s ago)" if stepped else "")
            )
            return (
                f"{who} is lost: its heartbeat {key} is {now - beat:.0f} s old "
                f"(heartbeat_timeout_s {timeout:.0f}{counted}) {why}; this node stops waiting "
                "for the run's DONE.json"
            )
        if now - self.started > self.cfg.rendezvous_timeout_s:
            since = f"last beat {now - beat:.0f} s ago" if entry else "no heartbeat at all"
            return (
                f"{who} did not heartbeat ({key}) within "
                f"{self.cfg.rendezvous_timeout_s:.0f} s of this node's start ({since}{counted})"
            )
        return None


def lost_nodes(
    s3,
    cfg: TrainConfig,
    failed_at: float,
    clock=time.time,
    sleep=time.sleep,
    s3_back_at: Callable[[], float | None] = aws.s3_answered_again_at,
) -> list[str]:
    """After a failed training, the nodes whose heartbeat went stale, named. Waits until each
    node has either beaten since failed_at (alive: nodes keep beating after their ranks end) or
    gone heartbeat_timeout_s without a beat (lost), counted from S3's return to the head when
    that is later."""
    pending = set(range(cfg.nodes))
    lost: list[str] = []
    wait_s = cfg.heartbeat_timeout_s + heartbeat_interval(cfg) + cfg.poll_interval_s
    while pending:
        for index in sorted(pending):
            entry = read_entry(s3, cfg, index)
            # After the read, which may have waited through an outage.
            now, back = clock(), s3_back_at()
            last = parse_stamp_s(entry["registered_at"]) if entry else 0.0
            if last >= math.floor(failed_at):  # heartbeats carry whole seconds
                pending.discard(index)
            elif stale_for(last, now, back) > cfg.heartbeat_timeout_s:
                pending.discard(index)
                lost.append(
                    f"{name_node(entry or {'index': index})} lost: no heartbeat for "
                    f"{now - last:.0f} s (heartbeat_timeout_s {cfg.heartbeat_timeout_s:.0f}"
                    f"{since_s3_returned(last, now, back)})"
                )
        if not pending or clock() >= max(failed_at, s3_back_at() or 0.0) + wait_s:
            break
        sleep(min(cfg.poll_interval_s, heartbeat_interval(cfg)))
    return lost


def beaten_since(
    s3, cfg: TrainConfig, indexes: list[int], since: float, clock=time.time, sleep=time.sleep
) -> set[int]:
    """The nodes among `indexes` whose heartbeat was rewritten at or after `since`, waiting a
    heartbeat interval and a poll for each to show (a node beats every poll_interval_s at
    most): the nodes alive after a failure, where a dead host's heartbeat is not stale yet."""
    alive: set[int] = set()
    deadline = clock() + heartbeat_interval(cfg) + cfg.poll_interval_s
    while True:
        for index in sorted(set(indexes) - alive):
            entry = read_entry(s3, cfg, index)
            if entry and parse_stamp_s(entry["registered_at"]) >= math.floor(since):
                alive.add(index)
        if alive >= set(indexes) or clock() >= deadline:
            return alive
        sleep(min(cfg.poll_interval_s, heartbeat_interval(cfg)))


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdigit():
        print(
            "usage: python3 -m bootstrap.fleet.supervision PARENT_PID -- COMMAND...",
            file=sys.stderr,
        )
        return 2
    die_with_parent_and_exec(int(argv[0]), argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
