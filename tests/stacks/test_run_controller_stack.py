"""The run controller as TeardownStack synthesizes it: a Standard state machine whose every task
retries and ends, on failure, in StopBilling; roles that create nothing at run time; names the
functions and the stacks agree on."""

import json

import answers
import cleanup
import ec2_fleet
import pytest
import train_stack
import zones
from test_teardown import as_list

from stacks.teardown import names
from stacks.teardown.run_controller import STATE_MACHINE_NAME

# What the relaunch never does any more: TrainStack makes its zones at deploy.
RUN_TIME_CREATIONS = (
    "ec2:CreateSubnet",
    "ec2:CreatePlacementGroup",
    "ec2:CreateLaunchTemplateVersion",
)


def definition(template) -> dict:
    [machine] = template.find_resources("AWS::StepFunctions::StateMachine").values()
    parts = machine["Properties"]["DefinitionString"]["Fn::Join"][1]
    return json.loads("".join(p if isinstance(p, str) else '"<arn>"' for p in parts).replace(
        '""<arn>""', '"<arn>"'))  # fmt: skip


@pytest.fixture(scope="module")
def machine(default) -> tuple[dict, dict]:
    [resource] = (
        default["TeardownStack"].find_resources("AWS::StepFunctions::StateMachine").values()
    )
    return resource["Properties"], definition(default["TeardownStack"])


def test_the_run_controller_is_a_standard_state_machine_in_jsonpath(machine):
    props, asl = machine
    assert props["StateMachineType"] == "STANDARD"
    assert props["StateMachineName"] == STATE_MACHINE_NAME
    assert asl.get("QueryLanguage", "JSONPath") == "JSONPath"
    assert asl["StartAt"] == "Identify"
    assert not any(
        "Assign" in state or "QueryLanguage" in state for state in asl["States"].values()
    )
    assert 0 < asl["TimeoutSeconds"] <= 365 * 86400


def test_every_task_retries_and_ends_in_stop_billing(machine):
    _, asl = machine
    tasks = {name: s for name, s in asl["States"].items() if s["Type"] == "Task"}
    assert set(tasks) == {
        "Record", "StopFleet", "CheckSettled", "Launch", "StopForCapacity", "StopAfterGivingUp",
        "ResultsReady", "DeleteStack", "FollowDelete", "StopBilling",
    }  # fmt: skip
    for name, task in tasks.items():
        assert task["Resource"] == "<arn>", name  # the function itself: its payload is the state
        retried = [r["ErrorEquals"] for r in task["Retry"]]
        assert ["AwsThrottled"] in retried and retried[-1] == ["States.ALL"], name
        stops_the_fleet = name in ("StopFleet", "StopForCapacity", "StopAfterGivingUp")
        assert (["NodePending"] in retried) is stops_the_fleet, name
        [catch] = task["Catch"]
        assert catch["ErrorEquals"] == ["States.ALL"]
        assert catch["Next"] == ("ControllerFailed" if name == "StopBilling" else "StopBilling")
    assert asl["States"]["StopBilling"]["Next"] == "ControllerFailed"
    assert asl["States"]["ControllerFailed"]["Type"] == "Fail"


def test_every_wait_takes_its_seconds_from_the_state_before_it(machine):
    _, asl = machine
    waits = {name: s for name, s in asl["States"].items() if s["Type"] == "Wait"}
    assert set(waits) == {
        "WaitToRecord", "WaitToSettle", "WaitForCapacity", "WaitForResults", "WaitForDelete"
    }  # fmt: skip
    assert all("SecondsPath" in s and "Seconds" not in s for s in waits.values())


@pytest.mark.parametrize(
    "overrides",
    [{}, {"market": "spot"}, {"capacityReservationId": "cr-0123456789abcdef0"}],
    ids=["on-demand", "spot", "reservation"],
)
def test_no_role_creates_a_subnet_a_placement_group_or_a_template_version(synth, overrides):
    for name, template in synth(**overrides).items():
        for policy in template.find_resources("AWS::IAM::Policy").values():
            for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
                actions = as_list(statement["Action"])
                assert not set(actions) & set(RUN_TIME_CREATIONS), (name, statement)
                assert not any(a in ("ec2:*", "*") or a.startswith("ec2:Create*") for a in actions)
        for role in template.find_resources("AWS::IAM::Role").values():
            for inline in role["Properties"].get("Policies", []):
                for statement in inline["PolicyDocument"]["Statement"]:
                    assert not set(as_list(statement["Action"])) & set(RUN_TIME_CREATIONS)


def test_the_functions_and_the_stacks_agree_on_names():
    assert (
        train_stack.TRAIN_STACK,
        train_stack.RUN_OUTPUT_KEY,
        train_stack.NOTIFY_OUTPUT_KEY,
        train_stack.MAX_RESTARTS_OUTPUT_KEY,
        train_stack.DEADLINE_OUTPUT_KEY,
        train_stack.REPLACEMENT_OUTPUT_KEY,
        train_stack.NODES_OUTPUT_KEY,
        zones.ZONES_OUTPUT_KEY,
        ec2_fleet.FLEET_TAG,
        ec2_fleet.NODE_TAG,
        answers.DEADLINE_TYPE,
    ) == (
        names.TRAIN_STACK_NAME,
        names.RUN_OUTPUT_KEY,
        names.NOTIFY_OUTPUT_KEY,
        names.MAX_RESTARTS_OUTPUT_KEY,
        names.DEADLINE_OUTPUT_KEY,
        names.REPLACEMENT_OUTPUT_KEY,
        names.NODES_OUTPUT_KEY,
        names.ZONES_OUTPUT_KEY,
        names.FLEET_TAG,
        names.NODE_TAG,
        names.DEADLINE_TYPE,
    )
    assert cleanup.STACK_DELETED == ("DELETE_IN_PROGRESS", "ROLLBACK_IN_PROGRESS")


def test_the_replacements_resource_is_answered_by_the_cleanup(default):
    [resource] = default["TrainStack"].find_resources(names.REPLACEMENTS_TYPE).values()
    token = json.dumps(resource["Properties"]["ServiceToken"])
    assert "CleanupProviderframeworkonEvent" in token
