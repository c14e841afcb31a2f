"""A node of the fleet, any index: after the steps every training node runs, it registers and
keeps its heartbeat while the head runs the training on it, until the run's DONE.json, or until
it finds the head lost, and then writes that DONE.json itself."""

from __future__ import annotations

import time

from bootstrap import aws
from bootstrap.fleet import node_failures, rendezvous, supervision
from bootstrap.fleet.interfaces import interface_of
from bootstrap.head import drill
from bootstrap.lines import one_line
from bootstrap.node.logs import upload_logs
from bootstrap.node.training_node import TrainingNode
from bootstrap.records import results
from bootstrap.steps import StepFailed, step


class Member(TrainingNode):
    def run(self) -> None:
        ip, instance_id = self.boot()
        cfg, s3 = self.cfg, self.s3
        started = time.time()
        # A stalled head is not a lost one while this node's ranks step (their node-steps.json).
        watch = supervision.HeadWatch(
            cfg, started, ranks_stepped_at=lambda: supervision.ranks_stepped_at(self.model_dir),
            log=self.log,
        )  # fmt: skip
        met: list[float] = []
        asked: list[float] = []  # when this node first saw the drill's stop asked
        interface = step("network interface", lambda: interface_of(ip))

        def on_beat(now: float) -> None:
            self.check_pull()
            if cfg.drill is not None and drill.mirror_stop(s3, cfg) and not asked:
                asked.append(now)
                self.log("the drill's head asked the training to stop at this epoch's end")
            # The fleet met when the head wrote this deployment's hostfile.
            at = None if met else rendezvous.last_written(s3, cfg, "hostfile")
            if at is not None and at >= int(started):
                met.append(at)
                self.phases.measure("rendezvous", started, max(at, started))

        step(
            "rendezvous",
            lambda: rendezvous.serve_as_member(
                s3, cfg, ip, instance_id, self.log,
                head_lost=lambda now: watch.lost(supervision.read_head(s3, cfg), now),
                fleet_ready=lambda check: rendezvous.signal_fleet_ready(cfg, check["detail"]),
                shards=self.holds, on_beat=on_beat, interface=interface,
            ),
        )  # fmt: skip
        self.follower.stop()
        step("upload logs", lambda: upload_logs(s3, cfg))

    def report(self, failure: StepFailed) -> None:
        """As every instance reports; and unless the head is gone (this node writes DONE.json
        then), the failure goes where the head reads it (bootstrap/fleet/node_failures.py)."""
        cfg = self.cfg
        told = (rendezvous.HeadLost, results.RecordTaken)
        if not isinstance(failure.__cause__, told):
            try:
                # A shell step's failure comes before the bootstrap asked who this node is.
                ip, instance_id = self.identity or (aws.private_ip(cfg), aws.instance_id(cfg))
                s3 = aws.s3_client(cfg.region, self.results_policy)
                node_failures.write(
                    s3, cfg, ip, instance_id, failure.cause, str(failure), time.time()
                )
            except Exception as exc:  # the head names this node lost instead
                self.log(f"could not tell the head why this node failed: {one_line(exc)}")
        super().report(failure)

    def writes_record(self, failure: StepFailed) -> bool:
        # The head writes the record; a node only when the head is gone.
        return isinstance(failure.__cause__, rendezvous.HeadLost)

    def written_by(self) -> str:
        return f"member {self.cfg.node_index}"
