"""The rehearsal's run controller is the one TeardownStack synthesizes (rehearsal/cloud.py): its
tick and the state machine's executions it starts; its decision, and what EC2 did to each
instance, turned into what happens to the node."""

import argparse
import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import boto3
import pytest

from contract import names
from rehearsal import common, core
from rehearsal.cloud import Cloud

NODES = 2


@pytest.fixture(scope="module")
def teardown(synth) -> dict:
    """TeardownStack for the rehearsal's bucket, run and nodes: the context the rehearsal gives
    `python app.py` (LocalS3.synthesize), synthesized in this process."""
    return synth(**core.Rehearsal.context(NODES)).documents[names.TEARDOWN_STACK]


@pytest.fixture(scope="module")
def server():
    """The local S3 as the rehearsal runs it, moto_server in its own process: the moto this
    process mocks EC2 and Step Functions with starts each Cloud empty (a ThreadedMotoServer
    here would share, and lose, its state)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    moto = shutil.which("moto_server", path=str(Path(sys.executable).parent))
    process = subprocess.Popen(
        [moto, "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            urllib.request.urlopen(f"{url}/moto-api/", timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    yield url
    process.terminate()
    process.wait(timeout=10)


@pytest.fixture
def moto_endpoint(server):
    urllib.request.urlopen(urllib.request.Request(f"{server}/moto-api/reset", method="POST"))
    return server


@pytest.fixture
def s3(moto_endpoint):
    client = boto3.client(
        "s3",
        endpoint_url=moto_endpoint,
        region_name=common.REGION,
        aws_access_key_id="rehearsal",
        aws_secret_access_key="rehearsal",
    )
    client.create_bucket(Bucket=common.BUCKET)
    return client


def put(s3, name: str, body: bytes) -> None:
    s3.put_object(Bucket=common.BUCKET, Key=f"runs/{common.RUN}/{name}", Body=body)


def ended(s3, attempt: int, status: str, cause: str | None) -> None:
    """The leader's DONE.json of `attempt`, and what the run left in S3 by then."""
    put(s3, "logs/node-0.log", b"log")
    put(s3, "model/checkpoints/ckpt-1.index", b"index")
    done = {"run": common.RUN, "attempt": attempt, "status": status, "cause": cause,
            "reason": cause, "epochs": 2}  # fmt: skip
    put(s3, "DONE.json", json.dumps(done).encode())


def cloud(teardown, s3, moto_endpoint, spot: bool, restarts: int = 2) -> Cloud:
    return Cloud(teardown, s3, endpoint=moto_endpoint, nodes=NODES, spot=spot, restarts=restarts)


def decided(running: Cloud, attempt: int):
    """The controller's ticks, as its schedule runs them, until it is done with `attempt`."""
    from controller import tick

    for _ in range(20):
        tick.handler({"trigger": "schedule"})
        running.workflow.settle()
        if (relaunch := running.decided(attempt)) is not None:
            return relaunch
    raise AssertionError(f"nothing decided about attempt {attempt}")


def test_a_lost_node_reboots_the_healthy_fleet_and_its_head_in_place(teardown, s3, moto_endpoint):
    with cloud(teardown, s3, moto_endpoint, spot=False) as running:
        instances, head = running.instances(), running.head()
        running.watch()
        ended(s3, 1, "failed", "node_lost")
        relaunch = decided(running, 1)
        [execution] = running.workflow.executions()
        states = running.workflow.states(execution)
        assert [e["decision"] for e in relaunch.entries] == ["relaunch"]
        assert (relaunch.rebooted, relaunch.started, relaunch.replaced) == ([0, 1], [], [])
        assert (relaunch.head, relaunch.head_instance) == ("rebooted", head)
        assert running.instances() == instances  # rebooted: the same instances
        assert states[states.index("StopFleet") :] == [
            "StopFleet", "CheckSettled", "SettledDecision", "Launch", "LaunchDecision",
            "Relaunched",
        ]  # fmt: skip
        running.watch()
        ended(s3, 2, "succeeded", None)
        relaunch = decided(running, 2)
        assert [e["decision"] for e in relaunch.entries] == ["teardown"]
        assert not relaunch.brought_back
        assert "DeleteStack" in running.workflow.states(running.workflow.executions()[-1])
        assert running.gone()


def test_a_spot_fleet_ec2_reclaimed_is_replaced_from_its_launch_templates(
    teardown, s3, moto_endpoint
):
    with cloud(teardown, s3, moto_endpoint, spot=True) as running:
        instances = running.instances()
        running.ec2.terminate_instances(InstanceIds=list(instances.values()))
        running.watch()
        ended(s3, 1, "interrupted", "interrupted")
        relaunch = decided(running, 1)
        assert (relaunch.rebooted, relaunch.started, relaunch.replaced) == ([], [], [0, 1])
        assert relaunch.head == "rebooted"  # on demand, whatever the nodes' market
        assert set(running.instances().values()).isdisjoint(instances.values())
        assert running.instances() == relaunch.launched
        for index, instance in relaunch.launched.items():  # what each new node reads at boot
            key = f"runs/{common.RUN}/launches/{instance}.json"
            assignment = json.loads(s3.get_object(Bucket=common.BUCKET, Key=key)["Body"].read())
            assert assignment["node_index"] == index


def test_restarts_run_out_and_nothing_comes_back(teardown, s3, moto_endpoint):
    with cloud(teardown, s3, moto_endpoint, spot=False, restarts=0) as running:
        running.watch()
        ended(s3, 1, "failed", "node_lost")
        relaunch = decided(running, 1)
        assert [(e["decision"], e["why"]) for e in relaunch.entries] == [
            ("stop", "restarts exhausted (0 of maxRestarts 0)")
        ]
        assert not relaunch.brought_back


def test_the_rehearsal_brings_back_the_nodes_the_workflow_relaunched(
    tmp_path, teardown, s3, moto_endpoint, monkeypatch
):
    """attempts.py end to end in process: the nodes are stubs that write DONE.json; the run
    controller (its tick on its schedule, in a thread), EC2 and S3 are the workflow's, and a
    node rebooted in place keeps its /data."""
    from rehearsal import cloud as cloud_module

    monkeypatch.setattr(cloud_module, "TICK_S", 0.2)
    args = argparse.Namespace(workdir=tmp_path, nodes=NODES, max_restarts=2, timeout=120)
    rehearsal = core.Rehearsal(args)
    rehearsal.s3, rehearsal.endpoint = s3, moto_endpoint
    (tmp_path / "cdk.out").mkdir()
    (tmp_path / "cdk.out" / "TeardownStack.template.json").write_text(json.dumps(teardown))
    outcomes = iter([("failed", "node_lost"), ("succeeded", None)])

    def start_nodes(epochs, **_):
        for index in range(NODES):
            (rehearsal.node_home(index) / "data").mkdir(parents=True, exist_ok=True)
        status, cause = next(outcomes)
        ended(s3, len(rehearsal.cloud.attempts()) + 1, status, cause)
        return {}

    monkeypatch.setattr(rehearsal, "start_nodes", start_nodes)
    monkeypatch.setattr(rehearsal, "end_nodes", lambda: None)
    monkeypatch.setattr(rehearsal, "show_status_after_each_epoch", lambda shown: shown)
    kept = []
    real_relaunch = rehearsal.relaunch

    def relaunch(done):
        real_relaunch(done)
        kept.extend(i for i in done.rebooted if (rehearsal.node_home(i) / "data").exists())

    monkeypatch.setattr(rehearsal, "relaunch", relaunch)
    try:
        entries = rehearsal.train_under_controller(epochs=2, max_restarts=2)
    finally:
        rehearsal.close_cloud()
    assert [(e["attempt"], e["decision"]) for e in entries] == [(1, "relaunch"), (2, "teardown")]
    assert kept == [0, 1]


class Listed:
    """A workflow whose list_executions says `statuses`."""

    def __init__(self, *statuses):
        self.statuses = statuses

    def executions(self):
        return [{"name": f"rehearsal-a1-{i}", "status": s} for i, s in enumerate(self.statuses)]


@pytest.mark.parametrize(
    ("statuses", "busy"),
    [
        # moto lists an execution before its start() gives it a status: a relaunch whose
        # instances were not started yet was taken for one that brought no node back.
        (("SUCCEEDED", None), True),
        (("RUNNING",), True),
        (("SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED"), False),
        ((), False),
    ],
)
def test_an_execution_listed_without_its_status_yet_is_still_under_way(statuses, busy):
    fleet = Cloud.__new__(Cloud)
    fleet.workflow = Listed(*statuses)
    assert fleet.workflow_busy() is busy
