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
from bootstrap.head import benchmark, checkpoints, drill, launch, mirror
from bootstrap.head.discovery import REACH_TIMEOUT_S, Discovery, Verdict
from bootstrap.head.elastic import (
    alias_interface,
    driver_gave_up,
    elastic_command,
    elastic_env,
    install_ssh_wrapper,
    too_few_left,
)
from bootstrap.head.hosts_file import script_command
from bootstrap.lines import one_line, trim_reason
from bootstrap.node import dataset, health, spot
from bootstrap.node.logs import upload_logs
from bootstrap.node.training_node import TrainingNode
from bootstrap.records import goodput, results
from bootstrap.records import timeline as fleet_view
from bootstrap.records.files import read_json, read_list
from bootstrap.steps import STEP_SECONDS, Interrupted, StepFailed, attempt_to, step
from contract import causes
from contract.runs import parse_stamp_s, stamp_at

NO_VERDICT = Verdict((), {})
# How often the head starts horovodrun again in one attempt after its elastic driver gave up
# (Head.start_again): each follows a node lost in a join or a reset, and the run controller
# replaces a node at most twice an attempt (contract/names.py REPLACEMENTS_PER_NODE);
# a failure that comes back more often is not a lost node's, and the attempt ends.
TRAINING_RESTARTS = 3
# The causes a horovodrun started again on the nodes left can get past: a node lost, its peers
# timing out or aborting waiting for it. Not the trainer's input, a full disk, a corrupt
# checkpoint (they fail again), nor a stall (the watchdog waited 10 minutes already).
RESTARTED_CAUSES = (causes.NODE_LOST, causes.COLLECTIVE_TIMEOUT, causes.RANK_KILLED)
RESETS_FILE = "resets.json"  # rank 0's record of the elastic resets (docs/contracts.md)
NODE_ENV_FILE = "node.env"  # in each node's mount point: its own settings (bootstrap/fleet/rank.py)


class InterfacesDiffer(RuntimeError):
    """The nodes name their network interfaces differently: horovodrun takes one name."""


class Head(TrainingNode):
    # The run's checkpoints, logs and DONE.json are the head's results: retried until they are
    # in S3 (the hard cap, or a shutdown's deadline, bounds it).
    results_policy = aws.UNTIL_DONE
    # This attempt's horovodrun restarts (start_again) for DONE.json's `training_restarts`, and
    # the resets of the horovodruns that ended (each trainer process records only its own).
    training_restarts: list[dict]
    earlier_resets: list[dict]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.training_restarts, self.earlier_resets = [], []

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
        # A replacement joins once the head reaches it over ssh (horovodrun starts its ranks so).
        hosts = Discovery(
            cfg, self.s3, head_key=self.key_fingerprint, since=self.met_since,
            ec2=aws.client("ec2", cfg.region) if cfg.instance_id is None else None,
            log=self.log,
            reach=lambda ip: None if self.same_host else self.ssh.reach(ip, REACH_TIMEOUT_S),
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
            {"resets": [*self.earlier_resets, *read_list(self.model_dir / RESETS_FILE)]},
            [], hosts.known,
        )  # fmt: skip
        self.known_hosts = hosts.known
        attempt.status.silent = lambda: [str(i) for i in (hosts.verdict or NO_VERDICT).silent]
        attempt.status.phase("training")
        schedule = self.drill_schedule()
        # A node's own failure costs that node (the discovery drops it); one that would fail on
        # any node ends the training at once.
        self.failures.ends = lambda doc: doc.get("cause") in causes.FLEET_WIDE

        def watch_nodes(proc) -> None:
            self.failures.on_end = lambda: launch.end_process(proc)
            if not self.failures.is_alive():  # a horovodrun started again: already watching
                self.failures.start()

        def train() -> None:
            nodes = None  # every node at first; the nodes left when started again
            while True:
                try:
                    self.run_elastic(hosts, nodes, watch_nodes)
                    return
                except RuntimeError as exc:
                    if self.failures.ended is not None:  # the node's words, not its ranks'
                        raise self.failures.ended from exc
                    outputs.sync()  # interrupted.json, if the ranks stopped at a checkpoint
                    # Spot notices left too few nodes: the ranks stopped at a checkpoint, named.
                    why = spot.interruption_reason(
                        self.s3, cfg, self.model_dir, attempt.started, attempt.outputs_since
                    )
                    if why:
                        raise Interrupted(why) from exc
                    failure = exc
                    gave_up = driver_gave_up(str(exc), cfg.min_nodes)
                    if gave_up and getattr(exc, "cause", None) != causes.NODE_LOST:
                        failure = launch.TrainingFailed(f"{gave_up}; {exc}", causes.NODE_LOST)
                    nodes = self.start_again(failure, hosts, failed_at=time.time())
                    if nodes is None:
                        if failure is exc:
                            raise
                        raise failure from exc

        try:
            step("training", train)
        finally:
            if schedule is not None:
                schedule.stop()
            self.failures.stop()
            hosts.stop()
            outputs.final()
            sync.stop()

    def drill_schedule(self) -> drill.Schedule | None:
        """A drill's experiments, played from here while the fleet trains (node.json `drill`)."""
        cfg = self.cfg
        if cfg.drill is None:
            return None
        plan = step("drill plan", lambda: drill.plan_of(cfg.drill))
        schedule = drill.Schedule(
            cfg, plan, aws.client("s3", cfg.region), aws.client("fis", cfg.region), self.log,
            poll_s=min(10.0, cfg.poll_interval_s * 2),
        )  # fmt: skip
        schedule.start()
        return schedule

    def run_elastic(self, hosts: Discovery, nodes: int | None, on_start) -> None:
        """One elastic horovodrun over the nodes the discovery lists, starting on `nodes` of
        them (every node: None). A failure names the nodes lost first: fewer than minNodes
        listed, else those whose heartbeat went stale (supervision.lost_nodes), not the peers
        that timed out waiting for them."""
        cfg = self.cfg
        program = [
            *launch.trainer_command(cfg, self.data_dir, self.model_dir),
            "--elastic",
            "--planned-ranks", str(cfg.nodes * cfg.slots),
            "--min-ranks", str(cfg.min_nodes * cfg.slots),
            # A drill's head asks the agreed stop through this file on every node.
            *(["--stop-file", str(drill.stop_file(cfg))] if cfg.drill else []),
        ]  # fmt: skip
        command = elastic_command(
            cfg, discovery=script_command(Path(cfg.state_dir)), key=self.key,
            interface=self.interface, program=["python3", "-m", "bootstrap.fleet.rank", *program],
            nodes=nodes,
        )  # fmt: skip

        def lost(failed_at: float) -> list[str]:
            return too_few_left(hosts.verdict, cfg.min_nodes) or self.lost_nodes(failed_at)

        launch.run_horovodrun(
            cfg, self.hostfile, self.key, self.ranks, program,
            elastic_env(self.env, self.ssh_bin), "train.log", command=command,
            progress=self.model_dir / "progress.json", lost=lost, log=self.log,
            on_start=on_start,
        )  # fmt: skip

    def start_again(self, failure: BaseException, hosts: Discovery, failed_at: float) -> int | None:
        """After horovodrun's elastic driver gave up (a node lost in a join or a reset: its
        peers abort in Gloo's rendezvous, every worker records FAILURE and the driver stops,
        horovod/runner/elastic/registration.py v0.28.1 lines 151-155, and horovodrun exits 1:
        bootstrap/head/discovery.py says why), start it again on the nodes the discovery still
        lists, from the newest checkpoint they or the head hold: a restart of the processes in
        place, not a relaunch of the fleet. Only nodes whose heartbeat beat since the failure
        count (a dead host's is not stale yet). Returns how many nodes it starts on, or None
        when the attempt ends instead: a cause a restart cannot get past, TRAINING_RESTARTS
        used, fewer than minNodes left. A SIGTERM meanwhile (Interrupted) ends it as any step."""
        cfg = self.cfg
        cause = getattr(failure, "cause", None)
        if cause not in RESTARTED_CAUSES:
            return None
        if len(self.training_restarts) >= TRAINING_RESTARTS:
            self.log(
                f"horovodrun failed again after {TRAINING_RESTARTS} restart(s) in this attempt "
                "(TRAINING_RESTARTS): the attempt ends"
            )
            return None
        try:
            listed = hosts.refresh().live
            alive = supervision.beaten_since(
                self.s3, cfg, [index for index, _, _ in listed], failed_at
            )
        except Interrupted:  # a shutdown: the step ends interrupted, as it would
            raise
        except Exception as exc:  # the fleet's record unreadable: the attempt ends as it would
            self.log(f"cannot read the fleet to start horovodrun again: {one_line(exc)}")
            return None
        live = [node for node in listed if node[0] in alive]
        if len(live) < cfg.min_nodes:
            return None
        addresses = list(dict.fromkeys(ip for _, ip, _ in live))
        if not self.same_host:
            step(
                "checkpoints to the nodes",
                lambda: mirror.push_newer(self.ssh, addresses, self.model_dir, self.model_dir),
            )
        resumed = checkpoints.newest_named(self.model_dir)
        reached = read_json(self.model_dir / "progress.json").get("global_step")
        named = [str(index) for index, _, _ in live]
        self.earlier_resets += read_list(self.model_dir / RESETS_FILE)
        self.training_restarts.append(
            {
                "at": stamp_at(time.time()), "cause": cause, "reason": trim_reason(str(failure)),
                "nodes": named, "reached_step": reached,
                "resumed_from_step": checkpoints.step_of(resumed) if resumed else None,
            }
        )  # fmt: skip
        # The hostfile names each rank's node in a failure's reason: the nodes it starts on.
        self.hostfile.write_text(rendezvous.hostfile_text([(ip, n) for _, ip, n in live]))
        self.ranks = sum(n for _, _, n in live)
        self.log(
            f"horovodrun ended ({one_line(failure)}); starting it again on node(s) "
            f"{', '.join(named)} from {resumed or 'the first step'} (restart "
            f"{len(self.training_restarts)} of at most {TRAINING_RESTARTS} in this attempt)"
        )
        return len(live)

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
        doc = self.with_training_restarts(doc)
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
            launched_at=parse_stamp_s(launched) if launched else self.attempt.started,
            first_step_at=parse_stamp_s(first) if first else None,
            start_step=self.resumes_at_step,
        )
        global_batch = (cfg.trainer.get("batch_per_gpu") or 0) * cfg.nodes * cfg.slots
        earlier = goodput.from_entries(self.attempt.earlier)
        return goodput.live(earlier, current, progress, global_batch)

    def failure_record(self, failure: StepFailed) -> dict:
        return self.with_training_restarts(super().failure_record(failure))

    def with_training_restarts(self, doc: dict) -> dict:
        """DONE.json with this attempt's horovodrun restarts, and the resets of every
        horovodrun of it (the ended ones' first)."""
        earlier = fleet_view.resets({"resets": self.earlier_resets}, [], self.known_hosts)
        return {
            **doc,
            "resets": [*earlier, *doc["resets"]],
            "training_restarts": list(self.training_restarts),
        }

    def writes_record(self, failure: StepFailed) -> bool:
        return True

    def written_by(self) -> str:
        return "head"

    def record_model_dir(self) -> Path | None:
        return self.model_dir
