"""The run's configuration on the record (issue 50): runs/<run>/config.json holds every context
value of the deploy that got its fleet up; a redeploy of the run with other training values is
refused in one line naming them, unless -c allowChange=true; `horovod-fleet runs` shows the
recipe, nodes and type."""

import datetime
import json

import boto3
import pytest
from test_deploy_answers import BUCKET, REGION, RUN, aws, request  # noqa: F401 (aws: a fixture)

from contract.names import RUN_CHECK_TYPE, RUN_RECORD_TYPE
from controller import answer_kit, answers
from stacks.config import KEYS
from stacks.train import run_record
from watch import cli

moto = pytest.mark.usefixtures("aws")  # the answers and the command against moto
TRAINING = {"recipe": "goyal", "nodes": 8, "instanceType": "p4d.24xlarge", "epochs": 90,
            "batchPerGpu": 256, "arch": "resnet50", "imageSize": 224}  # fmt: skip
CONTEXT = {key: None for key in KEYS} | {
    "run": RUN,
    "recipe": "goyal",
    "nodes": 8,
    "maxHours": None,
}
KEY = f"runs/{RUN}/config.json"


def check(training=TRAINING, allow=False, request_type="Create", **extra) -> dict:
    props = {"Bucket": BUCKET, "Run": RUN, "Training": json.dumps(training),
             "AllowChange": str(allow).lower()}  # fmt: skip
    return request(RUN_CHECK_TYPE, request_type, props, **extra)


def record(training=TRAINING, context=CONTEXT, request_type="Create", **extra) -> dict:
    props = {"Bucket": BUCKET, "Run": RUN, "Training": json.dumps(training),
             "Context": json.dumps(context)}  # fmt: skip
    return request(RUN_RECORD_TYPE, request_type, props, **extra)


def stored() -> dict:
    body = boto3.client("s3", region_name=REGION).get_object(Bucket=BUCKET, Key=KEY)["Body"]
    return json.loads(body.read())


def refusal(event: dict) -> str:
    with pytest.raises(answers.Refused) as raised:
        answers.on_event(event)
    return str(raised.value)


@moto
def test_the_record_holds_every_context_value_and_a_redeploy_with_others_is_refused():
    assert answers.on_event(check())["Data"] == {"Changed": ""}  # the run's first deploy
    answers.on_event(record())
    document = stored()
    assert document["format"] == "horovod-fleet/config/1"
    assert (document["run"], document["training"], document["context"]) == (RUN, TRAINING, CONTEXT)
    assert document["deployed_at"] == "2026-11-22T04:33:20Z" and document["changes"] == []
    # The same values (maxHours may change: it is not a training value) pass.
    assert answers.on_event(check())["Data"] == {"Changed": ""}
    line = refusal(check(TRAINING | {"recipe": "fast", "nodes": 4}))
    assert line == (
        f"run {RUN} was deployed with recipe=goyal, nodes=8 and this deploy asks for "
        f"recipe=fast, nodes=4: its checkpoints in s3://{BUCKET}/runs/{RUN}/ would resume under "
        "other values. Deploy it as another run (-c run=NAME), or add -c allowChange=true to go "
        "on with these"
    )
    allowed = answers.on_event(check(TRAINING | {"recipe": "fast", "nodes": 4}, allow=True))
    assert allowed["Data"] == {"Changed": "recipe,nodes"}


@moto
def test_a_changed_deploy_keeps_the_earlier_values_and_the_same_one_writes_nothing(monkeypatch):
    answers.on_event(record())
    first = stored()
    later = answers.now() + datetime.timedelta(hours=2)
    monkeypatch.setattr(answer_kit, "now", lambda: later)
    answers.on_event(record())  # the same deploy asked again (a replayed request)
    assert stored() == first
    fast = TRAINING | {"recipe": "fast", "epochs": 44, "batchPerGpu": 128}
    answers.on_event(record(fast, CONTEXT | {"recipe": "fast", "allowChange": "true"},
                            request_type="Update", PhysicalResourceId=f"s3://{BUCKET}/{KEY}"))  # fmt: skip
    document = stored()
    assert document["training"] == fast and document["deployed_at"] == "2026-11-22T06:33:20Z"
    assert document["changes"] == [{"deployed_at": "2026-11-22T04:33:20Z", "training": TRAINING}]


@moto
def test_a_rollback_passes_and_a_refused_write_does_not_fail_a_fleet_that_is_up(monkeypatch):
    answers.on_event(record())
    monkeypatch.setattr(answer_kit, "rolling_back", lambda stack_id: True)
    back = check(TRAINING | {"nodes": 2}, request_type="Update", PhysicalResourceId="x")
    assert answers.on_event(back)["PhysicalResourceId"] == f"s3://{BUCKET}/{KEY}"
    boto3.client("s3", region_name=REGION).delete_object(Bucket=BUCKET, Key=KEY)
    boto3.client("s3", region_name=REGION).delete_bucket(Bucket=BUCKET)
    # No bucket: the check says so in one line; the record, which comes once the fleet is up,
    # logs its failed read and write and lets the deploy complete.
    assert refusal(check()).startswith(f"cannot read s3://{BUCKET}/{KEY}: ")
    assert answers.on_event(record()) == {"PhysicalResourceId": f"s3://{BUCKET}/{KEY}"}


def test_train_stack_checks_before_any_launch_and_records_after_the_fleet_is_up(default):
    train = default["TrainStack"].to_json()["Resources"]
    [(check_id, check_resource)] = [
        (k, r) for k, r in train.items() if r["Type"] == run_record.RUN_CHECK_TYPE
    ]
    [(_, record_resource)] = [(k, r) for k, r in train.items() if r["Type"] == run_record.RUN_RECORD_TYPE]  # fmt: skip
    assert json.loads(check_resource["Properties"]["Training"]) == TRAINING  # cdk.json's run
    assert check_resource["Properties"]["AllowChange"] == "false"
    instances = [k for k, r in train.items() if r["Type"] == "AWS::EC2::Instance"]
    assert len(instances) == 9  # 8 nodes and the head
    for instance in instances:
        assert check_id in train[instance]["DependsOn"]
        assert instance in record_resource["DependsOn"]
    context = json.loads(record_resource["Properties"]["Context"])
    assert set(context) == set(KEYS) and context["recipe"] == "goyal"
    assert (run_record.RUN_CHECK_TYPE, run_record.RUN_RECORD_TYPE) == (
        RUN_CHECK_TYPE, RUN_RECORD_TYPE
    )  # fmt: skip


@moto
def test_horovod_fleet_runs_shows_the_recorded_recipe_nodes_and_type(capsys):
    answers.on_event(
        record(TRAINING | {"recipe": "fast", "nodes": 4, "instanceType": "p5.48xlarge"})
    )
    capsys.readouterr()  # the answer's log line
    assert cli.main(["runs", "--bucket", BUCKET]) == 0
    header, row = capsys.readouterr().out.splitlines()[:2]
    assert header.split()[:4] == ["run", "recipe", "nodes", "type"]
    assert row.split()[:4] == [RUN, "fast", "4", "p5.48xlarge"]
