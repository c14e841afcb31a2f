"""The head's host discovery (bootstrap/head/discovery.py): which nodes Horovod may use, the
script it runs every second, and the thread that keeps the script's file current."""

import json
import subprocess
import sys

import boto3
import pytest
from bootstrap_helpers import BUCKET, train_doc
from moto import mock_aws

from bootstrap.head import hosts_file
from bootstrap.head.discovery import Discovery, live_hosts
from bootstrap.head.hosts_file import admit, print_hosts
from bootstrap.node_config import parse
from contract.runs import stamp_at

NOW = 1_800_000_000.0
KEY = "k" * 64


def entry(index, ip=None, *, age=5.0, key=KEY, instance=None, shards=None, gpus=8):
    found = {
        "index": index,
        "ip": ip or f"10.0.0.{10 + index}",
        "gpus": gpus,
        "instance_id": instance or f"i-{index:04d}",
        "registered_at": stamp_at(NOW - age),
        "head_key_sha256": key,
    }
    if shards is not None:
        found["shards"] = shards
    return found


def judge(entries, **overrides):
    arguments = dict(
        nodes=3, now=NOW, heartbeat_timeout_s=120, head_key=KEY, since=NOW - 600,
        noticed=set(), ec2_states=None, admitted=set(), started=False,
    )  # fmt: skip
    return live_hosts(entries, **(arguments | overrides))


def test_live_nodes_are_listed_in_node_order_with_their_slots():
    verdict = judge([entry(2), entry(0), entry(1)])
    assert verdict.lines() == ["10.0.0.10:8", "10.0.0.11:8", "10.0.0.12:8"]
    assert verdict.left == {}


@pytest.mark.parametrize(
    ("changed", "why"),
    [
        (dict(age=121), "no heartbeat for 121 s"),
        (dict(key="other"), "without the head's key"),
        (dict(age=700), "before this attempt's rendezvous"),
    ],
)
def test_a_node_whose_registration_does_not_count_is_left_out_with_why(changed, why):
    verdict = judge([entry(0), entry(1, **changed)])
    assert verdict.lines() == ["10.0.0.10:8"]
    assert why in verdict.left[1] and verdict.left[1].startswith("node 1 (i-0001, 10.0.0.11)")


def test_after_an_s3_outage_a_heartbeat_counts_from_s3s_return():
    """No node could beat while S3 did not answer the head: its staleness counts from when S3
    answered again, as every heartbeat judgement does (bootstrap/fleet/supervision.py). Only
    then is the node silent, the word the run controller replaces a running node on."""
    old = [entry(0, age=200)]
    assert judge(old, s3_back_at=NOW - 30).lines() == ["10.0.0.10:8"]
    assert judge(old, s3_back_at=NOW - 30).silent == ()
    assert judge(old, s3_back_at=NOW - 130).lines() == []
    assert judge(old, s3_back_at=NOW - 130).silent == (0,)
    # Left out for another reason (a Spot notice), a node is not silent.
    assert judge([entry(0)], noticed={"i-0000"}).silent == ()


def test_a_spot_notice_of_the_instance_drops_it_but_not_its_replacement():
    verdict = judge([entry(0), entry(1)], noticed={"i-0001"})
    assert verdict.lines() == ["10.0.0.10:8"] and "Spot interruption notice" in verdict.left[1]
    replaced = judge([entry(0), entry(1, "10.0.0.99", instance="i-new")], noticed={"i-0001"})
    assert replaced.lines() == ["10.0.0.10:8", "10.0.0.99:8"]


def test_where_ec2_answers_only_running_instances_are_listed():
    states = {"i-0000": "running", "i-0001": "shutting-down"}
    verdict = judge([entry(0), entry(1), entry(2)], ec2_states=states)
    assert verdict.lines() == ["10.0.0.10:8"]
    assert "shutting-down" in verdict.left[1] and "is gone" in verdict.left[2]


def test_own_shards_make_the_first_world_but_a_node_joins_a_running_job_only_with_all():
    nodes = [entry(0, shards="own"), entry(1, shards="own"), entry(2, shards=None)]
    assert len(judge(nodes).lines()) == 3  # the first world: each reads its own shards
    running = judge(nodes, started=True, admitted={"10.0.0.10"})
    # Node 0 keeps its place; node 1 would join a world that re-shards; node 2 pulled all.
    assert running.lines() == ["10.0.0.10:8", "10.0.0.12:8"]
    assert "needs all of them" in running.left[1]
    assert "not pulled" in judge([entry(0, shards="none")]).left[0]


def test_nodes_at_one_address_share_a_line():
    verdict = judge([entry(0, "127.0.0.1", gpus=0), entry(1, "127.0.0.1", gpus=0)])
    assert verdict.lines() == ["127.0.0.1:2"]


def test_the_script_admits_one_new_host_a_run_in_node_order_and_drops_the_gone_at_once():
    desired = ["10.0.0.10:8", "10.0.0.11:8", "10.0.0.12:8"]
    first = admit(desired, [])
    second = admit(desired, first)
    third = admit(desired, second)
    assert (first, second, third) == (desired[:1], desired[:2], desired)
    assert admit(desired, third) == desired  # steady
    # Node 0 lost: gone at once, the others keep their order; its replacement comes last.
    after = ["10.0.0.11:8", "10.0.0.12:8", "10.0.0.99:8"]
    assert admit(after, third) == after


def test_the_script_prints_and_remembers_and_never_fails(tmp_path):
    (tmp_path / "hosts").write_text("10.0.0.10:8\n10.0.0.11:8\n")
    run = [sys.executable, "-m", "bootstrap.head.hosts_file", str(tmp_path)]
    outputs = [subprocess.run(run, capture_output=True, text=True, check=True) for _ in range(3)]
    both = "10.0.0.10:8\n10.0.0.11:8\n"
    assert [o.stdout for o in outputs] == ["10.0.0.10:8\n", both, both]
    # A state dir it cannot write: the hosts it printed last, exit 0 (a first failure would end
    # the job: horovod/runner/elastic/driver.py _discover_hosts).
    (tmp_path / "hosts").chmod(0o000)
    missing = subprocess.run(
        [sys.executable, "-m", "bootstrap.head.hosts_file", str(tmp_path / "nowhere")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert (missing.returncode, missing.stdout) == (0, "")


def test_a_broken_admitted_file_still_prints_the_last_hosts(tmp_path, capsys):
    (tmp_path / "hosts").write_text("10.0.0.10:8\n")
    (tmp_path / "hosts.admitted").mkdir()  # cannot be replaced by a file
    assert print_hosts(tmp_path) == 0
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("horovod-fleet discovery: ")


def test_the_script_command_runs_through_a_shell(tmp_path):
    (tmp_path / "hosts").write_text("10.0.0.10:8\n")
    command = hosts_file.script_command(tmp_path)
    result = subprocess.run(command, shell=True, capture_output=True, text=True, check=True)
    assert result.stdout == "10.0.0.10:8\n"


# --- the thread, against moto --------------------------------------------------------------------


def head_config(tmp_path, **overrides):
    doc = train_doc(role="head", state_dir=str(tmp_path / "state0"), **overrides)
    del doc["node_index"]
    return parse(doc)


@pytest.fixture
def fleet(s3, tmp_path):
    return head_config(tmp_path, nodes=2), s3


def register(s3, entry_doc):
    s3.put_object(
        Bucket=BUCKET, Key=f"runs/r1/nodes/{entry_doc['index']}.json",
        Body=json.dumps(entry_doc).encode(),
    )  # fmt: skip


def test_the_thread_writes_the_hosts_from_s3_and_ec2_and_logs_who_comes_and_goes(fleet, tmp_path):
    cfg, s3 = fleet
    lines = []
    with mock_aws():
        ec2 = boto3.client("ec2", region_name="us-east-1")
        launched = ec2.run_instances(ImageId="ami-12c6146b", MinCount=2, MaxCount=2)
        ids = [i["InstanceId"] for i in launched["Instances"]]
        for index, instance in enumerate(ids):
            register(s3, entry(index, instance=instance) | {"registered_at": stamp_at(NOW)})
        found = Discovery(
            cfg, s3, head_key=KEY, since=NOW - 10, ec2=ec2, log=lines.append,
            clock=lambda: NOW, s3_back_at=lambda: None,
        )  # fmt: skip
        found.refresh()
        assert (tmp_path / "state0" / "hosts").read_text() == "10.0.0.10:8\n10.0.0.11:8\n"
        ec2.terminate_instances(InstanceIds=[ids[1]])
        s3.put_object(
            Bucket=BUCKET, Key="runs/r1/interruptions/0.json",
            Body=json.dumps({"instance_id": ids[0], "noticed_at": stamp_at(NOW)}).encode(),
        )  # fmt: skip
        verdict = found.refresh()
    assert verdict.lines() == [] and (tmp_path / "state0" / "hosts").read_text() == ""
    assert lines[0] == "discovery: 2 host(s) live: 10.0.0.10:8, 10.0.0.11:8"
    assert any("Spot interruption notice" in line for line in lines)
    assert any("EC2 says its instance is" in line for line in lines)


def test_a_replacement_joins_only_once_its_heartbeat_is_steady_and_the_head_reaches_it(
    fleet, tmp_path
):
    """Issue 47: a replacement registered, was handed to the driver, and died mid-join; the
    others aborted in Gloo's rendezvous and horovodrun ended. A joiner is listed only after
    JOIN_BEATS beats over heartbeat_timeout_s / 2, and once the head reached it over ssh."""
    cfg, s3 = fleet  # 2 nodes, heartbeat_timeout_s 120 (train_doc's default): 60 s steady
    state = tmp_path / "state0"
    clock = [NOW]
    reached = {"10.0.0.99": "ssh 10.0.0.99 exited 255: Connection refused"}
    lines = []
    found = Discovery(
        cfg, s3, head_key=KEY, since=NOW - 600, log=lines.append, clock=lambda: clock[0],
        s3_back_at=lambda: None, reach=lambda ip: reached.get(ip),
    )  # fmt: skip
    (state / "hosts.admitted").write_text("10.0.0.10:8\n10.0.0.11:8\n")  # the world formed
    register(s3, entry(0, age=0))
    register(s3, entry(1, age=0))
    assert found.refresh().lines() == ["10.0.0.10:8", "10.0.0.11:8"]
    # Node 1 is lost; its replacement (another address) registers with every shard.
    (state / "hosts.admitted").write_text("10.0.0.10:8\n")

    def beat(at: float) -> list[str]:
        clock[0] = at
        register(s3, entry(0, age=NOW - at) | {"registered_at": stamp_at(at)})
        register(s3, entry(1, "10.0.0.99", instance="i-new") | {"registered_at": stamp_at(at)})
        return found.refresh().lines()

    assert beat(NOW + 1) == ["10.0.0.10:8"]
    assert "not ready to join yet: 1 heartbeat(s) over 0 s" in found.verdict.left[1]
    assert found.verdict.silent == ()  # not silent: the run controller leaves it alone
    assert beat(NOW + 31) == ["10.0.0.10:8"]
    assert beat(NOW + 61) == ["10.0.0.10:8"]  # steady, but the head cannot reach it
    assert "the head cannot reach it: ssh 10.0.0.99 exited 255" in found.verdict.left[1]
    reached.clear()
    assert beat(NOW + 63) == ["10.0.0.10:8", "10.0.0.99:8"]
    assert any("is ready to join" in line for line in lines)


def test_a_joiner_that_dies_before_it_is_steady_is_never_listed(fleet, tmp_path):
    cfg, s3 = fleet
    state = tmp_path / "state0"
    clock = [NOW]
    found = Discovery(
        cfg, s3, head_key=KEY, since=NOW - 600, log=lambda line: None,
        clock=lambda: clock[0], s3_back_at=lambda: None,
    )  # fmt: skip
    (state / "hosts.admitted").write_text("10.0.0.10:8\n10.0.0.11:8\n")
    register(s3, entry(0, age=0))
    register(s3, entry(1, age=0))
    found.refresh()
    (state / "hosts.admitted").write_text("10.0.0.10:8\n")
    register(s3, entry(1, "10.0.0.99", instance="i-new", age=0))  # it beat once, then died
    listed = []
    for at in range(0, 123, 2):  # two minutes of refreshes: only its one beat, growing old
        clock[0] = NOW + at
        register(s3, entry(0, age=0) | {"registered_at": stamp_at(NOW + at)})
        listed += found.refresh().lines()
    assert "10.0.0.99:8" not in listed
    assert found.verdict.silent == (1,)  # stale now: the run controller replaces it


def test_the_first_world_waits_for_no_steady_heartbeat():
    """Every node must be there for the first world anyway: only joiners are held back."""
    nodes = [entry(0), entry(1), entry(2)]
    unready = {"i-0002": "not ready to join yet"}
    assert len(judge(nodes, unready=unready).lines()) == 3
    joined = judge(nodes, unready=unready, started=True, admitted={"10.0.0.10", "10.0.0.11"})
    assert joined.lines() == ["10.0.0.10:8", "10.0.0.11:8"]
    # A node already running ranks keeps its place whatever the readiness says.
    kept = judge(nodes, unready=unready, started=True, admitted={"10.0.0.12"})
    assert "10.0.0.12:8" in kept.lines()


def test_two_refreshes_at_once_both_write_the_hosts_file(fleet, tmp_path):
    """The discovery's thread and the head's own refresh (before it starts horovodrun again)
    write the hosts file through one temporary name: one at a time."""
    import threading

    cfg, s3 = fleet
    register(s3, entry(0, age=0) | {"registered_at": stamp_at(NOW)})
    found = Discovery(
        cfg, s3, head_key=KEY, since=NOW - 600, log=lambda line: None, clock=lambda: NOW,
        s3_back_at=lambda: None,
    )  # fmt: skip
    failures = []

    def refresh_often() -> None:
        for _ in range(30):
            try:
                found.refresh()
            except Exception as exc:  # the race this test looks for
                failures.append(exc)

    threads = [threading.Thread(target=refresh_often) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert (tmp_path / "state0" / "hosts").read_text() == "10.0.0.10:8\n"
