"""Each node's start-up on the record: runs/<run>/phases/<node>.json (docs/contracts.md,
"Start-up, resets and goodput").

A node measures its own phases: from EC2's launch to the kernel's start (`launch`), to the node
script's first step (`boot`), the shell's steps (bootstrap/lib.sh writes them to
<state_dir>/shell-steps.tsv), and the Python bootstrap's own (health, the data pull, the
rendezvous, the allreduce check); the trainer's start-up comes from its
<model-dir>/startup.json, copied as soon as it appears. The record is rewritten in S3 at each
phase's end (a few writes an attempt, each one quick try: a missed write is made again with the
next). It is also kept in <state_dir>/phases.json, so a bootstrap restarted in place keeps the
attempt's `launch` and `boot` (the instance booted once) and measures the rest again.

The record also says how the node came back for its attempt (`came_back`: rebooted, started or
replaced, as the run controller's relaunch says in controller.json's `relaunch`; null for the
deployment's first attempt, and for a node the relaunch did not bring back, such as one the
tick replaced while the attempt went on), which the head copies into DONE.json's `attempts`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path

from bootstrap import aws
from bootstrap.lines import one_line
from bootstrap.node_config import TrainConfig
from bootstrap.records.files import read_json, save_json
from contract.runs import parse_stamp_s, stamp_at

FORMAT = "horovod-fleet/phases/1"
# The closed list, in start-up order (docs/contracts.md).
PHASES = (
    "launch", "boot", "image_check", "instance_store", "health", "data_pull", "own_shards",
    "rendezvous", "allreduce_check", "framework_start", "first_step",
)  # fmt: skip
# train_node.sh's steps (bootstrap/lib.sh `step`) that are phases; its "gpu fabric" step is part
# of `health`, with the Python bootstrap's GPU and EFA checks.
SHELL_PHASES = {"training image": "image_check", "instance store": "instance_store"}
FABRIC_STEP = "gpu fabric"
SHELL_STEPS = "shell-steps.tsv"
LOCAL_RECORD = "phases.json"
STARTUP = "startup.json"  # the trainer's, in its model dir (docs/contracts.md)
FOLLOW_EVERY_S = 5.0
QUICK = aws.RetryPolicy(budget_s=0)


def kernel_started_at(now: float, uptime_path: str | Path = "/proc/uptime") -> float | None:
    """When this machine's kernel started: now less its uptime (proc(5)), or None unreadable."""
    try:
        return now - float(Path(uptime_path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def read_shell_steps(path: str | Path, since: float) -> dict[str, tuple[float, float]]:
    """{step: (start, end)} of train_node.sh's finished steps that started at or after `since`
    (this boot's), the newest of each; lines it cannot read are left out."""
    steps: dict[str, tuple[float, float]] = {}
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return steps
    for line in lines:
        fields = line.split("\t")
        if len(fields) != 3:
            continue
        try:
            start, end = float(fields[1]), float(fields[2])
        except ValueError:
            continue
        if start >= since and end >= start:
            steps[fields[0]] = (start, end)
    return steps


def launched_at(cfg: TrainConfig, instance_id: str, log=aws.log) -> float | None:
    """When EC2 last launched this instance (DescribeInstances' LaunchTime: "The time that the
    instance was last launched", so a stopped and started node reports its start,
    https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_Instance.html); node.json's
    `launched_at` where there is no EC2 to ask (the rehearsal). None, said in one line, when EC2
    does not answer: the record then has no `launch` phase."""
    if cfg.launched_at:
        return parse_stamp_s(cfg.launched_at)
    try:
        found = aws.client("ec2", cfg.region).describe_instances(InstanceIds=[instance_id])
        return found["Reservations"][0]["Instances"][0]["LaunchTime"].timestamp()
    except Exception as exc:  # the record is a report: never a reason to stop
        log(f"phases: no launch time for {instance_id} ({one_line(exc)}): no 'launch' phase")
        return None


def span(start: float, end: float, **extra) -> dict:
    """One phase as the record holds it."""
    return {"start": stamp_at(start), "end": stamp_at(end), "s": round(end - start, 1), **extra}


class PhaseRecord:
    """This node's phases of its current attempt, in S3 and in its state_dir. Thread-safe: the
    data pull and the trainer's follower record from their own threads."""

    def __init__(
        self,
        cfg: TrainConfig,
        s3,
        attempt: int,
        instance_id: str,
        ip: str,
        log: Callable[[str], None] = aws.log,
    ) -> None:
        self.cfg, self.s3, self.log = cfg, s3, log
        self.local = Path(cfg.state_dir) / LOCAL_RECORD
        self.key = f"{cfg.runs_prefix}phases/{cfg.node_name}.json"
        self.lock = threading.Lock()
        self.unsaved = False
        self.fabric: tuple[float, float] | None = None  # the shell's GPU fabric step, if any
        kept = read_json(self.local)
        if (kept.get("run"), kept.get("attempt")) == (cfg.run, attempt):
            phases = {k: v for k, v in kept.get("phases", {}).items() if k in ("launch", "boot")}
            launched = kept.get("launched_at")
        else:
            phases, launched = {}, None
        self.doc = {
            "format": FORMAT, "run": cfg.run, "attempt": attempt, "node": cfg.node_name,
            "instance_id": instance_id, "ip": ip, "launched_at": launched, "came_back": None,
            "phases": phases,
        }  # fmt: skip
        # The first attempt was launched by the deployment; a later one's relaunch is read from
        # controller.json, once its try went through (a node may boot before it says so).
        self.came_back_known = attempt <= 1

    @property
    def phases(self) -> dict[str, dict]:
        return self.doc["phases"]

    def begin(self, launched: float | None, kernel_started: float | None, now: float) -> None:
        """The phases before the Python bootstrap: launch, boot and the shell's steps. A kernel
        that seems to have started before the launch is the rehearsal's host (its processes are
        the nodes): the node's boot then runs from its launch."""
        booted = kernel_started
        if launched is not None and (booted is None or booted < launched):
            booted = launched
        steps = read_shell_steps(Path(self.cfg.state_dir) / SHELL_STEPS, booted or 0.0)
        with self.lock:
            if "launch" not in self.phases and launched is not None and booted is not None:
                self.doc["launched_at"] = stamp_at(launched)
                self.phases["launch"] = span(launched, booted)
            first = min((start for start, _ in steps.values()), default=None)
            if "boot" not in self.phases and booted is not None and first is not None:
                self.phases["boot"] = span(booted, first)
            for step, code in SHELL_PHASES.items():
                if step in steps:
                    self.phases[code] = span(*steps[step])
            self.fabric = steps.get(FABRIC_STEP)
        self.save()

    def measure(self, code: str, start: float, end: float, **extra) -> None:
        if code not in PHASES:
            raise ValueError(f"unknown phase {code!r}")
        with self.lock:
            self.phases[code] = span(start, end, **extra)
        self.save()

    def health(self, start: float, end: float) -> None:
        """`health`: the shell's GPU fabric step and the Python checks; its seconds are the two
        steps' (the CloudWatch agent's start between them is not the node's health)."""
        fabric = self.fabric
        first = fabric[0] if fabric else start
        seconds = (fabric[1] - fabric[0] if fabric else 0.0) + (end - start)
        with self.lock:
            self.phases["health"] = {**span(first, end), "s": round(seconds, 1)}
        self.save()

    def learn_came_back(self) -> None:
        """How the run controller's relaunch brought this instance back for this attempt, from
        controller.json's `relaunch` (docs/contracts.md), once it says so; a quick read, made
        again with the next save while it does not."""
        if self.came_back_known:
            return
        key = f"{self.cfg.runs_prefix}controller.json"
        try:
            body = self.s3.with_policy(QUICK).get_object(Bucket=self.cfg.bucket, Key=key)
            relaunch = json.loads(body["Body"].read()).get("relaunch") or {}
        except Exception:  # absent, unreadable or S3 away: the next save asks again
            return
        if relaunch.get("attempt") != self.doc["attempt"] or "nodes" not in relaunch:
            return
        mine = (relaunch["nodes"] or {}).get(self.doc["node"]) or {}
        with self.lock:
            if mine.get("instance_id") == self.doc["instance_id"]:
                self.doc["came_back"] = mine.get("came_back")
            self.came_back_known = True

    def save(self) -> None:
        """Locally, and one quick try in S3 (a failed one is made again with the next save)."""
        self.learn_came_back()
        with self.lock:
            body = json.dumps(self.doc, indent=1)
            save_json(self.local, self.doc)
        try:
            self.s3.with_policy(QUICK).put_object(
                Bucket=self.cfg.bucket, Key=self.key, Body=body.encode(),
                ContentType="application/json",
            )  # fmt: skip
            self.unsaved = False
        except Exception as exc:
            if not self.unsaved:
                self.log(
                    f"phases: could not write s3://{self.cfg.bucket}/{self.key}: {one_line(exc)}"
                )
            self.unsaved = True

    def trainer_started(self, startup: dict) -> bool:
        """The trainer's startup.json as the `framework_start` and `first_step` phases; False
        while it lacks them."""
        try:
            started = parse_stamp_s(startup["started_at"])
            first_end = parse_stamp_s(startup["first_step_at"])
            framework_s, first_s = (
                float(startup["framework_start_s"]),
                float(startup["first_step_s"]),
            )
        except (KeyError, TypeError, ValueError):
            return False
        with self.lock:
            self.phases["framework_start"] = span(started, started + framework_s)
            self.phases["first_step"] = span(first_end - first_s, first_end)
        self.save()
        return True

    def follow_trainer(self, model_dir: Path, since: float) -> TrainerFollower:
        follower = TrainerFollower(self, Path(model_dir) / STARTUP, since)
        follower.start()
        return follower


class TrainerFollower(threading.Thread):
    """Copies this node's startup.json into its record once this attempt's trainer writes it
    (a file older than `since` is an earlier attempt's); retries a record S3 did not take."""

    def __init__(self, record: PhaseRecord, path: Path, since: float, every_s=FOLLOW_EVERY_S):
        super().__init__(name="phases-trainer", daemon=True)
        self.record, self.path, self.since, self.every_s = record, path, since, every_s
        self.stopped = threading.Event()
        self.copied = False

    def poll(self) -> None:
        if not self.copied:
            try:
                fresh = self.path.stat().st_mtime >= self.since
            except OSError:
                fresh = False
            if fresh:
                self.copied = self.record.trainer_started(read_json(self.path))
        if self.record.unsaved:
            self.record.save()

    def run(self) -> None:
        while not self.stopped.wait(self.every_s):
            self.poll()
            if self.copied and not self.record.unsaved:
                return

    def stop(self) -> None:
        """A last look, then no more."""
        self.stopped.set()
        self.poll()


def read_records(s3, cfg: TrainConfig, attempt: int) -> list[dict]:
    """Every node's record of `attempt` in runs/<run>/phases/ (others are earlier attempts')."""
    prefix = f"{cfg.runs_prefix}phases/"
    records = []
    for key in aws.list_sizes(s3, cfg.bucket, prefix):
        body = s3.get_object(Bucket=cfg.bucket, Key=f"{prefix}{key}")["Body"].read()
        try:
            doc = json.loads(body)
        except ValueError:
            continue
        if isinstance(doc, dict) and doc.get("attempt") == attempt and doc.get("run") == cfg.run:
            records.append(doc)
    return records
