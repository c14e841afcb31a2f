"""`cdk deploy` of a changed TrainStack over a live fleet never restarts a node on old code:
the code guard (stacks/train/code_guard.py) refuses it in one line before any node is touched,
and lets every other deploy through."""

import json

import boto3
import pytest
from moto import mock_aws

from contract import names
from controller import answers

OLD = {
    "Run": "r1",
    "Code": "1111aaaa.zip,2222bbbb.zip",
    "ImageId": "ami-12c6146b",
    "InstanceType": "p4d.24xlarge",
    "UserData": "IyEvYmluL2Jhc2gKb2xk",
    "LaunchTemplateVersion": "1",
}
REFUSAL = (
    "run r1 is live on code 1111aaaa.zip,2222bbbb.zip (node(s) {node}); wait for it to end or "
    "cdk destroy TrainStack, then deploy"
)


@pytest.fixture
def train_stack(aws_credentials):
    """TrainStack in moto CloudFormation (its id is what the fleet's tag holds), and EC2."""
    answers.client.cache_clear()
    with mock_aws():
        cloudformation = boto3.client("cloudformation", region_name="us-east-1")
        stack_id = cloudformation.create_stack(
            StackName="TrainStack",
            TemplateBody='{"Resources": {"Topic": {"Type": "AWS::SNS::Topic"}}}',
        )["StackId"]
        yield stack_id
    answers.client.cache_clear()


def node(stack_id: str) -> str:
    """A fleet node as both CloudFormation's and the run controller's instances are tagged."""
    [instance] = boto3.client("ec2", region_name="us-east-1").run_instances(
        ImageId="ami-12c6146b",
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[
            {"ResourceType": "instance", "Tags": [{"Key": names.FLEET_TAG, "Value": stack_id}]}
        ],
    )["Instances"]
    return instance["InstanceId"]


def guard_request(stack_id: str, request_type: str, new: dict, old: dict | None = None) -> dict:
    return {
        "RequestType": request_type,
        "StackId": stack_id,
        "RequestId": "req-1",
        "ResourceType": names.CODE_GUARD_TYPE,
        "LogicalResourceId": "CodeGuard",
        "ResourceProperties": {"ServiceToken": "arn:aws:lambda:token", **new},
        **({} if old is None else {"OldResourceProperties": old, "PhysicalResourceId": stack_id}),
    }


def refused(event: dict) -> str | None:
    try:
        answers.on_event(event)
    except answers.Refused as refusal:
        return str(refusal)
    return None


@pytest.mark.parametrize(
    "change",
    [
        {"UserData": "IyEvYmluL2Jhc2gKbmV3"},  # new code URLs or node.json
        {"ImageId": "ami-0f00ba4"},
        {"InstanceType": "p5.48xlarge"},
        {"LaunchTemplateVersion": "2"},
    ],
    ids=["user data", "image", "type", "template"],
)
def test_a_change_to_what_nodes_run_is_refused_while_a_node_lives(train_stack, change):
    live = node(train_stack)
    event = guard_request(train_stack, "Update", {**OLD, **change}, OLD)
    assert refused(event) == REFUSAL.format(node=live)


@pytest.mark.parametrize("state", ["stopped", "terminated"])
def test_a_stopped_node_counts_as_live_a_terminated_one_does_not(train_stack, state):
    ec2 = boto3.client("ec2", region_name="us-east-1")
    instance = node(train_stack)
    if state == "stopped":
        ec2.stop_instances(InstanceIds=[instance])
    else:
        ec2.terminate_instances(InstanceIds=[instance])
    event = guard_request(train_stack, "Update", {**OLD, "UserData": "bmV3"}, OLD)
    assert refused(event) == (REFUSAL.format(node=instance) if state == "stopped" else None)


def test_a_change_with_no_live_node_passes(train_stack):
    event = guard_request(train_stack, "Update", {**OLD, "UserData": "bmV3"}, OLD)
    assert answers.on_event(event) == {"PhysicalResourceId": train_stack}


BUCKET = "horovod-fleet-123456789012-us-east-1"


def attempts(stack_id: str, *decisions: str) -> None:
    """The run's attempts.json as the run controller writes it, each entry in this stack."""
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket=BUCKET)
    entries = [{"attempt": n, "decision": d, "why": "restart 1 of 3", "stack_id": stack_id}
               for n, d in enumerate(decisions, 1)]  # fmt: skip
    s3.put_object(Bucket=BUCKET, Key="runs/r1/attempts.json",
                  Body=json.dumps({"attempts": entries}).encode())  # fmt: skip


@pytest.mark.parametrize(
    ("decisions", "live"),
    [(("relaunch",), True), (("relaunch", "teardown"), False), ((), False)],
    ids=["relaunching", "ended", "no attempt ended"],
)
def test_a_spot_relaunch_with_every_node_terminated_is_a_live_run(train_stack, decisions, live):
    """Bug 7: a Spot relaunch terminates every node before it launches them again, and the
    guard took "no instance running" for "no live run". A run is live until its final record."""
    ec2 = boto3.client("ec2", region_name="us-east-1")
    ec2.terminate_instances(InstanceIds=[node(train_stack), node(train_stack)])
    if decisions:
        attempts(train_stack, *decisions)
    else:
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket=BUCKET)
    changed = {**OLD, "UserData": "bmV3", "Bucket": BUCKET}
    answer = refused(guard_request(train_stack, "Update", changed, {**OLD, "Bucket": BUCKET}))
    expected = (
        "run r1 is live on code 1111aaaa.zip,2222bbbb.zip (relaunching after attempt 1: restart "
        "1 of 3); wait for it to end or cdk destroy TrainStack, then deploy"
    )
    assert answer == (expected if live else None)


def test_another_stacks_relaunch_does_not_count(train_stack):
    attempts("arn:aws:cloudformation:us-east-1:123456789012:stack/TrainStack/other", "relaunch")
    changed = {**OLD, "UserData": "bmV3", "Bucket": BUCKET}
    assert refused(guard_request(train_stack, "Update", changed, {**OLD, "Bucket": BUCKET})) is None


def test_another_stacks_nodes_do_not_count(train_stack):
    node("arn:aws:cloudformation:us-east-1:123456789012:stack/TrainStack/other")
    assert refused(guard_request(train_stack, "Update", {**OLD, "UserData": "bmV3"}, OLD)) is None


def test_an_update_of_nothing_the_nodes_run_passes_over_a_live_fleet(train_stack):
    node(train_stack)
    assert refused(guard_request(train_stack, "Update", {**OLD}, OLD)) is None


def test_the_guard_added_to_a_stack_with_a_live_fleet_refuses_until_it_ends(train_stack):
    """A TrainStack deployed before the guard: its nodes' old properties are unknown."""
    assert refused(guard_request(train_stack, "Create", OLD)) is None
    live = node(train_stack)
    assert refused(guard_request(train_stack, "Create", OLD)) == REFUSAL.format(node=live)


def test_the_rollback_of_a_refused_update_passes(train_stack, monkeypatch):
    """CloudFormation then sends the old properties back as an Update; refusing it too would
    leave the stack in UPDATE_ROLLBACK_FAILED."""
    node(train_stack)
    assert not answers.rolling_back(train_stack)  # CREATE_COMPLETE in moto
    cloudformation = answers.client("cloudformation")
    [stack] = cloudformation.describe_stacks(StackName=train_stack)["Stacks"]
    rolling = {"Stacks": [{**stack, "StackStatus": "UPDATE_ROLLBACK_IN_PROGRESS"}]}
    monkeypatch.setattr(cloudformation, "describe_stacks", lambda **_: rolling)
    back = guard_request(train_stack, "Update", OLD, {**OLD, "UserData": "bmV3"})
    assert refused(back) is None


def guard_of(template) -> tuple[str, dict]:
    [(logical_id, guard)] = template.find_resources(names.CODE_GUARD_TYPE).items()
    return logical_id, guard


@pytest.mark.parametrize("market", ["on-demand", "spot"])
def test_the_guard_holds_what_node_0_runs_and_every_node_waits_for_it(synth, default, market):
    template = (default if market == "on-demand" else synth(market="spot"))["TrainStack"]
    guard_id, guard = guard_of(template)
    resources = template.to_json()["Resources"]
    [node0] = [r for k, r in resources.items() if k.startswith("FleetNode0") and
               r["Type"] == "AWS::EC2::Instance"]  # fmt: skip
    props, node_props = guard["Properties"], node0["Properties"]
    assert (props["ImageId"], props["InstanceType"], props["UserData"]) == (
        node_props["ImageId"],
        node_props["InstanceType"],
        node_props["UserData"],
    )
    assert props["LaunchTemplateVersion"] == node_props["LaunchTemplate"]["Version"]
    assert "AnswersProvider" in str(props["ServiceToken"])
    fleet = [
        (k, r)
        for k, r in resources.items()
        if r["Type"] == "AWS::EC2::Instance"
        or (r["Type"] == "AWS::EC2::LaunchTemplate" and "Replacement" in k)
    ]
    assert len(fleet) >= 2
    for logical_id, resource in fleet:
        assert guard_id in resource.get("DependsOn", []), logical_id
