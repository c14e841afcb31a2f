"""The leader (node 0): after the steps every training node runs, it meets the fleet, checks it
with an allreduce, signals CloudFormation, restores the checkpoints, runs horovodrun under its
stall watch, uploads the results and writes DONE.json last; or runs the benchmark instead."""

from __future__ import annotations

import os
import time
from pathlib import Path

from bootstrap import aws
from bootstrap.fleet import rendezvous, supervision
from bootstrap.fleet.rendezvous import parse_stamp
from bootstrap.leader import benchmark, checkpoints, goodput, launch, results
from bootstrap.node import dataset, health, spot
from bootstrap.node.logs import upload_logs
from bootstrap.node.training_node import TrainingNode
from bootstrap.steps import STEP_SECONDS, Interrupted, StepFailed, attempt_to, step


class Leader(TrainingNode):
    # The leader's checkpoints, logs and DONE.json are the run's results: retried until they are
    # in S3 (the hard cap, or a shutdown's deadline, bounds it).
    results_policy = aws.UNTIL_DONE

    def run(self) -> None:
        ip, instance_id = self.boot()
        cfg, attempt, status = self.cfg, self.attempt, self.attempt.status
        self.hostfile = Path(cfg.state_dir) / "hostfile"
        nodes = step("rendezvous", lambda: self.meet(ip, instance_id))
        self.ranks = sum(n["gpus"] or 1 for n in nodes)
        self.key = rendezvous.private_key_path(cfg)
        if cfg.benchmark:
            # The benchmark runs the allreduce check at every size itself, and reports it.
            step("signal", lambda: self.fleet_ready(f"{len(nodes)} node(s) met"))
            benchmark.lead(
                cfg, self.s3, nodes, self.key, self.data_dir, attempt.started, self.log, step
            )
            status.end("done", None)
            return
        self.env = launch.launcher_env(cfg, dict(os.environ))
        # What marks this run's training processes, for a restarted bootstrap to end them.
        self.env[supervision.JOB_ENV] = supervision.job_id(cfg)
        fleet = f"{len(nodes)} node(s) met, no GPUs: no allreduce check"
        if cfg.gpus_per_node:
            fleet = self.check_fleet()
        step("signal", lambda: self.fleet_ready(fleet))
        store = self.restore()
        if not cfg.trainer.get("data_wait_s"):
            # A trainer that does not wait for its files (node.json `trainer` without
            # data_wait_s) lists what is on disk: every node must hold every shard first.
            step("fleet shards", self.wait_for_fleet_shards)
        self.train(store)
        self.finish(store)

    def meet(self, ip: str, instance_id: str) -> list[dict]:
        cfg, s3, attempt = self.cfg, self.s3, self.attempt
        # A restarted bootstrap (systemd, after this one died) first ends what it left running.
        supervision.end_leftovers(cfg, self.log)
        if recorded := results.clear_done(s3, cfg, attempt.started):
            raise results.RecordTaken(f"{results.describe_record(cfg, recorded)}: it stands")
        since = time.time()
        key = rendezvous.ensure_leader_key(s3, cfg)
        public_key = key.with_suffix(".pub").read_text()
        fingerprint = rendezvous.key_fingerprint(public_key)
        # The leader is a host in the hostfile too: a launcher that ssh-es to it must get in.
        rendezvous.install_authorized_key(cfg.authorized_keys_file, public_key)

        def register() -> None:
            rendezvous.register_node(
                s3, cfg, ip, instance_id, time.time(), fingerprint, self.holds()
            )

        register()
        registered = time.time()
        attempt.heartbeat = supervision.Heartbeat(
            register, supervision.heartbeat_interval(cfg), self.log
        )
        attempt.heartbeat.start()
        self.log(f"registered as node 0 ({ip}); waiting for {cfg.nodes} node(s)")
        self.key_fingerprint, self.met_since = fingerprint, since
        nodes = rendezvous.wait_for_nodes(
            s3, cfg, leader_key=fingerprint, since=since, while_waiting=self.check_pull
        )
        text = rendezvous.write_hostfile(s3, cfg, nodes, self.hostfile)
        self.phases.measure("rendezvous", registered, time.time())
        self.log("hostfile:\n" + text.rstrip())
        return nodes

    def wait_for_fleet_shards(self) -> None:
        dataset.wait_for_fleet_shards(
            self.s3, self.cfg, self.pull, self.key_fingerprint, self.met_since, log=self.log
        )

    def fleet_ready(self, detail: str) -> None:
        rendezvous.write_fleet_check(self.s3, self.cfg, detail, time.time())
        rendezvous.signal_fleet_ready(self.cfg, detail, self.log)

    def lost_members(self, failed_at: float) -> list[str]:
        lost: list[str] = []
        attempt_to(
            "read the members' heartbeats",
            lambda: lost.extend(supervision.lost_nodes(self.s3, self.cfg, failed_at)),
        )
        return lost

    def run_horovod(
        self,
        program: list[str],
        log_name: str,
        keep: int = 1000,
        progress: Path | None = None,
        on_start=None,
    ) -> str:
        # Each rank under bootstrap.fleet.rank, which names the signal that kills it; horovodrun
        # is guarded, and a failure names the members whose heartbeat went stale.
        ranked = ["python3", "-m", "bootstrap.fleet.rank", *program]
        return launch.run_horovodrun(
            self.cfg, self.hostfile, self.key, self.ranks, ranked, self.env, log_name,
            keep=keep, progress=progress, lost=self.lost_members, log=self.log,
            on_start=on_start,
        )  # fmt: skip

    def check_fleet(self) -> str:
        """The allreduce check on every GPU of every node: the transport NCCL used, as expected."""
        cfg = self.cfg
        self.attempt.status.phase("allreduce_check")
        # What the image baked for the network, in the log above any failure of the check and in
        # the reason of a wrong transport, which `horovod-fleet status` shows.
        stack = health.image_network_stack(cfg.image["manifest"])
        self.log(f"the image's network stack: {stack}")

        def allreduce_check() -> str:
            check = ["python3", "-m", "bootstrap.fleet.allreduce_check"]
            nccl_log = self.run_horovod(check, "allreduce-check.log", keep=1_000_000)
            try:
                return "NCCL transport: " + health.check_transport(nccl_log, cfg.efa, cfg.gpudirect)
            except health.HealthError as exc:
                raise health.HealthError(f"{exc} (image: {stack})") from None

        started = time.time()
        fleet = step("allreduce check", allreduce_check)
        self.phases.measure("allreduce_check", started, time.time())
        self.log(fleet)
        return fleet

    def restore(self) -> checkpoints.ModelStore:
        cfg, attempt = self.cfg, self.attempt
        store = checkpoints.ModelStore(self.s3, cfg, self.model_dir, self.log)
        resumes_from = step("restore checkpoints", store.restore)
        self.resumes_at_step = checkpoints.step_of(resumes_from) if resumes_from else 0
        attempt.store, attempt.outputs_since = store, time.time()
        attempt.resumes_from(self.model_dir)
        self.log(
            f"restored and verified {checkpoints.model_prefix(cfg)}: the trainer resumes from "
            f"{resumes_from}"
            if resumes_from
            else f"no checkpoint in {checkpoints.model_prefix(cfg)} yet: the trainer starts run "
            f"{cfg.run} from its first step"
        )
        return store

    def train(self, store: checkpoints.ModelStore) -> None:
        cfg, attempt = self.cfg, self.attempt
        sync = checkpoints.CheckpointSync(store, cfg.checkpoint_sync_s, self.log)
        sync.start()
        attempt.status.live_goodput = self.live_goodput
        attempt.status.phase("training")

        def end_if_the_pull_fails(proc) -> None:
            """The trainer started beside the rest of the data pull: its failure ends it."""
            if self.pull is not None:
                self.pull.on_failure(lambda: launch.end_process(proc))

        def train() -> None:
            try:
                self.run_horovod(
                    launch.trainer_command(cfg, self.data_dir, self.model_dir),
                    "train.log",
                    progress=self.model_dir / "progress.json",
                    on_start=end_if_the_pull_fails,
                )
            except RuntimeError as exc:
                self.check_pull()  # the data pull's failure, not what it did to the ranks
                # A Spot notice stopped the ranks (any node's): an interruption, named, not a
                # failure.
                why = spot.interruption_reason(
                    self.s3, cfg, self.model_dir, attempt.started, attempt.outputs_since
                )
                if why:
                    raise Interrupted(why) from exc
                raise

        try:
            step("training", train)
        finally:
            sync.stop()

    def finish(self, store: checkpoints.ModelStore) -> None:
        cfg, attempt, s3 = self.cfg, self.attempt, self.s3
        # Results are retried until they are in S3: the hard cap bounds the wait (README).
        attempt.status.phase("uploading")
        step("upload results", lambda: store.upload(aws.UNTIL_DONE))
        self.follower.stop()  # this node's trainer's start-up, into its record
        doc = results.done_document(
            cfg, "succeeded", None, self.model_dir, time.time(), attempt.started,
            attempt.outputs_since, attempt.earlier, STEP_SECONDS, restarts=attempt.restarts,
            records=self.phase_records(),
        )  # fmt: skip
        self.log(
            f"run {cfg.run} succeeded: top-1 {doc['top1']}, top-5 {doc['top5']}, goodput "
            f"{doc['goodput']} (from the first launch), {doc['runtime_goodput']} (from the "
            "first step)"
        )
        step("upload logs", lambda: upload_logs(s3, cfg, aws.UNTIL_DONE))
        attempt.status.end("done", None, record=doc)
        step(
            "write DONE.json",
            lambda: results.write_done(s3.with_policy(aws.UNTIL_DONE), cfg, doc, attempt.started),
        )
        attempt.heartbeat.stop()
        self.log(f"wrote s3://{cfg.bucket}/{cfg.runs_prefix}DONE.json")

    def live_goodput(self, progress: dict) -> dict | None:
        """status.json's goodput while training: this attempt from its launch (this node's,
        about the fleet's) and the step it resumed at, the earlier ones from attempts.json."""
        cfg, record = self.cfg, self.phases.doc
        launched = record.get("launched_at")
        first = record["phases"].get("first_step", {}).get("end")
        current = goodput.Attempt(
            ended_at=time.time(),
            launched_at=parse_stamp(launched) if launched else self.attempt.started,
            first_step_at=parse_stamp(first) if first else None,
            start_step=self.resumes_at_step,
        )
        global_batch = (cfg.trainer.get("batch_per_gpu") or 0) * cfg.nodes * cfg.slots
        earlier = goodput.from_entries(self.attempt.earlier)
        return goodput.live(earlier, current, progress, global_batch)

    def writes_record(self, failure: StepFailed) -> bool:
        return True

    def written_by(self) -> str:
        return "leader"

    def record_model_dir(self) -> Path | None:
        return self.model_dir
