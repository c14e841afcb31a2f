"""Spot interruption notices: polled only on a Spot node, recorded once in S3, turned into a
SIGTERM to exactly this node's Horovod ranks, and read back for the leader's reason.

.venv/bin/python -m pytest tests/bootstrap/node/test_spot.py
"""

import ast
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
from pathlib import Path

import pytest
from bootstrap_helpers import BUCKET

from bootstrap import aws
from bootstrap.node import spot

REPO = Path(__file__).resolve().parents[3]
NOTICE = {"action": "terminate", "time": "2026-11-25T14:02:00Z"}
NOW = 1_795_000_000.0  # 2026-11-18T11:06:40Z


def not_yet(url="http://169.254.169.254/latest/meta-data/spot/instance-action", code=404):
    return urllib.error.HTTPError(url, code, "Not Found" if code == 404 else "Error", {}, None)


def imds_answers(monkeypatch, answers):
    """aws.imds answering each call with the next of `answers` (an exception is raised), the
    last one for ever after."""
    calls = []

    def imds(path):
        calls.append(path)
        answer = answers[min(len(calls), len(answers)) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(aws, "imds", imds)
    return calls


def catches_sigterm(pid: int) -> bool:
    """Whether the process has installed its SIGTERM handler (proc(5), SigCgt)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


@pytest.fixture
def processes():
    """Real processes for the watcher to find in /proc: two rank wrappers (bootstrap.fleet.rank around
    a sleeper), a launcher-like process carrying `-m bootstrap.fleet.rank` among its arguments (as
    horovodrun does) and a plain sleeper; every one of them ended afterwards."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    started = {
        "rank": [
            subprocess.Popen([sys.executable, "-m", "bootstrap.fleet.rank", *sleeper], env=env)
            for _ in range(2)
        ],
        "launcher": [subprocess.Popen([*sleeper, "-m", "bootstrap.fleet.rank", *sleeper])],
        "other": [subprocess.Popen(sleeper)],
    }
    deadline = time.monotonic() + 30
    while not all(catches_sigterm(p.pid) for p in started["rank"]):
        assert time.monotonic() < deadline, "the rank wrappers never installed their handler"
        time.sleep(0.05)
    yield started
    for proc in [p for group in started.values() for p in group]:
        proc.kill()
        proc.wait()


def test_a_notice_is_recorded_once_and_stops_exactly_the_ranks(
    train_config, s3, processes, monkeypatch
):
    cfg = train_config(market="spot", node_index=1, ip="10.0.1.23", instance_id="i-0abc")
    calls = imds_answers(monkeypatch, [not_yet(), json.dumps(NOTICE)])
    puts = []
    s3.meta.events.register("before-call.s3.PutObject", lambda params, **_: puts.append(params))
    ours = {p.pid for group in processes.values() for p in group}
    lines, sleeps = [], []
    watch = spot.SpotWatch(
        cfg, s3, spot.imds_notice,
        # Only this test's processes: others on the machine are not ours to signal.
        ranks=lambda: [pid for pid in spot.rank_processes() if pid in ours],
        clock=lambda: NOW, sleep=sleeps.append, log=lines.append,
    )  # fmt: skip
    watch.run()  # returns once it acted
    assert calls == ["meta-data/spot/instance-action"] * 2 and sleeps == [5]
    assert len(puts) == 1
    record = s3.get_object(Bucket=BUCKET, Key="runs/r1/interruptions/1.json")
    assert json.loads(record["Body"].read()) == {
        "index": 1, "instance_id": "i-0abc", "ip": "10.0.1.23", "action": "terminate",
        "time": "2026-11-25T14:02:00Z", "noticed_at": "2026-11-18T11:06:40Z",
    }  # fmt: skip
    assert lines[0] == "Spot interruption notice: terminate at 2026-11-25T14:02:00Z"
    ranks = ", ".join(str(pid) for pid in sorted(p.pid for p in processes["rank"]))
    assert lines[1] == (
        f"sent SIGTERM to 2 Horovod rank process(es) on this node (pids {ranks}): they "
        "checkpoint and stop"
    )
    # bootstrap.fleet.rank passes the SIGTERM on: its program died of it, and it says so by its code.
    assert [p.wait(10) for p in processes["rank"]] == [128 + signal.SIGTERM] * 2
    assert all(p.poll() is None for p in processes["launcher"] + processes["other"])


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="a network namespace needs root"
)
def test_a_rank_of_another_host_sharing_the_kernel_is_not_this_node_s():
    """The rehearsal's hosts are network namespaces of one kernel: node 1's notice must not
    stop node 0's ranks."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    rank = [
        sys.executable,
        "-m",
        "bootstrap.fleet.rank",
        sys.executable,
        "-c",
        "import time; time.sleep(60)",
    ]
    here = subprocess.Popen(rank, env=env)
    elsewhere = subprocess.Popen(["unshare", "--net", *rank], env=env)  # unshare execs: same pid
    try:
        deadline = time.monotonic() + 30
        while not all(catches_sigterm(p.pid) for p in (here, elsewhere)):
            assert time.monotonic() < deadline, "the rank wrappers never installed their handler"
            time.sleep(0.05)
        found = spot.rank_processes()
        assert here.pid in found and elsewhere.pid not in found
    finally:
        for proc in (here, elsewhere):
            proc.kill()
            proc.wait()


def test_only_a_python_running_the_rank_module_is_a_rank():
    assert spot.is_rank(["python3", "-m", "bootstrap.fleet.rank", "python3", "-m", "trainer.train"])
    horovodrun = [
        "python3",
        "/usr/bin/horovodrun",
        "-np",
        "2",
        "python3",
        "-m",
        "bootstrap.fleet.rank",
    ]
    assert not spot.is_rank(horovodrun)
    assert not spot.is_rank(
        ["bash", "-c", "python3 -m bootstrap.fleet.rank python3 -m trainer.train"]
    )
    assert not spot.is_rank([""])


def test_an_imds_error_is_logged_once_and_polling_goes_on(train_config, s3, monkeypatch):
    cfg = train_config(market="spot", ip="10.0.1.5", instance_id="i-0lead")
    answers = [not_yet(code=500), urllib.error.URLError("timed out"), not_yet()]
    calls = imds_answers(monkeypatch, [*answers, json.dumps(NOTICE)])
    lines, sleeps = [], []
    spot.SpotWatch(
        cfg, s3, spot.imds_notice, ranks=list, clock=lambda: NOW, sleep=sleeps.append,
        log=lines.append,
    ).run()  # fmt: skip
    assert len(calls) == 4 and sleeps == [5, 5, 5]
    errors = [line for line in lines if line.startswith("cannot read the Spot interruption")]
    assert len(errors) == 1 and "HTTP Error 500" in errors[0]
    assert "(further errors are not logged)" in errors[0]
    assert s3.get_object(Bucket=BUCKET, Key="runs/r1/interruptions/0.json")


def test_an_on_demand_node_starts_no_watcher(train_config):
    cfg = train_config()
    assert cfg.market == "on-demand"
    threads = threading.active_count()
    with spot.watching(cfg, s3=object(), fetch=lambda: NOTICE) as watch:
        assert watch is None and threading.active_count() == threads


def test_the_rehearsal_s_notice_file_is_watched_and_the_watcher_stops_cleanly(
    train_config, s3, tmp_path
):
    notice = tmp_path / "notice.json"
    cfg = train_config(market="spot", spot_notice_file=str(notice), ip="127.0.0.1",
                       instance_id="i-rehearsal")  # fmt: skip
    fetch = spot.notice_source(cfg)
    assert fetch() is None
    with spot.watching(cfg, s3, ranks=list, log=lambda line: None, interval_s=0.05) as watch:
        assert watch.is_alive()
        notice.write_text(json.dumps(NOTICE))
        deadline = time.monotonic() + 10
        while watch.is_alive():
            assert time.monotonic() < deadline, "the notice file was never acted on"
            time.sleep(0.05)
    assert fetch() == NOTICE
    record = json.loads(
        s3.get_object(Bucket=BUCKET, Key="runs/r1/interruptions/0.json")["Body"].read()
    )
    assert (record["instance_id"], record["action"]) == ("i-rehearsal", "terminate")
    # Stopped while it waits: the block ends at once, not after the next poll.
    with spot.watching(cfg, s3, fetch=lambda: None, ranks=list) as watch:
        stopping = time.monotonic()
    assert not watch.is_alive() and time.monotonic() - stopping < 1


def test_the_interrupted_file_mirrors_the_trainer_s():
    # Read, not imported: the trainer's recorder imports TensorFlow.
    source = ast.parse((REPO / "trainer" / "recorder.py").read_text())
    assigned = {
        node.targets[0].id: node.value.value
        for node in source.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        and isinstance(node.targets[0], ast.Name)
    }  # fmt: skip
    assert assigned["INTERRUPTED_FILE"] == spot.INTERRUPTED_FILE
