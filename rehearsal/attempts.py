"""The attempt loop of a run as the deployed fleet makes it: the run controller that TeardownStack
deploys looks after the run from its deploy on (rehearsal/cloud.py: its tick every few seconds,
the executions it starts in moto's Step Functions, EC2 and CloudFormation, the local S3), and
what its relaunch did to each instance happens to that node.

`Attempts` is one part of `Rehearsal` (rehearsal/core.py): it trains with the nodes
(rehearsal/nodes.py) against the local S3 (rehearsal/local_s3.py).
"""

from __future__ import annotations

import json
import shutil
import time

from rehearsal.cloud import Cloud, Relaunch
from rehearsal.common import StepFailed, say
from rehearsal.nodes import HEARTBEAT_TIMEOUT_S


class Attempts:
    """A run's attempts under the run controller, its relaunch between them."""

    def deploy_cloud(self, max_restarts: int) -> Cloud:
        """The fleet as deployed (its instances, TrainStack's tags and outputs) and its run
        controller ticking; a stack the controller deleted (a run ended) is deployed anew, as
        `cdk deploy` would."""
        if self.cloud is not None and self.cloud.gone():
            self.close_cloud()
        if self.cloud is None:
            template = self.workdir / "cdk.out" / "TeardownStack.template.json"
            self.cloud = Cloud(
                json.loads(template.read_text()),
                self.s3,
                endpoint=self.endpoint,
                nodes=self.args.nodes,
                spot=self.market == "spot",
                restarts=max_restarts,
                min_nodes=self.min_nodes,
                heartbeat_s=self.heartbeat_s,
                log_path=self.workdir / "controller.log",
            ).__enter__()
            self.cloud.start_ticking()
            # The nodes know their instances by the ids EC2 gave them, as on AWS: the records
            # the controller weighs a node by (its failure, its Spot notice) name them.
            self.deployed, self.head_instance = self.cloud.instances(), self.cloud.head()
        return self.cloud

    def close_cloud(self) -> None:
        if self.cloud is not None:
            self.cloud.__exit__(None, None, None)
            self.cloud = None

    def run_attempt(self, epochs: int, max_restarts: int, **overrides) -> Relaunch:
        """One attempt: the nodes boot and train, and whatever becomes of them (they finish,
        fail, or die with nothing left to say), the attempt is over when the run controller has
        recorded it and its action has run. Returns what the controller did."""
        self.market = overrides.get("market", "on-demand")
        # What the stack's outputs and tags say of the row's node.json (rehearsal/nodes.py).
        self.min_nodes = overrides.get("min_nodes", max(1, self.args.nodes - 1))
        self.heartbeat_s = overrides.get("heartbeat_timeout_s", HEARTBEAT_TIMEOUT_S)
        cloud = self.deploy_cloud(max_restarts)
        attempt = len(cloud.attempts()) + 1
        cloud.watch()
        procs = self.start_nodes(epochs, **overrides)
        deadline = time.time() + self.args.timeout
        shown_epoch = 0
        while time.time() < deadline:
            shown_epoch = self.show_status_after_each_epoch(shown_epoch)
            codes = {name: p.poll() for name, p in procs.items()}
            if any(self.restartable(name, code) for name, code in codes.items()):
                self.restart_killed(procs)
            for index, instance in cloud.joined(attempt).items():
                procs[f"node{index}"] = self.join(index, instance, epochs, overrides)
            if (relaunch := cloud.decided(attempt)) is not None:
                if shown_epoch:  # a training attempt: its last screen, the record on it
                    self.show_status()
                for entry in relaunch.entries:
                    say(f"run controller: attempt {entry['attempt']} {entry['status']}: "
                        f"{entry['decision']} ({entry['why']})")  # fmt: skip
                return relaunch
            time.sleep(0.5)
        raise StepFailed(
            f"the run controller decided nothing about attempt {attempt} in "
            f"{self.args.timeout:.0f} s (node exits: {codes})"
        )

    def join(self, index: int, instance: str, epochs: int, overrides: dict):
        """The run controller replaced node `index` while the attempt goes on: its new instance
        (a new address, empty disks, the replacement template's node.json without an index)
        boots, waits for its launch assignment, pulls the data and joins the training."""
        self.launched[index] = instance
        if self.fleet:
            self.fleet.replace(self.fleet.nodes[index])
        else:
            shutil.rmtree(self.node_home(index), ignore_errors=True)
        say(f"EC2: the run controller launched {instance} ({self.node_ip(index)}) for node {index}")
        proc = self.start_instance(
            f"node{index}", self.node_document(index, epochs, overrides), self.workdir / "data"
        )
        self.node_processes.append(proc)
        self.node_groups.append(proc.pid)
        return proc

    def relaunch(self, relaunch: Relaunch) -> None:
        """What the run controller's StopFleet and Launch states did to each instance
        (stacks/teardown/controller/steps_fleet.py), done to its host. Every process of every
        node ends. A node whose instance was rebooted keeps its disks: its instance store (/data,
        the dataset) and its root (state, logs); one stopped and started keeps its root and
        comes back with an empty instance store; one replaced (EC2 ended it, or a Spot one that
        needed a stop) is a new instance, with a new id and address and nothing on its disks.
        The head alike: rebooted or started it keeps its disk, replaced (EC2 ended it, and the
        controller launched it again from its template) it is a new instance that takes the run
        over from S3. Either way each boot service then runs train_node.sh again."""
        if not relaunch.brought_back:
            raise StepFailed("the run controller decided relaunch and EC2 brought no node back")
        self.end_nodes()
        for index, instance in relaunch.launched.items():
            self.launched[index] = instance
            if self.fleet:
                self.fleet.replace(self.fleet.nodes[index])
            else:
                shutil.rmtree(self.node_home(index), ignore_errors=True)
        for index in relaunch.started + relaunch.rebooted:
            if self.fleet:
                self.fleet.kill_host(self.fleet.nodes[index].namespace)
        for index in relaunch.started:
            shutil.rmtree(self.node_home(index) / "data", ignore_errors=True)
        self.relaunch_head(relaunch)
        if relaunch.replaced:
            launched = ", ".join(
                f"{self.instance_id(i)} ({self.node_ip(i)})" for i in relaunch.replaced
            )
            say(f"EC2: launched in one request from the replacement template: {launched}")
        if relaunch.started:
            said = ", ".join(f"node {i}" for i in relaunch.started)
            say(f"EC2: stopped and started again, /data empty: {said}")
        if relaunch.rebooted:
            said = ", ".join(f"node {i}" for i in relaunch.rebooted)
            say(f"EC2: rebooted in place, /data kept: {said}")

    def relaunch_head(self, relaunch: Relaunch) -> None:
        if relaunch.head is None:
            return
        if self.fleet:
            if relaunch.head == "replaced":
                self.fleet.replace(self.fleet.head)
            else:
                self.fleet.kill_host(self.fleet.head.namespace)
        elif relaunch.head == "replaced":
            shutil.rmtree(self.workdir / "head", ignore_errors=True)
        self.head_instance = relaunch.head_instance
        where = f" from its template: {self.head_instance} ({self.head_ip()})"
        say(f"EC2: the head {relaunch.head}" + (where if relaunch.head == "replaced" else ""))

    def train_under_controller(
        self, epochs: int, max_restarts: int, before_relaunch=None, **overrides
    ) -> list[dict]:
        """Attempts of one run as the deployed fleet makes them: the run controller ends each
        (its tick reads DONE.json, the instances, the heartbeats), and on `relaunch` the nodes
        its StopFleet and Launch brought back boot again and resume from S3. Returns the
        controller's entries."""
        entries = []
        while True:
            relaunch = self.run_attempt(epochs, max_restarts, **overrides)
            entries += relaunch.entries
            if not relaunch.entries or relaunch.entries[-1]["decision"] != "relaunch":
                self.end_nodes()
                return entries
            if before_relaunch:
                before_relaunch(self)
            self.relaunch(relaunch)

    def train_recovering(self, epochs: int) -> None:
        """Every attempt of the plain rehearsal's run under the run controller, as on the fleet:
        a node lost mid-run (its host killed from outside, say) or a whole fleet gone silent is
        relaunched and the run resumes from S3, at most --max-restarts times. Fails when the run
        did not succeed."""
        entries = self.train_under_controller(epochs, self.args.max_restarts)
        done = self.done_json()
        if done is None:
            raise StepFailed("the run controller ended the run without a DONE.json")
        if done["status"] != "succeeded":
            decided = f"; the run controller decided {entries[-1]['decision']}" if entries else ""
            raise StepFailed(
                f"attempt {done.get('attempt')} {done['status']}: {done['reason']}{decided}"
            )
        if relaunches := sum(e["decision"] == "relaunch" for e in entries):
            say(f"recovered: the run succeeded after {relaunches} relaunch(es) of the fleet")
