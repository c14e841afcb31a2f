"""`horovod-fleet hold` and `release` against moto: the record they write (runs/<run>/hold.json,
docs/contracts.md), the status screen's line, and one line for every bad input."""

import json

import boto3
import pytest
from moto import mock_aws

from watch import cli

BUCKET = "horovod-fleet-123456789012-us-east-1"
HOLD = "runs/r1/hold.json"


@pytest.fixture
def aws(monkeypatch):
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_ENDPOINT_URL", "AWS_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        yield s3


def train_stack(run: str = "r1", outputs: bool = True) -> str:
    """TrainStack deploying `run`: its tag from CreateStack on, its outputs once created."""
    template = {"Resources": {"Handle": {"Type": "AWS::CloudFormation::WaitConditionHandle"}}}
    if outputs:
        template["Outputs"] = {
            "HorovodFleetRun": {"Value": run},
            "HorovodFleetDeadline": {"Value": "2026-11-29T12:00:00Z"},
        }
    created = boto3.client("cloudformation", region_name="us-east-1").create_stack(
        StackName="TrainStack",
        TemplateBody=json.dumps(template),
        Tags=[{"Key": "horovod-fleet:run", "Value": run}],
    )
    return created["StackId"]


# The head's status.json, as `status` shows it (docs/contracts.md).
STATUS = {"format": "horovod-fleet/status/1", "run": "r1", "attempt": 1, "phase": "training",
          "updated_at": "2026-11-29T10:00:00Z", "instance_type": "p4d.24xlarge", "nodes": 2,
          "gpus_per_node": 8, "nodes_healthy": 2}  # fmt: skip


def record(s3) -> dict:
    return json.loads(s3.get_object(Bucket=BUCKET, Key=HOLD)["Body"].read())


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_hold_puts_the_deployed_run_on_hold_and_release_hands_it_back(aws, capsys):
    stack_id = train_stack()
    aws.put_object(Bucket=BUCKET, Key="runs/r1/status.json", Body=json.dumps(STATUS).encode())
    code, out, err = run_cli(capsys, "hold", "--reason", "looking at node 1")
    assert (code, err) == (0, "")
    assert out.startswith("run r1 held: the run controller takes no action on it but the hard cap")
    assert "(at 2026-11-29T12:00:00Z)" in out and "horovod-fleet release" in out
    held = record(aws)
    assert held["format"] == "horovod-fleet/hold/1"
    assert (held["run"], held["stack_id"], held["held"], held["reason"]) == (
        "r1", stack_id, True, "looking at node 1",
    )  # fmt: skip
    assert held["held_by"].startswith("arn:aws:") and held["held_at"].endswith("Z")
    assert run_cli(capsys, "hold")[1].startswith("run r1 is already held, since ")
    code, out, _ = run_cli(capsys, "status", "--bucket", BUCKET)
    assert code == 0
    assert "  hold        held since " in out and "(looking at node 1)" in out
    code, out, err = run_cli(capsys, "release")
    assert (code, err) == (0, "") and out.startswith("run r1 released")
    released = record(aws)
    assert released["held"] is False and released["released_at"] and released["held_at"]
    assert "hold  " not in run_cli(capsys, "status", "--bucket", BUCKET)[1]
    assert run_cli(capsys, "release")[1] == "run r1 is not held: nothing changed\n"


def test_a_run_being_created_can_be_held(aws, capsys):
    """No outputs yet while TrainStack is created: the run is its stack-level tag."""
    train_stack(outputs=False)
    assert run_cli(capsys, "hold", "--run", "r1")[0] == 0
    assert record(aws)["held"] is True


def test_a_hold_of_an_earlier_stack_shows_as_not_in_force(aws, capsys):
    train_stack()
    aws.put_object(Bucket=BUCKET, Key=HOLD, Body=json.dumps({
        "held": True, "stack_id": "arn:aws:cloudformation:us-east-1:1:stack/TrainStack/old",
        "held_at": "2026-11-01T00:00:00Z", "held_by": "someone"}).encode())  # fmt: skip
    aws.put_object(Bucket=BUCKET, Key="runs/r1/status.json", Body=json.dumps(STATUS).encode())
    out = run_cli(capsys, "status", "--bucket", BUCKET)[1]
    assert "for an earlier TrainStack, not in force" in out
    assert run_cli(capsys, "hold")[1].startswith("run r1 held")  # this stack's hold, anew


BAD = [
    # (argv, what the one line says)
    (["hold"], "error: nothing to hold in us-east-1: no TrainStack"),
    (["hold", "--run", "Bad/Name"], "error: --run 'Bad/Name' is not a run name: 1-40 lowercase"),
    (["release", "--run", "r" * 41], "is not a run name"),
    (["release"], "error: no run: pass --run NAME (no TrainStack in us-east-1)"),
    (["hold", "now"], "error: unrecognized arguments: now (see horovod-fleet --help)"),
    (["hold", "--run"], "error: argument --run: expected one argument"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "says"), BAD, ids=[" ".join(b[0]) for b in BAD])
def test_bad_input_is_one_line_and_writes_nothing(aws, capsys, argv, says):
    try:
        code, out, err = run_cli(capsys, *argv, "--bucket", BUCKET)
    except SystemExit as parser_exit:  # argparse's own errors
        code, (out, err) = parser_exit.code, capsys.readouterr()
    assert code != 0 and out == ""
    assert says in err and err.count("\n") == 1, err
    assert aws.list_objects_v2(Bucket=BUCKET, Prefix="runs/").get("KeyCount", 0) == 0


def test_a_run_that_is_not_deployed_is_not_held(aws, capsys):
    train_stack("r2")
    code, out, err = run_cli(capsys, "hold", "--run", "r1", "--bucket", BUCKET)
    assert (code, out) == (1, "")
    assert err == "error: run 'r1' is not deployed: TrainStack runs 'r2'\n"
