"""The run controller's teardown, executed from the synthesized workflow in moto: when the fleet
goes, what it waits for, the one stack it may delete, the delete it follows, the hard cap, and
where every failure ends."""

import json
import time

import clients
import pytest
import tick
import train_stack
from moto.cloudformation.exceptions import ValidationError
from moto.cloudformation.models import CloudFormationBackend
from run_controller_fleet import (
    BUCKET,
    CAP_EVENT,
    RUN,
    ZONES,
    Ec2Answers,
    Fleet,
    done_event,
    put_json,
    read_json,
    ticks,  # noqa: F401  (a fixture)
)
from test_run_workflow import ATTEMPTS, CONTROLLER, DONE

# ruff: noqa: F811  (ticks is a fixture)


def finish(fleet: Fleet, **done) -> None:
    put_json(DONE, {"run": RUN, "status": "succeeded", "attempt": 1, **done})


def past_the_cap(fleet: Fleet) -> None:
    """TrainStack's hard cap, passed (its HorovodFleetDeadline output)."""
    fleet.update_outputs({**fleet.outputs, "HorovodFleetDeadline": "2020-01-01T00:00:00Z"})


def only(executions: list[dict]) -> dict:
    [execution] = executions
    return execution


def put_results(checkpoint: bool = True, logs: bool = True) -> None:
    s3 = clients.client("s3")
    if checkpoint:
        s3.put_object(Bucket=BUCKET, Key=f"runs/{RUN}/model/checkpoints/ckpt-3.index", Body=b"i")
    if logs:
        s3.put_object(Bucket=BUCKET, Key=f"runs/{RUN}/logs/node-0.log", Body=b"log")


def test_a_finished_run_with_its_results_deletes_train_stack_and_nothing_else(workflow, ticks):
    fleet = Fleet(zones=ZONES[:1])
    other = clients.client("cloudformation").create_stack(
        StackName="DatasetStack",
        TemplateBody=json.dumps({"Resources": {"T": {"Type": "AWS::SNS::Topic"}}}),
    )["StackId"]
    finish(fleet)
    put_results()
    ticks(done_event())
    ticks.until_quiet()
    execution = only(workflow.executions())
    assert workflow.states(execution)[-1] == "Deleted"
    assert fleet.stack_status() == "DELETE_COMPLETE"
    stacks = clients.client("cloudformation").describe_stacks(StackName=other)["Stacks"]
    assert stacks[0]["StackStatus"] == "CREATE_COMPLETE"
    [entry] = read_json(ATTEMPTS)["attempts"]
    assert (entry["decision"], entry["why"]) == ("teardown", "the run finished")


@pytest.mark.parametrize("present", ["checkpoint", "logs", None])
def test_the_fleet_waits_for_its_results_and_goes_once_they_arrive(workflow, ticks, present):
    fleet = Fleet(zones=ZONES[:1])
    finish(fleet)
    put_results(checkpoint=present == "checkpoint", logs=present == "logs")
    # A checkpoint's data file alone is not a checkpoint: its .index is written last.
    clients.client("s3").put_object(
        Bucket=BUCKET, Key=f"runs/{RUN}/model/checkpoints/ckpt-1.data-0", Body=b""
    )

    def results_arrive(_execution, state, _seconds):
        if state == "WaitForResults":
            put_results()

    workflow.on_wait = results_arrive
    ticks.until_quiet()
    execution = only(workflow.executions())
    assert [(state, s) for _, state, s in workflow.waits] == [("WaitForResults", 600)]
    assert workflow.states(execution).count("ResultsReady") == 2
    assert fleet.stack_status() == "DELETE_COMPLETE"


@pytest.mark.parametrize(
    ("done", "at_once"),
    [
        ({"status": "failed", "cause": "trainer_input"}, True),
        ({"status": "interrupted", "cause": "interrupted"}, True),  # restarts: 0
        ({"status": "succeeded", "benchmark": "synthetic"}, True),  # a benchmark has no checkpoint
        ({"status": "succeeded"}, False),
    ],
)
def test_a_run_that_ended_without_a_checkpoint_needs_only_its_logs(workflow, ticks, done, at_once):
    """A run that died before its first checkpoint must not bill until the hard cap; a finished
    one waits for its checkpoint."""
    fleet = Fleet(zones=ZONES[:1], max_restarts=0)
    put_json(DONE, {"run": RUN, "attempt": 1, **done})
    put_results(checkpoint=False)
    workflow.on_wait = lambda _e, state, _s: state == "WaitForResults" and put_results()
    ticks.until_quiet()
    assert (workflow.waits == []) is at_once
    assert fleet.stack_status() == "DELETE_COMPLETE"


def test_a_done_json_for_another_run_leaves_the_deployed_fleet(workflow, ticks):
    fleet = Fleet(zones=ZONES[:1])
    put_json("runs/old-run/DONE.json", {"run": "old-run", "status": "succeeded", "attempt": 1})
    assert ticks(done_event("old-run"))["actions"] == []
    assert workflow.executions() == []
    assert fleet.stack_status() == "UPDATE_COMPLETE"


@pytest.mark.parametrize("name", ["DatasetStack", "TeardownStack", "PreprocessStack", "Other"])
def test_the_controller_refuses_to_delete_any_other_stack(workflow, name):
    stack = {"id": f"arn:aws:cloudformation:us-east-1:123456789012:stack/{name}/x", "name": name}
    with pytest.raises(train_stack.RefusedStack):
        train_stack.delete(stack)


def test_the_hard_cap_deletes_without_its_results_and_ends_a_relaunch_that_waits(
    workflow, ticks, monkeypatch
):
    """The cap reads nothing first, and the relaunch waiting for capacity is stopped: it would
    start nodes in a stack being deleted."""
    fleet = Fleet(zones=ZONES[:1])
    answers = Ec2Answers(monkeypatch, fleet)
    answers.impaired = dict.fromkeys(fleet.nodes, "system")  # stopped and started: a new host
    answers.full = {ZONES[0]: "InsufficientInstanceCapacity"}
    capped = []

    def cap_while_waiting(execution, state, _seconds):
        if state == "WaitForCapacity" and not capped:
            past_the_cap(fleet)
            capped.append(tick.handler(CAP_EVENT))
            # On AWS this wait lasts ten minutes and the cap acts in seconds: hold the scaled
            # wait until the cap's execution has ended (this one is stopped by then), so a
            # loaded machine cannot end the wait first. moto marks this execution stopped only
            # once its thread leaves this callback: waiting for that would last the 30 s.
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and any(
                "-cap-" in e["name"] for e in workflow.running()
            ):
                time.sleep(0.05)

    workflow.on_wait = cap_while_waiting
    fleet.fail("node_lost")
    ticks.until_quiet()
    executions = workflow.executions()
    statuses = {e["name"].split("-")[2]: e["status"] for e in executions}
    assert statuses == {"a1": "ABORTED", "cap": "SUCCEEDED"}
    assert capped[0]["actions"] == ["stop_executions", "start"]
    cap = next(e for e in executions if "-cap-" in e["name"])
    assert "ResultsReady" not in workflow.states(cap)
    assert fleet.stack_status() == "DELETE_COMPLETE"


def test_a_stack_being_updated_is_deleted_once_the_update_is_over(workflow, ticks, monkeypatch):
    """CloudFormation refuses a delete while an update runs; the cap asks again a minute later
    until it takes it."""
    fleet = Fleet(zones=ZONES[:1])
    past_the_cap(fleet)
    fleet.set_stack_status("UPDATE_IN_PROGRESS")
    real = CloudFormationBackend.delete_stack

    def refused_while_updating(backend, name_or_stack_id):
        stack = backend.get_stack(name_or_stack_id)
        if stack.status == "UPDATE_IN_PROGRESS":
            raise ValidationError(
                name_or_stack_id, "is in UPDATE_IN_PROGRESS state and can not be deleted"
            )
        return real(backend, name_or_stack_id)

    monkeypatch.setattr(CloudFormationBackend, "delete_stack", refused_while_updating)

    def update_done(_execution, state, _seconds):
        if state == "WaitToDelete":
            fleet.set_stack_status("UPDATE_COMPLETE")

    workflow.on_wait = update_done
    ticks(CAP_EVENT)
    execution = only(workflow.executions())
    assert [(state, s) for _, state, s in workflow.waits if state == "WaitToDelete"] == [
        ("WaitToDelete", 60)
    ]
    assert workflow.states(execution)[-1] == "Deleted"


def fail_deletes(monkeypatch, times: int) -> list[str]:
    """moto's DeleteStack ends the way a stuck network interface makes it end: DELETE_FAILED."""
    calls = []
    real = CloudFormationBackend.delete_stack

    def delete_stack(backend, name_or_stack_id):
        calls.append(name_or_stack_id)
        if len(calls) > times:
            return real(backend, name_or_stack_id)
        for stack in backend.stacks.values():
            if name_or_stack_id in (stack.name, stack.stack_id):
                stack.status = "DELETE_FAILED"
                stack.status_reason = "The following resource(s) failed to delete: [Subnet]."

    monkeypatch.setattr(CloudFormationBackend, "delete_stack", delete_stack)
    return calls


def test_a_failed_delete_terminates_the_stacks_instances_and_deletes_again(
    workflow, ticks, monkeypatch
):
    fleet = Fleet(zones=ZONES[:1])
    bystander = clients.client("ec2").run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1)
    calls = fail_deletes(monkeypatch, times=1)
    past_the_cap(fleet)
    ticks(CAP_EVENT)
    execution = only(workflow.executions())
    assert calls == [fleet.stack_id, fleet.stack_id]
    assert fleet.billing() == []
    instance = bystander["Instances"][0]["InstanceId"]
    [reservation] = clients.client("ec2").describe_instances(InstanceIds=[instance])["Reservations"]
    assert reservation["Instances"][0]["State"]["Name"] == "running"
    assert workflow.states(execution)[-1] == "Deleted"


def test_following_a_delete_ends_after_three_hours_in_a_failed_execution(
    workflow, ticks, monkeypatch
):
    """Then the execution fails, and its alarm mails."""
    fleet = Fleet(zones=ZONES[:1])
    fail_deletes(monkeypatch, times=100)
    past_the_cap(fleet)
    ticks(CAP_EVENT)
    execution = only(workflow.executions())
    assert execution["status"] == "FAILED"
    assert workflow.states(execution)[-1] == "DeleteUnconfirmed"
    follows = [s for _, state, s in workflow.waits if state == "WaitForDelete"]
    assert sum(follows) == 3 * 3600 - 600
    assert fleet.billing() == []


def test_a_step_that_keeps_failing_stops_the_billing_and_records_why(workflow, ticks, monkeypatch):
    """Every state's Catch ends in StopBilling: the nodes stop, attempts.json and
    controller.json say the controller failed and why, and the execution fails (its alarm mails)."""
    fleet = Fleet(zones=ZONES[:1])
    Ec2Answers(monkeypatch, fleet)
    workflow.faults["steps_fleet.launch"] = [RuntimeError("the launch broke")] * 3
    fleet.fail("node_lost")
    ticks()
    execution = only(workflow.executions())
    assert execution["status"] == "FAILED"
    assert workflow.states(execution)[-2:] == ["StopBilling", "ControllerFailed"]
    assert fleet.billing() == []
    [failure] = read_json(ATTEMPTS)["controller_failures"]
    assert (failure["execution"], failure["error"], failure["cause"]) == (
        execution["executionArn"],
        "RuntimeError",
        "the launch broke",
    )
    status = read_json(CONTROLLER)
    assert status["controller_state"] == "Failed"
    assert status["reason"].startswith("the run controller failed (RuntimeError: the launch broke)")


def test_the_run_is_mailed_when_its_fleet_goes(workflow, ticks, monkeypatch):
    topic = clients.client("sns").create_topic(Name=f"horovod-fleet-notify-{RUN}")["TopicArn"]
    fleet = Fleet(zones=ZONES[:1])
    outputs = {
        o["OutputKey"]: o["OutputValue"]
        for o in clients.client("cloudformation").describe_stacks(StackName="TrainStack")["Stacks"][
            0
        ]["Outputs"]
    }
    fleet.update_outputs(
        {**outputs, "NotifyTopic": topic, "HorovodFleetDeadline": "2020-01-01T00:00:00Z"}
    )
    published = []
    monkeypatch.setattr(clients.client("sns"), "publish", lambda **kw: published.append(kw))
    ticks(CAP_EVENT)
    ticks.until_quiet()
    [mail] = published
    assert mail["TopicArn"] == topic
    assert mail["Subject"] == f"horovod-fleet: run {RUN} stopped by its guard"
    assert "hard cap" in mail["Message"] and f"runs/{RUN}/" in mail["Message"]
