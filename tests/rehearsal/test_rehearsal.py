"""The rehearsal as a smoke test: the whole run on this machine, then a rerun that resumes.

.venv/bin/python -m pytest -m e2e tests/rehearsal/test_rehearsal.py
"""

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.e2e
def test_rehearsal_trains_across_two_nodes_and_resumes(tmp_path):
    workdir = tmp_path / "rehearsal"
    result = subprocess.run(
        [sys.executable, "-m", "rehearsal", "--workdir", str(workdir), "--epochs", "2",
         "--rerun-epochs", "3"],
        cwd=REPO, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    out = result.stdout
    assert result.returncode == 0, out[-5000:] + result.stderr[-2000:]
    assert re.search(r"^\[head\] 10\.213\.\d+\.2 slots=1$", out, re.M) or "127.0.0.1 slots=2" in out
    assert "Step  Epoch     Speed    Loss FinLoss        LR" in out  # the training table
    assert "data already pulled and verified" in out  # the rerun skipped the pull
    assert "Resuming from" in out and "2 epochs done" in out  # and resumed from S3
    assert re.search(r"final accuracy: top-1 [01]\.\d{3}", out)
    # The real `horovod-fleet status` against the local endpoint, mid-run and at the end.
    screens = out.split("horovod-fleet status: run rehearsal")[1:]
    mid_run = [s for s in screens if re.search(r"progress    epoch 1/2|phase       training", s)]
    assert mid_run, out[-5000:]
    assert all(k in mid_run[0] for k in ("ETA", "$0.00 so far", "hard cap    0:"))
    assert any("DONE.json   succeeded" in s for s in screens)
    run = workdir / "s3" / "runs" / "rehearsal"  # the rehearsal's copy of what the run wrote
    done = json.loads((run / "DONE.json").read_text())
    assert list((run / "model" / "checkpoints").glob("*.index"))
    assert (run / "model" / "eval.json").exists() and list((run / "logs").rglob("train.log"))
    assert done["status"] == "succeeded" and done["epochs"] == 3
    # Each sample class has its own hue: 3 epochs across the two hosts must learn it, well
    # above the 0.1 of chance (it reaches ~0.7); broken labels or unsynchronised ranks do not.
    assert done["top1"] >= 0.3, done
    assert done["images_per_s"] > 0
    # Every node's start-up on the record, and the fleet's view of it with each phase's slowest
    # node (docs/contracts.md); the rerun skipped the pull, which is still on the record.
    assert sorted(p.name for p in (run / "phases").iterdir()) == ["0.json", "1.json", "head.json"]
    phases = done["timeline"]["phases"]
    assert list(phases) == ["launch", "boot", "image_check", "instance_store", "health",
                            "data_pull", "own_shards", "rendezvous", "allreduce_check",
                            "framework_start", "first_step"]  # fmt: skip
    for code in ("launch", "boot", "instance_store", "health", "data_pull", "own_shards",
                 "rendezvous"):  # fmt: skip
        # The head boots too (its own record, phases/head.json), and pulls no data.
        assert set(phases[code]["by_node"]) - {"head"} == {"0", "1"}, (code, phases[code])
        assert re.fullmatch(
            r"(node [01] \(rehearsal-node-[01]|head \(rehearsal-head), [\d.]+\)",
            phases[code]["slowest"],
        )
    for key in ("goodput", "runtime_goodput"):  # null until the trainer writes its steps
        assert done[key] is None or 0 <= done[key] <= 1, done


def test_a_failed_node_gives_the_others_time_to_report_before_blame(monkeypatch, tmp_path):
    """The member that noticed first is not blamed alone: the leader, whose step failed, gets
    time to finish its report, and every node that failed is named."""
    from rehearsal import common, core, processes

    monkeypatch.setattr(processes, "REPORT_GRACE_S", 20)
    rehearsal = core.Rehearsal(argparse.Namespace(workdir=tmp_path))
    procs = {
        "node0": subprocess.Popen(["bash", "-c", "sleep 1; exit 1"]),
        "node1": subprocess.Popen(["bash", "-c", "exit 1"]),
    }
    with pytest.raises(common.StepFailed, match=r"^node0 exited 1, node1 exited 1"):
        rehearsal.wait(procs, 60)


def test_fault_table_has_a_row_per_fault(capsys):
    from rehearsal.faults import print_table

    print_table([("S3 down", "succeeded", "succeeded, epochs 2", "pass"),
                 ("rank killed", "failed", "x" * 300, "FAIL")])  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split(" | ")[0].strip() == "fault" and len(lines) == 4
    assert lines[3].rstrip().endswith("FAIL") and "..." in lines[3]


def test_the_rehearsal_restarts_a_killed_node_bootstrap_as_systemd_would(monkeypatch, tmp_path):
    """Restart=on-abnormal: SIGKILL restarts; a reported failure (exit 1) or SIGTERM does not."""
    from rehearsal import core, processes

    monkeypatch.setattr(processes, "RESTART_SEC", 0)
    rehearsal = core.Rehearsal(argparse.Namespace(workdir=tmp_path))
    again = ["bash", "-c", "echo restarted"]
    procs = {name: subprocess.Popen(["sleep", "60"]) for name in ("node0", "node1")}
    procs["node2"] = subprocess.Popen(["bash", "-c", "exit 1"])
    rehearsal.services = {name: (again, dict(os.environ)) for name in procs}
    procs["node0"].kill()
    procs["node1"].terminate()
    for proc in procs.values():
        proc.wait()
    rehearsal.restart_killed(procs)
    assert rehearsal.restarts == {"node0": 1}
    assert procs["node0"].wait(10) == 0
    assert procs["node1"].returncode == -15 and procs["node2"].returncode == 1
    rehearsal.close()
    assert rehearsal.output["node0"] == ["restarted\n"]


def plain_rehearsal(tmp_path, monkeypatch, outcomes: list[str]):
    """A plain rehearsal whose nodes, EC2 and run controller are stubs: each attempt ends as
    `outcomes` says, and the controller relaunches every failed one."""
    from rehearsal import core

    rehearsal = core.Rehearsal(
        argparse.Namespace(workdir=tmp_path, epochs=4, rerun_epochs=0, max_restarts=2)
    )
    attempts = iter(outcomes)
    calls = {"relaunch": 0, "done": None}

    def run_attempt(epochs, max_restarts, **overrides):
        from rehearsal.cloud import Relaunch

        calls["done"] = {"status": next(attempts), "attempt": calls["relaunch"] + 1, "reason": "r"}
        failed = calls["done"]["status"] != "succeeded"
        relaunch = failed and calls["relaunch"] < max_restarts
        entry = {"attempt": calls["done"]["attempt"], "status": calls["done"]["status"],
                 "decision": "relaunch" if relaunch else "teardown", "why": ""}  # fmt: skip
        return Relaunch(entries=[entry], rebooted=[0, 1] if relaunch else [])

    def relaunch(done):
        assert done.rebooted == [0, 1]
        calls["relaunch"] += 1

    monkeypatch.setattr(rehearsal, "run_attempt", run_attempt)
    monkeypatch.setattr(rehearsal, "relaunch", relaunch)
    monkeypatch.setattr(rehearsal, "end_nodes", lambda: None)
    monkeypatch.setattr(rehearsal, "done_json", lambda: calls["done"])
    [(_, training)] = [(n, a) for n, a in rehearsal.plan_steps() if n == "training nodes"]
    return training, calls


def test_the_plain_rehearsal_recovers_a_lost_node_under_the_run_controller(tmp_path, monkeypatch):
    training, calls = plain_rehearsal(tmp_path, monkeypatch, ["failed", "succeeded"])
    training()
    assert calls["relaunch"] == 1 and calls["done"]["attempt"] == 2


def test_the_plain_rehearsal_fails_when_its_restarts_run_out(tmp_path, monkeypatch):
    from rehearsal import common

    training, calls = plain_rehearsal(tmp_path, monkeypatch, ["failed"] * 3)
    with pytest.raises(common.StepFailed, match=r"^attempt 3 failed: r; .*decided teardown"):
        training()
    assert calls["relaunch"] == 2
