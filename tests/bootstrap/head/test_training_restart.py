"""A loss during a join or a reset costs at worst a restart of horovodrun in place, never a
relaunch (issue 47): when horovodrun's elastic driver gives up (a replacement died mid-join, the
others aborted in Gloo's rendezvous, every worker failed), the head starts it again on the
nodes it still has, at most TRAINING_RESTARTS times an attempt, each on DONE.json's record, and
the record names the lost node, not a healthy peer that timed out waiting for it. The head's
steps in their real order, with horovodrun, the nodes' heartbeats and the copies to the nodes
played by the test (tests/bootstrap/head/test_head.py's fixture).

    .venv/bin/python -m pytest tests/bootstrap/head/test_training_restart.py
"""

import json
import threading
import time

import pytest
from test_head import (
    NODE,
    head_up_to_the_check,  # noqa: F401 - test_head's fixture
)

from bootstrap.fleet import rendezvous
from bootstrap.head import checkpoints, discovery, head, launch, mirror
from bootstrap.head.head import Head
from bootstrap.steps import StepFailed
from contract.runs import stamp_at

OFI = "NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/Libfabric/0\n"
NODES = [dict(NODE, index=i, ip=f"10.0.0.{6 + i}", instance_id=f"i-n{i}") for i in range(3)]
# What the issue's run printed when node 2's replacement died mid-join: ranks 0 and 1 waited in
# Gloo's rendezvous for the new world, timed out and aborted (horovod/common/gloo/http_store.cc
# "Wait timeout", thrown from Horovod's background thread: SIGABRT); the driver stopped.
ABORTED = """[0]<stderr>:terminate called after throwing an instance of 'gloo::IoException'
[0]<stderr>:  what():  [/tmp/horovod/third_party/gloo/gloo/rendezvous/http_store.cc:54] Wait timeout after 30
[1]<stderr>:terminate called after throwing an instance of 'gloo::IoException'
[1]<stderr>:horovod-fleet rank exit: rank 1 killed by SIGABRT
[0]<stderr>:horovod-fleet rank exit: rank 0 killed by SIGABRT
ERROR:root:failure count == 3 -> stop running
Process 1 exit with status code 134
"""


def registration(s3, cfg, index: int, at: float) -> None:
    key = json.loads(s3.get_object(Bucket=cfg.bucket, Key="runs/r1/head.json")["Body"].read())
    doc = {**NODES[index], "interface": "ens5", "shards": "all", "registered_at": stamp_at(at),
           "head_key_sha256": key["head_key_sha256"]}  # fmt: skip
    s3.put_object(Bucket=cfg.bucket, Key=f"runs/r1/nodes/{index}.json", Body=json.dumps(doc))


@pytest.fixture
def fleet_of_three(head_up_to_the_check, s3, monkeypatch):  # noqa: F811 - the fixture
    """The head of 3 nodes (minNodes 2): nodes 0 and 1 beat every 0.2 s once `beating` is set;
    node 2 beats until `node_2_lost` is set, its heartbeat then 100 s old (or, with
    `node_2_silent` set, as old as its last beat)."""
    cfg, events, _, attempt = head_up_to_the_check
    cfg = cfg.__class__(**{**cfg.__dict__, "nodes": 3, "min_nodes": 2, "instance_id": "i-head"})
    monkeypatch.setattr(rendezvous, "wait_for_nodes", lambda *a, **k: [dict(n) for n in NODES])
    monkeypatch.setattr(discovery, "REFRESH_S", 0.1)
    monkeypatch.setattr(
        mirror, "push_newer", lambda ssh, hosts, *a: events.append(f"push to {', '.join(hosts)}")
    )
    monkeypatch.setattr(checkpoints.ModelStore, "restore", lambda store: False)
    beating, node_2_lost, stopped = threading.Event(), threading.Event(), threading.Event()
    node_2_silent = threading.Event()  # set: node 2 stops beating instead of going stale

    def beat() -> None:
        while not stopped.wait(0.2):
            if beating.is_set():
                for index in (0, 1, 2):
                    lost = index == 2 and node_2_lost.is_set()
                    if not (lost and node_2_silent.is_set()):  # silent: its last beat stays
                        registration(s3, cfg, index, time.time() - (100 if lost else 0))

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    yield cfg, events, attempt, beating, node_2_lost, node_2_silent
    stopped.set()
    thread.join(5)


def done(s3, cfg) -> dict:
    return json.loads(s3.get_object(Bucket=cfg.bucket, Key="runs/r1/DONE.json")["Body"].read())


def test_a_node_lost_mid_join_costs_a_restart_in_place_naming_it(fleet_of_three, s3, monkeypatch):
    """Before: horovodrun exited 1, the attempt was recorded collective_timeout "rank 1 on node
    1 and rank 2 on node 2 stopped answering rank 0", and the whole fleet was relaunched."""
    cfg, events, attempt, beating, node_2_lost, _ = fleet_of_three
    runs = []

    def horovodrun(command, env, log_path, keep, on_start=None):
        if "bootstrap.fleet.allreduce_check" in command:
            beating.set()
            time.sleep(0.5)  # every node registered with the head's key
            return 0, OFI
        runs.append(command[command.index("-np") + 1])
        if len(runs) == 1:
            node_2_lost.set()  # node 2 died in the join: the others aborted waiting for it
            time.sleep(0.6)  # its heartbeat stale by then (it died 30 s before the others)
            return 1, ABORTED
        return 0, "training done\n"

    monkeypatch.setattr(launch, "stream", horovodrun)
    Head(cfg, attempt).run()
    assert runs == ["24", "16"]  # every node's slots, then nodes 0 and 1's
    assert "push to 10.0.0.6, 10.0.0.7" in events  # the newest checkpoint, where older
    record = done(s3, cfg)
    assert record["status"] == "succeeded" and record["attempt"] == 1
    (restart,) = record["training_restarts"]
    assert (restart["cause"], restart["nodes"]) == ("node_lost", ["0", "1"])
    assert restart["reason"].startswith("node 2 (i-n2, 10.0.0.8) lost: no heartbeat for ")
    assert "node 1" not in restart["reason"] and "node 0" not in restart["reason"]
    assert "the ranks left failed waiting for it" in restart["reason"]


def test_the_restarts_are_bounded_and_the_attempt_then_ends_naming_the_lost_node(
    fleet_of_three, s3, monkeypatch
):
    cfg, _events, attempt, beating, node_2_lost, _ = fleet_of_three
    monkeypatch.setattr(head, "TRAINING_RESTARTS", 2)
    runs = []

    def horovodrun(command, env, log_path, keep, on_start=None):
        if "bootstrap.fleet.allreduce_check" in command:
            beating.set()
            time.sleep(0.5)
            return 0, OFI
        runs.append(command[command.index("-np") + 1])
        node_2_lost.set()
        time.sleep(0.6)
        return 1, ABORTED

    monkeypatch.setattr(launch, "stream", horovodrun)
    node = Head(cfg, attempt)
    with pytest.raises(StepFailed) as failed:
        node.run()
    assert runs == ["24", "16", "16"]  # the first, then TRAINING_RESTARTS more
    assert (failed.value.step, failed.value.cause) == ("training", "node_lost")
    assert failed.value.reason.startswith("TrainingFailed: node 2 (i-n2, 10.0.0.8) lost: ")
    node.report(failed.value)
    record = done(s3, cfg)
    assert (record["status"], record["cause"]) == ("failed", "node_lost")
    assert [r["nodes"] for r in record["training_restarts"]] == [["0", "1"], ["0", "1"]]


def test_a_dead_host_whose_heartbeat_is_not_stale_yet_is_not_started_on(
    fleet_of_three, s3, monkeypatch
):
    """Node 2's host died and its heartbeat is still younger than heartbeat_timeout_s (the
    driver's own word on too few slots named the loss, and nothing waited for the heartbeat to
    go stale): the discovery still lists it, but it has not beaten since the failure, so
    horovodrun starts again on nodes 0 and 1 only."""
    cfg, _events, attempt, beating, node_2_lost, node_2_silent = fleet_of_three
    cfg = cfg.__class__(**{**cfg.__dict__, "heartbeat_timeout_s": 8})
    monkeypatch.setattr(Head, "lost_nodes", lambda self, failed_at: [])
    node_2_silent.set()
    runs = []

    def horovodrun(command, env, log_path, keep, on_start=None):
        if "bootstrap.fleet.allreduce_check" in command:
            beating.set()
            time.sleep(0.5)
            return 0, OFI
        runs.append(command[command.index("-np") + 1])
        if len(runs) == 1:
            node_2_lost.set()  # it stops beating; its last beat stays fresh for 8 s
            time.sleep(1.2)
            return 1, ABORTED
        return 0, "training done\n"

    monkeypatch.setattr(launch, "stream", horovodrun)
    Head(cfg, attempt).run()
    assert runs == ["24", "16"]
    assert done(s3, cfg)["training_restarts"][0]["nodes"] == ["0", "1"]
