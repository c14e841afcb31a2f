"""The head's runs/<run>/status.json, its CloudWatch metrics and its e-mails (docs/contracts.md,
"A run as it goes").

The head says which phase it is in; a thread rewrites status.json at each phase change and, while
the trainer runs, every node.json status_every_s (15 s) from the trainer's progress.json, with the nodes
whose heartbeat is fresh and the newest checkpoint in S3. Each new progress.json also becomes one
line of CloudWatch embedded metric format (EMF) in <log_dir>/metrics.log, which the baked
CloudWatch agent ships to the run's log group like every other log file; CloudWatch Logs then
extracts the metrics (specification:
https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/CloudWatch_Embedded_Metric_Format_Specification.html;
the x-amzn-logs-format header is optional for PutLogEvents:
https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/CloudWatch_Embedded_Metric_Format_Generation_PutLogEvents.html).
With a topic in node.json, the start of training and the end of the run are published to SNS.

Watching must never cost the run: every S3 and SNS call here is best effort, on the thread, with
one quick try (a failure is one log line and the next write tries again). An S3 outage is not a
line per call: one when S3 stops answering, about one a minute while it lasts, with its true
age, and one when S3 answers again (OutageLog).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

from bootstrap import aws
from bootstrap.lines import one_line
from bootstrap.node_config import TrainConfig
from contract import runs
from contract.records import STATUS_FORMAT
from contract.runs import parse_stamp_s, stamp_at

PHASES = (
    "booting", "pulling_data", "allreduce_check", "training", "evaluating", "uploading",
    "done", "failed", "interrupted",
)  # fmt: skip
ENDED = ("done", "failed", "interrupted")
METRICS_LOG = "metrics.log"
# The EMF metrics (namespace and Run dimension from node.json `metrics`); the dashboard in
# stacks/train/dashboard.py graphs the same names.
METRIC_UNITS = {
    "images_per_s": "Count/Second",
    "loss": "None",
    "top1": "None",
    "usd_so_far": "None",
    "attempt": "Count",
}
# One try, quickly: a status that misses a beat is rewritten 15 s later.
QUICK = aws.RetryPolicy(budget_s=0)
OUTAGE_NOTE_EVERY_S = 60
_CHECKPOINT = re.compile(r"ckpt-(\d+)\.index$")


class OutageLog:
    """The status writer's lines about an S3 outage: one when its calls stop being answered, one
    about every minute while that lasts (the age counted from the first failure), one when S3
    answers again. Thread-safe: the status thread and the bootstrap's own thread both call S3."""

    def __init__(
        self, log: Callable[[str], None], clock: Callable[[], float], every_s=OUTAGE_NOTE_EVERY_S
    ):
        self.log, self.clock, self.every_s = log, clock, every_s
        self.lock = threading.Lock()
        self.since: float | None = None
        self.next_note = 0.0

    def unanswered(self, what: str, error: BaseException) -> None:
        with self.lock:
            now = self.clock()
            last = one_line(error.__cause__ or error)
            if self.since is None:
                self.since, self.next_note = now, now + self.every_s
                self.log(
                    f"status: S3 unreachable since {stamp_at(now)} (could not {what}: {last}); "
                    "status.json is rewritten once it answers"
                )
            elif now >= self.next_note:
                self.next_note = now + self.every_s
                self.log(
                    f"status: S3 unreachable for {now - self.since:.0f} s (since "
                    f"{stamp_at(self.since)}); last error: {last}"
                )

    def answered(self) -> None:
        with self.lock:
            if self.since is not None:
                self.log(f"status: S3 answers again after {self.clock() - self.since:.0f} s")
                self.since = None


class RunStatus:
    """What the head publishes about its run. Nodes get one too, which does nothing."""

    def __init__(
        self,
        cfg: TrainConfig,
        s3,
        model_dir: Path,
        *,
        attempt_started: float,
        log: Callable[[str], None] = aws.log,
        sns=None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cfg, self.s3, self.sns, self.log, self.clock = cfg, s3, sns, log, clock
        self.progress_path = Path(model_dir) / "progress.json"
        self.metrics_path = Path(cfg.log_dir) / METRICS_LOG
        self.enabled = cfg.is_head
        self.attempt_started = attempt_started
        self.earlier: list[dict] | None = None  # attempts.json's entries, once read
        self.current = "booting"
        self.reason: str | None = None
        self.progress: dict | None = None
        self.emitted_at: str | None = None
        self.notified: set[str] = set()
        self.outage = OutageLog(log, clock)
        # status.json's `goodput` (docs/contracts.md): live(progress) while the trainer runs,
        # DONE.json's figures once the attempt has ended.
        self.live_goodput: Callable[[dict], dict | None] | None = None
        self.final_goodput: dict | None = None
        # status.json's `resets` (docs/contracts.md): live() while the trainer runs (rank 0's
        # resets.json, its hosts named as nodes), DONE.json's once the attempt has ended.
        self.live_resets: Callable[[], list[dict]] | None = None
        self.final_resets: list[dict] | None = None
        # status.json's `nodes_silent`: the nodes the head's discovery leaves out for a stale
        # heartbeat (judged as every heartbeat is, after an S3 outage too); the run controller
        # replaces a running node only on this word.
        self.silent: Callable[[], list[str]] = list
        self.wake = threading.Event()
        self.stopping = False
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._follow, name="run-status", daemon=True)
        if self.enabled:
            self.thread.start()

    def phase(self, phase: str, reason: str | None = None) -> None:
        """A phase change: published now (on the thread)."""
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}")
        self.current, self.reason = phase, reason
        self.wake.set()

    def end(
        self, phase: str, reason: str | None, wait_s: float = 30, record: dict | None = None
    ) -> None:
        """The attempt's last word: publish it and wait (bounded) until it is out. `record`:
        the DONE.json about to be written, whose goodput status.json carries."""
        if record is not None:
            self.final_goodput = goodput_of(record)
            self.final_resets = record.get("resets")
        self.phase(phase, reason)
        self.stopping = True
        self.wake.set()
        if self.enabled:
            self.thread.join(wait_s)

    # ------------------------------------------------------------ on the thread

    def _follow(self) -> None:
        while True:
            self.wake.wait(self.cfg.status_every_s)
            self.wake.clear()
            stopping = self.stopping
            self.publish()
            if stopping:
                return

    def publish(self) -> dict:
        """Read progress.json, write status.json, the metrics line and any e-mail due."""
        with self.lock:
            phase = self.current
            if phase in ("training", "evaluating", "uploading", *ENDED):
                self._read_progress()
            if phase == "training" and self.progress:
                phase = self.progress["phase"]  # the trainer knows when it evaluates
            doc = self.document(phase)
            self._s3("write status.json", lambda: self._put(doc))
            self._notify(doc)
            return doc

    def document(self, phase: str) -> dict:
        cfg = self.cfg
        return {
            "format": STATUS_FORMAT,
            "run": cfg.run,
            "attempt": self._attempt(),
            "phase": phase,
            "updated_at": stamp_at(self.clock()),
            "attempt_started_at": stamp_at(self.attempt_started),
            "instance_type": cfg.instance_type,
            "nodes": cfg.nodes,
            "gpus_per_node": cfg.gpus_per_node,
            "nodes_healthy": self._s3("count healthy nodes", self._nodes_healthy),
            "nodes_training": self._nodes_training(),
            "nodes_silent": [] if phase in ENDED else self.silent(),
            "progress": self.progress,
            "checkpoint": self._s3("find the newest checkpoint", self._newest_checkpoint),
            "reason": self.reason if phase in ENDED else None,
            "cost": cfg.cost,
            "goodput": self._goodput(),
            "resets": self._resets(),
        }

    def _nodes_training(self) -> int | None:
        """The nodes in the trainer's current world (progress.json's `ranks` over the slots of
        a node); null before the trainer's first log step."""
        ranks = (self.progress or {}).get("ranks")
        return None if ranks is None else -(-ranks // self.cfg.slots)

    def _resets(self) -> list[dict]:
        if self.final_resets is not None:
            return self.final_resets
        if self.live_resets is None:
            return []
        try:
            return self.live_resets()
        except Exception as exc:  # a report, never a reason to stop
            self.log(f"status: could not read the resets: {one_line(exc)}")
            return []

    def _goodput(self) -> dict | None:
        if self.final_goodput is not None:
            return self.final_goodput
        if self.live_goodput is None or not self.progress:
            return None
        try:
            return self.live_goodput(self.progress)
        except Exception as exc:  # a report, never a reason to stop
            self.log(f"status: could not work out goodput: {one_line(exc)}")
            return None

    def _read_progress(self) -> None:
        try:
            progress = json.loads(self.progress_path.read_text())
        except (OSError, ValueError):
            return  # not written yet, or (never, it is renamed into place) half written
        self.progress = progress
        if progress.get("updated_at") != self.emitted_at:
            self.emitted_at = progress.get("updated_at")
            self._try("write the metrics line", lambda: self._emit_metrics(progress))

    def _emit_metrics(self, progress: dict) -> None:
        values = {k: progress.get(k) for k in METRIC_UNITS if progress.get(k) is not None}
        if not values:
            return
        if self.cfg.cost:
            # This attempt's fleet time at the table's price: the dashboard's spend.
            hours = (self.clock() - self.attempt_started) / 3600
            values["usd_so_far"] = round(self.cfg.cost["usd_per_hour"] * hours, 2)
        values["attempt"] = self._attempt()  # a relaunched run shows its count on the dashboard
        self.metrics_path.parent.mkdir(parents=True, exist_ok=True)
        with self.metrics_path.open("a") as out:
            out.write(json.dumps(emf_line(self.cfg, values, self.clock())) + "\n")

    def _put(self, doc: dict) -> None:
        self.s3.with_policy(QUICK).put_object(
            Bucket=self.cfg.bucket,
            Key=f"{self.cfg.runs_prefix}{runs.STATUS}",
            Body=json.dumps(doc, indent=1).encode(),
            ContentType="application/json",
        )

    def _attempt(self) -> int:
        """One more than the ended attempts the run controller recorded (1 without any)."""
        return len(self.earlier_attempts()) + 1

    def earlier_attempts(self) -> list[dict]:
        """The ended attempts the run controller recorded in attempts.json ([] without it, or
        when S3 cannot say: the count is a report, never a reason to stop). Read once per
        attempt (the controller writes it only between attempts); a failed read is retried."""
        if self.earlier is None:
            self.earlier = self._s3("read attempts.json", self._recorded_attempts)
        return self.earlier or []

    def _recorded_attempts(self) -> list[dict]:
        key = f"{self.cfg.runs_prefix}{runs.ATTEMPTS}"
        s3 = self.s3.with_policy(QUICK)
        if not s3.list_objects_v2(Bucket=self.cfg.bucket, Prefix=key).get("KeyCount"):
            return []
        body = s3.get_object(Bucket=self.cfg.bucket, Key=key)["Body"].read()
        return [e for e in json.loads(body).get("attempts", []) if isinstance(e, dict)]

    def _nodes_healthy(self) -> int:
        """Nodes whose heartbeat is younger than heartbeat_timeout_s."""
        now = self.clock()
        listing = self.s3.with_policy(QUICK).list_objects_v2(
            Bucket=self.cfg.bucket, Prefix=f"{self.cfg.runs_prefix}{runs.NODES}"
        )
        healthy = set()
        for obj in listing.get("Contents", []):
            body = self.s3.with_policy(QUICK).get_object(Bucket=self.cfg.bucket, Key=obj["Key"])
            entry = json.loads(body["Body"].read())
            if now - parse_stamp_s(entry["registered_at"]) <= self.cfg.heartbeat_timeout_s:
                healthy.add(entry["index"])
        return len(healthy)

    def _newest_checkpoint(self) -> dict | None:
        prefix = f"{self.cfg.runs_prefix}{runs.CHECKPOINTS}"
        found = aws.list_sizes(self.s3.with_policy(QUICK), self.cfg.bucket, prefix)
        steps = [int(m.group(1)) for key in found if (m := _CHECKPOINT.search(key))]
        if not steps:
            return None
        step = max(steps)
        key = f"{prefix}ckpt-{step}"
        head = self.s3.with_policy(QUICK).head_object(Bucket=self.cfg.bucket, Key=f"{key}.index")
        return {"key": key, "step": step, "at": runs.stamp(head["LastModified"])}

    def _notify(self, doc: dict) -> None:
        """E-mail (through the run's SNS topic) once when training starts and once at the end."""
        if not self.cfg.notify_topic_arn:
            return
        phase = doc["phase"]
        event = "end" if phase in ENDED else "start" if phase == "training" else None
        if event is None or event in self.notified:
            return
        subject, message = notification(doc)
        sent = self._try(
            "publish the notification",
            lambda: self._sns().publish(
                TopicArn=self.cfg.notify_topic_arn, Subject=subject, Message=message
            ),
        )
        if sent is not None:
            self.notified.add(event)

    def _sns(self):
        if self.sns is None:
            self.sns = aws.client("sns", self.cfg.region)
        return self.sns

    def _try(self, what: str, action: Callable[[], object]):
        try:
            return action()
        except Exception as exc:
            self.log(f"status: could not {what}: {one_line(exc)}")
            return None

    def _s3(self, what: str, action: Callable[[], object]):
        """_try for an action of S3 calls: an outage goes to the OutageLog, not a line per call."""
        try:
            result = action()
        except aws.S3Unavailable as exc:
            self.outage.unanswered(what, exc)
            return None
        except Exception as exc:
            self.log(f"status: could not {what}: {one_line(exc)}")
            return None
        self.outage.answered()
        return result


def goodput_of(record: dict) -> dict:
    """status.json's `goodput` from a DONE.json."""
    return {k: record.get(k) for k in ("goodput", "runtime_goodput")}


def emf_line(cfg: TrainConfig, values: dict, now: float) -> dict:
    """One EMF document: the values as metrics of node.json's namespace and dimension."""
    dimension = cfg.metrics["dimension"]
    return {
        "_aws": {
            "Timestamp": int(now * 1000),
            "CloudWatchMetrics": [
                {
                    "Namespace": cfg.metrics["namespace"],
                    "Dimensions": [sorted(dimension)],
                    "Metrics": [{"Name": k, "Unit": METRIC_UNITS[k]} for k in values],
                }
            ],
        },
        **dimension,
        **values,
    }


def notification(doc: dict) -> tuple[str, str]:
    """Subject (at most 100 characters, SNS's limit) and body of an e-mail about `doc`."""
    run, phase = doc["run"], doc["phase"]
    status = {"done": "succeeded", "failed": "failed", "interrupted": "was interrupted"}
    if phase in ENDED:
        subject = f"horovod-fleet: run {run} {status[phase]}"
    else:
        subject = f"horovod-fleet: run {run} started training"
    lines = [
        f"Run {run}, attempt {doc['attempt']}: {phase}",
        f"{doc['nodes']} x {doc['instance_type']}, {doc['nodes_healthy']} healthy",
    ]
    if doc["reason"]:
        lines.append(f"Reason: {doc['reason']}")
    progress = doc["progress"] or {}
    if progress:
        lines.append(
            f"Epoch {progress['epoch']}/{progress['epochs']}, loss {progress['loss']}, "
            f"top-1 {progress['top1']}"
        )
    lines.append(f"Watch it: horovod-fleet status --run {run}")
    return subject[:100], "\n".join(lines)
