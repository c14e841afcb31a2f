"""The run controller's workflow, executed from the synthesized TeardownStack in moto with the
real step code (rehearsal/state_machine.py) and started by the real tick: what each trigger ends
in, and the failures of AWS's ordinary behaviour it must survive."""

import copy
import json

import pytest
from botocore.exceptions import ClientError
from run_controller_fleet import (
    CAP_EVENT,
    RUN,
    ZONES,
    Ec2Answers,
    Fleet,
    alarm_event,
    done_event,
    read_json,
    set_idle_alarm,
    spot_warning_event,
    state_change_event,
    ticks,  # noqa: F401  (a fixture)
)

from controller import act, clients, tick
from rehearsal import state_machine

# ruff: noqa: F811  (ticks is a fixture)

ATTEMPTS, DONE, STATUS, CONTROLLER = (
    f"runs/{RUN}/{name}"
    for name in ("attempts.json", "DONE.json", "status.json", "controller.json")
)


@pytest.fixture
def launches():
    """Every RunInstances request the steps make, as they made it."""
    made = []

    def record(params, **_):
        made.append(copy.deepcopy(params))

    events = clients.client("ec2").meta.events
    events.register("before-parameter-build.ec2.RunInstances", record)
    yield made
    events.unregister("before-parameter-build.ec2.RunInstances", record)


def only(executions: list[dict], part: str) -> dict:
    [found] = [e for e in executions if part in e["name"]]
    return found


def attempt_execution(executions: list[dict]) -> dict:
    [found] = [e for e in executions if e["name"].split("-")[-2].startswith("a")]
    return found


class LambdaThrottled(Exception):
    """What Step Functions names a throttled Lambda invocation: the function never ran."""

    error_type = "Lambda.TooManyRequestsException"


# --- the cases ---------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["tick", "StopFleet"])
def test_a_step_that_fails_once_right_after_the_relaunch_decision_still_relaunches(
    workflow, ticks, monkeypatch, where
):
    """The tick has written `relaunch` into attempts.json and removed DONE.json when it dies
    (bug 1's window), or StopFleet's function fails once: the next tick starts the relaunch, or
    the state is retried, and the fleet comes back."""
    fleet = Fleet()
    Ec2Answers(monkeypatch, fleet)
    fleet.fail("node_lost")
    if where == "tick":
        real = act.DO["delete_done"]

        def then_die(*args):
            real(*args)
            monkeypatch.setitem(act.DO, "delete_done", real)
            raise RuntimeError("Runtime.ExitError")

        monkeypatch.setitem(act.DO, "delete_done", then_die)
        with pytest.raises(RuntimeError):
            tick.handler({})
    else:
        workflow.faults["steps_fleet.stop_fleet"] = [RuntimeError("Runtime.ExitError")]
    ticks.until_quiet()
    [execution] = workflow.executions()
    assert execution["status"] == "SUCCEEDED"
    assert workflow.states(execution)[-1] == "Relaunched"
    assert len(workflow.steps_called("steps_fleet.stop_fleet")) == (
        2 if where == "StopFleet" else 1
    )
    assert [n["state"] for n in fleet.instances()] == ["running", "running"]
    [entry] = read_json(ATTEMPTS)["attempts"]
    assert (entry["attempt"], entry["decision"]) == (1, "relaunch")
    assert read_json(DONE) is None
    assert read_json(STATUS) is None  # the leader's alone: the controller never writes it
    status = read_json(CONTROLLER)
    assert status["execution"] == execution["executionArn"]
    assert (status["phase"], status["attempt"], status["controller_state"]) == (
        "relaunching",
        2,
        "Relaunched",
    )


def test_lambda_throttled_for_two_minutes_after_the_relaunch_decision_still_relaunches(
    workflow, ticks, monkeypatch
):
    """Bug 2: a new account's Lambda concurrency can be 10, and Step Functions reports a
    throttled invocation as Lambda.TooManyRequestsException. Every step of the relaunch is
    throttled for two minutes of its retries: the relaunch still ends Relaunched."""
    fleet = Fleet(zones=ZONES[:1])
    Ec2Answers(monkeypatch, fleet)
    for step in ("steps_fleet.stop_fleet", "steps_fleet.settled", "steps_fleet.launch"):
        workflow.faults[step] = throttled_for(workflow, 120)
    fleet.fail("node_lost")
    ticks.until_quiet()
    [execution] = workflow.executions()
    assert workflow.states(execution)[-1] == "Relaunched"
    assert "StopBilling" not in workflow.states(execution)
    assert [n["state"] for n in fleet.instances()] == ["running", "running"]


class throttled_for(list):
    """Faults that throttle a step until its retries have waited `seconds` (unscaled)."""

    def __init__(self, workflow, seconds: float) -> None:
        super().__init__()
        self.workflow, self.seconds, self.since = workflow, seconds, None

    def __bool__(self) -> bool:
        return True

    def pop(self, _index=0):
        waited = sum(self.workflow.retries)
        self.since = waited if self.since is None else self.since
        return LambdaThrottled("Rate exceeded") if waited - self.since < self.seconds else None


def test_the_idle_alarm_during_a_capacity_wait_does_not_end_the_run(workflow, ticks, monkeypatch):
    """No zone has capacity; the idle alarm fires while the relaunch waits (its nodes publish no
    GPU metric), and the tick runs. The relaunch keeps its documented schedule (the next zone at
    once, then 10, 20, 40 minutes after each round of both zones, 4 rounds) and ends with its
    one-line record; the tick judges no idle fleet while a relaunch runs."""
    fleet = Fleet()
    answers = Ec2Answers(monkeypatch, fleet)
    answers.impaired = dict.fromkeys(fleet.nodes, "system")  # stopped and started: a new host
    answers.full = {zone: "InsufficientInstanceCapacity" for zone in ZONES}
    set_idle_alarm(RUN, "ALARM")
    ticked = []

    def idle_fires(execution, state, seconds):
        if state == "WaitForCapacity":  # the tick runs while the relaunch waits
            ticked.append(tick.handler(alarm_event()))

    workflow.on_wait = idle_fires
    fleet.fail("node_lost")
    ticks.until_quiet()
    attempt = next(e for e in workflow.executions() if e["name"].startswith(f"{RUN}-a1-"))
    assert ticked and {t["phase"] for t in ticked} == {"relaunching"}
    capacity_waits = [s for name, state, s in workflow.waits
                      if name == attempt["name"] and state == "WaitForCapacity"]  # fmt: skip
    assert capacity_waits == [0, 600, 0, 1200, 0, 2400, 0]
    done = read_json(DONE)
    assert (done["status"], done["cause"], done["attempt"], done["written_by"]) == (
        "failed",
        "no_capacity",
        2,
        "controller",
    )
    assert done["reason"] == (
        "no capacity for the fleet in us-east-1a, us-east-1b: InsufficientInstanceCapacity on "
        "each of 8 tries; deploy again later, in another region, or with a capacity reservation"
    )
    assert [(e["attempt"], e["decision"]) for e in read_json(ATTEMPTS)["attempts"]] == [
        (1, "relaunch"),
        (2, "teardown"),
    ]
    assert workflow.states(attempt)[-1] == "GaveUp"
    assert not any("-idle-" in e["name"] for e in workflow.executions())
    assert fleet.stack_status() == "DELETE_COMPLETE"
    assert fleet.billing() == []


def test_a_refused_stop_of_a_pending_node_leaves_no_node_billing_through_the_wait(
    workflow, ticks, monkeypatch
):
    """EC2 refuses to stop a node that has never reached `running`: StopFleet is retried until
    it can stop it, never skipped, so no node bills while the relaunch waits for capacity (the
    node that comes back in place runs until then: its reboot comes once a try went through)."""
    fleet = Fleet(zones=ZONES[:1])
    answers = Ec2Answers(monkeypatch, fleet)
    answers.make_pending(fleet.nodes[1], refusals=2)
    answers.impaired = {fleet.nodes[1]: "instance"}  # once it runs: stopped and started
    answers.full, answers.full_tries = {ZONES[0]: "InsufficientInstanceCapacity"}, 1
    billing_while_waiting = []
    workflow.on_wait = lambda _e, state, _s: billing_while_waiting.append((state, fleet.billing()))
    fleet.fail("node_lost")
    ticks.until_quiet()
    [execution] = workflow.executions()
    assert answers.stops_refused == [fleet.nodes[1], fleet.nodes[1]]
    assert workflow.retries.count(15) == 2  # NodePending: 15 s, until EC2 stops it
    waited = [(state, billing) for state, billing in billing_while_waiting
              if state == "WaitForCapacity"]  # fmt: skip
    assert waited and all(billing == [] for _, billing in waited), billing_while_waiting
    assert workflow.states(execution)[-1] == "Relaunched"
    assert [n["state"] for n in fleet.instances()] == ["running", "running"]


@pytest.mark.parametrize("code", ["InsufficientInstanceCapacity", "UnfulfillableCapacity"])
def test_unfulfillable_capacity_waits_like_insufficient_instance_capacity(
    workflow, ticks, monkeypatch, code
):
    """Spot's "not enough spare capacity" (UnfulfillableCapacity, errors-overview) is a capacity
    answer: the relaunch waits and tries again, it does not give up."""
    fleet = Fleet(spot=True, zones=ZONES[:1])
    answers = Ec2Answers(monkeypatch, fleet)
    answers.full, answers.full_tries = {ZONES[0]: code}, 1
    clients.client("ec2").terminate_instances(InstanceIds=fleet.nodes)  # EC2 reclaimed both
    fleet.fail("interrupted", status="interrupted")
    ticks.until_quiet()
    [execution] = workflow.executions()
    assert workflow.states(execution)[-1] == "Relaunched"
    assert [(state, s) for _, state, s in workflow.waits] == [("WaitForCapacity", 600)]
    assert [e["decision"] for e in read_json(ATTEMPTS)["attempts"]] == ["relaunch"]
    assert read_json(DONE) is None
    nodes = fleet.instances()
    assert [n["node"] for n in nodes] == [0, 1] and not set(fleet.nodes) & {n["id"] for n in nodes}


@pytest.mark.parametrize("trigger", ["done", "spot-warning", "instance-state", "idle", "hard-cap"])
def test_a_duplicate_delivery_of_any_trigger_does_nothing_twice(
    workflow, ticks, monkeypatch, trigger
):
    """EventBridge, Lambda and Scheduler deliver at least once: the same event twice at once,
    and again after everything ran, brings ticks forward and nothing else."""
    fleet = Fleet(spot=trigger in ("spot-warning", "instance-state"), zones=ZONES[:1])
    Ec2Answers(monkeypatch, fleet)
    if trigger == "done":
        fleet.fail("node_lost")
        event = done_event()
    elif trigger in ("spot-warning", "instance-state"):
        clients.client("ec2").terminate_instances(InstanceIds=fleet.nodes)
        event = (spot_warning_event if trigger == "spot-warning" else state_change_event)(
            fleet.nodes[0], *(["terminated"] if trigger == "instance-state" else [])
        )
    elif trigger == "idle":
        set_idle_alarm(RUN, "ALARM")
        ticks.advance(minutes=41)  # past the launch grace
        fleet.beat()
        event = alarm_event()
    else:
        event = CAP_EVENT
        fleet.update_outputs({**fleet.outputs, "HorovodFleetDeadline": "2020-01-01T00:00:00Z"})
    ticks(event)
    ticks(copy.deepcopy(event))
    ticks.advance(minutes=4)  # EC2's events: past the notice for the leader's DONE.json
    ticks.until_quiet()
    ticks(copy.deepcopy(event))
    names = [e["name"] for e in workflow.executions()]
    assert len(names) == len(set(names)) == 1, names
    attempts = (read_json(ATTEMPTS) or {}).get("attempts", [])
    if trigger in ("done", "spot-warning", "instance-state"):
        assert [(e["attempt"], e["decision"]) for e in attempts] == [(1, "relaunch")]
        assert len(workflow.steps_called("steps_fleet.launch")) == 1
        assert len(fleet.billing()) == 2
    else:
        assert attempts == []
        assert len(workflow.steps_called("steps_teardown.delete_stack")) == 1
        assert fleet.stack_status() == "DELETE_COMPLETE"


def test_a_whole_fleet_spot_reclaim_without_done_json_relaunches_from_ec2s_own_event(
    workflow, ticks, monkeypatch, launches
):
    """EC2 reclaims every Spot node, leader included, before any wrote DONE.json (notices are
    best effort). The tick sees the fleet gone, awaits the leader's record for the notice,
    writes the attempt's DONE.json itself, and relaunches every node in one request."""
    fleet = Fleet(spot=True)
    Ec2Answers(monkeypatch, fleet)
    clients.client("ec2").terminate_instances(InstanceIds=fleet.nodes)
    for node in fleet.nodes:
        ticks(state_change_event(node, "terminated"))
    assert read_json(DONE) is None
    ticks.advance(minutes=3)
    ticks.until_quiet()
    [attempt] = workflow.executions()
    assert attempt["status"] == "SUCCEEDED" and workflow.states(attempt)[-1] == "Relaunched"
    [entry] = read_json(ATTEMPTS)["attempts"]
    assert (entry["attempt"], entry["status"], entry["cause"], entry["decision"]) == (
        1,
        "interrupted",
        "interrupted",
        "relaunch",
    )
    assert read_json(DONE) is None  # removed for the next attempt
    nodes = fleet.instances()
    assert [n["node"] for n in nodes] == [0, 1]
    assert all(n["state"] == "running" and not n["cloudformation"] for n in nodes)
    assert [
        (r["LaunchTemplate"]["LaunchTemplateId"], r["MinCount"], r["MaxCount"]) for r in launches
    ] == [(fleet.template, 2, 2)]


def test_a_definition_moto_refuses_is_refused_again_while_a_good_one_is_checked_once(
    workflow, monkeypatch
):
    """validate_once (rehearsal/state_machine.py) keeps moto's CreateStateMachine check: a
    definition that fails it fails every time; the deployed one is checked once."""
    checked = []

    def validate(definition):
        checked.append(definition)
        return moto_check(definition=definition)

    moto_check = state_machine.VALIDATE
    monkeypatch.setattr(state_machine, "VALIDATE", validate)
    role = "arn:aws:iam::123456789012:role/controller"
    bad = json.dumps({"StartAt": "Go", "States": {"Go": {"Type": "NoSuchType", "End": True}}})
    for _ in range(2):
        with pytest.raises(ClientError, match=r"ASLParserException.*NoSuchType"):
            workflow.sfn.create_state_machine(name="bad", definition=bad, roleArn=role)
    deployed = workflow.sfn.describe_state_machine(stateMachineArn=workflow.arn)["definition"]
    workflow.sfn.create_state_machine(name="again", definition=deployed, roleArn=role)
    assert checked == [bad, bad]  # the deployed one was checked when the workflow deployed it
