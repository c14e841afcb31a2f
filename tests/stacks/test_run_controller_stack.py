"""The run controller as TeardownStack synthesizes it: a Standard state machine whose every task
has a timeout, retries Lambda's own throttling for minutes and ends, on failure, in StopBilling;
roles that create nothing at run time."""

import json

import pytest
from test_teardown import as_list

from contract import names
from controller import cleanup
from stacks.teardown.run_controller import STATE_MACHINE_NAME, STEP_TIMEOUT_MINUTES
from stacks.teardown.workflow import STOP_BILLING_RETRY_S, retry_span

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
    assert asl["StartAt"] == "Identify" and asl["States"]["Identify"]["Next"] == "Route"
    routes = {c["StringEquals"]: c["Next"] for c in asl["States"]["Route"]["Choices"]}
    assert routes == {"relaunch": "StopFleet", "teardown": "ResultsReady",
                      "delete": "DeleteStack", "follow": "FollowDelete"}  # fmt: skip
    assert not any(
        "Assign" in state or "QueryLanguage" in state for state in asl["States"].values()
    )
    assert 0 < asl["TimeoutSeconds"] <= 365 * 86400


def tasks_of(asl: dict) -> dict:
    return {name: s for name, s in asl["States"].items() if s["Type"] == "Task"}


def test_every_task_retries_and_ends_in_stop_billing(machine):
    _, asl = machine
    tasks = tasks_of(asl)
    assert set(tasks) == {
        "StopFleet", "CheckSettled", "Launch", "StopForCapacity", "StopAfterGivingUp",
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


def span(retrier: dict) -> float:
    """How long a Retry retries (Step Functions' waits: IntervalSeconds x BackoffRate^n, each
    capped at MaxDelaySeconds); with jitter each wait is shorter, so none here may have it."""
    assert "JitterStrategy" not in retrier
    return retry_span(
        retrier["MaxAttempts"],
        retrier.get("IntervalSeconds", 1),
        retrier.get("BackoffRate", 2.0),
        retrier.get("MaxDelaySeconds", float("inf")),
    )


def test_every_task_retries_lambdas_throttling_for_minutes_and_stop_billing_for_longer(machine):
    """Done when: every Task retries Lambda.TooManyRequestsException for at least 5 minutes,
    StopBilling for at least 15 (bug 2: only States.ALL matched it, 3 invocations in 30 s)."""
    _, asl = machine
    for name, task in tasks_of(asl).items():
        [retrier] = [
            r for r in task["Retry"] if "Lambda.TooManyRequestsException" in r["ErrorEquals"]
        ]
        assert task["Retry"].index(retrier) == 0, name  # matched before States.ALL
        assert {"Lambda.ServiceException", "Lambda.AWSLambdaException",
                "Lambda.SdkClientException"} <= set(retrier["ErrorEquals"])  # fmt: skip
        assert span(retrier) >= (STOP_BILLING_RETRY_S if name == "StopBilling" else 5 * 60), name
    assert STOP_BILLING_RETRY_S >= 15 * 60


def test_every_task_has_a_timeout_past_its_functions(machine, default):
    """Done when: every Task has TimeoutSeconds."""
    _, asl = machine
    functions = default["TeardownStack"].find_resources("AWS::Lambda::Function")
    longest = max(f["Properties"]["Timeout"] for f in functions.values())
    for name, task in tasks_of(asl).items():
        assert task["TimeoutSeconds"] >= 2 * 60, name
        assert task["TimeoutSeconds"] <= longest + 60, name
    assert asl["States"]["Launch"]["TimeoutSeconds"] == (STEP_TIMEOUT_MINUTES["launch"] + 1) * 60


def test_every_wait_takes_its_seconds_from_the_state_before_it(machine):
    _, asl = machine
    waits = {name: s for name, s in asl["States"].items() if s["Type"] == "Wait"}
    assert set(waits) == {
        "WaitToSettle", "WaitForCapacity", "WaitForResults", "WaitToDelete", "WaitForDelete"
    }  # fmt: skip
    assert all("SecondsPath" in s and "Seconds" not in s for s in waits.values())


@pytest.mark.parametrize(
    "overrides",
    [{}, {"market": "spot"}, {"capacityReservationId": "cr-0123456789abcdef0", "az": "us-east-1a"}],
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


def test_the_cleanup_ends_the_replacements_only_while_the_stack_itself_is_deleted():
    """A Delete in an update's cleanup, or of a rolled-back update's resource, ends nothing."""
    assert cleanup.STACK_DELETED == ("DELETE_IN_PROGRESS", "ROLLBACK_IN_PROGRESS")


def test_the_replacements_resource_is_answered_by_the_cleanup(default):
    [resource] = default["TrainStack"].find_resources(names.REPLACEMENTS_TYPE).values()
    token = json.dumps(resource["Properties"]["ServiceToken"])
    assert "CleanupProviderframeworkonEvent" in token
