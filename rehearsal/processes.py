"""The rehearsal's processes: each started in its own session with its output copied to ours, the
watches that fire on a node's line, the wait for a step's processes, and systemd's part (a node
bootstrap killed by a signal is restarted as its unit's Restart=on-abnormal does).

`NodeProcesses` is one part of `Rehearsal` (rehearsal/core.py): it reads the state
`Rehearsal.__init__` sets up, and `self.s3` (rehearsal/local_s3.py) for the status screen after
each epoch.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from contract import runs
from rehearsal.common import BUCKET, REGION, REPO, RUN, StepFailed, say

# After one node fails, how long the others get to report theirs: a member needs the heartbeat
# timeout (heartbeat_timeout_s, rehearsal/nodes.py) and a poll to find its leader lost and write
# DONE.json.
REPORT_GRACE_S = 100
# The node unit's Restart=on-abnormal (bootstrap/lib.sh): a bootstrap killed by any signal but
# these is started again after RestartSec, at most StartLimitBurst times.
CLEAN_SIGNALS = {signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE}
RESTART_SEC = 5
RESTART_LIMIT = 5
STATUS_TIMEOUT_S = 60  # the status screen after each epoch: shown only, never the verdict


def matches(pattern: str | re.Pattern, line: str) -> bool:
    """A watch's trigger: a substring of the line, or a regular expression found in it."""
    return bool(pattern.search(line)) if isinstance(pattern, re.Pattern) else pattern in line


class NodeProcesses:
    """The rehearsal's processes and systemd's part for the nodes' bootstraps."""

    def env(self, role: str = "rehearsal") -> dict[str, str]:
        """A process's environment; `role` is the deployed role whose IAM policies the local S3
        judges its requests by (rehearsal/iam_s3.py): node, preprocessor, controller, or none."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(
            AWS_ENDPOINT_URL=self.endpoint,
            AWS_ACCESS_KEY_ID=role,
            AWS_SECRET_ACCESS_KEY="rehearsal",
            AWS_DEFAULT_REGION=REGION,
            AWS_REGION=REGION,
            PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}",
            PYTHONPATH=str(REPO),
            PYTHONUNBUFFERED="1",
            TF_CPP_MIN_LOG_LEVEL="2",
            NO_PROXY="*",
        )
        return env

    def start(
        self, name: str, cmd: list[str], env: dict[str, str], log: Path | None = None
    ) -> subprocess.Popen:
        """Start a process in its own session (so cleanup can end its whole group) and copy
        its output to ours, each line prefixed with its name, or only to `log`."""
        proc = subprocess.Popen(
            cmd,
            env=env,
            cwd=REPO,
            stdout=log.open("w") if log else subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.processes.append(proc)
        self.named[name] = proc
        if log:
            return proc

        lines = self.output.setdefault(name, [])

        def copy() -> None:
            for line in proc.stdout:
                sys.stdout.write(f"[{name}] {line}")
                sys.stdout.flush()
                lines.append(line)
                for watch in [w for w in self.watches if w[0] == name and matches(w[1], line)]:
                    self.watches.remove(watch)
                    watch[2]()

        copier = threading.Thread(target=copy, daemon=True)
        copier.start()
        self.copiers.append(copier)
        return proc

    def wait(self, procs: dict[str, subprocess.Popen], timeout_s: float) -> dict[str, int]:
        """Wait for every process; returns their exit codes, or raises StepFailed naming the
        ones that failed. A failure gives the others REPORT_GRACE_S to finish theirs (the
        leader writes DONE.json after a member fails), so the node that failed first is the
        one blamed, not the one that noticed."""
        deadline = time.time() + timeout_s
        shown_epoch = 0
        while time.time() < deadline:
            shown_epoch = self.show_status_after_each_epoch(shown_epoch)
            codes = {name: p.poll() for name, p in procs.items()}
            # Judged on the same exit codes: a bootstrap killed while the status screen ran
            # is systemd's to restart, not a failure.
            if any(self.restartable(name, code) for name, code in codes.items()):
                self.restart_killed(procs)
                continue
            if any(c not in (None, 0) for c in codes.values()):
                grace = time.time() + REPORT_GRACE_S
                while time.time() < grace and any(p.poll() is None for p in procs.values()):
                    time.sleep(0.5)
                codes = {name: p.poll() for name, p in procs.items()}
                failed = [f"{n} exited {c}" for n, c in codes.items() if c not in (None, 0)]
                raise StepFailed(", ".join(failed) + " (the log is above)")
            if all(c == 0 for c in codes.values()):
                if shown_epoch:  # a training run: its last screen
                    self.show_status()
                return codes
            time.sleep(0.5)
        raise StepFailed(f"{', '.join(procs)} still running after {timeout_s:.0f} s")

    def show_status_after_each_epoch(self, shown_epoch: int) -> int:
        """Print `horovod-fleet status` each time the leader's status.json is in a new epoch
        (the previous one is over); returns the newest epoch shown."""
        if not self.status_screens:
            return shown_epoch
        try:
            body = self.s3.get_object(Bucket=BUCKET, Key=runs.key(RUN, runs.STATUS))["Body"]
            status = json.loads(body.read())
        except Exception:  # not written yet (or half-way through a rewrite): next time
            return shown_epoch
        if status.get("phase") not in ("training", "evaluating"):  # or the last run's
            return shown_epoch
        epoch = (status.get("progress") or {}).get("epoch") or 0
        if epoch > shown_epoch:
            self.show_status()
        return max(epoch, shown_epoch)

    def show_status(self) -> None:
        """The real command against the local endpoint, as a user would run it."""
        watch = [sys.executable, "-m", "watch.cli", "status", "--run", RUN, "--bucket", BUCKET]
        try:
            result = subprocess.run(
                watch, env=self.env(), capture_output=True, text=True, timeout=STATUS_TIMEOUT_S
            )
        except subprocess.TimeoutExpired:  # a loaded machine: the screen only shows the run
            say(f"horovod-fleet status did not answer within {STATUS_TIMEOUT_S} s: not shown")
            return
        print(result.stdout + result.stderr, end="", flush=True)

    def restartable(self, name: str, code: int | None) -> bool:
        """A node bootstrap killed by a signal that its unit's Restart=on-abnormal restarts."""
        if code is None or code >= 0 or name not in self.services:
            return False
        if signal.Signals(-code) in CLEAN_SIGNALS:
            return False
        return self.restarts.get(name, 0) < RESTART_LIMIT

    def restart_killed(self, procs: dict[str, subprocess.Popen]) -> None:
        """Play systemd's part for the simulated nodes: a node bootstrap killed by a signal
        (Restart=on-abnormal) is started again after RESTART_SEC, in place in procs."""
        for name, proc in list(procs.items()):
            code = proc.poll()
            if not self.restartable(name, code):
                continue
            self.restarts[name] = self.restarts.get(name, 0) + 1
            say(
                f"{name}'s bootstrap was killed by {signal.Signals(-code).name}: restarting it "
                f"in {RESTART_SEC} s, as its unit's Restart=on-abnormal does"
            )
            time.sleep(RESTART_SEC)
            command, env = self.services[name]
            procs[name] = self.start(name, command, env)
            self.node_processes = list(procs.values())
            self.node_groups.append(procs[name].pid)

    def end_nodes(self) -> None:
        """SIGKILL every node process group, restarted ones included (their sshd too)."""
        for group in self.node_groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
