"""`python -m trainer.train --elastic` under horovodrun's elastic mode on this machine: two hosts
faked as Horovod's own integration tests fake them (`localhost` and `127.0.0.1`, both local, so
no ssh: test/integration/elastic_common.py v0.28.1), listed by a discovery script that reads a
file the test rewrites. A host killed mid-epoch (rank 0's), a host that returns and gets the
state, a host dropped from the discovery, a planned leave, a leave below --min-ranks.

    .venv/bin/python -m pytest -m slow tests/trainer/test_train_elastic.py
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest
from trainer_helpers import HOROVODRUN, PYTHON, REPO, trainer_env

pytestmark = pytest.mark.slow

HOSTS = ("localhost", "127.0.0.1")


class ElasticJob:
    """horovodrun --gloo --host-discovery-script over a hosts file, and the trainer's output."""

    def __init__(self, workdir: Path, slots: int, args: list[str], *, min_ranks: int = 1):
        self.workdir = workdir
        self.hosts_file = workdir / "hosts"
        self.model_dir = workdir / "model"
        self.digests = workdir / "digests"
        self.digests.mkdir()
        script = workdir / "discover.sh"
        script.write_text(f"#!/bin/sh\ncat {self.hosts_file}\n")
        script.chmod(0o755)
        self.list_hosts(*(f"{host}:{slots}" for host in HOSTS))
        ranks = slots * len(HOSTS)
        command = [HOROVODRUN, "-np", str(ranks), "--min-np", str(min_ranks)]
        command += ["--max-np", str(ranks), "--gloo", "--host-discovery-script", str(script)]
        # A failed host is blacklisted; it may return after 1-2 s (docs/elastic.rst).
        command += ["--blacklist-cooldown-range", "1", "2"]
        command += [PYTHON, "-m", "trainer.train", "--model-dir", str(self.model_dir), *args]
        command += ["--elastic", "--planned-ranks", str(ranks), "--min-ranks", str(min_ranks)]
        env = trainer_env(TRAINER_WEIGHTS_DIGEST_DIR=str(self.digests))
        self.process = subprocess.Popen(
            command,
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # the test ends what it started, and only that
        )
        self.lines: list[str] = []
        self.cursor = 0  # wait_for reads on after its last match
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def list_hosts(self, *lines: str) -> None:
        self.hosts_file.write_text("".join(f"{line}\n" for line in lines))

    def wait_for(self, pattern: str, timeout: float = 300) -> re.Match:
        """The first line after the last match that matches `pattern`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lines, done = list(self.lines), self.process.poll() is not None
            for index in range(self.cursor, len(lines)):
                if match := re.search(pattern, lines[index]):
                    self.cursor = index + 1
                    return match
            self.cursor = len(lines)
            if done:
                break
            time.sleep(0.2)
        raise AssertionError(f"no line matches {pattern!r}:\n" + "\n".join(self.lines[-40:]))

    def ranks_on(self, host: str) -> list[psutil.Process]:
        """The trainer processes horovodrun started on `host` (HOROVOD_HOSTNAME)."""
        found = []
        for process in psutil.Process(self.process.pid).children(recursive=True):
            try:
                env = process.environ()
                if env.get("HOROVOD_HOSTNAME") == host and "trainer.train" in process.cmdline():
                    found.append(process)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return found

    def first_rank_0_host(self) -> str:
        """The host Horovod gave rank 0 at the start (in no set order: a set of hosts)."""
        for host in HOSTS:
            if any(p.environ().get("HOROVOD_RANK") == "0" for p in self.ranks_on(host)):
                return host
        raise AssertionError("no rank 0")

    def finish(self, timeout: float = 600) -> int:
        try:
            code = self.process.wait(timeout=timeout)
        finally:
            self.stop()
        self.reader.join(timeout=10)
        return code

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def output(self) -> str:
        return "\n".join(self.lines)

    def resets(self) -> list[dict]:
        return json.loads((self.model_dir / "resets.json").read_text())

    def world_digests(self) -> dict[int, set[str]]:
        worlds: dict[int, set[str]] = {}
        for path in self.digests.glob("world-*-rank-*.sha256"):
            world = int(path.name.split("-")[1])
            worlds.setdefault(world, set()).add(path.read_text().strip())
        return worlds


@pytest.fixture
def elastic_job(tmp_path):
    jobs = []

    def start(*args, **kwargs) -> ElasticJob:
        jobs.append(ElasticJob(tmp_path, *args, **kwargs))
        return jobs[-1]

    yield start
    for job in jobs:
        job.stop()


def test_rank_0_s_host_killed_then_back_then_dropped_trains_on_with_the_same_state(
    elastic_job, digits_data
):
    """4 ranks on 2 hosts, float16 (its loss scale and good-step count are state too).
    - Rank 0 is SIGKILLed mid-epoch: Horovod blacklists its host and ends its other rank; the 2
      ranks left restore their last commit and train on, one of them the new rank 0.
    - After the blacklist's cooldown the host is discovered again: its 2 new ranks get the state.
    - The discovery drops it (Horovod's graceful removal): every rank commits at the next check
      step, rank 0 keeps that step on disk, no step is redone, the dropped ranks are aborted.
    After every reset every rank holds the same digest of every variable; the run finishes."""
    args = ["--data-dir", str(digits_data), "--arch", "resnet18", "--image-size", "32"]
    args += ["--batch-size", "4", "--epochs", "2", "--steps-per-epoch", "12", "--log-every", "2"]
    args += ["--precision", "fp16", "--eval-every", "2"]
    job = elastic_job(2, args)
    job.wait_for(r"\]<stdout>: +2 +0\.17 ")  # mid-epoch 1
    lost = job.first_rank_0_host()
    kept = next(host for host in HOSTS if host != lost)
    [rank_0] = [p for p in job.ranks_on(lost) if p.environ().get("HOROVOD_RANK") == "0"]
    rank_0.kill()
    job.wait_for(r"elastic: reset to 2 ranks \(from 4; hosts lost: " + re.escape(lost))
    job.wait_for(r"elastic: reset to 4 ranks \(from 2; hosts lost: none, added: " + re.escape(lost))
    job.list_hosts(f"{kept}:2")
    job.wait_for(r"elastic: reset to 2 ranks \(from 4; hosts lost: " + re.escape(lost))
    code = job.finish()
    assert code == 0, job.output()[-4000:]

    killed, back, dropped = job.resets()
    assert (killed["ranks_before"], killed["ranks_after"]) == (4, 2)
    assert (killed["hosts_lost"], killed["hosts_added"]) == ([lost], [])
    assert killed["steps_redone"] == killed["failed_at_step"] - killed["resumed_at_step"] >= 0
    assert 0 < killed["recovery_s"] < 300
    assert (back["ranks_before"], back["ranks_after"], back["hosts_added"]) == (2, 4, [lost])
    assert (dropped["hosts_lost"], dropped["ranks_after"]) == ([lost], 2)
    assert back["steps_redone"] == dropped["steps_redone"] == 0  # announced: nothing lost
    step = dropped["failed_at_step"]
    assert (job.model_dir / "checkpoints" / f"ckpt-{step}.index").exists()
    assert f"{lost}[0] has been removed from elastic job" in job.output()
    train = json.loads((job.model_dir / "train.json").read_text())
    assert train["epochs"] == 2 and train["resets"] == [killed, back, dropped]
    assert train["steps_redone"] == killed["steps_redone"]
    # The digest of every state variable after each world's sync: one per world, every rank.
    worlds = job.world_digests()
    assert sorted(worlds) == [0, 1, 2, 3], worlds
    assert all(len(digests) == 1 for digests in worlds.values()), worlds
    final = {p.read_text() for p in job.digests.glob("rank-*.sha256")}
    assert len(final) == 1, final


def synthetic_job(elastic_job, *, min_ranks: int) -> ElasticJob:
    args = ["--synthetic", "--num-classes", "10", "--arch", "resnet18", "--image-size", "32"]
    args += ["--batch-size", "4", "--epochs", "2", "--steps-per-epoch", "10", "--log-every", "5"]
    return elastic_job(1, args, min_ranks=min_ranks)


def other_host(job: ElasticJob) -> str:
    rank_0_host = job.first_rank_0_host()
    return next(host for host in HOSTS if host != rank_0_host)


def test_a_signalled_host_leaves_at_a_commit_and_the_others_redo_no_step(elastic_job):
    """A Spot notice: the node's bootstrap sends SIGTERM to its ranks and the discovery stops
    listing it. Its rank leaves with EXIT_LEFT (76), never 0, the other trains on alone and
    finishes with exit 0."""
    job = synthetic_job(elastic_job, min_ranks=1)
    job.wait_for(r"\]<stdout>: +5 +0\.50 ")
    leaving = other_host(job)
    job.list_hosts(f"{job.first_rank_0_host()}:1")
    [rank] = job.ranks_on(leaving)
    rank.send_signal(signal.SIGTERM)
    job.wait_for(rf"left the elastic job: host {re.escape(leaving)} leaves the elastic job at step")
    code = job.finish()
    assert code == 0, job.output()[-4000:]
    assert "Process 1 exit with status code 76." in job.output()
    [reset] = job.resets()
    assert (reset["hosts_lost"], reset["ranks_after"], reset["steps_redone"]) == ([leaving], 1, 0)


def test_a_leave_below_min_ranks_stops_every_rank_at_a_checkpoint(elastic_job):
    job = synthetic_job(elastic_job, min_ranks=2)
    job.wait_for(r"\]<stdout>: +5 +0\.50 ")
    [rank] = job.ranks_on(other_host(job))
    rank.send_signal(signal.SIGTERM)
    code = job.finish()
    assert code != 0  # horovodrun's own status for its ranks' 75
    assert job.output().count("exit with status code 75.") == 2, job.output()[-4000:]
    assert "fewer than --min-ranks 2: every rank stops" in job.output()
    marker = json.loads((job.model_dir / "interrupted.json").read_text())
    assert marker["reason"].startswith("a signal on another rank: stopped at step")
    assert marker["checkpoint"].endswith(f"ckpt-{marker['step']}")
