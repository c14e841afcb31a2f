"""The run controller's tick against moto, with the synthesized workflow and the real step code:
the issue's failures, each reproduced as the world the tick reads, minute by minute. An event
only brings a tick forward (`ticks(event)`); the schedule's ticks are `ticks()`."""

import datetime
import re

import pytest
from botocore.exceptions import ClientError
from run_controller_fleet import (
    CAP_EVENT,
    RUN,
    ZONES,
    Ec2Answers,
    Fleet,
    RefusedReads,
    alarm_event,
    done_event,
    put_json,
    read_json,
    set_idle_alarm,
    spot_warning_event,
    state_change_event,
    ticks,  # noqa: F401  (a fixture)
)

from controller import clients, executions

# ruff: noqa: F811  (ticks is a fixture)

ATTEMPTS, DONE, CONTROLLER = (
    f"runs/{RUN}/{n}" for n in ("attempts.json", "DONE.json", "controller.json")
)


def cap_schedule(at: str) -> None:
    """The run's hard-cap schedule as RunGuard makes it (its name, its at()), which the tick
    reads while the stack has no outputs."""
    clients.client("scheduler").create_schedule(
        Name=f"horovod-fleet-cap-{RUN}",
        ScheduleExpression=f"at({at})",
        FlexibleTimeWindow={"Mode": "OFF"},
        Target={
            "Arn": "arn:aws:lambda:us-east-1:123456789012:function:Tick",
            "RoleArn": "arn:aws:iam::123456789012:role/cap",
        },
    )


def attempts() -> list[tuple[int, str]]:
    return [(e["attempt"], e["decision"]) for e in (read_json(ATTEMPTS) or {}).get("attempts", [])]


# --- bug 1: the alarm and the cap during a create ------------------------------------------------


def test_the_idle_alarm_that_fired_during_the_create_ends_a_fleet_that_never_trains(ticks):
    """The alarm treats missing data as breaching: it enters ALARM while TrainStack is created,
    and CloudWatch acts on a transition once. The tick reads its state every minute, so the
    fleet that never trains (its nodes alive, beating, hung before the first step) goes after
    its launch grace (40 minutes), not at the cap."""
    fleet = Fleet(zones=ZONES[:1], creating=True)
    set_idle_alarm(RUN, "ALARM")
    ticks(alarm_event())  # the alarm's one action, during the create
    assert fleet.stack_status() == "CREATE_IN_PROGRESS"
    ticks.minutes(10, fleet, every=5)
    fleet.created()
    ticks.minutes(35, fleet, every=5)
    assert fleet.stack_status() == "CREATE_COMPLETE"  # within its launch grace
    ticks.minutes(10, fleet, every=5)
    assert fleet.stack_status() == "DELETE_COMPLETE"
    assert fleet.billing() == []


def test_the_hard_cap_that_fires_during_a_slow_create_deletes_the_stack(ticks):
    """The cap's schedule fires while TrainStack is still created (no outputs: no run there for
    an event to match): the tick reads the cap's time from that schedule and deletes."""
    fleet = Fleet(zones=ZONES[:1], creating=True)
    deadline = ticks.now() + datetime.timedelta(minutes=30)
    cap_schedule(deadline.strftime("%Y-%m-%dT%H:%M:%S"))
    ticks.minutes(29, fleet, every=29)
    assert fleet.stack_status() == "CREATE_IN_PROGRESS"
    ticks.advance(minutes=1)
    ticks(CAP_EVENT)
    ticks.until_quiet()
    assert fleet.stack_status() == "DELETE_COMPLETE"


# --- the guards act whatever else fails (issue 47) ----------------------------------------------


def past_the_cap(fleet: Fleet, ticks) -> dict:
    ticks.advance(hours=1, minutes=1)
    return CAP_EVENT


def idle_past_its_window(fleet: Fleet, ticks) -> dict:
    """The alarm in ALARM since the deploy; 45 minutes on, past the launch grace (40) and the
    idle window (30). The newest checkpoint's time is unreadable: the alarm is judged alone."""
    set_idle_alarm(RUN, "ALARM")
    ticks.advance(minutes=45)
    return alarm_event()


def cdk_destroy_failed(fleet: Fleet, ticks) -> dict:
    """cdk destroy ended DELETE_FAILED (an interface held it up): the tick follows it."""
    fleet.set_stack_status("DELETE_FAILED")
    return {"trigger": "schedule"}


@pytest.mark.parametrize("guard", [past_the_cap, idle_past_its_window, cdk_destroy_failed])
def test_the_guards_delete_train_stack_while_s3_refuses_every_read_of_the_run(ticks, guard):
    """Bug 5's "one unreadable record disables the hard cap": with every read of runs/<run>/
    refused (403), each guard is decided and acted on from CloudFormation, EC2, Step Functions
    and CloudWatch, before any record is read; the tick still fails with the refusal (its
    error alarm), and once the stack is gone nothing of the fleet bills (its orphans go)."""
    fleet = Fleet(zones=ZONES[:1], hours=1)
    ticks.minutes(2, fleet)
    event = guard(fleet, ticks)
    with RefusedReads() as refused:
        with pytest.raises(ClientError, match="AccessDenied"):
            ticks(event)
        ticks.workflow.settle()
        assert refused.refused  # the tick did read the records, and was refused
        assert fleet.stack_status() == "DELETE_COMPLETE"
        ticks.advance(minutes=6)  # past the orphan timeout: no stack, so nothing of S3 is read
        assert ticks()["actions"] in ([], ["terminate"])
    assert fleet.billing() == []


# --- bug 3: a stale DONE.json during an EC2 event -----------------------------------------------


def test_a_stale_done_json_during_an_ec2_event_does_not_take_the_next_attempts_record(
    ticks, monkeypatch
):
    """Attempt 1 was relaunched; the old leader's shutdown wrote attempt 1's DONE.json again.
    Then EC2 reclaims a node of attempt 2, and attempt 2's leader writes its own DONE.json: that
    one is recorded and relaunched, not answered with attempt 1's record under attempt 2's name."""
    fleet = Fleet(spot=True, zones=ZONES[:1])
    Ec2Answers(monkeypatch, fleet)
    fleet.fail("interrupted", status="interrupted")
    ticks.until_quiet()
    assert attempts() == [(1, "relaunch")]
    fleet.fail("interrupted", status="interrupted")  # the old leader's late record, attempt 1
    reclaimed = fleet.instances()[1]["id"]
    clients.client("ec2").terminate_instances(InstanceIds=[reclaimed])
    ticks(state_change_event(reclaimed, "terminated"))
    ticks.advance(minutes=4)
    ticks(state_change_event(reclaimed, "terminated"))
    leader = {"run": RUN, "status": "interrupted", "cause": "interrupted", "attempt": 2,
              "reason": "Spot interruption of node 1"}  # fmt: skip
    put_json(DONE, leader)
    ticks(done_event())
    ticks.until_quiet()
    assert attempts() == [(1, "relaunch"), (2, "relaunch")]
    assert [n["state"] for n in fleet.instances()] == ["running", "running"]


# --- bug 5: the controller's own stops --------------------------------------------------------------


def test_stop_billings_own_stops_are_never_recorded_as_faults(ticks, workflow, monkeypatch):
    """The relaunch keeps failing: StopBilling stops the nodes each time, EC2 says so. No EC2
    event becomes an attempt of its own: the tick resumes the relaunch twice, then gives it up,
    keeps nothing billing and records why, once."""
    fleet = Fleet(zones=ZONES[:1])
    Ec2Answers(monkeypatch, fleet)
    workflow.faults["steps_fleet.launch"] = [RuntimeError("the launch broke")] * 9
    fleet.fail("node_lost")
    for _ in range(6):
        decision = ticks()
        for node in fleet.nodes:
            ticks(state_change_event(node, "stopped"))
    assert decision["phase"] == "controller_failed"
    assert attempts() == [(1, "relaunch")]
    assert fleet.billing() == []
    failures = read_json(ATTEMPTS)["controller_failures"]
    assert [f.get("final", False) for f in failures] == [False, False, False, True]
    assert len(workflow.steps_called("steps_fleet.launch")) == 9
    assert read_json(CONTROLLER)["phase"] == "controller_failed"


# --- bug 6: events during an update --------------------------------------------------------------


def test_a_spot_reclaim_during_an_update_is_relaunched_once_the_update_is_over(ticks, monkeypatch):
    fleet = Fleet(spot=True, zones=ZONES[:1])
    Ec2Answers(monkeypatch, fleet)
    fleet.set_stack_status("UPDATE_IN_PROGRESS")  # cdk deploy -c maxRestarts=5
    clients.client("ec2").terminate_instances(InstanceIds=fleet.nodes)
    for node in fleet.nodes:
        ticks(spot_warning_event(node))
        ticks(state_change_event(node, "terminated"))
    assert read_json(DONE) is None and attempts() == []
    fleet.set_stack_status("UPDATE_COMPLETE")
    ticks()  # EC2 ended the nodes: the leader's record is awaited for the notice
    ticks.advance(minutes=4)
    ticks.until_quiet()
    assert attempts() == [(1, "relaunch")]
    assert [n["node"] for n in fleet.instances()] == [0, 1]
    assert all(n["state"] == "running" for n in fleet.instances())


# --- orphans -------------------------------------------------------------------------------------


def test_an_orphaned_instance_of_the_stack_that_no_record_knows_is_ended_after_the_timeout(ticks):
    """cdk destroy raced a launch: an instance of the fleet outlives its stack. Nothing claims
    it; after clustermgtd's 300 s it is terminated. A bystander instance is never touched."""
    fleet = Fleet(zones=ZONES[:1])
    orphan = clients.client("ec2").run_instances(
        LaunchTemplate={"LaunchTemplateId": fleet.template}, MinCount=1, MaxCount=1
    )["Instances"][0]["InstanceId"]
    bystander = clients.client("ec2").run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1)
    fleet.set_stack_status("DELETE_COMPLETE")
    ticks.advance(seconds=290)
    assert ticks()["actions"] == []
    ticks.advance(seconds=20)
    assert ticks()["actions"] == ["terminate"]
    state = clients.client("ec2").describe_instances(
        InstanceIds=[orphan, bystander["Instances"][0]["InstanceId"]]
    )
    states = [i["State"]["Name"] for r in state["Reservations"] for i in r["Instances"]]
    assert sorted(states) == ["running", "terminated"]


# --- whole-fleet silence ---------------------------------------------------------------------------


def test_a_whole_fleet_gone_silent_is_relaunched(ticks, monkeypatch):
    """Every node's heartbeat stops (a network event, a wedged image), every instance runs, no
    DONE.json: the tick writes the attempt's record, naming the silent nodes, and relaunches."""
    fleet = Fleet(zones=ZONES[:1])
    Ec2Answers(monkeypatch, fleet)
    ticks.minutes(5, fleet)
    ticks.minutes(2)  # silent since
    assert attempts() == []
    ticks.minutes(1)
    ticks.until_quiet()
    [entry] = read_json(ATTEMPTS)["attempts"]
    assert (entry["cause"], entry["decision"]) == ("node_lost", "relaunch")
    assert entry["reason"].startswith("node 0, node 1 silent: no heartbeat for more than 120 s")


# --- the tick itself -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "event",
    [
        {"source": "aws.s3", "detail": {"object": {"key": f"runs/{RUN}/logs/DONE.json"}}},
        {"detail-type": "Scheduled Event", "source": "aws.events"},
        {"trigger": "hard-cap", "run": "another-run"},
        {**alarm_event(), "alarmData": {"alarmName": "x"}},
        "not even a document",
    ],
)
def test_an_events_content_is_never_trusted(ticks, event):
    """Whatever invoked it, the tick reads the world: a fleet training is left alone."""
    fleet = Fleet(zones=ZONES[:1])
    ticks.advance(minutes=1)
    fleet.beat()
    assert ticks(event)["phase"] == "training"
    assert ticks.workflow.executions() == []


def test_with_no_train_stack_the_tick_reads_two_things_and_ends(ticks):
    calls = []

    def count(model, **_):
        calls.append(model.name)

    services = ("cloudformation", "ec2", "s3", "stepfunctions", "cloudwatch", "scheduler")
    for service in services:
        clients.client(service).meta.events.register("before-call.*.*", count)
    try:
        assert ticks() == {"phase": "none", "why": "no TrainStack", "actions": []}
    finally:
        for service in services:
            clients.client(service).meta.events.unregister("before-call.*.*", count)
    assert calls == ["DescribeStacks", "DescribeInstances"]


# Step Functions' rule for a name: 1 to 80 characters, none of whitespace, < > { } [ ] ? * " #
# % \ ^ | ~ ` $ & , ; : /, nor control characters.
# https://docs.aws.amazon.com/step-functions/latest/apireference/API_StartExecution.html
NAME_RULE = re.compile(r"[^\s<>{}\[\]?*\"#%\\^|~`$&,;:/\x00-\x1f\x7f-\x9f]{1,80}")


def test_every_execution_name_keeps_step_functions_rules_at_the_longest_run_name():
    run, stack = "r" * 40, "arn:aws:cloudformation:us-east-1:123456789012:stack/TrainStack/x"
    kinds = ["a9999", "cap", "idle", "destroy"]
    names = [executions.name(run, kind, stack, resume) for kind in kinds for resume in (0, 9)]
    assert all(NAME_RULE.fullmatch(name) for name in names), names
    assert [executions.parse(run, stack, name) for name in names] == [
        (kind, resume) for kind in kinds for resume in (0, 9)
    ]
    # A run whose name begins with another's is not the other's; another stack's is not this one's.
    assert executions.parse("r", stack, executions.name("r-a1", "cap", stack)) is None
    assert executions.parse(run, stack, executions.name(run, "cap", stack + "y")) is None
