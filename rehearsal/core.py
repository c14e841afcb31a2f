"""The rehearsal: `Rehearsal`, its steps and their verdict, composed of its parts (the node
processes in rehearsal/processes.py, the local S3 and its snapshots in rehearsal/local_s3.py, the
nodes and their fleet in rehearsal/nodes.py, the attempt loop in rehearsal/attempts.py).
rehearsal/__main__.py is its command line; rehearsal/benchmark.py and rehearsal/faults.py build
on this module.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable

from rehearsal import iam_s3
from rehearsal.attempts import Attempts
from rehearsal.cloud import Cloud
from rehearsal.common import BUCKET, RUN, StepFailed, say
from rehearsal.hosts import Fleet
from rehearsal.local_s3 import LocalS3
from rehearsal.nodes import Nodes
from rehearsal.processes import NodeProcesses


class Rehearsal(Attempts, Nodes, LocalS3, NodeProcesses):
    """One rehearsal: its parts share the state set up here, and `run` takes its steps."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.workdir = args.workdir.resolve()
        self.processes: list[subprocess.Popen] = []
        self.named: dict[str, subprocess.Popen] = {}  # the newest process started under a name
        # Node namespaces to make: the fault rehearsal makes as many as its largest row needs
        # (None: --nodes).
        self.fleet_size: int | None = None
        self.fleet: Fleet | None = None
        self.endpoint = ""
        self.step = "start"
        self.node_processes: list[subprocess.Popen] = []
        self.copiers: list[threading.Thread] = []
        # (node name, text or pattern, action): the first line of that node containing text
        # runs action (the fault rehearsal injects its faults this way).
        self.watches: list[tuple[str, str | re.Pattern, Callable[[], None]]] = []
        self.output: dict[str, list[str]] = {}
        # node name -> (command, env) that systemd's restart of its bootstrap runs, and how
        # often it did.
        self.services: dict[str, tuple[list[str], dict[str, str]]] = {}
        self.restarts: dict[str, int] = {}
        self.node_groups: list[int] = []  # every node process group, restarted ones included
        self.entries: list[dict] = []  # the run controller's decisions of the current row
        self.iam: iam_s3.IamS3Proxy | None = None  # the local S3's IAM judge
        self.market = "on-demand"  # the market of the newest attempt's node.json
        self.launched: dict[int, str] = {}  # node index -> the instance a relaunch launched for it
        self.deployed: dict[int, str] = {}  # node index -> its deployed instance (in moto)
        self.head_instance: str | None = None  # the head's instance (in moto), once deployed
        self.fault_threads: list[threading.Thread] = []  # a fault that goes on (the rehearsal's)
        self.noted: dict = {}  # what a fault row's action noted for its checks
        self.cloud: Cloud | None = None  # the fleet in moto and its run controller, once needed
        self.shards = (4, 2)  # the preprocessing's training and validation shards
        self.status_screens = True  # `horovod-fleet status` after each epoch (not the drill's)

    def close(self) -> None:
        """End every process, then let their output drain: nothing prints after the verdict."""
        for proc in self.processes:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                    proc.wait(timeout=5)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
        self.close_cloud()
        if self.iam:
            self.iam.stop()
            self.iam = None
        if self.fleet:
            self.fleet.close()
        for copier in self.copiers:
            copier.join(timeout=10)

    def plan_steps(self) -> list:
        steps = [
            ("local S3 endpoint", lambda: self.start_s3(sample=True)),
            ("sample dataset", self.make_sample),
            ("preprocessing node", self.preprocess),
            ("training nodes", lambda: self.train_recovering(self.args.epochs)),
            ("results", lambda: self.report(self.args.epochs)),
        ]
        if self.args.rerun_epochs:
            steps += [
                (
                    "reboot: training nodes again",
                    lambda: self.train_recovering(self.args.rerun_epochs),
                ),
                ("results after the rerun", lambda: self.report(self.args.rerun_epochs)),
            ]
        return steps

    def run(self) -> int:
        started = time.time()
        steps = self.plan_steps()
        failure = None
        try:
            for self.step, action in steps:
                say(f"--- {self.step}")
                action()
            self.check_no_refusals()
        except (StepFailed, RuntimeError, OSError) as exc:
            failure = f"FAILED at step '{self.step}': {exc}{self.leader_said()}{self.refused()}"
            self.keep_s3()
        finally:
            # Whatever ended the steps (Ctrl-C, an error nobody foresaw): no namespace, bridge
            # or process outlives the rehearsal, and the verdict is the last line.
            self.close()
        if failure:
            say(failure)
            return 1
        say(f"rehearsal succeeded in {time.time() - started:.0f} s; files in {self.workdir}")
        return 0

    def refused(self) -> str:
        """The IAM refusals so far, for a verdict: on AWS each would be an AccessDenied."""
        refusals = self.iam.refusals if self.iam else []
        if not refusals:
            return ""
        shown = "; ".join(dict.fromkeys(refusals))
        return f"; {len(refusals)} request(s) refused by IAM: {shown[:1500]}"

    def check_no_refusals(self) -> None:
        """A run that got past a refusal still made a request its role may not make: on AWS
        that request fails, so the rehearsal does too."""
        if self.iam and self.iam.refusals:
            self.step = "IAM"
            raise StepFailed("the deployed roles' policies refuse what the nodes asked")

    def leader_said(self) -> str:
        """On a failure, what the run's own DONE.json says (printed, and named in the verdict:
        the leader knows which step failed, wherever the rehearsal noticed it)."""
        done = self.done_json() if self.step.startswith(("training", "reboot")) else None
        if done is None:
            return ""
        say("DONE.json:")
        print(json.dumps(done, indent=2), flush=True)
        return f"; DONE.json: status {done['status']}, reason: {done['reason']}"

    def report(self, epochs: int) -> None:
        done = self.done_json()
        if done is None:
            raise StepFailed(f"no s3://{BUCKET}/runs/{RUN}/DONE.json")
        keys = self.keep_s3()
        say("DONE.json:")
        print(json.dumps(done, indent=2), flush=True)
        if done["status"] != "succeeded":
            raise StepFailed(f"DONE.json status {done['status']}: {done['reason']}")
        if not any(k.endswith(".index") for k in keys if "/model/checkpoints/" in k):
            raise StepFailed("no checkpoint under runs/<run>/model/checkpoints/")
        if done["epochs"] != epochs:
            raise StepFailed(f"DONE.json says {done['epochs']} epochs, expected {epochs}")
        chance = 1 / self.args.classes
        say(
            f"final accuracy: top-1 {done['top1']:.3f} (chance {chance:.3f}), top-5 {done['top5']:.3f}"
        )
