"""The head's steps in their real order, with the nodes' rendezvous, identity, signals,
horovodrun and the copies to and from the nodes recorded instead of run: it signals SUCCESS only
after the allreduce check, puts the restored checkpoint on the nodes, says which checkpoint the
trainer resumes from, names a Spot interruption, ends the attempt with a node's reported
failure, and keeps the attempt's record.

.venv/bin/python -m pytest tests/bootstrap/head/test_head.py
"""

import dataclasses
import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest
from bootstrap_helpers import head_doc, train_doc

from bootstrap import aws
from bootstrap.fleet import node_failures, rendezvous
from bootstrap.head import checkpoints, discovery, launch, mirror
from bootstrap.head.head import Head, InterfacesDiffer
from bootstrap.node.attempt import Attempt
from bootstrap.node_config import parse
from bootstrap.steps import StepFailed
from contract.runs import stamp_at

NODE = {"index": 0, "ip": "10.0.0.6", "gpus": 8, "instance_id": "i-n0", "interface": None}


@pytest.fixture
def head_up_to_the_check(s3, tmp_path, monkeypatch):
    """The head of a one-node GPU fleet whose node has registered, with signals, horovodrun and
    the copies to and from the node recorded instead of made: what runs is the real order of
    the head's steps."""
    if shutil.which("ssh-keygen") is None:
        pytest.skip("ssh-keygen (openssh-client) not installed")
    cfg = parse(
        head_doc(
            nodes=1, signal={"stack": "TrainStack", "resource": "HeadInstance"},
            heartbeat_timeout_s=60, state_dir=str(tmp_path / "state"),
            log_dir=str(tmp_path / "logs"), mount_point=str(tmp_path / "data"),
            # The nodes' trainer waits for its files: no wait for every node's whole pull.
            trainer={**train_doc()["trainer"], "data_wait_s": 600},
        )
    )  # fmt: skip
    events: list[str] = []
    aws.client.cache_clear()  # clients made before moto started would reach for AWS
    monkeypatch.setattr(aws, "private_ip", lambda cfg: "10.0.0.5")
    monkeypatch.setattr(aws, "instance_id", lambda cfg: "i-head")
    monkeypatch.setattr(
        aws,
        "signal_cloudformation",
        lambda cfg, success, reason: events.append(f"signal {success}: {reason}") or "recorded",
    )
    monkeypatch.setattr(rendezvous, "wait_for_nodes", lambda *a, **k: [dict(NODE)])
    monkeypatch.setattr(
        mirror, "push_all", lambda ssh, hosts, *a: events.append(f"push to {', '.join(hosts)}")
    )
    monkeypatch.setattr(mirror.Mirror, "sync", lambda self: None)
    attempt = Attempt()
    yield cfg, events, monkeypatch, attempt
    # What a failure report ends on the head: the status thread and the heartbeat.
    if attempt.status is not None:
        attempt.status.end("failed", "test over", wait_s=5)
    if attempt.heartbeat is not None:
        attempt.heartbeat.stop()
    aws.client.cache_clear()


def test_the_head_signals_success_only_after_the_allreduce_check(head_up_to_the_check, tmp_path):
    cfg, events, monkeypatch, attempt = head_up_to_the_check
    tcp = "NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/Socket/0\n"
    image = tmp_path / "image.json"
    versions = {"efa_installer": "1.47.0", "efa_driver": "2.17.3g", "aws_ofi_nccl": "1.18.0-1"}
    proof = {"passed": True, "instance_type": "g5.xlarge", "efa_nv_peermem_loaded": True}
    image.write_text(json.dumps({"versions": versions, "proof": proof}))
    cfg = dataclasses.replace(cfg, image={**cfg.image, "manifest": str(image)})
    logged: list[str] = []

    def horovodrun(command, env, log_path, keep, on_start=None):
        events.append("allreduce check")
        return 0, tcp

    monkeypatch.setattr(launch, "stream", horovodrun)
    with pytest.raises(StepFailed) as failed:
        Head(cfg, attempt, log=logged.append).run()
    assert events == ["allreduce check"]  # no SUCCESS: the deployment rolls back
    # The reason `horovod-fleet status` shows names what the image baked for the network.
    stack = (
        "EFA installer 1.47.0, efa driver 2.17.3g, aws-ofi-nccl 1.18.0-1, efa_nv_peermem loaded "
        "at the GPU proof on g5.xlarge"
    )
    assert failed.value.reason.startswith("HealthError: EFA expected but NCCL used transport")
    assert failed.value.reason.endswith(f" (image: {stack})")
    assert f"the image's network stack: {stack}" in logged


def test_a_head_that_passes_the_check_signals_and_publishes_it(head_up_to_the_check, s3):
    cfg, events, monkeypatch, attempt = head_up_to_the_check
    ofi = "NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/Libfabric/0\n"

    def horovodrun(command, env, log_path, keep, on_start=None):
        events.append(
            "allreduce check" if "bootstrap.fleet.allreduce_check" in command else "train"
        )
        if len(events) > 2:
            raise RuntimeError("stop after the check")
        return 0, ofi

    monkeypatch.setattr(launch, "stream", horovodrun)
    monkeypatch.setattr(checkpoints.ModelStore, "restore", lambda store: events.append("restore"))
    with pytest.raises(StepFailed, match="stop after the check"):
        Head(cfg, attempt).run()
    assert events[:4] == [
        "allreduce check",
        "signal True: healthy, data verified; fleet check: NCCL transport: ofi",
        "restore",
        "push to 10.0.0.6",  # the restored checkpoints onto the node, wherever rank 0 lands
    ]
    # The head's heartbeat and key, which every node watches and installs.
    head = json.loads(s3.get_object(Bucket=cfg.bucket, Key="runs/r1/head.json")["Body"].read())
    public = s3.get_object(Bucket=cfg.bucket, Key="runs/r1/ssh/head.pub")["Body"].read().decode()
    assert head["ip"] == "10.0.0.5" and head["head_key_sha256"] == rendezvous.key_fingerprint(
        public
    )
    check = json.loads(
        s3.get_object(Bucket=cfg.bucket, Key="runs/r1/fleet-check.json")["Body"].read()
    )
    assert check["passed"] and check["detail"] == "NCCL transport: ofi"


@pytest.mark.parametrize(
    ("chosen", "said"),
    [
        ("ckpt-7", "restored and verified s3://fleet-data/runs/r1/model/ onto every node: the "
         "trainer resumes from ckpt-7"),
        (None, "no checkpoint in s3://fleet-data/runs/r1/model/ yet: the trainer starts run r1 "
         "from its first step"),
    ],
)  # fmt: skip
def test_the_head_says_which_checkpoint_the_trainer_resumes_from(
    head_up_to_the_check, capsys, chosen, said
):
    """Before: "restored and verified ...: the trainer resumes from it" whenever S3 held any
    file of the model dir, tensorboard's alone included, and the trainer then started over."""
    cfg, _events, monkeypatch, attempt = head_up_to_the_check
    ofi = "NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/Libfabric/0\n"

    def horovodrun(command, env, log_path, keep, on_start=None):
        if "bootstrap.fleet.allreduce_check" in command:
            return 0, ofi
        raise RuntimeError("stop before training")

    monkeypatch.setattr(launch, "stream", horovodrun)
    monkeypatch.setattr(checkpoints.ModelStore, "restore", lambda store: chosen)
    with pytest.raises(StepFailed, match="stop before training"):
        Head(cfg, attempt).run()
    messages = [line.split(" [bootstrap] ", 1)[-1] for line in capsys.readouterr().out.splitlines()]
    assert said in messages


@pytest.mark.parametrize("noticed", [True, False])
def test_training_ended_by_a_spot_notice_is_interrupted_and_names_the_node(
    head_up_to_the_check, s3, tmp_path, noticed
):
    cfg, _events, monkeypatch, attempt = head_up_to_the_check
    ofi = "NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/Libfabric/0\n"
    stopped = "[1]<stderr>:stopping\nProcess 1 exit with status code 75\n"

    def horovodrun(command, env, log_path, keep, on_start=None):
        if "bootstrap.fleet.allreduce_check" in command:
            return 0, ofi
        # What a node's watcher and the trainer's coordinated stop leave behind (rank 0's
        # interrupted.json, copied here by the mirror).
        if noticed:
            record = {"index": 1, "instance_id": "i-0abc", "ip": "10.0.1.23",
                      "action": "terminate", "time": "2026-11-25T14:02:00Z",
                      "noticed_at": stamp_at(time.time())}  # fmt: skip
            s3.put_object(Bucket=cfg.bucket, Key="runs/r1/interruptions/1.json",
                          Body=json.dumps(record).encode())  # fmt: skip
        stop = Path(cfg.mount_point) / "model" / "interrupted.json"
        stop.parent.mkdir(parents=True, exist_ok=True)
        stop.write_text(json.dumps({"reason": "SIGTERM", "checkpoint": "ckpt-1234", "step": 1234}))
        # Written after the restore, as a real trainer's is, minutes later: the file system's
        # coarse clock may stamp a file written now a few ms before time.time() said.
        os.utime(stop, (time.time() + 1, time.time() + 1))
        return 1, stopped

    monkeypatch.setattr(launch, "stream", horovodrun)
    monkeypatch.setattr(checkpoints.ModelStore, "restore", lambda store: False)
    with pytest.raises(StepFailed) as ended:
        Head(cfg, attempt).run()
    if noticed:
        assert ended.value.status == "interrupted"
        assert str(ended.value) == (
            "step 'training' was interrupted: Spot interruption of node 1 (i-0abc, 10.0.1.23), "
            "terminate at 2026-11-25T14:02:00Z: every rank stopped at step 1234 and its "
            "checkpoint was saved"
        )
    else:  # every other end keeps its reason
        assert ended.value.status == "failed"
        assert "horovodrun exited 1: " in str(ended.value)


def test_a_head_restarted_in_place_keeps_the_attempt_s_start_on_the_record(
    head_up_to_the_check, s3
):
    cfg, _events, monkeypatch, attempt = head_up_to_the_check
    began = time.time() - 3600
    record = {"run": "r1", "attempt": 1, "started_at": stamp_at(began), "restarts": []}
    Path(cfg.state_dir).mkdir(parents=True)
    (Path(cfg.state_dir) / "attempt.json").write_text(json.dumps(record))
    tcp = "NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/Socket/0\n"
    monkeypatch.setattr(
        launch, "stream", lambda command, env, log_path, keep, on_start=None: (0, tcp)
    )
    with pytest.raises(StepFailed) as failed:
        Head(cfg, attempt).run()
    Head(cfg, attempt).report(failed.value)
    read = lambda key: json.loads(s3.get_object(Bucket=cfg.bucket, Key=key)["Body"].read())  # noqa: E731
    done, status = read("runs/r1/DONE.json"), read("runs/r1/status.json")
    assert done["attempt_started_at"] == status["attempt_started_at"] == stamp_at(began)
    assert done["restarts"] == [
        {"at": done["restarts"][0]["at"], "resumed_from_step": None, "reached_step": None}
    ]
    assert done["restarts"][0]["at"] >= stamp_at(time.time() - 60)


def test_a_restarted_head_whose_attempt_a_node_already_ended_adds_nothing(
    head_up_to_the_check, s3, capsys
):
    """A node found the head lost while systemd restarted it: the node's DONE.json is the
    attempt's record, and the restarted head neither clears nor overwrites it."""
    cfg, events, monkeypatch, attempt = head_up_to_the_check
    monkeypatch.setattr(launch, "stream", lambda *a, **k: events.append("horovodrun") or (1, ""))
    ended = {"status": "failed", "cause": "node_lost", "written_by": "member 1"}
    s3.put_object(Bucket=cfg.bucket, Key="runs/r1/DONE.json", Body=json.dumps(ended))
    attempt.started = time.time() - 600  # the attempt's first start, before the member wrote
    with pytest.raises(StepFailed) as failed:
        Head(cfg, attempt).run()
    Head(cfg, attempt).report(failed.value)
    assert (
        json.loads(s3.get_object(Bucket=cfg.bucket, Key="runs/r1/DONE.json")["Body"].read())
        == ended
    )
    out = capsys.readouterr().out
    assert (
        "FAILED: step 'rendezvous' failed: RecordTaken: s3://fleet-data/runs/r1/DONE.json already "
        "holds this attempt's record, written by member 1 (status failed, cause node_lost): it "
        "stands"
    ) in out
    assert "wrote s3://" not in out and "horovodrun" not in events


class Horovodrun:
    """horovodrun's process as the head's launch sees it: ended by end_process."""

    def __init__(self):
        self.ended = threading.Event()

    def terminate(self):
        self.ended.set()

    kill = terminate

    def poll(self):
        return 1 if self.ended.is_set() else None


def test_a_nodes_reported_failure_ends_the_training_with_its_cause(head_up_to_the_check, s3):
    """The rest of node 0's data pull found a corrupt shard while the trainer ran: the node
    says so in runs/<run>/failures/0.json, horovodrun is ended at once and the attempt fails
    with the node's cause and words (corrupt_shard: not relaunched), not with what its ranks
    said."""
    cfg, events, monkeypatch, attempt = head_up_to_the_check
    monkeypatch.setattr(node_failures, "WATCH_S", 0.05)
    ofi = "NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/Libfabric/0\n"

    def horovodrun(command, env, log_path, keep, on_start=None):
        if "bootstrap.fleet.allreduce_check" in command:
            return 0, ofi
        events.append("training")
        proc = Horovodrun()
        on_start(proc)
        node_failures.write(
            s3, dataclasses.replace(cfg, node_index=0), "10.0.0.6", "i-n0", "corrupt_shard",
            "step 'data pull' failed: VerificationError: train-00009-of-01024: sha256 differs",
            time.time(),
        )  # fmt: skip
        assert proc.ended.wait(30), "horovodrun was not ended"
        return 143, "terminated"

    monkeypatch.setattr(launch, "stream", horovodrun)
    monkeypatch.setattr(checkpoints.ModelStore, "restore", lambda store: False)
    with pytest.raises(StepFailed) as failed:
        Head(cfg, attempt).run()
    assert "training" in events  # no wait for the fleet's shards first: the trainer waits
    assert (failed.value.step, failed.value.cause) == ("training", "corrupt_shard")
    assert failed.value.reason.startswith(
        "NodeFailed: node 0 (i-n0, 10.0.0.6) failed: step 'data pull' failed: VerificationError"
    )


def test_nodes_that_name_their_interfaces_apart_are_refused_in_one_line(head_up_to_the_check):
    cfg, _events, monkeypatch, attempt = head_up_to_the_check
    nodes = [dict(NODE, interface="ens32"), dict(NODE, index=1, ip="10.0.0.7", interface="ens5")]
    monkeypatch.setattr(rendezvous, "wait_for_nodes", lambda *a, **k: nodes)
    with pytest.raises(StepFailed) as failed:
        Head(dataclasses.replace(cfg, nodes=2), attempt).run()
    assert failed.value.step == "network interface"
    assert isinstance(failed.value.__cause__, InterfacesDiffer)
    assert "(ens32, ens5)" in str(failed.value)


def register(s3, cfg, *, age_s: float = 0.0, **entry) -> None:
    """Node 0's registration as the node writes it, naming the head's published key."""
    head = json.loads(s3.get_object(Bucket=cfg.bucket, Key="runs/r1/head.json")["Body"].read())
    doc = {**NODE, "interface": "ens5", "shards": "own", "registered_at":
           stamp_at(time.time() - age_s), "head_key_sha256": head["head_key_sha256"], **entry}  # fmt: skip
    s3.put_object(Bucket=cfg.bucket, Key="runs/r1/nodes/0.json", Body=json.dumps(doc).encode())


def test_the_head_trains_elastic_over_the_hosts_its_discovery_lists(head_up_to_the_check, s3):
    """One elastic horovodrun from the head: every node's slots at most, minNodes' at least,
    the discovery script (whose file lists node 0 before it first runs), the keep-alive ssh
    first on its PATH, and the trainer's elastic flags."""
    cfg, _events, monkeypatch, attempt = head_up_to_the_check
    # node.json names the instance (no EC2 to ask, as in the rehearsal)
    cfg = dataclasses.replace(cfg, instance_id="i-head")
    ofi = "NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/Libfabric/0\n"
    seen = {}

    def horovodrun(command, env, log_path, keep, on_start=None):
        if "bootstrap.fleet.allreduce_check" in command:
            register(s3, cfg)
            return 0, ofi
        seen.update(command=command, env=env, hosts=(Path(cfg.state_dir) / "hosts").read_text())
        return 1, "RuntimeError: stop here"

    monkeypatch.setattr(launch, "stream", horovodrun)
    monkeypatch.setattr(checkpoints.ModelStore, "restore", lambda store: False)
    with pytest.raises(StepFailed):
        Head(cfg, attempt).run()
    command = seen["command"]
    at = lambda flag: command[command.index(flag) + 1]  # noqa: E731
    assert (at("-np"), at("--min-np"), at("--max-np")) == ("8", "8", "8")
    assert "bootstrap.head.hosts_file" in at("--host-discovery-script")
    assert seen["hosts"] == "10.0.0.6:8\n"
    program = command[command.index("bootstrap.fleet.rank") + 1 :]
    assert program[:3] == ["python3", "-m", "trainer.train"]
    assert program[-5:] == ["--elastic", "--planned-ranks", "8", "--min-ranks", "8"]
    assert seen["env"]["PATH"].split(os.pathsep)[0] == str(Path(cfg.state_dir) / "ssh-bin")
    assert seen["env"]["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "30"


def test_a_node_s_own_failure_costs_that_node_and_too_few_left_is_node_lost(
    head_up_to_the_check, s3, monkeypatch
):
    """A node whose own failure would not fail another (its health, not the dataset) is
    dropped by the discovery, and the training goes on without it; when fewer than minNodes
    are left, horovodrun's driver gives up after its elastic timeout, and the reason names
    what the discovery found of each node (node_lost: relaunched)."""
    cfg, _events, _, attempt = head_up_to_the_check
    cfg = dataclasses.replace(cfg, instance_id="i-head")

    monkeypatch.setattr(node_failures, "WATCH_S", 0.05)
    monkeypatch.setattr(discovery, "REFRESH_S", 0.05)
    ofi = "NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/Libfabric/0\n"
    hosts = Path(cfg.state_dir) / "hosts"

    def horovodrun(command, env, log_path, keep, on_start=None):
        if "bootstrap.fleet.allreduce_check" in command:
            register(s3, cfg)
            return 0, ofi
        proc = Horovodrun()
        on_start(proc)
        assert hosts.read_text() == "10.0.0.6:8\n"
        node_failures.write(
            s3, dataclasses.replace(cfg, node_index=0), "10.0.0.6", "i-n0", "node_unhealthy",
            "step 'gpu health' failed: Xid 79", time.time(),
        )  # fmt: skip
        deadline = time.time() + 30
        while hosts.read_text() and time.time() < deadline:
            time.sleep(0.05)
        assert hosts.read_text() == ""  # dropped by the discovery ...
        time.sleep(0.3)
        assert not proc.ended.is_set()  # ... not the end of the training
        return 1, "Timed out waiting for minimum number of slots to become available."

    monkeypatch.setattr(launch, "stream", horovodrun)
    monkeypatch.setattr(checkpoints.ModelStore, "restore", lambda store: False)
    with pytest.raises(StepFailed) as failed:
        Head(cfg, attempt).run()
    assert (failed.value.step, failed.value.cause) == ("training", "node_lost")
    assert failed.value.reason.startswith(
        "TrainingFailed: fewer than minNodes (1) nodes left to train on, 0 listed: node 0 "
        "(i-n0, 10.0.0.6): it reported its own failure; horovodrun exited 1: "
    )
