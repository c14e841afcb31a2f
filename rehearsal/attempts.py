"""The attempt loop of a run as the deployed fleet makes it: after each attempt the run
controller's own code decides (its Record step), and on `relaunch` the rehearsal plays EC2's
part and the fleet comes back.

`Attempts` is one part of `Rehearsal` (rehearsal/core.py): it trains with the nodes
(rehearsal/nodes.py) and runs the controller against the local S3 (rehearsal/local_s3.py).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from rehearsal.common import BUCKET, REPO, RUN, StepFailed, say

# The run controller's program (the reaper's Lambda asset), run against the local S3 endpoint.
CONTROLLER = REPO / "stacks" / "teardown" / "reaper" / "controller.py"


class Attempts:
    """A run's attempts under the run controller, EC2's relaunch between them."""

    def end_attempt(self, max_restarts: int) -> dict | None:
        """What the run controller's Record step does on a DONE.json: its own code decides and
        records the attempt, here against the local S3 endpoint (docs/contracts.md)."""
        command = [sys.executable, str(CONTROLLER), "--bucket", BUCKET, "--run", RUN,
                   "--max-restarts", str(max_restarts)]  # fmt: skip
        result = subprocess.run(
            command, env=self.env("reaper"), capture_output=True, text=True, timeout=120
        )
        if result.returncode:
            raise StepFailed(f"the run controller failed: {result.stderr.strip()[-500:]}")
        entry = json.loads(result.stdout) if result.stdout.strip() else None
        if entry:
            say(f"run controller: attempt {entry['attempt']} {entry['status']}: "
                f"{entry['decision']} ({entry['why']})")  # fmt: skip
        return entry

    def relaunch(self) -> None:
        """Play EC2's part in the run controller's relaunch (stacks/teardown/reaper/steps_fleet.py,
        StopFleet and Launch). An on-demand fleet is stopped and started: every process of every node
        ends, and each node comes back with an empty instance store (/data) but its own address
        and instance id. A Spot fleet is terminated and launched again from the nodes' launch
        templates: each node is a new instance (new id and address, nothing left on its disks).
        Either way its boot service then runs train_node.sh again."""
        self.end_nodes()
        if self.market == "spot":
            for index in range(self.args.nodes):
                self.replacements[index] = self.replacements.get(index, 0) + 1
                if self.fleet:
                    self.fleet.replace(self.fleet.nodes[index])
                else:
                    shutil.rmtree(self.node_home(index), ignore_errors=True)
            launched = ", ".join(
                f"{self.instance_id(i)} ({self.node_ip(i)})" for i in range(self.args.nodes)
            )
            say(f"EC2: the Spot fleet was terminated and launched from its templates: {launched}")
            return
        if self.fleet:
            for node in self.fleet.nodes:
                self.fleet.kill_host(node.namespace)
        for index in range(self.args.nodes):
            shutil.rmtree(self.node_home(index) / "data", ignore_errors=True)
        say("EC2: the fleet stopped and started again; every node's /data is empty")

    def train_under_controller(
        self, epochs: int, max_restarts: int, before_relaunch=None, **overrides
    ) -> list[dict]:
        """Attempts of one run as the deployed fleet makes them: after each, the run controller
        decides; on `relaunch` the fleet comes back (EC2's part played here) and resumes from
        S3. Returns the controller's entries."""
        entries = []
        while True:
            try:
                self.train(epochs, **overrides)
            except StepFailed as exc:  # a node failed: the controller judges DONE.json
                say(f"the nodes: {exc}")
            entry = self.end_attempt(max_restarts)
            if entry is None:
                return entries
            entries.append(entry)
            if entry["decision"] != "relaunch":
                return entries
            if before_relaunch:
                before_relaunch(self)
            self.relaunch()

    def train_recovering(self, epochs: int) -> None:
        """Every attempt of the plain rehearsal's run under the run controller, as on the fleet:
        a node lost mid-run (its host killed from outside, say) is relaunched and the run
        resumes from S3, at most --max-restarts times. Fails when the run did not succeed."""
        entries = self.train_under_controller(epochs, self.args.max_restarts)
        done = self.done_json()
        if done is None:
            raise StepFailed("the nodes ended without a DONE.json (their log is above)")
        if done["status"] != "succeeded":
            decided = f"; the run controller decided {entries[-1]['decision']}" if entries else ""
            raise StepFailed(
                f"attempt {done.get('attempt')} {done['status']}: {done['reason']}{decided}"
            )
        if relaunches := sum(e["decision"] == "relaunch" for e in entries):
            say(f"recovered: the run succeeded after {relaunches} relaunch(es) of the fleet")
