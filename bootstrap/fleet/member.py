"""A member of the fleet (node_index > 0): after the steps every training node runs, it
registers and keeps its heartbeat while the leader runs the training, until the run's DONE.json,
or until it finds the leader lost, and then writes that DONE.json itself."""

from __future__ import annotations

import time

from bootstrap.fleet import rendezvous, supervision
from bootstrap.node.logs import upload_logs
from bootstrap.node.training_node import TrainingNode
from bootstrap.steps import StepFailed, step


class Member(TrainingNode):
    def run(self) -> None:
        ip, instance_id = self.boot()
        cfg, s3 = self.cfg, self.s3
        started = time.time()
        watch = supervision.LeaderWatch(cfg, started)
        met: list[float] = []

        def on_beat(now: float) -> None:
            self.check_pull()
            # The fleet met when the leader wrote this deployment's hostfile.
            at = None if met else rendezvous.last_written(s3, cfg, "hostfile")
            if at is not None and at >= int(started):
                met.append(at)
                self.phases.measure("rendezvous", started, max(at, started))

        step(
            "rendezvous",
            lambda: rendezvous.serve_as_member(
                s3, cfg, ip, instance_id, self.log,
                leader_lost=lambda now: watch.lost(supervision.read_entry(s3, cfg, 0), now),
                fleet_ready=lambda check: rendezvous.signal_fleet_ready(cfg, check["detail"]),
                shards=self.holds, on_beat=on_beat,
            ),
        )  # fmt: skip
        self.follower.stop()
        step("upload logs", lambda: upload_logs(s3, cfg))

    def writes_record(self, failure: StepFailed) -> bool:
        # The leader writes the record; a member only when the leader is gone.
        return isinstance(failure.__cause__, rendezvous.LeaderLost)

    def written_by(self) -> str:
        return f"member {self.cfg.node_index}"
