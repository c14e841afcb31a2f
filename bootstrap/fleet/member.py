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
        watch = supervision.LeaderWatch(cfg, time.time())
        step(
            "rendezvous",
            lambda: rendezvous.serve_as_member(
                s3, cfg, ip, instance_id, self.log,
                leader_lost=lambda now: watch.lost(supervision.read_entry(s3, cfg, 0), now),
                fleet_ready=lambda check: rendezvous.signal_fleet_ready(cfg, check["detail"]),
            ),
        )  # fmt: skip
        step("upload logs", lambda: upload_logs(s3, cfg))

    def writes_record(self, failure: StepFailed) -> bool:
        # The leader writes the record; a member only when the leader is gone.
        return isinstance(failure.__cause__, rendezvous.LeaderLost)

    def written_by(self) -> str:
        return f"member {self.cfg.node_index}"
