"""The run controller's workflow, executed from the synthesized TeardownStack in moto with the
real step code (rehearsal/state_machine.py): what each trigger ends in, and the failures of
AWS's ordinary behaviour it must survive."""

import copy

import clients
import ec2_fleet
import pytest
import starter
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
)

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


def throttled_once(monkeypatch, module, name: str, operation: str) -> list:
    """`module.name` answers RequestLimitExceeded on its first call, as EC2 does when throttled."""
    real, calls = getattr(module, name), []

    def once(*args, **kwargs):
        calls.append(args)
        if len(calls) == 1:
            error = {"Code": "RequestLimitExceeded", "Message": "Request limit exceeded."}
            raise ClientError({"Error": error}, operation)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, once)
    return calls


# --- the cases ---------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["Record", "StopFleet"])
def test_a_step_that_fails_once_right_after_the_relaunch_decision_still_relaunches(
    workflow, monkeypatch, where
):
    """Record has written `relaunch` into attempts.json and removed DONE.json when EC2 throttles
    its next call (bug 1's window), or StopFleet's function fails once: the state is retried and
    finds the attempt recorded, and the fleet comes back."""
    fleet = Fleet()
    Ec2Answers(monkeypatch, fleet)
    fleet.fail("node_lost")
    if where == "Record":
        throttled_once(monkeypatch, ec2_fleet, "nodes", "DescribeInstances")
    else:
        workflow.faults["steps_fleet.stop_fleet"] = [RuntimeError("Runtime.ExitError")]
    starter.handler(done_event())
    [execution] = workflow.settle()
    assert execution["status"] == "SUCCEEDED"
    states = workflow.states(execution)
    assert states[-1] == "Relaunched"
    assert (
        len(
            workflow.steps_called(
                f"steps{'_fleet' if where != 'Record' else ''}."
                f"{'stop_fleet' if where != 'Record' else 'record'}"
            )
        )
        == 2
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


def test_the_idle_alarm_during_a_capacity_wait_does_not_end_the_run(workflow, monkeypatch):
    """No zone has capacity; the idle alarm fires while the relaunch waits (its nodes publish no
    GPU metric). The relaunch keeps its documented schedule (the next zone at once, then 10,
    20, 40 minutes after each round of both zones, 4 rounds) and ends with its one-line record;
    the idle guard waits for it and deletes nothing."""
    fleet = Fleet()
    answers = Ec2Answers(monkeypatch, fleet)
    answers.full = {zone: "InsufficientInstanceCapacity" for zone in ZONES}
    set_idle_alarm(RUN, "ALARM")
    fired = []

    def idle_fires(execution, state, seconds):
        if state == "WaitForCapacity" and not fired:
            fired.append(starter.handler(alarm_event()))

    workflow.on_wait = idle_fires
    fleet.fail("node_lost")
    starter.handler(done_event())
    executions = workflow.settle()
    attempt, idle = attempt_execution(executions), only(executions, "-idle-")
    assert fired and fired[0]["started"]
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
    # The relaunch's own teardown deleted the fleet; the idle guard only waited.
    assert "DeleteStack" in workflow.states(attempt)
    assert "DeleteStack" not in workflow.states(idle)
    idle_records = [e for e in workflow.steps_called("steps.record") if e["trigger"] == "idle"]
    assert len(idle_records) > 1 and idle_records[1]["record"]["deferred_to"] == [attempt["name"]]
    assert fleet.stack_status() == "DELETE_COMPLETE"
    assert fleet.billing() == []


def test_a_refused_stop_of_a_pending_node_leaves_no_node_billing_through_the_wait(
    workflow, monkeypatch
):
    """EC2 refuses to stop a node that has never reached `running`: StopFleet is retried until
    it can stop it, never skipped, so no node bills while the relaunch waits for capacity."""
    fleet = Fleet(zones=ZONES[:1])
    answers = Ec2Answers(monkeypatch, fleet)
    answers.make_pending(fleet.nodes[1], refusals=2)
    answers.full, answers.full_tries = {ZONES[0]: "InsufficientInstanceCapacity"}, 1
    billing_while_waiting = []
    workflow.on_wait = lambda _e, state, _s: billing_while_waiting.append((state, fleet.billing()))
    fleet.fail("node_lost")
    starter.handler(done_event())
    [execution] = workflow.settle()
    assert answers.stops_refused == [fleet.nodes[1], fleet.nodes[1]]
    assert workflow.retries.count(15) == 2  # NodePending: 15 s, until EC2 stops it
    waited = [state for state, _ in billing_while_waiting]
    assert "WaitForCapacity" in waited
    assert all(billing == [] for _, billing in billing_while_waiting), billing_while_waiting
    assert workflow.states(execution)[-1] == "Relaunched"
    assert [n["state"] for n in fleet.instances()] == ["running", "running"]


@pytest.mark.parametrize("code", ["InsufficientInstanceCapacity", "UnfulfillableCapacity"])
def test_unfulfillable_capacity_waits_like_insufficient_instance_capacity(
    workflow, monkeypatch, code
):
    """Spot's "not enough spare capacity" (UnfulfillableCapacity, errors-overview) is a capacity
    answer: the relaunch waits and tries again, it does not give up."""
    fleet = Fleet(spot=True, zones=ZONES[:1])
    answers = Ec2Answers(monkeypatch, fleet)
    answers.full, answers.full_tries = {ZONES[0]: code}, 1
    fleet.fail("interrupted", status="interrupted")
    starter.handler(done_event())
    [execution] = workflow.settle()
    assert workflow.states(execution)[-1] == "Relaunched"
    assert [(state, s) for _, state, s in workflow.waits] == [("WaitForCapacity", 600)]
    assert [e["decision"] for e in read_json(ATTEMPTS)["attempts"]] == ["relaunch"]
    assert read_json(DONE) is None
    nodes = fleet.instances()
    assert [n["node"] for n in nodes] == [0, 1] and not set(fleet.nodes) & {n["id"] for n in nodes}


def deliver(workflow, event: dict) -> set[str]:
    """The same event twice at once, and again once everything has run (EventBridge, Lambda and
    Scheduler deliver at least once): the names of the executions the deliveries started or
    found."""
    decided = [starter.handler(event), starter.handler(copy.deepcopy(event))]
    workflow.settle()
    decided.append(starter.handler(copy.deepcopy(event)))
    workflow.settle()
    return {d["execution"] for d in decided if "execution" in d}


@pytest.mark.parametrize("trigger", ["done", "spot-warning", "instance-state", "idle", "hard-cap"])
def test_a_duplicate_delivery_of_any_trigger_does_nothing_twice(workflow, monkeypatch, trigger):
    fleet = Fleet(spot=trigger in ("spot-warning", "instance-state"), zones=ZONES[:1])
    Ec2Answers(monkeypatch, fleet)
    reclaim = lambda: clients.client("ec2").terminate_instances(InstanceIds=fleet.nodes)  # noqa: E731
    if trigger == "done":
        fleet.fail("node_lost")
        event = done_event()
    elif trigger == "spot-warning":
        event = spot_warning_event(fleet.nodes[0])
        # EC2 reclaims the nodes two minutes after its notice, while the controller waits.
        workflow.on_wait = lambda _e, state, _s: state == "WaitToRecord" and reclaim()
    elif trigger == "instance-state":
        reclaim()
        event = state_change_event(fleet.nodes[0], "terminated")
    elif trigger == "idle":
        set_idle_alarm(RUN, "ALARM")
        monkeypatch.setenv("LAUNCH_GRACE_MINUTES", "0")
        monkeypatch.setenv("IDLE_MINUTES", "0")
        event = alarm_event()
    else:
        event = CAP_EVENT
    names = deliver(workflow, event)
    assert len(names) == 1
    executions = workflow.executions()
    assert len([e for e in executions if e["name"] in names]) == 1
    attempts = (read_json(ATTEMPTS) or {}).get("attempts", [])
    if trigger in ("done", "spot-warning", "instance-state"):
        assert [(e["attempt"], e["decision"]) for e in attempts] == [(1, "relaunch")]
        assert len([e for e in executions if e["name"].startswith(f"{RUN}-a1-")]) == (
            1 if trigger == "done" else 2  # the event's and the attempt's
        )
        assert len(workflow.steps_called("steps_fleet.launch")) == 1
        assert len(fleet.billing()) == 2
    else:
        assert attempts == []
        assert len(workflow.steps_called("steps_teardown.delete_stack")) == 1
        assert fleet.stack_status() == "DELETE_COMPLETE"


def test_a_whole_fleet_spot_reclaim_without_done_json_relaunches_from_ec2s_own_event(
    workflow, monkeypatch, launches
):
    """EC2 reclaims every Spot node, leader included, before any wrote DONE.json (notices are
    best effort). Its own state-change events start the controller: it waits for the notice,
    writes the attempt's DONE.json itself, and relaunches every node in one request."""
    fleet = Fleet(spot=True)
    Ec2Answers(monkeypatch, fleet)
    clients.client("ec2").terminate_instances(InstanceIds=fleet.nodes)
    for node in fleet.nodes:
        starter.handler(state_change_event(node, "terminated"))
    executions = workflow.settle()
    attempt = attempt_execution(executions)
    assert attempt["status"] == "SUCCEEDED" and workflow.states(attempt)[-1] == "Relaunched"
    assert len([e for e in executions if "-ec2-" in e["name"]]) == 2
    assert ("WaitToRecord", 180) in [(state, s) for _, state, s in workflow.waits]
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
