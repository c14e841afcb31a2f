"""The head: the fleet's CPU instance that runs horovodrun and what the run needs besides
training. It meets the nodes, checks them with an allreduce, signals CloudFormation, restores
the checkpoints and puts them on node 0, runs the training from here under its stall watch with
rank 0's outputs copied here, uploads the results and writes DONE.json last; or runs the
benchmark instead. It holds no data and runs no rank (stacks/train/head.py says why)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from bootstrap import aws
from bootstrap.fleet import node_failures, rendezvous, supervision
from bootstrap.fleet.rank import NODE_ENV
from bootstrap.fleet.rendezvous import parse_stamp
from bootstrap.head import benchmark, checkpoints, goodput, launch, mirror, results
from bootstrap.head import timeline as fleet_view
from bootstrap.head.discovery import Discovery, Verdict
from bootstrap.head.elastic import (
    alias_interface,
    driver_gave_up,
    elastic_command,
    elastic_env,
    install_ssh_wrapper,
    too_few_left,
)
from bootstrap.head.hosts_file import script_command
from bootstrap.node import dataset, health, spot
from bootstrap.node.attempt import read_json, read_list
from bootstrap.node.logs import upload_logs
from bootstrap.node.training_node import TrainingNode
from bootstrap.steps import STEP_SECONDS, Interrupted, StepFailed, attempt_to, step
from contract import causes

NO_VERDICT = Verdict((), {})
RESETS_FILE = "resets.json"  # rank 0's record of the elastic resets (docs/contracts.md)
NODE_ENV_FILE = "node.env"  # in each node's mount point: its own settings (bootstrap/fleet/rank.py)


class InterfacesDiffer(RuntimeError):
    """The nodes name their network interfaces differently: horovodrun takes one name."""


class Head(TrainingNode):
    # The run's checkpoints, logs and DONE.json are the head's results: retried until they are
    # in S3 (the hard cap, or a shutdown's deadline, bounds it).
    results_policy = aws.UNTIL_DONE

    def run(self) -> None:
        ip, instance_id = self.begin()
        cfg, attempt, status = self.cfg, self.attempt, self.attempt.status
        self.hostfile = Path(cfg.state_dir) / "hostfile"
        # What a node says failed on it: before training, any such failure ends the attempt.
        self.failures = node_failures.Watch(cfg, self.s3, since=attempt.started, log=self.log)
        # The nodes pull their data meanwhile: the run is in that phase until they have met.
        status.phase("pulling_data")
        nodes = step("rendezvous", lambda: self.meet(ip, instance_id))
        self.nodes = nodes
        # The rehearsal without network namespaces: every node is this host, and node 0's model
        # dir is this one (its node.json says so), so nothing is copied either way.
        self.same_host = {n["ip"] for n in nodes} == {ip}
        self.ranks = sum(n["gpus"] or 1 for n in nodes)
        self.key = rendezvous.private_key_path(cfg)
        self.ssh = mirror.Ssh(self.key, cfg.ssh_port, shutil.which("ssh") or "ssh")
        self.interface = step("network interface", lambda: self.driver_interface(nodes, ip))
        if cfg.benchmark:
            # The benchmark runs the allreduce check at every size itself, and reports it.
            step("signal", lambda: self.fleet_ready(f"{len(nodes)} node(s) met"))
            benchmark.lead(
                cfg, self.s3, nodes, self.key, self.data_dir, attempt.started, self.log, step,
                self.interface,
            )  # fmt: skip
            status.end("done", None)
            return
        self.env = launch.launcher_env(cfg, dict(os.environ))
        # What marks this run's training processes, for a restarted bootstrap to end them.
        self.env[supervision.JOB_ENV] = supervision.job_id(cfg)
        # Each node's own settings, read by its ranks over this environment.
        self.env[NODE_ENV] = str(Path(cfg.mount_point) / NODE_ENV_FILE)
        self.ssh_bin = install_ssh_wrapper(Path(cfg.state_dir))
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
        key = rendezvous.ensure_head_key(s3, cfg)
        fingerprint = rendezvous.key_fingerprint(key.with_suffix(".pub").read_text())

        def beat() -> None:
            rendezvous.register_head(s3, cfg, ip, instance_id, time.time(), fingerprint)

        beat()
        registered = time.time()
        attempt.heartbeat = supervision.Heartbeat(
            beat, supervision.heartbeat_interval(cfg), self.log
        )
        attempt.heartbeat.start()
        self.log(f"the head ({ip}) published the run's key; waiting for {cfg.nodes} node(s)")
        self.key_fingerprint, self.met_since = fingerprint, since
        nodes = rendezvous.wait_for_nodes(
            s3, cfg, head_key=fingerprint, since=since, while_waiting=self.failures.check
        )
        text = rendezvous.write_hostfile(s3, cfg, nodes, self.hostfile)
        self.phases.measure("rendezvous", registered, time.time())
        self.log("hostfile:\n" + text.rstrip())
        return nodes

    def driver_interface(self, nodes: list[dict], ip: str) -> str | None:
        """The interface name horovodrun gives every rank and takes the driver's address from:
        the one the nodes registered (node.json `network_interface` where they named none),
        which this host then has too (elastic.alias_interface)."""
        names = {n["interface"] for n in nodes if n.get("interface")}
        if len(names) > 1:
            raise InterfacesDiffer(
                f"the nodes' network interfaces have different names ({', '.join(sorted(names))}):"
                " horovodrun gives every rank one"
            )
        name = names.pop() if names else self.cfg.network_interface
        if name and (done := alias_interface(name, ip)):
            self.log(done)
        return name

    def wait_for_fleet_shards(self) -> None:
        dataset.wait_for_fleet_shards(
            self.s3, self.cfg, None, self.key_fingerprint, self.met_since, log=self.log,
            while_waiting=self.failures.check,
        )  # fmt: skip

    def fleet_ready(self, detail: str) -> None:
        rendezvous.write_fleet_check(self.s3, self.cfg, detail, time.time())
        rendezvous.signal_fleet_ready(self.cfg, detail, self.log)

    def lost_nodes(self, failed_at: float) -> list[str]:
        lost: list[str] = []
        attempt_to(
            "read the nodes' heartbeats",
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
        # is guarded, and a failure names the nodes whose heartbeat went stale.
        ranked = ["python3", "-m", "bootstrap.fleet.rank", *program]
        return launch.run_horovodrun(
            self.cfg, self.hostfile, self.key, self.ranks, ranked, self.env, log_name,
            keep=keep, interface=self.interface, progress=progress, lost=self.lost_nodes,
            log=self.log, on_start=on_start,
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
        """The newest whole checkpoint from S3 onto this disk, then onto every node's in place
        of its own: rank 0, wherever it is, resumes from it (a node's leftovers, which S3 does
        not vouch for, are gone)."""
        cfg, attempt = self.cfg, self.attempt
        store = checkpoints.ModelStore(self.s3, cfg, self.model_dir, self.log)
        resumes_from = step("restore checkpoints", store.restore)
        self.resumes_at_step = checkpoints.step_of(resumes_from) if resumes_from else 0
        attempt.store, attempt.outputs_since = store, time.time()
        attempt.resumes_from(self.model_dir)
        hosts = list(dict.fromkeys(n["ip"] for n in self.nodes))
        if not self.same_host:
            step(
                "checkpoints to the nodes",
                lambda: mirror.push_all(self.ssh, hosts, self.model_dir, self.model_dir),
            )
        self.log(
            f"restored and verified {checkpoints.model_prefix(cfg)} onto every node: the "
            f"trainer resumes from {resumes_from}"
            if resumes_from
            else f"no checkpoint in {checkpoints.model_prefix(cfg)} yet: the trainer starts run "
            f"{cfg.run} from its first step"
        )
        return store

    def train(self, store: checkpoints.ModelStore) -> None:
        """One elastic horovodrun from here over the nodes the discovery lists: a node lost
        costs a reset of the others, not the attempt (bootstrap/head/elastic.py)."""
        cfg, attempt = self.cfg, self.attempt
        sync = checkpoints.CheckpointSync(store, cfg.checkpoint_sync_s, self.log)
        sync.start()
        hosts = Discovery(
            cfg, self.s3, head_key=self.key_fingerprint, since=self.met_since,
            ec2=aws.client("ec2", cfg.region) if cfg.instance_id is None else None,
            log=self.log,
        )  # fmt: skip
        # The script only prints the file: it must exist before horovodrun first runs it.
        step("host discovery", hosts.refresh)
        hosts.start()
        # Rank 0's outputs, into this model dir, from whichever live node holds rank 0: the
        # uploads, the watchdog and status.json read them here.
        outputs = mirror.Mirror(
            self.ssh, lambda: [] if self.same_host else hosts.addresses(), self.model_dir,
            self.model_dir, source=None, log=self.log,
        )  # fmt: skip
        outputs.start()
        attempt.status.live_goodput = self.live_goodput
        attempt.status.live_resets = lambda: fleet_view.resets(
            {"resets": read_list(self.model_dir / RESETS_FILE)}, [], hosts.known
        )
        self.known_hosts = hosts.known
        attempt.status.silent = lambda: [str(i) for i in (hosts.verdict or NO_VERDICT).silent]
        attempt.status.phase("training")
        # A node's own failure costs that node (the discovery drops it); one that would fail on
        # any node ends the training at once.
        self.failures.ends = lambda doc: doc.get("cause") in causes.FLEET_WIDE

        def watch_nodes(proc) -> None:
            self.failures.on_end = lambda: launch.end_process(proc)
            self.failures.start()

        def train() -> None:
            program = [
                *launch.trainer_command(cfg, self.data_dir, self.model_dir),
                "--elastic",
                "--planned-ranks", str(cfg.nodes * cfg.slots),
                "--min-ranks", str(cfg.min_nodes * cfg.slots),
            ]  # fmt: skip
            command = elastic_command(
                cfg, discovery=script_command(Path(cfg.state_dir)), key=self.key,
                interface=self.interface,
                program=["python3", "-m", "bootstrap.fleet.rank", *program],
            )  # fmt: skip
            try:
                launch.run_horovodrun(
                    cfg, self.hostfile, self.key, self.ranks, program,
                    elastic_env(self.env, self.ssh_bin), "train.log", command=command,
                    progress=self.model_dir / "progress.json",
                    lost=lambda failed_at: too_few_left(hosts.verdict, cfg.min_nodes),
                    log=self.log, on_start=watch_nodes,
                )  # fmt: skip
            except RuntimeError as exc:
                if self.failures.ended is not None:  # the node's words, not what its ranks said
                    raise self.failures.ended from exc
                outputs.final()  # interrupted.json, if the ranks stopped at a checkpoint
                # Spot notices left too few nodes: the ranks stopped at a checkpoint, named.
                why = spot.interruption_reason(
                    self.s3, cfg, self.model_dir, attempt.started, attempt.outputs_since
                )
                if why:
                    raise Interrupted(why) from exc
                gave_up = driver_gave_up(str(exc), cfg.min_nodes)
                if gave_up and getattr(exc, "cause", None) != causes.NODE_LOST:
                    raise launch.TrainingFailed(f"{gave_up}; {exc}", causes.NODE_LOST) from exc
                raise

        try:
            step("training", train)
        finally:
            self.failures.stop()
            hosts.stop()
            outputs.final()
            sync.stop()

    def finish(self, store: checkpoints.ModelStore) -> None:
        cfg, attempt, s3 = self.cfg, self.attempt, self.s3
        # Results are retried until they are in S3: the hard cap bounds the wait (README).
        attempt.status.phase("uploading")
        step("upload results", lambda: store.upload(aws.UNTIL_DONE))
        doc = results.done_document(
            cfg, "succeeded", None, self.model_dir, time.time(), attempt.started,
            attempt.outputs_since, attempt.earlier, STEP_SECONDS, restarts=attempt.restarts,
            records=self.phase_records(), written_by=self.written_by(), hosts=self.known_hosts,
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
        """status.json's goodput while training: this attempt from its launch (the head's,
        about the fleet's), its first step (rank 0's node's startup.json, copied here) and the
        step it resumed at, the earlier ones from attempts.json."""
        cfg, record = self.cfg, self.phases.doc
        launched = record.get("launched_at")
        first = read_json(self.model_dir / "startup.json").get("first_step_at")
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
        return "head"

    def record_model_dir(self) -> Path | None:
        return self.model_dir
