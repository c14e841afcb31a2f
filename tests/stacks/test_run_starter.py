"""The run controller's starter (what each trigger starts, by which name, or why nothing) and
the idle guard's judgment (steps.judge_idle), against moto."""

import datetime
import re

import clients
import executions
import pytest
import starter
import steps
from moto.cloudwatch.models import cloudwatch_backends
from moto.core import DEFAULT_ACCOUNT_ID
from moto.s3.models import s3_backends
from run_controller_fleet import (
    BUCKET,
    CAP_EVENT,
    RUN,
    ZONES,
    Ec2Answers,
    Fleet,
    alarm_event,
    done_event,
    put_json,
    set_idle_alarm,
    spot_warning_event,
    state_change_event,
)
from test_run_workflow import DONE

# Step Functions' rule for a name: 1 to 80 characters, none of whitespace, < > { } [ ] ? * " #
# % \ ^ | ~ ` $ & , ; : /, nor control characters.
# https://docs.aws.amazon.com/step-functions/latest/apireference/API_StartExecution.html
NAME_RULE = re.compile(r"[^\s<>{}\[\]?*\"#%\\^|~`$&,;:/\x00-\x1f\x7f-\x9f]{1,80}")


def test_every_execution_name_keeps_step_functions_rules_at_the_longest_run_name():
    run, stack = "r" * 40, "arn:aws:cloudformation:us-east-1:123456789012:stack/TrainStack/x"
    names = [
        executions.attempt_name(run, 9999, stack),
        executions.ec2_name(run, 9999, stack, "i-0123456789abcdef0", "terminated"),
        executions.idle_name(run, 9999, stack, "2026-11-22T04:30:00.000+0000"),
        executions.cap_name(run, stack),
        executions.destroy_name(run, stack),
    ]
    assert all(NAME_RULE.fullmatch(name) for name in names), names
    assert [executions.of_run(run, name) for name in names] == [True] * 5
    assert [executions.of_attempt(run, name) for name in names] == [
        True,
        False,
        False,
        False,
        False,
    ]
    # A run whose name begins with another's is not the other's.
    assert not executions.of_run("r", executions.attempt_name("r-a1", 1, stack))


def test_an_instance_of_no_fleet_is_dropped(workflow):
    Fleet(zones=ZONES[:1])
    other = clients.client("ec2").run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1)
    instance = other["Instances"][0]["InstanceId"]
    for event in (state_change_event(instance, "terminated"), spot_warning_event(instance)):
        assert "ignored" in starter.handler(event)
    assert "ignored" in starter.handler(state_change_event("i-0000000000000dead", "terminated"))
    assert workflow.executions() == []


def test_a_fleet_whose_every_node_is_up_gets_nothing_from_a_state_change(workflow, monkeypatch):
    """The controller's own stop and start make such events, late or twice."""
    fleet = Fleet(zones=ZONES[:1])
    decided = starter.handler(state_change_event(fleet.nodes[0], "stopped"))
    assert decided["fleet"] == "whole"
    assert workflow.executions() == []


def test_ec2s_events_defer_to_a_live_attempt(workflow, monkeypatch):
    fleet = Fleet(zones=ZONES[:1])
    answers = Ec2Answers(monkeypatch, fleet)
    answers.full, answers.full_tries = {ZONES[0]: "InsufficientInstanceCapacity"}, 1
    seen = []
    workflow.on_wait = lambda *_: seen.append(
        starter.handler(state_change_event(fleet.nodes[0], "stopped"))
    )
    fleet.fail("node_lost")
    starter.handler(done_event())
    [execution] = workflow.settle()
    assert seen and seen[0]["deferred"] == "instance-state"
    assert seen[0]["to"] == [execution["name"]]


def test_a_done_json_the_controller_wrote_starts_nothing(workflow):
    """Its writer, an execution, handles it."""
    Fleet(zones=ZONES[:1])
    put_json(DONE, {"run": RUN, "status": "failed", "cause": "no_capacity", "attempt": 2,
                    "written_by": "controller"})  # fmt: skip
    assert starter.handler(done_event())["ignored"] == "done"
    assert workflow.executions() == []


@pytest.mark.parametrize(
    "event",
    [
        {"source": "aws.s3", "detail": {"object": {"key": f"runs/{RUN}/logs/DONE.json"}}},
        {"source": "aws.s3", "detail": {"object": {"key": "runs/a/b/DONE.json"}}},
        {"detail-type": "Scheduled Event", "source": "aws.events"},
        {"trigger": "hard-cap"},
        {**alarm_event(), "alarmData": {"alarmName": "x"}},
    ],
)
def test_an_event_of_another_shape_starts_nothing(workflow, event):
    Fleet(zones=ZONES[:1])
    assert "ignored" in starter.handler(event)
    assert workflow.executions() == []


def test_a_trigger_when_no_train_stack_is_deployed_starts_nothing(workflow):
    for event in (CAP_EVENT, alarm_event()):
        assert "ignored" in starter.handler(event)


# --- the idle guard's judgment ---------------------------------------------------------------
# Times count from DEPLOYED, when TrainStack finished its update; moto's own timestamps are set
# to them so the judgment sees one clock.

DEPLOYED = datetime.datetime(2026, 11, 22, 2, 0, tzinfo=datetime.timezone.utc)


def minutes(value: float) -> datetime.datetime:
    return DEPLOYED + datetime.timedelta(minutes=value)


def naive(at: datetime.datetime) -> datetime.datetime:
    return at.astimezone(datetime.timezone.utc).replace(tzinfo=None)


@pytest.fixture
def idle(workflow, monkeypatch):
    """judge(now, alarm_since, checkpoint_at) -> Record's answer for the idle alarm."""
    fleet = Fleet(zones=ZONES[:1])
    from moto.cloudformation.models import cloudformation_backends

    for event in (
        cloudformation_backends[DEFAULT_ACCOUNT_ID]["us-east-1"].stacks[fleet.stack_id].events
    ):
        event.timestamp = naive(DEPLOYED)

    def judge(now: float, since: float | None, checkpoint: float | None = None) -> dict:
        if since is None:
            set_idle_alarm(RUN, "OK")
        else:
            set_idle_alarm(RUN, "ALARM")
            alarms = cloudwatch_backends[DEFAULT_ACCOUNT_ID]["us-east-1"].alarms
            alarms[f"horovod-fleet-idle-{RUN}"].state_updated_timestamp = naive(minutes(since))
        if checkpoint is not None:
            key = f"runs/{RUN}/model/checkpoints/ckpt-3.index"
            clients.client("s3").put_object(Bucket=BUCKET, Key=key, Body=b"i")
            bucket = s3_backends[DEFAULT_ACCOUNT_ID]["global"].buckets[BUCKET]
            bucket.keys[key].last_modified = naive(minutes(checkpoint))
        monkeypatch.setattr(steps, "now", lambda: minutes(now))
        event = {"run": RUN, "attempt": 1, "trigger": "idle",
                 "execution": {"arn": "arn:aws:states:us-east-1:123456789012:execution:x:y"}}  # fmt: skip
        return steps.record(event)

    return judge


def test_an_idle_fleet_that_never_checkpointed_goes_without_waiting_for_results(idle):
    """Hung in NCCL init or rendezvous: no checkpoint will ever come; its logs are in CloudWatch."""
    assert idle(now=41, since=35)["next"] == "delete"


def test_idle_before_the_launch_grace_waits_until_it_has_passed(idle):
    """The nodes get the rendezvous timeout and a start before idle means stuck."""
    answer = idle(now=5, since=-10)
    assert (answer["next"], answer["wait_s"]) == ("wait", 35 * 60)
    assert idle(now=40, since=-10)["next"] == "delete"


@pytest.mark.parametrize(
    ("checkpoint_at", "now", "expected"),
    [
        # Onset at 45 min: quiet since 15. A checkpoint at 30.5 is progress: due at 60.5.
        (30.5, 55, ("wait", 330)),
        (30.5, 61, ("delete", None)),
        (5.5, 46, ("delete", None)),  # a checkpoint from before the quiet 30 minutes
    ],
)
def test_idle_with_a_checkpoint_counts_the_window_from_the_newest_one(
    idle, checkpoint_at, now, expected
):
    answer = idle(now=now, since=45, checkpoint=checkpoint_at)
    assert (answer["next"], answer.get("wait_s")) == expected


def test_an_alarm_no_longer_in_alarm_does_nothing(idle):
    assert idle(now=90, since=None)["next"] == "nothing"
