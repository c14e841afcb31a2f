"""The leader's steps in their real order, with health, data pull, identity, signals and
horovodrun recorded instead of run: it signals SUCCESS only after the allreduce check, says which
checkpoint the trainer resumes from, names a Spot interruption, and keeps the attempt's record.

.venv/bin/python -m pytest tests/bootstrap/leader/test_leader.py
"""

import dataclasses
import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from bootstrap import aws
from bootstrap.fleet.rendezvous import utc_stamp
from bootstrap.leader import checkpoints, launch
from bootstrap.leader.leader import Leader
from bootstrap.node import data_pull, health
from bootstrap.node.attempt import Attempt
from bootstrap.steps import StepFailed


@pytest.fixture
def leader_up_to_the_check(s3, train_config, monkeypatch):
    """A one-node GPU leader whose health, data pull and identity pass, with signals and
    horovodrun recorded instead of sent: what runs is the real order of the leader's steps."""
    if shutil.which("ssh-keygen") is None:
        pytest.skip("ssh-keygen (openssh-client) not installed")
    cfg = train_config(
        nodes=1, signal={"stack": "TrainStack", "resource": "Node0"}, heartbeat_timeout_s=60
    )
    events: list[str] = []
    aws.client.cache_clear()  # clients made before moto started would reach for AWS
    monkeypatch.setattr(health, "count_gpus", lambda: 8)
    monkeypatch.setattr(health, "efa_present", lambda: True)
    monkeypatch.setattr(health, "life_cycle", lambda cfg: cfg.market)

    def pull(*args, on_own, **kwargs):
        events.append("pull")
        now = time.time()
        on_own(now)
        return data_pull.Pulled({}, 0, now, now, now)

    monkeypatch.setattr(data_pull, "pull_dataset", pull)
    monkeypatch.setattr(aws, "private_ip", lambda cfg: "10.0.0.5")
    monkeypatch.setattr(aws, "instance_id", lambda cfg: "i-0")
    monkeypatch.setattr(
        aws,
        "signal_cloudformation",
        lambda cfg, success, reason: events.append(f"signal {success}: {reason}") or "recorded",
    )
    attempt = Attempt()
    yield cfg, events, monkeypatch, attempt
    # What a failure report ends on a node: the status thread and the heartbeat.
    if attempt.status is not None:
        attempt.status.end("failed", "test over", wait_s=5)
    if attempt.heartbeat is not None:
        attempt.heartbeat.stop()
    aws.client.cache_clear()


def test_a_leader_signals_success_only_after_the_allreduce_check(leader_up_to_the_check, tmp_path):
    cfg, events, monkeypatch, attempt = leader_up_to_the_check
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
        Leader(cfg, attempt, log=logged.append).run()
    assert events == ["pull", "allreduce check"]  # no SUCCESS: the deployment rolls back
    # The reason `horovod-fleet status` shows names what the image baked for the network.
    stack = (
        "EFA installer 1.47.0, efa driver 2.17.3g, aws-ofi-nccl 1.18.0-1, efa_nv_peermem loaded "
        "at the GPU proof on g5.xlarge"
    )
    assert failed.value.reason.startswith("HealthError: EFA expected but NCCL used transport")
    assert failed.value.reason.endswith(f" (image: {stack})")
    assert f"the image's network stack: {stack}" in logged


def test_a_leader_that_passes_the_check_signals_and_publishes_it(leader_up_to_the_check, s3):
    cfg, events, monkeypatch, attempt = leader_up_to_the_check
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
        Leader(cfg, attempt).run()
    assert events[:3] == [
        "pull",
        "allreduce check",
        "signal True: healthy, data verified; fleet check: NCCL transport: ofi",
    ]
    check = json.loads(
        s3.get_object(Bucket=cfg.bucket, Key="runs/r1/fleet-check.json")["Body"].read()
    )
    assert check["passed"] and check["detail"] == "NCCL transport: ofi"


@pytest.mark.parametrize(
    ("chosen", "said"),
    [
        ("ckpt-7", "restored and verified s3://fleet-data/runs/r1/model/: the trainer resumes "
         "from ckpt-7"),
        (None, "no checkpoint in s3://fleet-data/runs/r1/model/ yet: the trainer starts run r1 "
         "from its first step"),
    ],
)  # fmt: skip
def test_the_leader_says_which_checkpoint_the_trainer_resumes_from(
    leader_up_to_the_check, capsys, chosen, said
):
    """Before: "restored and verified ...: the trainer resumes from it" whenever S3 held any
    file of the model dir, tensorboard's alone included, and the trainer then started over."""
    cfg, _events, monkeypatch, attempt = leader_up_to_the_check
    ofi = "NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/Libfabric/0\n"

    def horovodrun(command, env, log_path, keep, on_start=None):
        if "bootstrap.fleet.allreduce_check" in command:
            return 0, ofi
        raise RuntimeError("stop before training")

    monkeypatch.setattr(launch, "stream", horovodrun)
    monkeypatch.setattr(checkpoints.ModelStore, "restore", lambda store: chosen)
    with pytest.raises(StepFailed, match="stop before training"):
        Leader(cfg, attempt).run()
    messages = [line.split(" [bootstrap] ", 1)[-1] for line in capsys.readouterr().out.splitlines()]
    assert said in messages


@pytest.mark.parametrize("noticed", [True, False])
def test_training_ended_by_a_spot_notice_is_interrupted_and_names_the_node(
    leader_up_to_the_check, s3, tmp_path, noticed
):
    cfg, _events, monkeypatch, attempt = leader_up_to_the_check
    cfg = dataclasses.replace(cfg, mount_point=str(tmp_path / "data"))
    ofi = "NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/Libfabric/0\n"
    stopped = "[1]<stderr>:stopping\nProcess 1 exit with status code 75\n"

    def horovodrun(command, env, log_path, keep, on_start=None):
        if "bootstrap.fleet.allreduce_check" in command:
            return 0, ofi
        # What a member's watcher and the trainer's coordinated stop leave behind.
        if noticed:
            record = {"index": 1, "instance_id": "i-0abc", "ip": "10.0.1.23",
                      "action": "terminate", "time": "2026-11-25T14:02:00Z",
                      "noticed_at": utc_stamp(time.time())}  # fmt: skip
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
        Leader(cfg, attempt).run()
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


def test_a_leader_restarted_in_place_keeps_the_attempt_s_start_on_the_record(
    leader_up_to_the_check, s3
):
    cfg, _events, monkeypatch, attempt = leader_up_to_the_check
    began = time.time() - 3600
    record = {"run": "r1", "attempt": 1, "started_at": utc_stamp(began), "restarts": []}
    Path(cfg.state_dir).mkdir(parents=True)
    (Path(cfg.state_dir) / "attempt.json").write_text(json.dumps(record))
    tcp = "NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/Socket/0\n"
    monkeypatch.setattr(
        launch, "stream", lambda command, env, log_path, keep, on_start=None: (0, tcp)
    )
    with pytest.raises(StepFailed) as failed:
        Leader(cfg, attempt).run()
    Leader(cfg, attempt).report(failed.value)
    read = lambda key: json.loads(s3.get_object(Bucket=cfg.bucket, Key=key)["Body"].read())  # noqa: E731
    done, status = read("runs/r1/DONE.json"), read("runs/r1/status.json")
    assert done["attempt_started_at"] == status["attempt_started_at"] == utc_stamp(began)
    assert done["restarts"] == [
        {"at": done["restarts"][0]["at"], "resumed_from_step": None, "reached_step": None}
    ]
    assert done["restarts"][0]["at"] >= utc_stamp(time.time() - 60)


def test_a_restarted_leader_whose_attempt_a_member_already_ended_adds_nothing(
    leader_up_to_the_check, s3, capsys
):
    """A member found the leader lost while systemd restarted it: the member's DONE.json is the
    attempt's record, and the restarted leader neither clears nor overwrites it."""
    cfg, events, monkeypatch, attempt = leader_up_to_the_check
    monkeypatch.setattr(launch, "stream", lambda *a, **k: events.append("horovodrun") or (1, ""))
    ended = {"status": "failed", "cause": "node_lost", "written_by": "member 1"}
    s3.put_object(Bucket=cfg.bucket, Key="runs/r1/DONE.json", Body=json.dumps(ended))
    attempt.started = time.time() - 600  # the attempt's first start, before the member wrote
    with pytest.raises(StepFailed) as failed:
        Leader(cfg, attempt).run()
    Leader(cfg, attempt).report(failed.value)
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
    """horovodrun's process as the leader's launch sees it: ended by end_process."""

    def __init__(self):
        self.ended = threading.Event()

    def terminate(self):
        self.ended.set()

    kill = terminate

    def poll(self):
        return 1 if self.ended.is_set() else None


def test_a_trainer_that_waits_for_its_files_starts_beside_the_pull_and_ends_with_it(
    leader_up_to_the_check, tmp_path
):
    """node.json `trainer` with data_wait_s: each rank waits for its own files, so training
    starts once every node holds its own shards. When the rest of the pull then finds a corrupt
    shard, horovodrun is ended at once and the attempt fails as the data pull (corrupt_shard),
    not as whatever its ranks said."""
    cfg, events, monkeypatch, attempt = leader_up_to_the_check
    cfg = dataclasses.replace(cfg, trainer={**cfg.trainer, "data_wait_s": 600},
                              mount_point=str(tmp_path / "data"))  # fmt: skip
    ofi = "NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/Libfabric/0\n"
    training = threading.Event()

    def pull(*args, on_own, **kwargs):
        on_own(time.time())
        training.wait(30)
        raise data_pull.VerificationError("train-00009-of-01024: sha256 differs from the manifest")

    def horovodrun(command, env, log_path, keep, on_start=None):
        if "bootstrap.fleet.allreduce_check" in command:
            return 0, ofi
        events.append("training")
        proc = Horovodrun()
        on_start(proc)
        training.set()  # the trainer runs while the rest of the pull comes
        assert proc.ended.wait(30), "horovodrun was not ended"
        return 143, "terminated"

    monkeypatch.setattr(data_pull, "pull_dataset", pull)
    monkeypatch.setattr(launch, "stream", horovodrun)
    monkeypatch.setattr(checkpoints.ModelStore, "restore", lambda store: False)
    with pytest.raises(StepFailed) as failed:
        Leader(cfg, attempt).run()
    assert "training" in events  # no wait for the fleet's shards first
    assert (failed.value.step, failed.value.cause) == ("data pull", "corrupt_shard")
    assert "train-00009-of-01024: sha256 differs" in failed.value.reason
