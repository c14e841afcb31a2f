"""`python -m bootstrap`: a user mistake is one `error: ...` line and exit 2; a failure report
whose own AWS calls fail still names the original failure, in one line each, and exits 1.

.venv/bin/python -m pytest tests/bootstrap/test_bootstrap_main.py
"""

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from bootstrap_helpers import train_doc
from botocore.exceptions import EndpointConnectionError, NoCredentialsError

from bootstrap import __main__ as bootstrap_main
from bootstrap import aws, checkpoints, launch, results
from bootstrap.node_config import parse
from bootstrap.rendezvous import utc_stamp


def bootstrap(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bootstrap", *argv], capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def node_json(tmp_path):
    path = tmp_path / "node.json"
    path.write_text(json.dumps(train_doc(log_dir=str(tmp_path / "logs"))))
    return str(path)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bogus"], "argument command: invalid choice: 'bogus' (choose from"),
        ([], "the following arguments are required: command"),
        (["fail", "data pull"], "the following arguments are required: reason"),
        (["cloudwatch-config"], "the following arguments are required: path"),
        (["--bogus", "train-node"], "unrecognized arguments: --bogus"),
    ],
)
def test_usage_mistake_is_one_line(node_json, argv, message):
    result = bootstrap("--node-json", node_json, *argv)
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: {message}")
    assert result.stderr.endswith(" (see --help)\n") and result.stderr.count("\n") == 1
    assert result.stdout == ""


def test_binary_node_json_is_one_line_naming_the_file(tmp_path):
    path = tmp_path / "node.json"
    path.write_bytes(b"{\xff\xfe}")
    result = bootstrap("--node-json", str(path), "train-node")
    assert result.returncode == 2
    assert result.stderr == f"error: node.json: {path} is not UTF-8 text (byte 0xff at offset 1)\n"


@pytest.mark.parametrize(
    ("target", "problem"),
    [("missing-dir/agent.json", "No such file or directory"), (".", "Is a directory")],
)
def test_unwritable_cloudwatch_config_is_one_line(node_json, tmp_path, target, problem):
    path = tmp_path / target
    result = bootstrap("--node-json", node_json, "cloudwatch-config", str(path))
    assert result.returncode == 2
    assert result.stderr == (f"error: cannot write the CloudWatch agent config {path}: {problem}\n")
    assert not (tmp_path / "missing-dir").exists()


def test_cloudwatch_config_is_written(node_json, tmp_path):
    result = bootstrap("--node-json", node_json, "cloudwatch-config", str(tmp_path / "agent.json"))
    assert result.returncode == 0, result.stderr
    assert "logs" in json.loads((tmp_path / "agent.json").read_text())


def test_failure_report_survives_unreachable_aws(tmp_path, monkeypatch, capsys):
    """No network, no credentials: every AWS call of the report fails; the report still logs the
    original failure once, says in one line each what it could not do, and does not raise."""
    cfg = parse(
        train_doc(
            signal={"stack": "TrainStack", "resource": "Node0"},
            mount_point=str(tmp_path / "data"),
            log_dir=str(tmp_path / "logs"),
        )
    )

    def unreachable(*args):
        raise EndpointConnectionError(endpoint_url="https://aws.example")

    def no_credentials(*args):
        raise NoCredentialsError()

    monkeypatch.setattr(aws, "signal_cloudformation", unreachable)
    monkeypatch.setattr(checkpoints.ModelStore, "upload", unreachable)
    monkeypatch.setattr(results, "write_done", no_credentials)
    failure = bootstrap_main.StepFailed("data pull", "RuntimeError: s5cmd cp failed", "unknown")
    attempt = bootstrap_main.Attempt()
    attempt.store = checkpoints.ModelStore(None, cfg, tmp_path / "data" / "model")

    bootstrap_main.report_failure(cfg, failure, attempt)

    refused = (
        'EndpointConnectionError: Could not connect to the endpoint URL: "https://aws.example"'
    )
    messages = [line.split(" [bootstrap] ", 1)[1] for line in capsys.readouterr().out.splitlines()]
    assert messages == [
        "FAILED: step 'data pull' failed: RuntimeError: s5cmd cp failed",
        f"could not signal FAILURE to CloudFormation: {refused}",
        f"could not upload the checkpoints: {refused}",
        "could not write s3://fleet-data/runs/r1/DONE.json: "
        "NoCredentialsError: Unable to locate credentials",
    ]


def test_multi_line_errors_become_one_failure_line():
    def s5cmd_fails():
        raise RuntimeError("s5cmd cp failed: ERROR session\ncaused by: dial tcp: refused")

    with pytest.raises(bootstrap_main.StepFailed) as failure:
        bootstrap_main.step("data pull", s5cmd_fails)
    assert failure.value.reason == (
        "RuntimeError: s5cmd cp failed: ERROR session caused by: dial tcp: refused"
    )


def test_children_get_the_nodes_region(node_json, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_REGION", "recorded-so-teardown-restores-it")
    monkeypatch.delenv("AWS_REGION")
    assert (
        bootstrap_main.main(
            ["--node-json", node_json, "cloudwatch-config", str(tmp_path / "a.json")]
        )
        == 0
    )
    region = json.loads(Path(node_json).read_text())["region"]
    assert bootstrap_main.os.environ["AWS_REGION"] == region


@pytest.fixture
def leader_up_to_the_check(s3, train_config, monkeypatch):
    """A one-node GPU leader whose health, data pull and identity pass, with signals and
    horovodrun recorded instead of sent: what runs is the real order of train_node's steps."""
    if shutil.which("ssh-keygen") is None:
        pytest.skip("ssh-keygen (openssh-client) not installed")
    cfg = train_config(
        nodes=1, signal={"stack": "TrainStack", "resource": "Node0"}, heartbeat_timeout_s=60
    )
    events: list[str] = []
    aws.client.cache_clear()  # clients made before moto started would reach for AWS
    monkeypatch.setattr(bootstrap_main.health, "count_gpus", lambda: 8)
    monkeypatch.setattr(bootstrap_main.health, "efa_present", lambda: True)
    monkeypatch.setattr(bootstrap_main.health, "life_cycle", lambda cfg: cfg.market)
    monkeypatch.setattr(bootstrap_main.data_pull, "pull_dataset", lambda *a: events.append("pull"))
    monkeypatch.setattr(aws, "private_ip", lambda cfg: "10.0.0.5")
    monkeypatch.setattr(aws, "instance_id", lambda cfg: "i-0")
    monkeypatch.setattr(
        aws,
        "signal_cloudformation",
        lambda cfg, success, reason: events.append(f"signal {success}: {reason}") or "recorded",
    )
    attempt = bootstrap_main.Attempt()
    yield cfg, events, monkeypatch, attempt
    # What report_failure ends on a node: the status thread and the heartbeat.
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
    monkeypatch.setattr(bootstrap_main, "log", logged.append)

    def horovodrun(command, env, log_path, keep, on_start=None):
        events.append("allreduce check")
        return 0, tcp

    monkeypatch.setattr(launch, "stream", horovodrun)
    with pytest.raises(bootstrap_main.StepFailed) as failed:
        bootstrap_main.train_node(cfg, attempt)
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
        events.append("allreduce check" if "bootstrap.allreduce_check" in command else "train")
        if len(events) > 2:
            raise RuntimeError("stop after the check")
        return 0, ofi

    monkeypatch.setattr(launch, "stream", horovodrun)
    monkeypatch.setattr(checkpoints.ModelStore, "restore", lambda store: events.append("restore"))
    with pytest.raises(bootstrap_main.StepFailed, match="stop after the check"):
        bootstrap_main.train_node(cfg, attempt)
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
        if "bootstrap.allreduce_check" in command:
            return 0, ofi
        raise RuntimeError("stop before training")

    monkeypatch.setattr(launch, "stream", horovodrun)
    monkeypatch.setattr(checkpoints.ModelStore, "restore", lambda store: chosen)
    with pytest.raises(bootstrap_main.StepFailed, match="stop before training"):
        bootstrap_main.train_node(cfg, attempt)
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
        if "bootstrap.allreduce_check" in command:
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
    with pytest.raises(bootstrap_main.StepFailed) as ended:
        bootstrap_main.train_node(cfg, attempt)
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
    with pytest.raises(bootstrap_main.StepFailed) as failed:
        bootstrap_main.train_node(cfg, attempt)
    bootstrap_main.report_failure(cfg, failed.value, attempt)
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
    with pytest.raises(bootstrap_main.StepFailed) as failed:
        bootstrap_main.train_node(cfg, attempt)
    bootstrap_main.report_failure(cfg, failed.value, attempt)
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
