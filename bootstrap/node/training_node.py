"""What every instance of the fleet runs first (the attempt's record, its identity, its phases
record), what every node runs besides (health, the data) and how each reports a failure. Member
(bootstrap/fleet/member.py, every node) and Head (bootstrap/head/head.py) take it from there
and say what differs."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from pathlib import Path

from bootstrap import aws
from bootstrap.head import results
from bootstrap.head.status import RunStatus
from bootstrap.node import data_pull, dataset, health, phases
from bootstrap.node.attempt import Attempt
from bootstrap.node.logs import upload_logs
from bootstrap.node_config import TrainConfig
from bootstrap.steps import STEP_SECONDS, StepFailed, announce_failure, attempt_to, step


class TrainingNode(ABC):
    """One training node's bootstrap for one attempt. `results_policy`: how long its checkpoints,
    logs and DONE.json are retried when it reports a failure."""

    results_policy = aws.STEP_POLICY

    def __init__(self, cfg: TrainConfig, attempt: Attempt, log=aws.log):
        self.cfg, self.attempt, self.log = cfg, attempt, log
        self.data_dir = Path(cfg.mount_point) / "tfrecords"
        self.model_dir = Path(cfg.mount_point) / "model"
        self.pull: dataset.DatasetPull | None = None
        self.phases: phases.PhaseRecord | None = None
        self.follower: phases.TrainerFollower | None = None
        self.identity: tuple[str, str] | None = None  # (ip, instance id), once known

    @abstractmethod
    def run(self) -> None:
        """The attempt on this node, from boot to its last step."""

    def begin(self) -> tuple[str, str]:
        """What every instance of the fleet runs first: the attempt's record, status.json (the
        head's), its identity and its phases record; returns its private IP and instance id."""
        cfg, attempt = self.cfg, self.attempt
        self.s3 = aws.s3_client(cfg.region)
        attempt.status = status = RunStatus(
            cfg, self.s3, self.model_dir, attempt_started=attempt.started
        )
        attempt.earlier = status.earlier_attempts()
        attempt.begin(cfg, self.model_dir)
        status.attempt_started = attempt.started
        status.phase("booting")
        ip, instance_id = step(
            "instance identity", lambda: (aws.private_ip(cfg), aws.instance_id(cfg))
        )
        self.identity = (ip, instance_id)
        self.phases = record = phases.PhaseRecord(
            cfg, self.s3, attempt.number, instance_id, ip, self.log
        )
        now = time.time()
        record.begin(
            phases.launched_at(cfg, instance_id, self.log), phases.kernel_started_at(now), now
        )
        return ip, instance_id

    def boot(self) -> tuple[str, str]:
        """The steps every training node runs first; returns its private IP and instance id.
        The data pull runs on beside what follows once this node's own shards are here."""
        cfg, attempt = self.cfg, self.attempt
        ip, instance_id = self.begin()
        record, status = self.phases, attempt.status
        started = time.time()
        step(
            "health",
            lambda: self.log(
                health.check_node(
                    cfg, health.count_gpus(), health.efa_present(), health.life_cycle(cfg)
                )
            ),
        )
        record.health(started, time.time())
        if not cfg.benchmark or cfg.benchmark.mode == "data":  # a synthetic benchmark reads no data
            status.phase("pulling_data")
            # A node back in place for a new attempt verifies every shard it kept again.
            self.pull = dataset.DatasetPull(
                cfg.bucket, cfg.dataset_prefix, self.data_dir, self.own_shards, record, self.log,
                verified_for=f"run {cfg.run} attempt {attempt.number}",
            )  # fmt: skip
            self.pull.start()
            # A benchmark's worlds are not the fleet's first: its ranks may read any shard.
            step("data pull", self.pull.wait_all if cfg.benchmark else self.pull.wait_own)
        # The trainer's start-up, copied into the record once this attempt's trainer writes it.
        self.follower = record.follow_trainer(self.model_dir, attempt.started)
        # No SUCCESS yet: CloudFormation counts a node as created only once the whole fleet has
        # met and passed the allreduce check (the head's fleet-check.json), so a broken network
        # rolls the deployment back instead of reaching CREATE_COMPLETE.
        return ip, instance_id

    def own_shards(self, manifest: dict) -> set[str]:
        cfg = self.cfg
        return data_pull.own_files(manifest, cfg.node_index, cfg.nodes, cfg.slots)

    def holds(self) -> str:
        """What this node's registration says it holds of the dataset (docs/contracts.md)."""
        if self.pull is None:  # a synthetic benchmark: it needs nothing
            return dataset.ALL
        return self.pull.holds or "none"

    def check_pull(self) -> None:
        """The data pull's failure, raised in whichever step looks (it runs beside them)."""
        if self.pull is not None:
            self.pull.check()

    # ------------------------------------------------------------ reporting a failure

    @abstractmethod
    def writes_record(self, failure: StepFailed) -> bool:
        """Whether this node writes the attempt's DONE.json for this failure."""

    @abstractmethod
    def written_by(self) -> str:
        """DONE.json's `written_by` when this node writes it."""

    # The instances the head's discovery saw at each address (bootstrap/head/discovery.py), which
    # name the elastic resets' hosts in DONE.json; None on a node that runs no discovery.
    known_hosts: dict[str, list[dict]] | None = None

    def record_model_dir(self) -> Path | None:
        """Whose trainer outputs the failure's DONE.json reads (None: this node ran no trainer)."""
        return None

    def report(self, failure: StepFailed) -> None:
        """Whatever failed: tell CloudFormation (rolls the fleet back while it is being created),
        keep the logs and the checkpoints this attempt may upload, and write the attempt's
        DONE.json (status failed, or interrupted after a SIGTERM) when this node is the one to
        (writes_record) so teardown reacts. After a SIGTERM everything here fits in the
        shutdown's time. A failure that found this attempt's DONE.json already written by
        another node adds nothing to it."""
        cfg, attempt, policy = self.cfg, self.attempt, self.results_policy
        announce_failure(cfg, failure)
        s3 = aws.s3_client(cfg.region, policy)
        if attempt.store is not None:
            attempt_to("upload the checkpoints", lambda: attempt.store.upload(policy))
        attempt_to("upload the logs", lambda: upload_logs(s3, cfg, policy))
        recorded = isinstance(failure.__cause__, results.RecordTaken)
        if self.follower is not None:
            self.follower.stop()
        doc = None
        if self.writes_record(failure) and not recorded:
            doc = self.failure_record(failure)
        # status.json before DONE.json: DONE.json starts the teardown, so it is the last word.
        if attempt.status is not None and not recorded:
            attempt.status.end(failure.status, str(failure), record=doc)
        if doc is not None:
            results.record_failure(
                aws.s3_client(cfg.region, aws.UNTIL_DONE), cfg, doc, attempt.started
            )
        if attempt.heartbeat is not None:
            attempt.heartbeat.stop()

    def failure_record(self, failure: StepFailed) -> dict:
        attempt = self.attempt
        if attempt.status is not None:  # a read of attempts.json that failed at the start retries
            attempt.earlier = attempt.status.earlier_attempts()
        return results.done_document(
            self.cfg, failure.status, str(failure), self.record_model_dir(), time.time(),
            attempt.started, attempt.outputs_since, attempt.earlier, STEP_SECONDS,
            cause=failure.cause, restarts=attempt.restarts, written_by=self.written_by(),
            records=self.phase_records(), hosts=self.known_hosts,
        )  # fmt: skip

    def phase_records(self) -> list[dict]:
        """This attempt's nodes' phases records as S3 holds them, this node's as it has it (a
        failed read: this node's alone)."""
        if self.phases is None:  # failed before it knew who it is
            return []
        found: list[dict] = []
        attempt_to(
            "read the fleet's phases records",
            lambda: found.extend(
                phases.read_records(
                    self.s3.with_policy(phases.QUICK), self.cfg, self.attempt.number
                )
            ),
        )
        own = self.phases.doc
        return [r for r in found if r.get("node") != own["node"]] + [own]
