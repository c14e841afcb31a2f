"""No supervisor as a single point of failure: horovodrun dies with the leader's bootstrap, a
restarted bootstrap ends what its predecessor left, the leader heartbeats, members fail loudly
when it stops, a failed training names the node whose heartbeat went stale, and the node's unit
restarts a killed bootstrap (and hands over to it at the first boot).

    .venv/bin/python -m pytest tests/bootstrap/fleet/test_supervision.py
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from bootstrap_helpers import BUCKET

from bootstrap.fleet import rendezvous, supervision
from contract import runs

REPO = Path(__file__).resolve().parents[3]


def wait_for(predicate, timeout_s=10.0):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_guarded_command_dies_with_the_process_that_started_it(tmp_path):
    """A bootstrap SIGKILLed mid-run takes horovodrun along (before: horovodrun and the ranks
    trained on unsupervised, and nothing reached S3)."""
    pid_file = tmp_path / "child.pid"
    parent = textwrap.dedent(
        f"""
        import subprocess, sys, time
        from bootstrap.fleet import supervision
        command = supervision.guarded(["bash", "-c", "echo $$ > {pid_file}; exec sleep 300"])
        subprocess.Popen(command)
        time.sleep(300)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "PATH": f"{Path(sys.executable).parent}:"
           f"{os.environ['PATH']}"}  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", parent], env=env)
    try:
        assert wait_for(lambda: pid_file.exists() and pid_file.read_text().strip())
        child = int(pid_file.read_text())
        assert alive(child)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert wait_for(lambda: not alive(child)), "the guarded command outlived its parent"
    finally:
        proc.kill()


def test_the_guard_refuses_to_start_when_its_parent_is_already_gone():
    result = subprocess.run(
        [sys.executable, "-m", "bootstrap.fleet.supervision", "1", "--", "true"],
        capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 1 and "parent 1 is gone" in result.stderr


def test_a_restarted_bootstrap_ends_only_this_run_s_leftover_training(train_config, monkeypatch):
    cfg = train_config()
    job = supervision.job_id(cfg)
    ours = subprocess.Popen(["sleep", "300"], env={**os.environ, supervision.JOB_ENV: job})
    other = subprocess.Popen(["sleep", "300"], env={**os.environ, supervision.JOB_ENV: job + "x"})
    lines = []
    try:
        killed = supervision.end_leftovers(cfg, lines.append)
        assert killed == [ours.pid]
        assert ours.wait(5) == -signal.SIGKILL
        assert other.poll() is None
        assert "ended 1 training process(es)" in lines[0] and str(ours.pid) in lines[0]
    finally:
        ours.kill()
        other.kill()


def test_the_leader_heartbeats_until_stopped(s3, train_config):
    cfg = train_config(heartbeat_timeout_s=1)
    beats = []
    heartbeat = supervision.Heartbeat(lambda: beats.append(time.time()), 0.05)
    heartbeat.start()
    assert wait_for(lambda: len(beats) >= 3, 5)
    heartbeat.stop()
    heartbeat.join(1)
    assert not heartbeat.is_alive()
    assert supervision.heartbeat_interval(cfg) == pytest.approx(0.25)


def entry(index, at, ip="10.0.0.1", instance="i-0lead"):
    return {"index": index, "ip": ip, "gpus": 8, "instance_id": instance,
            "registered_at": runs.stamp_at(at)}  # fmt: skip


def head(at, ip="10.0.0.1", instance="i-0head"):
    return {"ip": ip, "instance_id": instance, "registered_at": runs.stamp_at(at)}


def test_a_node_names_its_head_once_the_head_s_heartbeat_goes_stale(train_config):
    cfg = train_config(node_index=1, heartbeat_timeout_s=60, rendezvous_timeout_s=600)
    watch = supervision.HeadWatch(cfg, started=1000)
    assert watch.lost(None, 1010) is None  # the head has not booted yet: no verdict
    assert watch.lost(head(990), 1020) is None  # alive
    assert watch.lost(head(1050), 1100) is None  # a restarted head beats again
    why = watch.lost(head(1050), 1111)
    assert why.startswith("the head (i-0head, 10.0.0.1) is lost: its heartbeat ")
    assert "runs/r1/head.json is 61 s old" in why and "\n" not in why


def test_a_stalled_head_ends_nothing_while_the_nodes_ranks_step(train_config):
    """Issue 47: the head's processes paused (SIGSTOP) for 90 s after epoch 1 while the ranks
    trained on; 60 s after its last beat every node declared it lost and the attempt ended.
    A late head heartbeat ends nothing while this node's ranks step."""
    cfg = train_config(node_index=1, heartbeat_timeout_s=60, rendezvous_timeout_s=600)
    stepped = [None]
    lines = []
    watch = supervision.HeadWatch(
        cfg, started=1000, ranks_stepped_at=lambda: stepped[0], log=lines.append
    )
    assert watch.lost(head(1100), 1110) is None  # alive
    stepped[0] = 1180
    assert watch.lost(head(1100), 1190) is None  # 90 s silent, the ranks stepped 10 s ago
    assert "is silent" in lines[-1] and "this node's ranks stepped 10 s ago" in lines[-1]
    assert watch.lost(head(1100), 1195) is None and len(lines) == 1  # said once
    assert watch.lost(head(1195), 1200) is None  # it beats again: nothing was lost
    assert "beats again after" in lines[-1]
    # The ranks stop (the head's host gone took their ssh sessions): lost, once their last
    # step is older than 3 times the longest gap seen between two (30 s here) or
    # heartbeat_timeout_s.
    stepped[0] = 1210
    assert watch.lost(head(1195), 1300) is None
    why = watch.lost(head(1195), 1301)
    assert why.startswith("the head (i-0head, 10.0.0.1) is lost: its heartbeat ")
    assert "this node's ranks are not stepping (their last step 91 s ago)" in why


def test_ranks_whose_steps_come_seldom_still_count_as_stepping(train_config):
    """The rehearsal's loaded CPU: a step of 30 s, longer than a heartbeat_timeout_s of 20 s."""
    cfg = train_config(node_index=1, heartbeat_timeout_s=20, rendezvous_timeout_s=300)
    stepped = [1000.0]
    watch = supervision.HeadWatch(cfg, started=900, ranks_stepped_at=lambda: stepped[0])
    for at in range(1000, 1091, 5):  # a step every 30 s, the head beating
        stepped[0] = 1000 + (at - 1000) // 30 * 30
        assert watch.lost(head(at), at) is None
    assert watch.stepping_window_s() == 90
    assert watch.lost(head(1090), 1170) is None  # silent 80 s; the last step 80 s ago
    assert "is lost" in watch.lost(head(1090), 1181)


def test_a_silent_head_is_lost_past_what_a_relaunch_takes_even_while_the_ranks_step(
    train_config,
):
    budget = {"launch": 120, "boot": 120, "own_shards": 26.5, "data_pull": 24.7,
              "rendezvous": 10, "allreduce_check": 60, "framework_start": 120, "first_step": 60}  # fmt: skip
    cfg = train_config(
        node_index=1, heartbeat_timeout_s=120, rendezvous_timeout_s=1800, startup_budget_s=budget
    )
    # A relaunch keeps the nodes' data: every phase but the pull (490 s), not 30 minutes.
    assert supervision.head_silence_bound_s(cfg) == 490
    no_budget = train_config(node_index=1, heartbeat_timeout_s=20, rendezvous_timeout_s=300)
    assert supervision.head_silence_bound_s(no_budget) == 300  # the rehearsal's node.json
    clock = [0.0]
    watch = supervision.HeadWatch(cfg, started=900, ranks_stepped_at=lambda: clock[0] - 5)

    def lost(at: float) -> str | None:
        clock[0] = at  # the ranks stepped 5 s before each look
        return watch.lost(head(1000), at)

    assert lost(1000) is None
    assert lost(1490) is None  # 490 s silent, stepping
    assert "silent for 491 s, past the 490 s a relaunch takes" in lost(1491)


def test_an_earlier_attempts_steps_do_not_keep_a_lost_head(train_config):
    """A node kept in place holds the previous attempt's node-steps.json: not this one's."""
    cfg = train_config(node_index=1, heartbeat_timeout_s=60, rendezvous_timeout_s=600)
    watch = supervision.HeadWatch(cfg, started=1000, ranks_stepped_at=lambda: 995)
    assert watch.lost(head(1001), 1002) is None
    assert "is lost" in watch.lost(head(1001), 1040 + 22)


def test_the_nodes_ranks_stepped_when_their_step_file_was_written(tmp_path):
    assert supervision.ranks_stepped_at(tmp_path) is None
    (tmp_path / supervision.NODE_STEPS_FILE).write_text('{"global_step": 5}')
    os.utime(tmp_path / supervision.NODE_STEPS_FILE, (1234, 1234))
    assert supervision.ranks_stepped_at(tmp_path) == 1234


def test_a_node_whose_head_never_beats_gives_up_after_the_rendezvous_timeout(train_config):
    cfg = train_config(node_index=1, heartbeat_timeout_s=60, rendezvous_timeout_s=300)
    watch = supervision.HeadWatch(cfg, started=1000)
    stale = head(0)  # a previous deployment's heartbeat
    assert watch.lost(stale, 1200) is None
    assert "did not heartbeat" in watch.lost(stale, 1301)


def test_after_an_s3_outage_the_head_gets_heartbeat_timeout_s_to_beat_again(train_config):
    """Before: S3 reset every connection for 75 s (heartbeat_timeout_s 60); when it answered
    again, the node read its leader's 80 s old heartbeat and quit, 11 s before the healthy
    leader wrote DONE.json."""
    cfg = train_config(node_index=1, heartbeat_timeout_s=60, rendezvous_timeout_s=600)
    back = [None]
    watch = supervision.HeadWatch(cfg, started=1000, s3_back_at=lambda: back[0])
    assert watch.lost(head(1000), 1010) is None  # alive
    # S3 stops answering at 1015, answers again at 1090: the newest beat it shows is 1010.
    back[0] = 1090
    assert watch.lost(head(1010), 1090) is None
    assert watch.lost(head(1010), 1150) is None  # 60 s since S3's return: not yet
    assert watch.lost(head(1160), 1165) is None  # the head's next beat arrives
    # A head that stays silent after S3's return is lost heartbeat_timeout_s later.
    why = watch.lost(head(1010), 1151)
    assert "runs/r1/head.json is 141 s old (heartbeat_timeout_s 60; counted from S3 " in why
    assert "answering this node again 61 s ago)" in why


def test_a_node_that_never_saw_its_head_waits_out_s3_s_return_too(train_config):
    cfg = train_config(node_index=1, heartbeat_timeout_s=60, rendezvous_timeout_s=300)
    watch = supervision.HeadWatch(cfg, started=1000, s3_back_at=lambda: 1280)
    assert watch.lost(None, 1301) is None  # past the rendezvous timeout, S3 back 21 s ago
    assert "no heartbeat at all; counted from S3" in watch.lost(None, 1341)


def test_serve_as_member_stops_waiting_for_done_when_the_head_is_lost(s3, train_config):
    """Before: a member whose leader died waited for DONE.json forever."""
    cfg = train_config(node_index=1, heartbeat_timeout_s=8, rendezvous_timeout_s=30)
    s3.put_object(Bucket=BUCKET, Key="runs/r1/ssh/head.pub", Body=b"ssh-ed25519 AAAA hvd-r1")
    now = [time.time()]
    s3.put_object(Bucket=BUCKET, Key="runs/r1/head.json", Body=json.dumps(head(now[0])))
    watch = supervision.HeadWatch(cfg, now[0])

    def sleep(seconds):
        now[0] += seconds

    with pytest.raises(rendezvous.HeadLost, match=r"the head \(i-0head, 10.0.0.1\) is lost"):
        rendezvous.serve_as_member(
            s3, cfg, "10.0.0.2", "i-1", lambda m: None, lambda: now[0], sleep,
            head_lost=lambda t: watch.lost(supervision.read_head(s3, cfg), t),
        )  # fmt: skip
    assert now[0] - watch.started < 20


def test_a_failed_training_names_the_member_whose_heartbeat_went_stale(s3, train_config):
    cfg = train_config(nodes=3, heartbeat_timeout_s=20)
    failed_at = 1000.0
    put = lambda i, e: s3.put_object(  # noqa: E731 - a two-line helper
        Bucket=BUCKET, Key=f"runs/r1/nodes/{i}.json", Body=json.dumps(e)
    )
    put(0, entry(0, 1001, "10.0.0.1", "i-0zero"))  # alive: beat since the failure
    put(1, entry(1, 990, "10.0.0.2", "i-0one"))  # its network died at about 990
    put(2, entry(2, 995, "10.0.0.3", "i-0two"))  # alive: beats again below
    now = [failed_at]

    def sleep(seconds):
        now[0] += seconds
        if now[0] >= 1004:
            put(2, entry(2, now[0], "10.0.0.3", "i-0two"))

    lost = supervision.lost_nodes(s3, cfg, failed_at, lambda: now[0], sleep)
    assert lost == [
        "node 1 (i-0one, 10.0.0.2) lost: no heartbeat for 21 s (heartbeat_timeout_s 20)"
    ]
    assert now[0] <= failed_at + 30


def test_a_failed_training_after_an_s3_outage_waits_for_members_to_beat_again(s3, train_config):
    """S3 answered the head again at 1000 after an outage: the member's beat of 900 is not a
    verdict; its beat at 1010 shows it alive, and a silent member is named only 20 s after S3's
    return."""
    cfg = train_config(nodes=3, heartbeat_timeout_s=20)
    put = lambda i, e: s3.put_object(  # noqa: E731 - a two-line helper
        Bucket=BUCKET, Key=f"runs/r1/nodes/{i}.json", Body=json.dumps(e)
    )
    put(1, entry(1, 900, "10.0.0.2", "i-0one"))  # silent since before the outage
    put(2, entry(2, 900, "10.0.0.3", "i-0two"))  # beats again once S3 answers it
    put(0, entry(0, 900, "10.0.0.1", "i-0zero"))  # so does node 0
    now = [1000.0]

    def sleep(seconds):
        now[0] += seconds
        if now[0] >= 1010:
            put(2, entry(2, now[0], "10.0.0.3", "i-0two"))
            put(0, entry(0, now[0], "10.0.0.1", "i-0zero"))

    lost = supervision.lost_nodes(s3, cfg, 995.0, lambda: now[0], sleep, lambda: 1000.0)
    assert lost == [
        "node 1 (i-0one, 10.0.0.2) lost: no heartbeat for 121 s (heartbeat_timeout_s 20; "
        "counted from S3 answering this node again 21 s ago)"
    ]
    assert 1020 < now[0] <= 1030


def test_a_failure_with_every_member_beating_names_nobody(s3, train_config):
    cfg = train_config(nodes=2, heartbeat_timeout_s=20)
    for index in (0, 1):
        s3.put_object(
            Bucket=BUCKET, Key=f"runs/r1/nodes/{index}.json", Body=json.dumps(entry(index, 1001))
        )
    assert supervision.lost_nodes(s3, cfg, 1000.5, lambda: 1001, lambda s: None) == []


# ---------------------------------------------------------------- the node's systemd unit


def run_lib(tmp_path, body: str, **env):
    """Source lib.sh with a systemctl stub that records its calls, then run body."""
    stubs = tmp_path / "bin"
    stubs.mkdir(exist_ok=True)
    (stubs / "systemctl").write_text(f'#!/bin/bash\necho "$*" >> {tmp_path}/systemctl.calls\n')
    (stubs / "systemctl").chmod(0o755)
    (tmp_path / "units").mkdir(exist_ok=True)
    script = f"set -euo pipefail\nsource {REPO}/bootstrap/lib.sh\n{body}\n"
    return subprocess.run(
        ["bash", "-c", script],
        env={"PATH": f"{stubs}:{os.environ['PATH']}", "SYSTEMD_UNIT_DIR": str(tmp_path / "units"),
             "NODE_JSON": "/etc/horovod-fleet/node.json", **env},
        capture_output=True, text=True,
    )  # fmt: skip


def test_the_node_unit_restarts_a_killed_bootstrap_but_not_a_reported_failure(tmp_path):
    result = run_lib(tmp_path, "install_boot_service /opt/horovod-fleet/bootstrap/train_node.sh")
    assert result.returncode == 0, result.stderr
    unit = (tmp_path / "units" / "horovod-fleet-node.service").read_text()
    assert "\nRestart=on-abnormal\n" in unit and "\nRestartSec=5\n" in unit
    assert "\nStartLimitBurst=5\n" in unit.split("[Service]")[0]
    assert "\nEnvironment=HOROVOD_FLEET_SERVICE=1\n" in unit
    calls = (tmp_path / "systemctl.calls").read_text().splitlines()
    assert calls == ["daemon-reload", "enable horovod-fleet-node.service"]


def test_the_first_boot_hands_over_to_the_unit_without_waiting_for_cloud_final(tmp_path):
    result = run_lib(tmp_path, "config() { echo /var/log/x; }\nhand_over_to_boot_service")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "systemctl.calls").read_text() == (
        "start --no-block horovod-fleet-node.service\n"
    )
    # Under the unit, the script goes on in place.
    again = run_lib(
        tmp_path, "hand_over_to_boot_service || echo runs-here", HOROVOD_FLEET_SERVICE="1"
    )
    assert again.stdout.strip().endswith("runs-here")


def test_the_nodes_alive_after_a_failure_are_those_that_beat_since(s3, train_config):
    cfg = train_config(nodes=3, heartbeat_timeout_s=20)
    put = lambda i, at: s3.put_object(  # noqa: E731 - a two-line helper
        Bucket=BUCKET, Key=f"runs/r1/nodes/{i}.json", Body=json.dumps(entry(i, at))
    )
    put(0, 1001)  # beat since the failure at 1000
    put(1, 995)  # its host died at about 995: fresh still, but silent since
    put(2, 999)  # beats again below
    now = [1000.0]

    def sleep(seconds):
        now[0] += seconds
        put(2, now[0])

    alive = supervision.beaten_since(s3, cfg, [0, 1, 2], 1000.0, lambda: now[0], sleep)
    assert alive == {0, 2}
    assert now[0] - 1000 <= supervision.heartbeat_interval(cfg) + cfg.poll_interval_s + 1
