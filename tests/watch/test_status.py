"""horovod-fleet status/runs/logs against recorded S3 states (moto), and its one-line errors."""

import json
import os
import re
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from watch import cli
from watch.screen import RunFacts, status_screen

ROOT = Path(__file__).resolve().parents[2]
BUCKET = "horovod-fleet-123456789012-us-east-1"
COST = {"usd_per_hour": 32.7726, "prices_as_of": "2025-06 (us-east-1)", "max_hours": 4}
PHASE_LABELS = {
    "booting": "booting", "pulling_data": "pulling data", "allreduce_check": "allreduce check",
    "training": "training", "evaluating": "evaluating", "uploading": "uploading",
    "done": "done", "failed": "failed", "interrupted": "interrupted",
}  # fmt: skip


def stamp(delta_s: float = 0) -> str:
    return (datetime.now(timezone.utc) + timedelta(seconds=delta_s)).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_doc(phase: str, progress: dict | None = None, **changes) -> dict:
    doc = {
        "format": "horovod-fleet/status/1", "run": "r1", "attempt": 1, "phase": phase,
        "updated_at": stamp(-5), "attempt_started_at": stamp(-1800),
        "instance_type": "p4d.24xlarge", "nodes": 2, "gpus_per_node": 8, "nodes_healthy": 2,
        "progress": progress, "checkpoint": None, "reason": None, "cost": COST,
    }  # fmt: skip
    return doc | changes


PROGRESS = {
    "phase": "training", "epoch": 2, "epochs": 3, "step": 40, "steps_per_epoch": 100,
    "global_step": 140, "images_per_s": 1600.0, "loss": 2.345, "top1": 0.41, "eta_s": 900.0,
    "updated_at": stamp(-5),
}  # fmt: skip


@pytest.fixture
def s3(monkeypatch):
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_REGION", raising=False)
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        yield client


def put(s3, key: str, doc: dict) -> None:
    s3.put_object(Bucket=BUCKET, Key=key, Body=json.dumps(doc).encode())


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("phase", list(PHASE_LABELS))
def test_each_phase_from_a_recorded_status_json(s3, capsys, phase):
    progress = PROGRESS if phase in ("training", "evaluating", "uploading", "done") else None
    put(s3, "runs/r1/status.json", status_doc(phase, progress))
    code, out, err = run_cli(capsys, "status", "--run", "r1", "--bucket", BUCKET)
    assert (code, err) == (0, "")
    assert out.startswith("horovod-fleet status") and out.endswith("\n\n")
    assert f"phase       {PHASE_LABELS[phase]}, attempt 1" in out


def test_mid_run_screen_shows_progress_eta_dollars_and_the_cap(s3, capsys):
    status = status_doc("training", PROGRESS)
    status["checkpoint"] = {"key": "runs/r1/model/checkpoints/ckpt-100", "step": 100, "at": stamp()}
    put(s3, "runs/r1/status.json", status)
    for index in (0, 1):
        put(s3, f"runs/r1/nodes/{index}.json", {"index": index, "instance_id": f"i-{index}"})
    _, out, _ = run_cli(capsys, "status", "--run", "r1", "--bucket", BUCKET)
    assert "2 up, 2 healthy of 2 x p4d.24xlarge (8 GPUs each)" in out
    assert "epoch 2/3, step 40/100 (global step 140)" in out
    assert "1,600.0 img/s global, 100.0 img/s per GPU" in out
    assert "loss        2.345   top-1 0.4100" in out
    assert "ETA         0:15:00" in out
    # 2 x $32.7726/h for 30 minutes so far, and 15 more minutes to the end of training.
    assert re.search(r"cost        \$3[23]\.\d\d so far, ~\$49\.\d\d projected", out)
    assert "2 x p4d.24xlarge at $32.7726/h = $65.55/h (list prices 2025-06 (us-east-1))" in out
    assert re.search(r"hard cap    3:(30:00|2\d:\d\d) left", out)
    assert "estimated from the head's start" in out
    assert "ckpt-100 (step 100," in out


def test_an_ended_run_shows_done_json_reason(s3, capsys):
    put(s3, "runs/r1/status.json", status_doc("training", PROGRESS))  # the leader died mid-run
    put(s3, "runs/r1/DONE.json", {
        "run": "r1", "status": "failed", "reason": "rank 1 on 10.0.0.2 killed by SIGKILL",
        "top1": None, "duration_s": 1800, "finished_at": stamp(-60),
    })  # fmt: skip
    _, out, _ = run_cli(capsys, "status", "--run", "r1", "--bucket", BUCKET)
    assert "phase       failed, attempt 1" in out
    assert "DONE.json   failed: rank 1 on 10.0.0.2 killed by SIGKILL" in out
    assert "hard cap    not reached: the run has ended" in out
    assert "ETA" not in out and "projected" not in out


def test_a_relaunched_run_lists_its_ended_attempts(s3, capsys):
    put(s3, "runs/r1/status.json", status_doc("training", PROGRESS))  # the leader's last word
    put(s3, "runs/r1/controller.json", {"phase": "relaunching", "attempt": 2,
                                        "updated_at": stamp(-1)})  # fmt: skip
    put(s3, "runs/r1/attempts.json", {
        "format": "horovod-fleet/attempts/1", "run": "r1", "max_restarts": 3,
        "attempts": [{"attempt": 1, "status": "failed", "decision": "relaunch",
                      "why": "restart 1 of 3", "reason": "node 1 (i-0abc, 10.0.0.12) lost: "
                      "no heartbeat for 120 s " + "x" * 200}],
    })  # fmt: skip
    _, out, _ = run_cli(capsys, "status", "--run", "r1", "--bucket", BUCKET)
    assert "phase       relaunching, attempt 2" in out
    [line] = [line for line in out.splitlines() if line.startswith("  attempt 1 ")]
    assert line.startswith(
        "  attempt 1   failed, relaunch (restart 1 of 3): node 1 (i-0abc, 10.0.0.12) lost"
    )
    assert line.endswith("...") and len(line) < 160


def test_a_run_the_controller_handles_names_its_state_and_console_page(s3, capsys):
    arn = "arn:aws:states:eu-west-1:123456789012:execution:horovod-fleet-run-controller:r1-a1-0a1b2c3d"
    put(s3, "runs/r1/status.json", status_doc("training", PROGRESS))
    put(s3, "runs/r1/controller.json", {
        "phase": "relaunching", "attempt": 2, "updated_at": stamp(-1),
        "execution": arn, "controller_state": "WaitForCapacity",
        "reason": "waiting for capacity: InsufficientInstanceCapacity in eu-west-1a (try 1 of 8)",
    })  # fmt: skip
    _, out, _ = run_cli(capsys, "status", "--run", "r1", "--bucket", BUCKET)
    assert (
        "  controller  WaitForCapacity: https://eu-west-1.console.aws.amazon.com/states/home?"
        f"region=eu-west-1#/v2/executions/details/{arn}"
    ) in out.splitlines()
    assert "  reason      waiting for capacity: InsufficientInstanceCapacity" in out


def test_the_leader_s_newer_word_keeps_the_controller_s_line(s3, capsys):
    """A Spot warning starts an execution while the leader still writes status.json: each has
    its own document, so the leader's rewrite cannot drop the controller's line, and the
    controller's older phase does not hide the leader's."""
    arn = "arn:aws:states:us-east-1:123456789012:execution:horovod-fleet-run-controller:r1-a1-0a"
    put(s3, "runs/r1/controller.json", {
        "execution": arn, "controller_state": "Record", "phase": "relaunching",
        "reason": "relaunching after the warning", "updated_at": stamp(-60),
    })  # fmt: skip
    put(s3, "runs/r1/status.json", status_doc("training", PROGRESS))
    _, out, _ = run_cli(capsys, "status", "--run", "r1", "--bucket", BUCKET)
    assert "phase       training" in out and "relaunching" not in out
    assert (
        f"  controller  Record: https://us-east-1.console.aws.amazon.com/states/home?region=us-east-1#/v2/executions/details/{arn}"
        in out.splitlines()
    )


def test_phase_comes_from_cloudformation_before_the_leader_writes():
    now = datetime.now(timezone.utc)
    for stack_phase, label in (("image_bake", "image bake"), ("booting", "booting")):
        screen = status_screen(RunFacts("r1", BUCKET, now, stack_phase=stack_phase))
        assert screen.splitlines()[1] == f"  phase       {label}"
        assert screen.endswith("\n\n")


def test_exact_hard_cap_from_train_stack_output():
    now = datetime.now(timezone.utc)
    facts = RunFacts("r1", BUCKET, now, status=status_doc("training", PROGRESS))
    facts.hard_cap_at = now + timedelta(hours=1)
    assert "hard cap    1:00:00 left" in status_screen(facts)
    assert "estimated" not in status_screen(facts)


def test_missing_run_is_one_line_naming_it_and_the_runs_there(s3, capsys):
    put(s3, "runs/other/status.json", status_doc("done"))
    code, out, err = run_cli(capsys, "status", "--run", "nosuchrun", "--bucket", BUCKET)
    assert (code, out) == (1, "")
    assert err == (
        f"error: run 'nosuchrun' not found: nothing in s3://{BUCKET}/runs/nosuchrun/ and "
        "TrainStack is not deploying it (runs in the bucket: other)\n"
    )


def test_missing_bucket_is_one_line(s3, capsys):
    code, _, err = run_cli(capsys, "status", "--run", "r1", "--bucket", "no-such-bucket")
    assert code == 1 and err.count("\n") == 1
    assert err.startswith("error: bucket no-such-bucket does not exist")


def test_bucket_from_the_account_and_run_from_train_stack(s3, capsys):
    cloudformation = boto3.client("cloudformation", region_name="us-east-1")
    template = {
        "Resources": {"Handle": {"Type": "AWS::CloudFormation::WaitConditionHandle"}},
        "Outputs": {
            "HorovodFleetRun": {"Value": "r1"},
            # 30 s short of 2 h: the screen's whole seconds cannot round it back up to 2:00:00.
            "HorovodFleetDeadline": {"Value": stamp(7170)},
        },
    }
    cloudformation.create_stack(StackName="TrainStack", TemplateBody=json.dumps(template))
    put(s3, "runs/r1/status.json", status_doc("training", PROGRESS))
    code, out, err = run_cli(capsys, "status")
    assert (code, err) == (0, ""), err
    assert out.startswith(f"horovod-fleet status: run r1  (s3://{BUCKET}/runs/r1/)")
    assert re.search(r"hard cap    1:59:[23]\d left", out) and "estimated" not in out


def test_runs_lists_status_top1_duration_and_cost(s3, capsys):
    put(s3, "runs/a/status.json", status_doc("training", PROGRESS, run="a"))
    put(s3, "runs/b/status.json", status_doc("done", PROGRESS, run="b"))
    put(s3, "runs/b/DONE.json", {"status": "succeeded", "top1": 0.7512, "duration_s": 1200,
                                 "finished_at": stamp(-600)})  # fmt: skip
    code, out, _ = run_cli(capsys, "runs", "--bucket", BUCKET)
    assert code == 0
    header, first, second = out.splitlines()
    assert header.split() == ["run", "recipe", "nodes", "type", "status", "top-1", "duration",
                              "cost", "goodput"]  # fmt: skip
    # No config.json (a run from before it): no recipe on record, status.json's nodes and type.
    assert first.split()[:6] == ["a", "-", "2", "p4d.24xlarge", "training", "0.4100"]
    # Billed from the first attempt's start to DONE.json: 20 minutes of 2 nodes at $32.7726/h.
    assert second.split() == ["b", "-", "2", "p4d.24xlarge", "done", "0.7512", "0:20:00",
                              "$21.85", "-"]  # fmt: skip


TIMELINE = {
    "phases": {
        "launch": {"s": 31.0, "slowest": "node 1 (i-1, 10.0.0.8)", "node": "1"},
        "own_shards": {"s": 4.2, "slowest": "node 0 (i-0, 10.0.0.7)", "node": "0"},
        "allreduce_check": {"s": None, "slowest": None, "node": None},
    },
    "budget_s": {"launch": 120, "own_shards": 3.1, "allreduce_check": 60},
}
GOODPUT = {
    "goodput": 0.8123, "runtime_goodput": 0.9312,
    "goodput_s": {"wall_s": 3000.0, "productive_s": 2437.0,
                  "lost": {"capacity_wait": 0.0, "launch": 31.0, "boot": 88.0, "pull": 4.2,
                           "checks": 40.0, "framework_start": 150.0, "checkpoint": 30.0,
                           "evaluation": 120.0, "recovery": 0.0, "redone": 60.0,
                           "other": 39.8}},
}  # fmt: skip


def test_runs_show_goodput_and_the_start_up_measured_against_estimated(s3, capsys):
    done = {"status": "succeeded", "top1": 0.76, "duration_s": 3000, "finished_at": stamp(-60),
            "attempt": 1, "timeline": TIMELINE, **GOODPUT}  # fmt: skip
    put(s3, "runs/b/status.json", status_doc("done", PROGRESS, run="b"))
    put(s3, "runs/b/DONE.json", done)
    code, out, _ = run_cli(capsys, "runs", "--bucket", BUCKET)
    assert code == 0
    lines = out.splitlines()
    assert lines[1].split()[-1] == "81.2%"
    table = lines[lines.index("b: start-up, attempt 1, measured (the slowest node) against "
                              "estimated"):]  # fmt: skip
    assert table[2].split() == ["launch", "31.0", "s", "120", "s", "node", "1", "(i-1,",
                                "10.0.0.8)"]  # fmt: skip
    assert table[3].split()[:5] == ["own_shards", "4.2", "s", "3.1", "s"]
    assert table[4].split() == ["allreduce_check", "-", "60", "s", "not", "run"]


def test_the_status_screen_shows_goodput_and_where_the_rest_went(s3, capsys):
    put(s3, "runs/r1/status.json", status_doc("done", PROGRESS))
    put(s3, "runs/r1/DONE.json", {"status": "succeeded", "top1": 0.76, "reason": None,
                                  "finished_at": stamp(-60), **GOODPUT})  # fmt: skip
    _, out, _ = run_cli(capsys, "status", "--run", "r1", "--bucket", BUCKET)
    assert "goodput     81.2% from the first launch, 93.1% from the first step" in out
    assert "lost: framework start 0:02:30, evaluation 0:02:00, boot 0:01:28, redone 0:01:00" in out
    # While training: status.json's live figure (no breakdown until DONE.json).
    put(s3, "runs/r1/status.json", status_doc("training", PROGRESS,
                                              goodput={"goodput": 0.5, "runtime_goodput": 0.7}))  # fmt: skip
    s3.delete_object(Bucket=BUCKET, Key="runs/r1/DONE.json")
    _, out, _ = run_cli(capsys, "status", "--run", "r1", "--bucket", BUCKET)
    assert "goodput     50.0% from the first launch, 70.0% from the first step\n" in out


def test_the_status_screen_shows_the_nodes_training_and_the_newest_reset(s3, capsys):
    at = stamp(-600)  # within the attempt, which started 1800 s ago
    reset = {"at": at, "lost": [{"node": "1", "instance_id": "i-1",
             "ip": "10.0.0.1"}], "added": [], "ranks_before": 16, "ranks_after": 8,
             "recovery_s": 41.2, "steps_redone": 3}  # fmt: skip
    put(s3, "runs/r1/status.json", status_doc("training", PROGRESS, nodes_training=1,
                                              resets=[reset]))  # fmt: skip
    _, out, _ = run_cli(capsys, "status", "--run", "r1", "--bucket", BUCKET)
    assert "nodes       1 of 2 training, " in out
    assert (
        f"resets      1, the last: {at}: node 1 lost, 16 -> 8 ranks, training "
        "again in 41 s, 3 step(s) redone"
    ) in out
    # Before the trainer's first step (and in a status.json without the keys): no such lines.
    put(s3, "runs/r1/status.json", status_doc("training", PROGRESS))
    _, out, _ = run_cli(capsys, "status", "--run", "r1", "--bucket", BUCKET)
    assert "of 2 training" not in out and "resets " not in out


def test_logs_print_the_training_table_the_head_s_horovodrun_prints(s3, capsys):
    logs = boto3.client("logs", region_name="us-east-1")
    logs.create_log_group(logGroupName="fleet-logs")
    logs.create_log_stream(logGroupName="fleet-logs", logStreamName="i-head/train.log")
    now = int(time.time() * 1000)
    logs.put_log_events(
        logGroupName="fleet-logs", logStreamName="i-head/train.log",
        logEvents=[{"timestamp": now, "message": "Epoch 1/3"},
                   {"timestamp": now + 1, "message": "     100   0.50    1600.0   2.345"}],
    )  # fmt: skip
    code, _, err = run_cli(
        capsys, "logs", "--run", "r1", "--bucket", BUCKET, "--log-group", "fleet-logs"
    )
    assert code == 1 and "the head of run 'r1' has not started" in err
    put(s3, "runs/r1/head.json", {"ip": "10.0.0.9", "instance_id": "i-head"})
    put(s3, "runs/r1/nodes/0.json", {"index": 0, "instance_id": "i-0"})
    code, out, _ = run_cli(
        capsys, "logs", "--run", "r1", "--bucket", BUCKET, "--log-group", "fleet-logs"
    )
    assert code == 0
    assert out.splitlines() == ["Epoch 1/3", "     100   0.50    1600.0   2.345"]
    code, _, err = run_cli(
        capsys, "logs", "--run", "r1", "--bucket", BUCKET, "--log-group", "g", "--node", "3"
    )
    assert code == 1 and "node 3 of run 'r1' has not registered" in err


def command(*argv: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    environ |= {"AWS_EC2_METADATA_DISABLED": "true", "PYTHONPATH": str(ROOT), **env}
    return subprocess.run(
        [sys.executable, "-m", "watch.cli", *argv], capture_output=True, text=True,
        env=environ, timeout=60,
    )  # fmt: skip


def test_unreachable_endpoint_is_one_line_within_seconds():
    began = time.monotonic()
    result = command(
        "status", "--run", "nosuchrun",
        AWS_ENDPOINT_URL="http://127.0.0.1:9", AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="y",
    )  # fmt: skip
    assert time.monotonic() - began < 60
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith("error: cannot reach http://127.0.0.1:9")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_no_credentials_is_one_line(tmp_path):
    result = command(
        "status", "--run", "r1",
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), AWS_CONFIG_FILE=str(tmp_path / "none"),
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.startswith("error: no AWS credentials")
    assert result.stderr.count("\n") == 1


def test_the_command_reads_only_the_contracts():
    for path in (ROOT / "watch").glob("*.py"):
        text = path.read_text()
        for package in ("stacks", "bootstrap", "trainer"):
            assert f"from {package}" not in text and f"import {package}" not in text, path


def test_enable_events_keeps_the_buckets_sqs_notification(s3, capsys):
    """README's old command replaced the whole configuration: the SQS notification went."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    sqs = boto3.client("sqs", region_name="us-east-1")
    queue = sqs.create_queue(QueueName="uploads")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]
    mine = {"Id": "uploads", "QueueArn": arn["QueueArn"], "Events": ["s3:ObjectCreated:*"]}
    s3.put_bucket_notification_configuration(
        Bucket=BUCKET, NotificationConfiguration={"QueueConfigurations": [mine]}
    )
    code, out, err = run_cli(capsys, "enable-events", "--bucket", BUCKET)
    assert (code, err) == (0, "")
    assert out == (
        f"s3://{BUCKET} now sends its events to EventBridge (the run controller sees DONE.json "
        "at once); its 1 other notification(s) kept\n"
    )
    assert s3.get_bucket_notification_configuration(Bucket=BUCKET)["QueueConfigurations"] == [mine]
    # moto's GetBucketNotificationConfiguration leaves EventBridgeConfiguration out: its model says.
    configuration = (
        s3_backends[DEFAULT_ACCOUNT_ID]["global"].buckets[BUCKET].notification_configuration
    )
    assert configuration.event_bridge == {}


def test_enable_events_without_a_bucket_is_one_line(s3, capsys):
    code, out, err = run_cli(capsys, "enable-events")
    assert code == 1 and out == ""
    assert (
        err
        == "error: enable-events needs --bucket NAME: the bucket you deploy with -c datasetBucket=\n"
    )
