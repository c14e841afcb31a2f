"""The head's drill schedule (node.json `drill`, docs/contracts.md): it plays the drill's
experiments one at a time while the fleet trains, each by its AWS FIS experiment template, judges
each live from the run's records (contract/drill_judge.py) and, once the last is judged, asks the
training to stop at the next epoch's end.

- The first experiment starts once `start_after_epoch` epochs are done (status.json's progress);
  each next one once the one before is judged: every observation seen, or `within_s` past.
- Each is started with FIS StartExperiment and the client token `<run>-<experiment>`: a retried
  call, or a head that takes the schedule over, starts nothing twice ("Unique, case-sensitive
  identifier that you provide to ensure the idempotency of the request", botocore's FIS model,
  StartExperimentRequest.clientToken; https://docs.aws.amazon.com/fis/latest/APIReference/API_StartExperiment.html).
- Its record `runs/<run>/drill/<experiment>.json` says when it started, its experiment id, FIS's
  state (GetExperiment) and, once judged, the verdict. The records are the schedule's state: a
  head launched again from its template (the last experiment terminates the head) reads them and
  goes on where the one before left off.
- Once every experiment is judged it writes `runs/<run>/stop.json`; each node then puts the
  request where its ranks look (bootstrap/member.py, `--stop-file`), and the trainer
  stops every rank at the next epoch's end, as a success (trainer/actions.py StopWhenAsked).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from botocore.exceptions import ClientError

from bootstrap.fleet.rendezvous import read_object
from bootstrap.lines import one_line
from bootstrap.node_config import ConfigError, TrainConfig
from contract import drill
from contract.drill_judge import (
    RECORD_FORMAT,
    STOP,
    STOP_FORMAT,
    Records,
    experiment_named,
    judge,
    record_key,
)
from contract.runs import stamp_at

# FIS's answers that mean the experiment will never start: recorded as its FAIL, and the drill
# goes on (botocore's FIS model, StartExperiment's errors); any other error is tried again.
REFUSALS = ("ValidationException", "ResourceNotFoundException", "ServiceQuotaExceededException")
# The local file each node's ranks read for the agreed stop (in its mount point, the same path
# on every node: docs/contracts.md).
STOP_FILE = "stop.json"


@dataclass(frozen=True)
class Planned:
    """One experiment of node.json's plan: contract/drill.py's, and its FIS template's id."""

    experiment: drill.Experiment
    template_id: str

    @property
    def name(self) -> str:
        return self.experiment.name


@dataclass(frozen=True)
class Plan:
    start_after_epoch: int
    max_epochs: int
    experiments: tuple[Planned, ...]


def plan_of(doc: dict) -> Plan:
    """node.json `drill` as the schedule plays it; ConfigError naming the bad key (an
    experiment this code does not know, or one listed with other codes than contract/drill.py
    has: the deployment and this image disagree)."""

    def fail(key: str, problem: str) -> ConfigError:
        return ConfigError(f"node.json: key 'drill.{key}' {problem}")

    try:
        after, epochs = int(doc["start_after_epoch"]), int(doc["max_epochs"])
        listed = list(doc["experiments"])
    except (KeyError, TypeError, ValueError) as exc:
        raise fail("experiments", f"is not a drill plan: {one_line(exc)}") from None
    planned = []
    for number, entry in enumerate(listed):
        where = f"experiments[{number}]"
        try:
            experiment = experiment_named(str(entry.get("name")))
        except drill.UnknownExperiment as exc:
            raise fail(f"{where}.name", str(exc)) from None
        if list(entry.get("observe") or []) != list(experiment.observe):
            raise fail(
                f"{where}.observe", f"must be {list(experiment.observe)} (contract/drill.py)"
            )
        if not entry.get("template_id"):
            raise fail(f"{where}.template_id", "must name the experiment's FIS template")
        planned.append(Planned(experiment, str(entry["template_id"])))
    return Plan(after, epochs, tuple(planned))


def stop_file(cfg: TrainConfig) -> Path:
    return Path(cfg.mount_point) / STOP_FILE


def mirror_stop(s3, cfg: TrainConfig) -> bool:
    """On a node, at each heartbeat: the head's stop request (runs/<run>/stop.json) copied where
    the node's ranks look (`--stop-file`), or a copy S3 no longer holds removed (an earlier
    run's, on a disk kept in place). Returns whether the stop is asked."""
    body = read_object(s3, cfg.bucket, f"{cfg.runs_prefix}{STOP}")
    path = stop_file(cfg)
    if body is None:
        path.unlink(missing_ok=True)
        return False
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.partial")
        partial.write_bytes(body)
        partial.rename(path)  # whole or absent: a rank never reads half of it
    return True


class Schedule(threading.Thread):
    """The drill's experiments played in order from the head, every `poll_s`, until each is
    judged and the stop is asked, or until stop(). `s3` and `fis` are boto3 clients (one try a
    call: a call that fails is made again at the next poll)."""

    def __init__(
        self,
        cfg: TrainConfig,
        plan: Plan,
        s3,
        fis,
        log: Callable[[str], None],
        poll_s: float = 10.0,
        clock: Callable[[], float] = time.time,
    ):
        super().__init__(daemon=True, name="drill")
        self.cfg, self.plan, self.s3, self.fis, self.log = cfg, plan, s3, fis, log
        self.poll_s, self.clock = poll_s, clock
        self.stopping = threading.Event()
        self.said: str | None = None  # the last error line, said once until another comes

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                if self.tick():
                    return
                self.said = None
            except Exception as exc:  # an S3 or FIS call failed: the next poll tries again
                line = f"drill: {one_line(exc)}; trying again"
                if line != self.said:
                    self.log(line)
                    self.said = line
            self.stopping.wait(self.poll_s)

    def stop(self) -> None:
        self.stopping.set()

    # --- one poll -----------------------------------------------------------------------------

    def tick(self) -> bool:
        """Start, poll and judge the experiment whose turn it is; True once the stop is asked."""
        records = self.read_records()
        for index, planned in enumerate(self.plan.experiments):
            record = self.read_json(record_key(self.cfg.runs_prefix, planned.name)) or {}
            if record.get("verdict"):
                continue
            if not record.get("started_at"):
                if index == 0 and not self.epochs_done(records):
                    return False
                record = self.begin(planned, records)
            self.follow(planned, record, records)
            return False
        return self.ask_stop()

    def epochs_done(self, records: Records) -> bool:
        """Whether the run has finished `start_after_epoch` epochs and trains on."""
        status = records.status or {}
        progress = status.get("progress") or {}
        done = (progress.get("epoch") or 0) - 1
        return status.get("phase") == "training" and done >= self.plan.start_after_epoch

    def begin(self, planned: Planned, records: Records) -> dict:
        """FIS StartExperiment with the deterministic token, and the record of it."""
        token = f"{self.cfg.run}-{planned.name}"
        base = {
            "format": RECORD_FORMAT,
            "run": self.cfg.run,
            "experiment": planned.name,
            "template_id": planned.template_id,
            "action_ids": list(planned.experiment.action_ids),
            "client_token": token,
            "attempt": (records.status or {}).get("attempt") or 1,
        }
        try:
            answer = self.fis.start_experiment(
                clientToken=token, experimentTemplateId=planned.template_id
            )["experiment"]
        except ClientError as exc:
            if exc.response["Error"].get("Code") not in REFUSALS:
                raise
            now = self.clock()
            record = {**base, "started_at": stamp_at(now), "fis_state": "refused",
                      "verdict": "FAIL", "judged_at": stamp_at(now),
                      "why": f"FIS refused to start it: {one_line(exc)}"}  # fmt: skip
            self.write(planned, record)
            self.log(f"drill: {planned.name}: {record['why']}")
            return record
        started = answer.get("startTime") or answer.get("creationTime")
        at = started.timestamp() if hasattr(started, "timestamp") else self.clock()
        record = {**base, "experiment_id": answer["id"], "started_at": stamp_at(at),
                  "fis_state": answer["state"]["status"]}  # fmt: skip
        self.write(planned, record)
        self.log(
            f"drill: started {planned.name} ({', '.join(planned.experiment.action_ids)}), FIS "
            f"experiment {answer['id']}: {planned.experiment.what}"
        )
        return record

    def follow(self, planned: Planned, record: dict, records: Records) -> None:
        """FIS's state of the experiment, then the judge's reading of the records."""
        if record.get("verdict"):
            return
        polled = record
        if record.get("experiment_id"):
            state = self.fis.get_experiment(id=record["experiment_id"])["experiment"]["state"]
            polled = {**record, "fis_state": state["status"]}
        judged = judge(planned.experiment, polled, records, self.clock())
        if judged != record:
            self.write(planned, judged)
        for code in judged.get("observed") or {}:
            if code not in (record.get("observed") or {}):
                self.log(f"drill: {planned.name}: {code} seen at {judged['observed'][code]}")
        if judged.get("verdict"):
            self.log(f"drill: {planned.name}: {judged['verdict']} ({judged['why']})")

    def ask_stop(self) -> bool:
        """Every experiment judged: the agreed stop, asked once."""
        key = f"{self.cfg.runs_prefix}{STOP}"
        if self.read_json(key) is None:
            document = {
                "format": STOP_FORMAT,
                "run": self.cfg.run,
                "asked_at": stamp_at(self.clock()),
                "at": "epoch_end",
                "by": "drill",
                "why": f"the drill's {len(self.plan.experiments)} experiment(s) are judged",
            }
            self.s3.put_object(Bucket=self.cfg.bucket, Key=key, Body=json.dumps(document).encode())
            self.log("drill: every experiment is judged; the training stops at this epoch's end")
        return True

    # --- records --------------------------------------------------------------------------------

    def read_json(self, key: str) -> dict | None:
        body = read_object(self.s3, self.cfg.bucket, key)
        return json.loads(body) if body else None

    def read_records(self) -> Records:
        prefix = self.cfg.runs_prefix
        controller = self.read_json(f"{prefix}controller.json")
        # The start-up records of the nodes the controller replaced: a replacement's ranks
        # stepping is its join.
        replaced = {str(r.get("node")) for r in (controller or {}).get("replacements") or []}
        return Records(
            status=self.read_json(f"{prefix}status.json"),
            done=self.read_json(f"{prefix}DONE.json"),
            attempts=self.read_json(f"{prefix}attempts.json"),
            controller=controller,
            phases={
                node: record
                for node in sorted(replaced)
                if (record := self.read_json(f"{prefix}phases/{node}.json")) is not None
            },
        )

    def write(self, planned: Planned, record: dict) -> None:
        self.s3.put_object(
            Bucket=self.cfg.bucket,
            Key=record_key(self.cfg.runs_prefix, planned.name),
            Body=json.dumps(record, indent=1).encode(),
        )
