"""The reaper Lambda against moto: what it deletes, stops, snapshots, waits for, refuses and
relaunches (the run controller's decisions played on EC2)."""

import datetime
import json
import urllib.request

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws
from moto.cloudformation.models import CloudFormationBackend, cloudformation_backends
from moto.cloudwatch.models import cloudwatch_backends
from moto.core import DEFAULT_ACCOUNT_ID
from moto.s3.models import s3_backends

from stacks.teardown.reaper import handler as reaper_module
from stacks.teardown.reaper.handler import Reaper, RefusedStack, deadline, parse_event, recheck_time

REGION = "us-east-1"
BUCKET = "horovod-fleet-dataset"
RUN = "resnet50-r1"
NOW = datetime.datetime(2026, 11, 22, 4, 33, 20, tzinfo=datetime.timezone.utc)
FUNCTION_ARN = f"arn:aws:lambda:{REGION}:123456789012:function:Reaper"
ENV = {
    "BUCKET": BUCKET,
    "RUN_OUTPUT_KEY": "HorovodFleetRun",
    "PREPROCESS_PARAMETER": "/horovod-fleet/preprocess",
    "IDLE_ALARM_PREFIX": "horovod-fleet-idle-",
    "RECHECK_PREFIX": "horovod-fleet-recheck-",
    "RECHECK_MINUTES": "10",
    "RECHECK_ROLE_ARN": "arn:aws:iam::123456789012:role/RecheckRole",
    "DEAD_LETTER_ARN": f"arn:aws:sqs:{REGION}:123456789012:ReaperDeadLetters",
    "MANIFEST_KEY": "tfrecords/manifest.json",
    "IDLE_MINUTES": "30",
    "LAUNCH_GRACE_MINUTES": "40",
}


# One session for every reaper a test makes: a new session loads every service model again
# (about 0.1 s a client), and moto's mock serves any client, whenever it was made.
SESSION = boto3.session.Session(region_name=REGION)


def stack_template(run: str | None) -> str:
    template = {"Resources": {"Handle": {"Type": "AWS::SNS::Topic"}}}
    if run is not None:
        template["Outputs"] = {"HorovodFleetRun": {"Value": run}}
    return json.dumps(template)


def s3_event(key: str, etag: str = "abc123") -> dict:
    """EventBridge "Object Created" event as S3 sends it with EventBridge notifications on."""
    return {
        "version": "0",
        "id": "17793124-05d4-b198-2fde-7ededc63b103",
        "detail-type": "Object Created",
        "source": "aws.s3",
        "account": "123456789012",
        "time": "2026-11-22T04:30:00Z",
        "region": REGION,
        "resources": [f"arn:aws:s3:::{BUCKET}"],
        "detail": {
            "version": "0",
            "bucket": {"name": BUCKET},
            "object": {"key": key, "size": 512, "etag": etag, "sequencer": "00617F08299329D189"},
            "request-id": "N4N7GDK58NMKJ12R",
            "requester": "123456789012",
            "source-ip-address": "10.0.0.5",
            "reason": "PutObject",
        },
    }


def alarm_event(run: str) -> dict:
    """CloudWatch alarm Lambda-action event (metric alarm)."""
    name = f"horovod-fleet-idle-{run}"
    return {
        "source": "aws.cloudwatch",
        "alarmArn": f"arn:aws:cloudwatch:{REGION}:123456789012:alarm:{name}",
        "accountId": "123456789012",
        "time": "2026-11-22T04:30:00.000+0000",
        "region": REGION,
        "alarmData": {
            "alarmName": name,
            "state": {"value": "ALARM", "reason": "Threshold Crossed", "timestamp": "2026-11-22"},
            "previousState": {"value": "OK", "reason": "", "timestamp": "2026-11-22"},
            "configuration": {
                "description": "idle",
                "metrics": [
                    {
                        "id": "m1",
                        "metricStat": {
                            "metric": {
                                "namespace": "HorovodFleet",
                                "name": "nvidia_smi_utilization_gpu",
                                "dimensions": {"Run": run},
                            },
                            "period": 300,
                            "stat": "Average",
                        },
                        "returnData": True,
                    }
                ],
            },
        },
    }


def decisions(capsys) -> list[dict]:
    lines = capsys.readouterr().out.splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


def stack_status(name: str) -> str | None:
    cloudformation = boto3.client("cloudformation", region_name=REGION)
    try:
        return cloudformation.describe_stacks(StackName=name)["Stacks"][0]["StackStatus"]
    except cloudformation.exceptions.ClientError:
        return None


def put_results(run: str) -> None:
    s3 = boto3.client("s3", region_name=REGION)
    s3.put_object(Bucket=BUCKET, Key=f"runs/{run}/model/checkpoints/ckpt-3.index", Body=b"i")
    s3.put_object(Bucket=BUCKET, Key=f"runs/{run}/logs/node-0.log", Body=b"log")


def schedules() -> list[dict]:
    client = boto3.client("scheduler", region_name=REGION)
    return [client.get_schedule(Name=s["Name"]) for s in client.list_schedules()["Schedules"]]


@pytest.fixture
def aws(monkeypatch):
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": REGION,
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with mock_aws():
        boto3.client("s3", region_name=REGION).create_bucket(Bucket=BUCKET)
        cloudformation = boto3.client("cloudformation", region_name=REGION)
        cloudformation.create_stack(StackName="TrainStack", TemplateBody=stack_template(RUN))
        cloudformation.create_stack(StackName="DatasetStack", TemplateBody=stack_template(None))
        yield


@pytest.fixture
def reaper(aws):
    return Reaper(ENV, FUNCTION_ARN, session=SESSION, now=lambda: NOW)


# --- event parsing ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (s3_event(f"runs/{RUN}/DONE.json"), {"trigger": "done", "run": RUN}),
        (s3_event("tfrecords/manifest.json", etag="e1"), {"trigger": "manifest", "etag": "e1"}),
        (s3_event("runs/a/b/DONE.json"), {"trigger": "ignored"}),
        (s3_event(f"runs/{RUN}/logs/DONE.json.tmp"), {"trigger": "ignored"}),
        (alarm_event(RUN), {"trigger": "idle", "run": RUN}),
        ({**alarm_event(RUN), "alarmData": {"alarmName": "x"}}, {"trigger": "ignored"}),
        ({"trigger": "hard-cap", "run": RUN}, {"trigger": "hard-cap", "run": RUN}),
        (
            {"trigger": "recheck", "reason": "idle", "run": RUN},
            {"trigger": "recheck", "reason": "idle", "run": RUN},
        ),
        ({"trigger": "hard-cap"}, {"trigger": "ignored"}),
        (
            {"trigger": "recheck", "reason": "hard-cap", "run": RUN},
            {"trigger": "recheck", "reason": "hard-cap", "run": RUN},
        ),
        ({"trigger": "recheck", "reason": "manifest", "run": RUN}, {"trigger": "ignored"}),
        ({"detail-type": "Scheduled Event"}, {"trigger": "ignored"}),
    ],
)
def test_parse_event_understands_each_trigger_shape(event, expected):
    parsed = parse_event(event)
    assert parsed.items() >= expected.items()


# --- deleting TrainStack ---------------------------------------------------------------------


def test_done_with_results_deletes_train_stack_and_nothing_else(reaper, capsys):
    put_results(RUN)
    reaper.handle(s3_event(f"runs/{RUN}/DONE.json"))
    assert stack_status("TrainStack") in (None, "DELETE_COMPLETE")
    assert stack_status("DatasetStack") == "CREATE_COMPLETE"
    decision, followed = decisions(capsys)
    assert decision["decision"] == "delete-stack"
    assert decision["stack"] == "TrainStack"
    assert decision["reason"] == "done"
    assert followed["decision"] == "follow-delete"


@pytest.mark.parametrize("name", ["DatasetStack", "TeardownStack", "PreprocessStack", "Other"])
def test_reaper_refuses_to_delete_any_other_stack(reaper, name, capsys):
    with pytest.raises(RefusedStack):
        reaper.delete_stack(name)
    assert stack_status("DatasetStack") == "CREATE_COMPLETE"
    assert decisions(capsys)[0]["decision"] == "refused"


def test_done_for_another_run_leaves_the_deployed_fleet(reaper, capsys):
    put_results("old-run")
    reaper.handle(s3_event("runs/old-run/DONE.json"))
    assert stack_status("TrainStack") == "CREATE_COMPLETE"
    assert decisions(capsys)[0]["decision"] == "other-run-deployed"


@pytest.mark.parametrize("present", ["checkpoint", "logs", None])
def test_waits_and_schedules_a_recheck_while_results_are_missing(reaper, capsys, present):
    s3 = boto3.client("s3", region_name=REGION)
    if present == "checkpoint":
        s3.put_object(Bucket=BUCKET, Key=f"runs/{RUN}/model/checkpoints/ckpt-1.index", Body=b"")
    if present == "logs":
        s3.put_object(Bucket=BUCKET, Key=f"runs/{RUN}/logs/node-0.log", Body=b"")
    # A checkpoint data file alone is not a checkpoint: the .index is written last.
    s3.put_object(Bucket=BUCKET, Key=f"runs/{RUN}/model/checkpoints/ckpt-1.data-0", Body=b"")
    reaper.handle(s3_event(f"runs/{RUN}/DONE.json"))
    assert stack_status("TrainStack") == "CREATE_COMPLETE"
    [decision] = decisions(capsys)
    assert decision["decision"] == "wait-for-results"
    assert len(decision["missing"]) == (2 if present is None else 1)
    [schedule] = schedules()
    assert schedule["Target"]["Arn"] == FUNCTION_ARN
    assert schedule["ActionAfterCompletion"] == "DELETE"
    assert schedule["Target"]["RoleArn"] == ENV["RECHECK_ROLE_ARN"]
    # A re-check that cannot invoke the reaper is retried, then kept where an alarm sees it.
    assert schedule["Target"]["DeadLetterConfig"] == {"Arn": ENV["DEAD_LETTER_ARN"]}
    assert schedule["Target"]["RetryPolicy"]["MaximumRetryAttempts"] > 0
    assert json.loads(schedule["Target"]["Input"]) == {
        "trigger": "recheck",
        "reason": "done",
        "run": RUN,
    }
    assert schedule["ScheduleExpression"] == "at(2026-11-22T04:50:00)"


@pytest.mark.parametrize(
    ("status", "deleted"), [("failed", True), ("interrupted", True), ("succeeded", False)]
)
def test_failed_run_needs_only_its_logs(reaper, capsys, status, deleted):
    """A run that died before its first checkpoint must not bill until the hard cap."""
    s3 = boto3.client("s3", region_name=REGION)
    s3.put_object(Bucket=BUCKET, Key=f"runs/{RUN}/logs/node-0.log", Body=b"Traceback")
    done = {"run": RUN, "status": status, "reason": "rank 3 lost"}
    s3.put_object(Bucket=BUCKET, Key=f"runs/{RUN}/DONE.json", Body=json.dumps(done).encode())
    reaper.handle(s3_event(f"runs/{RUN}/DONE.json"))
    assert (stack_status("TrainStack") in (None, "DELETE_COMPLETE")) is deleted
    expected = ["delete-stack", "follow-delete"] if deleted else ["wait-for-results"]
    assert [d["decision"] for d in decisions(capsys)] == ["attempt-ended", *expected]


def test_recheck_is_idempotent_and_deletes_once_results_arrive(reaper, capsys):
    reaper.handle(s3_event(f"runs/{RUN}/DONE.json"))
    reaper.handle(s3_event(f"runs/{RUN}/DONE.json"))  # S3 delivers at least once
    [schedule] = schedules()
    assert stack_status("TrainStack") == "CREATE_COMPLETE"
    put_results(RUN)
    reaper.handle(json.loads(schedule["Target"]["Input"]))
    assert stack_status("TrainStack") in (None, "DELETE_COMPLETE")
    assert [d["decision"] for d in decisions(capsys)] == [
        "wait-for-results",
        "wait-for-results",
        "delete-stack",
        "follow-delete",
    ]


def deny_every_read(reaper) -> None:
    """S3 as the reaper's role sees it when a key is missing (prefix-conditioned ListBucket:
    403, not 404), and here for every key, so nothing can be read at all."""

    def denied(**_):
        raise ClientError(
            {"Error": {"Code": "AccessDenied", "Message": "Access Denied"}}, "GetObject"
        )

    reaper.s3.get_object = denied


def test_hard_cap_deletes_without_reading_results(reaper, capsys):
    deny_every_read(reaper)
    reaper.handle({"trigger": "hard-cap", "run": RUN})
    assert stack_status("TrainStack") in (None, "DELETE_COMPLETE")
    decision, _ = decisions(capsys)
    assert decision["decision"] == "delete-stack"
    assert decision["reason"] == "hard-cap"
    [follow_up] = schedules()
    assert json.loads(follow_up["Target"]["Input"])["reason"] == "deleting"


def test_a_done_json_s3_denies_is_not_there_yet(reaper):
    deny_every_read(reaper)
    assert reaper.done_document(RUN) == {}


def test_second_trigger_after_delete_is_a_noop(reaper, capsys):
    put_results(RUN)
    reaper.handle(s3_event(f"runs/{RUN}/DONE.json"))
    reaper.handle(s3_event(f"runs/{RUN}/DONE.json"))
    reaper.handle({"trigger": "hard-cap", "run": RUN})
    reaper.handle(alarm_event(RUN))
    assert [d["decision"] for d in decisions(capsys)] == [
        "delete-stack",
        "follow-delete",
        "already-gone",
        "already-gone",
        "already-gone",
    ]
    [follow_up] = schedules()
    reaper.handle(json.loads(follow_up["Target"]["Input"]))
    assert [d["decision"] for d in decisions(capsys)] == ["deleted"]


def fail_deletes(monkeypatch) -> list[str]:
    """Make moto's DeleteStack end the way a stuck network interface makes it: DELETE_FAILED."""
    calls = []

    def delete_stack(backend, name_or_stack_id):
        calls.append(name_or_stack_id)
        for stack in backend.stacks.values():
            if name_or_stack_id in (stack.name, stack.stack_id):
                stack.status = "DELETE_FAILED"
                stack.status_reason = "The following resource(s) failed to delete: [Subnet]."

    monkeypatch.setattr(CloudFormationBackend, "delete_stack", delete_stack)
    return calls


def set_train_stack_status(status: str) -> None:
    backend = cloudformation_backends[DEFAULT_ACCOUNT_ID][REGION]
    [stack] = [s for s in backend.stacks.values() if s.name == "TrainStack"]
    stack.status = status


def train_stack_id() -> str:
    cloudformation = boto3.client("cloudformation", region_name=REGION)
    return cloudformation.describe_stacks(StackName="TrainStack")["Stacks"][0]["StackId"]


def launch(tags: dict[str, str]) -> str:
    ec2 = boto3.client("ec2", region_name=REGION)
    spec = [{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}]
    reservation = ec2.run_instances(
        ImageId="ami-12c6146b", MinCount=1, MaxCount=1, TagSpecifications=spec
    )
    return reservation["Instances"][0]["InstanceId"]


def test_failed_delete_terminates_the_stacks_instances_and_retries(reaper, capsys, monkeypatch):
    stack_id = train_stack_id()
    fleet = launch({"aws:cloudformation:stack-id": stack_id, "Project": "horovod-fleet"})
    bystander = launch({"Project": "horovod-fleet"})  # e.g. the preprocessing node
    calls = fail_deletes(monkeypatch)
    reaper.handle({"trigger": "hard-cap", "run": RUN})
    assert [d["decision"] for d in decisions(capsys)] == ["delete-stack", "follow-delete"]
    assert instance_state(fleet) == "running"  # the first delete gets its chance
    [schedule] = schedules()
    payload = json.loads(schedule["Target"]["Input"])
    assert payload == {
        "trigger": "recheck",
        "reason": "deleting",
        "run": RUN,
        "stack_id": stack_id,
        "check": 1,
    }
    assert parse_event(payload)["trigger"] == "recheck"
    reaper.handle(payload)  # ten minutes later: still DELETE_FAILED
    retry, followed = decisions(capsys)
    assert retry["decision"] == "delete-stack"
    assert retry["reason"] == "retry-failed-delete"
    assert retry["terminated"] == [fleet]
    assert "Subnet" in retry["status_reason"]
    assert followed["decision"] == "follow-delete"
    assert calls == ["TrainStack", "TrainStack"]
    assert instance_state(fleet) in ("shutting-down", "terminated")
    assert instance_state(bystander) == "running"


def test_delete_in_progress_is_followed_without_a_retry(reaper, capsys, monkeypatch):
    calls = fail_deletes(monkeypatch)
    stack_id = train_stack_id()
    set_train_stack_status("DELETE_IN_PROGRESS")
    reaper.handle(
        {"trigger": "recheck", "reason": "deleting", "run": RUN, "stack_id": stack_id, "check": 3}
    )
    [decision] = decisions(capsys)
    assert decision["decision"] == "follow-delete"
    assert decision["status"] == "DELETE_IN_PROGRESS"
    assert calls == []
    assert json.loads(schedules()[0]["Target"]["Input"])["check"] == 4


def test_following_a_delete_ends_after_three_hours(reaper, capsys, monkeypatch):
    fail_deletes(monkeypatch)
    stack_id = train_stack_id()
    set_train_stack_status("DELETE_IN_PROGRESS")
    last = 180 // int(ENV["RECHECK_MINUTES"])
    reaper.handle(
        {
            "trigger": "recheck",
            "reason": "deleting",
            "run": RUN,
            "stack_id": stack_id,
            "check": last,
        }
    )
    [decision] = decisions(capsys)
    assert decision["decision"] == "delete-unconfirmed"
    assert schedules() == []


def test_a_fleet_deployed_again_is_never_touched_by_an_old_follow_up(reaper, capsys):
    old_id = train_stack_id()
    cloudformation = boto3.client("cloudformation", region_name=REGION)
    cloudformation.delete_stack(StackName="TrainStack")
    cloudformation.create_stack(StackName="TrainStack", TemplateBody=stack_template(RUN))
    reaper.handle(
        {"trigger": "recheck", "reason": "deleting", "run": RUN, "stack_id": old_id, "check": 1}
    )
    assert [d["decision"] for d in decisions(capsys)] == ["deleted"]
    assert stack_status("TrainStack") == "CREATE_COMPLETE"
    assert schedules() == []


@pytest.mark.parametrize(
    "event",
    [
        {"trigger": "recheck", "reason": "deleting", "run": RUN, "check": 1},
        {"trigger": "recheck", "reason": "deleting", "run": RUN, "stack_id": "x", "check": "1"},
    ],
)
def test_a_follow_up_without_its_stack_id_and_count_is_ignored(event):
    assert parse_event(event) == {"trigger": "ignored"}


def test_no_train_stack_at_all_is_a_noop(reaper, capsys):
    boto3.client("cloudformation", region_name=REGION).delete_stack(StackName="TrainStack")
    reaper.handle({"trigger": "hard-cap", "run": RUN})
    assert decisions(capsys)[0]["decision"] == "already-gone"


# --- idle alarm ------------------------------------------------------------------------------
# Times in these tests count from DEPLOYED, when TrainStack finished creating; moto's own
# timestamps are set to them so the reaper sees one consistent clock.

DEPLOYED = datetime.datetime(2026, 11, 22, 2, 0, tzinfo=datetime.timezone.utc)


def minutes(value: float) -> datetime.datetime:
    return DEPLOYED + datetime.timedelta(minutes=value)


def naive(at: datetime.datetime) -> datetime.datetime:
    """moto keeps UTC times without a zone."""
    return at.astimezone(datetime.timezone.utc).replace(tzinfo=None)


def set_deployed(at: datetime.datetime) -> None:
    backend = cloudformation_backends[DEFAULT_ACCOUNT_ID][REGION]
    [stack] = [s for s in backend.stacks.values() if s.name == "TrainStack"]
    for event in stack.events:
        event.timestamp = naive(at)


def set_idle_alarm(state: str, since: datetime.datetime | None = None) -> None:
    cloudwatch = boto3.client("cloudwatch", region_name=REGION)
    name = f"horovod-fleet-idle-{RUN}"
    if not cloudwatch.describe_alarms(AlarmNames=[name])["MetricAlarms"]:
        cloudwatch.put_metric_alarm(
            AlarmName=name,
            Namespace="HorovodFleet",
            MetricName="nvidia_smi_utilization_gpu",
            Dimensions=[{"Name": "Run", "Value": RUN}],
            Statistic="Average",
            Period=300,
            EvaluationPeriods=6,
            Threshold=5,
            ComparisonOperator="LessThanThreshold",
        )
    cloudwatch.set_alarm_state(AlarmName=name, StateValue=state, StateReason="test")
    if since is not None:
        cloudwatch_backends[DEFAULT_ACCOUNT_ID][REGION].alarms[
            name
        ].state_updated_timestamp = naive(since)


def put_checkpoint(at: datetime.datetime) -> None:
    key = f"runs/{RUN}/model/checkpoints/ckpt-3.index"
    boto3.client("s3", region_name=REGION).put_object(Bucket=BUCKET, Key=key, Body=b"i")
    s3_backends[DEFAULT_ACCOUNT_ID]["global"].buckets[BUCKET].keys[key].last_modified = naive(at)


@pytest.fixture
def idle_reaper(aws):
    """A reaper whose clock the test sets (reaper.now = lambda: minutes(...))."""
    set_deployed(DEPLOYED)
    return Reaper(ENV, FUNCTION_ARN, session=SESSION)


def only_schedule() -> dict:
    [schedule] = schedules()
    return schedule


def test_idle_fleet_that_never_checkpointed_is_deleted_without_waiting_for_results(
    idle_reaper, capsys
):
    """Hung in NCCL init or rendezvous: no checkpoint will ever come; its logs are in CloudWatch."""
    set_idle_alarm("ALARM", since=minutes(35))
    idle_reaper.now = lambda: minutes(41)
    idle_reaper.handle(alarm_event(RUN))
    assert stack_status("TrainStack") in (None, "DELETE_COMPLETE")
    decision, followed = decisions(capsys)
    assert decision["decision"] == "delete-stack"
    assert decision["reason"] == "idle"
    assert decision["checkpoint"] is None
    assert followed["decision"] == "follow-delete"


def test_idle_before_the_launch_grace_waits_until_it_has_passed(idle_reaper, capsys):
    """The nodes get the rendezvous timeout and a start before idle means stuck."""
    set_idle_alarm("ALARM", since=minutes(-10))  # idle while the nodes pulled the data
    idle_reaper.now = lambda: minutes(5)
    idle_reaper.handle(alarm_event(RUN))
    assert stack_status("TrainStack") == "CREATE_COMPLETE"
    [decision] = decisions(capsys)
    assert decision["decision"] == "idle-wait"
    schedule = only_schedule()
    assert schedule["ScheduleExpression"] == "at(2026-11-22T02:40:00)"  # deploy + 40 min
    assert json.loads(schedule["Target"]["Input"]) == {
        "trigger": "recheck",
        "reason": "idle",
        "run": RUN,
    }
    # At the re-check the fleet still has not trained: deleted, 40 minutes after its launch.
    idle_reaper.now = lambda: minutes(40)
    idle_reaper.handle(json.loads(schedule["Target"]["Input"]))
    assert stack_status("TrainStack") in (None, "DELETE_COMPLETE")


def test_alarm_during_creation_is_rechecked_not_dropped(idle_reaper, capsys):
    """Missing data counts as breaching, so the alarm may fire before TrainStack exists fully;
    alarm actions fire only on a change of state, so a dropped event would never come back."""
    set_train_stack_status("CREATE_IN_PROGRESS")
    backend = cloudformation_backends[DEFAULT_ACCOUNT_ID][REGION]
    [stack] = [s for s in backend.stacks.values() if s.name == "TrainStack"]
    outputs = stack.output_map
    stack.output_map = {}  # CloudFormation shows no outputs before CREATE_COMPLETE
    set_idle_alarm("ALARM", since=minutes(-5))
    idle_reaper.now = lambda: minutes(-5)
    idle_reaper.handle(alarm_event(RUN))
    [decision] = decisions(capsys)
    assert decision["decision"] == "stack-busy"
    assert decision["status"] == "CREATE_IN_PROGRESS"
    recheck = json.loads(only_schedule()["Target"]["Input"])
    assert recheck == {"trigger": "recheck", "reason": "idle", "run": RUN}
    # Created; the re-check now judges the fleet: still within its launch grace.
    stack.output_map = outputs
    set_train_stack_status("CREATE_COMPLETE")
    idle_reaper.now = lambda: minutes(10)
    idle_reaper.handle(recheck)
    assert [d["decision"] for d in decisions(capsys)] == ["idle-wait"]


@pytest.mark.parametrize(
    ("checkpoint_at", "now", "expected"),
    [
        # Onset at 45 min: quiet since 15. A checkpoint at 30.5 is progress: due at 60.5.
        (30, 55, "idle-wait"),
        (30, 61, "delete-stack"),
        (5, 46, "delete-stack"),  # a checkpoint from before the quiet 30 minutes: no progress
    ],
)
def test_idle_with_a_checkpoint_counts_the_window_from_the_newest_one(
    idle_reaper, capsys, checkpoint_at, now, expected
):
    """The alarm's onset says the GPUs were quiet for 30 minutes before it; a checkpoint that
    reached S3 after that is progress (the GPU metric was missing, not idle)."""
    set_idle_alarm("ALARM", since=minutes(45))
    put_checkpoint(minutes(checkpoint_at + 0.5))
    idle_reaper.now = lambda: minutes(now)
    idle_reaper.handle(alarm_event(RUN))
    assert decisions(capsys)[0]["decision"] == expected
    deleted = stack_status("TrainStack") in (None, "DELETE_COMPLETE")
    assert deleted is (expected == "delete-stack")
    if expected == "idle-wait":
        assert only_schedule()["ScheduleExpression"] == "at(2026-11-22T03:01:00)"


def test_idle_alarm_no_longer_in_alarm_does_nothing(idle_reaper, capsys):
    set_idle_alarm("OK")  # the Lambda action was queued, then the fleet got busy again
    idle_reaper.now = lambda: minutes(90)
    idle_reaper.handle(alarm_event(RUN))
    assert stack_status("TrainStack") == "CREATE_COMPLETE"
    assert decisions(capsys)[0]["decision"] == "idle-cleared"
    assert schedules() == []  # the next OK -> ALARM change invokes the reaper again


@pytest.mark.parametrize(("alarm_state", "deleted"), [("OK", False), ("ALARM", True)])
def test_idle_recheck_asks_the_alarm_again(idle_reaper, capsys, alarm_state, deleted):
    set_idle_alarm("ALARM", since=minutes(20))
    idle_reaper.now = lambda: minutes(25)
    idle_reaper.handle(alarm_event(RUN))  # within the launch grace: re-check at 40 min
    recheck = json.loads(only_schedule()["Target"]["Input"])
    if alarm_state != "ALARM":
        set_idle_alarm(alarm_state)
    idle_reaper.now = lambda: minutes(40)
    idle_reaper.handle(recheck)
    assert (stack_status("TrainStack") in (None, "DELETE_COMPLETE")) is deleted
    expected = ["delete-stack", "follow-delete"] if deleted else ["idle-cleared"]
    assert [d["decision"] for d in decisions(capsys)] == ["idle-wait", *expected]


@pytest.mark.parametrize("status", ["UPDATE_IN_PROGRESS", "ROLLBACK_IN_PROGRESS"])
def test_hard_cap_on_a_stack_being_deployed_is_rechecked(reaper, capsys, status):
    """DeleteStack fails while an update runs; the cap must not be lost to that."""
    set_train_stack_status(status)
    reaper.handle({"trigger": "hard-cap", "run": RUN})
    assert [d["decision"] for d in decisions(capsys)] == ["stack-busy"]
    recheck = json.loads(only_schedule()["Target"]["Input"])
    assert recheck == {"trigger": "recheck", "reason": "hard-cap", "run": RUN}
    set_train_stack_status("UPDATE_COMPLETE")
    reaper.handle(recheck)
    assert stack_status("TrainStack") in (None, "DELETE_COMPLETE")


def test_a_rolled_back_create_is_already_gone(reaper, capsys):
    set_train_stack_status("ROLLBACK_COMPLETE")
    reaper.handle({"trigger": "hard-cap", "run": RUN})
    assert [d["decision"] for d in decisions(capsys)] == ["already-gone"]
    assert schedules() == []


# --- preprocessing ---------------------------------------------------------------------------


def register_preprocess(snapshot_volume: bool) -> tuple[str, str]:
    ec2 = boto3.client("ec2", region_name=REGION)
    instance = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1)["Instances"][0]
    volume = ec2.create_volume(AvailabilityZone=f"{REGION}a", Size=1000, VolumeType="sc1")
    value = {
        "instance_id": instance["InstanceId"],
        "volume_id": volume["VolumeId"],
        "snapshot_volume": snapshot_volume,
    }
    boto3.client("ssm", region_name=REGION).put_parameter(
        Name=ENV["PREPROCESS_PARAMETER"], Value=json.dumps(value), Type="String"
    )
    return instance["InstanceId"], volume["VolumeId"]


def instance_state(instance_id: str) -> str:
    ec2 = boto3.client("ec2", region_name=REGION)
    reservations = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
    return reservations[0]["Instances"][0]["State"]["Name"]


def volume_snapshots(volume_id: str) -> list[dict]:
    ec2 = boto3.client("ec2", region_name=REGION)
    filters = [{"Name": "volume-id", "Values": [volume_id]}]
    return ec2.describe_snapshots(OwnerIds=["self"], Filters=filters)["Snapshots"]


def test_manifest_stops_the_instance_then_snapshots_once(reaper, capsys):
    instance_id, volume_id = register_preprocess(snapshot_volume=True)
    reaper.handle(s3_event("tfrecords/manifest.json", etag="m1"))
    reaper.handle(s3_event("tfrecords/manifest.json", etag="m1"))
    assert instance_state(instance_id) == "stopped"
    [snapshot] = volume_snapshots(volume_id)
    assert {"Key": "horovod-fleet:manifest", "Value": "m1"} in snapshot["Tags"]
    assert [d["decision"] for d in decisions(capsys)] == [
        "stop-instance",
        "snapshot",
        "already-stopped",
        "snapshot-exists",
    ]
    assert stack_status("TrainStack") == "CREATE_COMPLETE"


def test_manifest_without_snapshot_only_stops(reaper):
    instance_id, volume_id = register_preprocess(snapshot_volume=False)
    reaper.handle(s3_event("tfrecords/manifest.json"))
    assert instance_state(instance_id) == "stopped"
    assert volume_snapshots(volume_id) == []


def test_manifest_under_the_configured_dataset_prefix(aws):
    instance_id, _ = register_preprocess(snapshot_volume=False)
    env = {**ENV, "MANIFEST_KEY": "imagenet/v2/manifest.json"}
    reaper = Reaper(env, FUNCTION_ARN, session=SESSION)
    assert reaper.handle(s3_event("tfrecords/manifest.json"))["trigger"] == "ignored"
    assert instance_state(instance_id) == "running"
    reaper.handle(s3_event("imagenet/v2/manifest.json"))
    assert instance_state(instance_id) == "stopped"


def test_manifest_without_a_preprocess_stack_is_a_noop(reaper, capsys):
    reaper.handle(s3_event("tfrecords/manifest.json"))
    assert decisions(capsys)[0]["decision"] == "no-preprocess-instance"


# --- hard-cap deadline -----------------------------------------------------------------------


def test_deadline_is_start_plus_max_hours():
    assert deadline(NOW, 4, NOW) == {
        "ScheduleExpression": "at(2026-11-22T08:33:20)",
        "Deadline": "2026-11-22T08:33:20Z",
    }
    assert deadline(NOW, 0.5, NOW)["ScheduleExpression"] == "at(2026-11-22T05:03:20)"
    assert deadline(NOW, 36, NOW)["ScheduleExpression"] == "at(2026-11-23T16:33:20)"


def test_deadline_in_the_past_is_moved_just_ahead():
    start = NOW - datetime.timedelta(hours=10)
    assert deadline(start, 4, NOW)["ScheduleExpression"] == "at(2026-11-22T04:38:20)"


@pytest.mark.parametrize("hours", [0, -1, float("nan")])
def test_deadline_rejects_non_positive_hours(hours):
    with pytest.raises(ValueError):
        deadline(NOW, hours, NOW)


def test_recheck_time_is_aligned_and_ahead():
    at = recheck_time(NOW, 10)
    assert at == datetime.datetime(2026, 11, 22, 4, 50, tzinfo=datetime.timezone.utc)
    assert recheck_time(NOW + datetime.timedelta(minutes=5), 10) == at


class Replies:
    """Captures the custom-resource responses the reaper PUTs to CloudFormation's URL."""

    def __init__(self):
        self.bodies = []

    def __call__(self, request: urllib.request.Request, timeout: float):
        assert request.get_method() == "PUT"
        assert request.full_url == "https://cloudformation-response.example/abc"
        self.bodies.append(json.loads(request.data))
        return self

    def __enter__(self):
        return self

    def __exit__(self, *_):
        return False

    def read(self):
        return b""


def deadline_request(request_type: str, max_hours: str, physical_id: str | None = None) -> dict:
    event = {
        "RequestType": request_type,
        "ResponseURL": "https://cloudformation-response.example/abc",
        "StackId": "arn:aws:cloudformation:us-east-1:123456789012:stack/TrainStack/guid",
        "RequestId": "req-1",
        "ResourceType": "Custom::HorovodFleetDeadline",
        "LogicalResourceId": "RunGuardDeadline",
        "ResourceProperties": {"ServiceToken": FUNCTION_ARN, "Run": RUN, "MaxHours": max_hours},
    }
    if physical_id:
        event["PhysicalResourceId"] = physical_id
    return event


def test_deadline_custom_resource_create_update_delete(reaper, monkeypatch):
    replies = Replies()
    monkeypatch.setattr(reaper_module.urllib.request, "urlopen", replies)
    reaper.handle(deadline_request("Create", "4"))
    created = replies.bodies[-1]
    assert created["Status"] == "SUCCESS"
    assert created["Data"]["ScheduleExpression"] == "at(2026-11-22T08:33:20)"
    assert created["RequestId"] == "req-1"
    assert created["LogicalResourceId"] == "RunGuardDeadline"

    # An hour later the user raises the cap to 6 h: it still counts from the first deploy.
    reaper.now = lambda: NOW + datetime.timedelta(hours=1)
    reaper.handle(deadline_request("Update", "6", created["PhysicalResourceId"]))
    updated = replies.bodies[-1]
    assert updated["Data"]["ScheduleExpression"] == "at(2026-11-22T10:33:20)"
    assert updated["PhysicalResourceId"] == created["PhysicalResourceId"]

    reaper.handle(deadline_request("Delete", "6", created["PhysicalResourceId"]))
    assert replies.bodies[-1]["Status"] == "SUCCESS"
    assert replies.bodies[-1]["PhysicalResourceId"] == created["PhysicalResourceId"]


def test_deadline_custom_resource_fails_cleanly_on_bad_hours(reaper, monkeypatch):
    replies = Replies()
    monkeypatch.setattr(reaper_module.urllib.request, "urlopen", replies)
    reaper.handle(deadline_request("Create", "zero"))
    assert replies.bodies[-1]["Status"] == "FAILED"
    assert "zero" in replies.bodies[-1]["Reason"]


def test_lambda_entry_point_reads_its_environment(aws, monkeypatch, capsys):
    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    put_results(RUN)

    class Context:
        invoked_function_arn = FUNCTION_ARN

    parsed = reaper_module.handler({"trigger": "hard-cap", "run": RUN}, Context())
    assert parsed == {"trigger": "hard-cap", "run": RUN}
    assert decisions(capsys)[0]["decision"] == "delete-stack"


# --- pinned preprocessing AMI and code --------------------------------------------------------

# moto reserves /aws/ names; the reaper treats any parameter name alike.
UBUNTU = "/test/canonical/ubuntu/ami-id"
CODE_V1 = {"bootstrap": "s3://assets/1111.zip", "trainer": "s3://assets/2222.zip"}
CODE_V2 = {"bootstrap": "s3://assets/3333.zip", "trainer": "s3://assets/4444.zip"}


def pin_request(request_type: str, parameter: str = UBUNTU, code=CODE_V1, **extra) -> dict:
    return {
        "RequestType": request_type,
        "ResponseURL": "https://cloudformation-response.example/abc",
        "StackId": "arn:aws:cloudformation:us-east-1:123456789012:stack/PreprocessStack/guid",
        "RequestId": "req-2",
        "ResourceType": "Custom::HorovodFleetPinned",
        "LogicalResourceId": "Pinned",
        "ResourceProperties": {
            "ServiceToken": FUNCTION_ARN,
            "ImageParameter": parameter,
            "Code": code,
        },
        **extra,
    }


def publish(parameter: str, image: str) -> None:
    boto3.client("ssm", region_name=REGION).put_parameter(
        Name=parameter, Value=image, Type="String", Overwrite=True
    )


def test_pinned_image_and_code_are_kept_by_a_redeploy(reaper, monkeypatch):
    replies = Replies()
    monkeypatch.setattr(reaper_module.urllib.request, "urlopen", replies)
    publish(UBUNTU, "ami-0aaaaaaaaaaaaaaaa")
    assert parse_event(pin_request("Create")) == {"trigger": "pinned"}
    reaper.handle(pin_request("Create"))
    created = replies.bodies[-1]
    assert created["Status"] == "SUCCESS"
    assert created["Data"] == {"ImageId": "ami-0aaaaaaaaaaaaaaaa", **CODE_V1}
    # Canonical publishes a new image and the code changes; a redeploy keeps both.
    publish(UBUNTU, "ami-0bbbbbbbbbbbbbbbb")
    old = {"ImageParameter": UBUNTU, "Code": CODE_V1}
    update = pin_request(
        "Update",
        code={**CODE_V2, "extra": "s3://assets/5555.zip"},
        PhysicalResourceId="ami-0aaaaaaaaaaaaaaaa",
        OldResourceProperties=old,
    )
    reaper.handle(update)
    assert replies.bodies[-1]["Data"] == {
        "ImageId": "ami-0aaaaaaaaaaaaaaaa",
        **CODE_V1,
        "extra": "s3://assets/5555.zip",  # new code the old node never had: the new URL
    }
    assert replies.bodies[-1]["PhysicalResourceId"] == "ami-0aaaaaaaaaaaaaaaa"
    # A new stack (destroy, deploy) takes the new image and code.
    reaper.handle(pin_request("Create", code=CODE_V2))
    assert replies.bodies[-1]["Data"] == {"ImageId": "ami-0bbbbbbbbbbbbbbbb", **CODE_V2}
    reaper.handle(pin_request("Delete", PhysicalResourceId="ami-0aaaaaaaaaaaaaaaa"))
    assert replies.bodies[-1]["Status"] == "SUCCESS"


def test_pinned_image_with_a_missing_parameter_fails_the_deploy_cleanly(reaper, monkeypatch):
    replies = Replies()
    monkeypatch.setattr(reaper_module.urllib.request, "urlopen", replies)
    reaper.handle(pin_request("Create", parameter="/no/such/parameter"))
    assert replies.bodies[-1]["Status"] == "FAILED"
    assert "/no/such/parameter" in replies.bodies[-1]["Reason"]


# --- dataset present before the fleet launches -------------------------------------------------


def dataset_request(request_type: str, key: str = "tfrecords/manifest.json") -> dict:
    return {
        "RequestType": request_type,
        "ResponseURL": "https://cloudformation-response.example/abc",
        "StackId": "arn:aws:cloudformation:us-east-1:123456789012:stack/TrainStack/guid",
        "RequestId": "req-3",
        "ResourceType": "Custom::HorovodFleetDataset",
        "LogicalResourceId": "Dataset",
        "ResourceProperties": {"ServiceToken": FUNCTION_ARN, "Bucket": BUCKET, "Key": key},
    }


def test_a_missing_manifest_fails_the_deploy_in_one_line(reaper, monkeypatch):
    replies = Replies()
    monkeypatch.setattr(reaper_module.urllib.request, "urlopen", replies)
    assert parse_event(dataset_request("Create")) == {"trigger": "dataset"}
    reaper.handle(dataset_request("Create"))
    [reply] = replies.bodies
    assert reply["Status"] == "FAILED"
    assert reply["Reason"].startswith(f"no s3://{BUCKET}/tfrecords/manifest.json: the fleet has")
    assert "Deploy PreprocessStack" in reply["Reason"] and "\n" not in reply["Reason"]


def test_a_missing_manifest_s3_answers_with_403_is_missing_too(reaper, monkeypatch):
    replies = Replies()
    monkeypatch.setattr(reaper_module.urllib.request, "urlopen", replies)

    def denied(**_):
        raise ClientError({"Error": {"Code": "403", "Message": "Forbidden"}}, "HeadObject")

    reaper.s3.head_object = denied
    reaper.handle(dataset_request("Create"))
    assert replies.bodies[-1]["Reason"].startswith(f"no s3://{BUCKET}/tfrecords/manifest.json")


def test_a_present_manifest_lets_the_fleet_launch_and_delete_always_succeeds(reaper, monkeypatch):
    replies = Replies()
    monkeypatch.setattr(reaper_module.urllib.request, "urlopen", replies)
    boto3.client("s3", region_name=REGION).put_object(
        Bucket=BUCKET, Key="tfrecords/manifest.json", Body=b"{}"
    )
    reaper.handle(dataset_request("Create"))
    reaper.handle(dataset_request("Delete", key="gone/manifest.json"))
    assert [r["Status"] for r in replies.bodies] == ["SUCCESS", "SUCCESS"]


def test_the_reaper_and_the_stacks_name_the_custom_resources_alike():
    from stacks.teardown import names

    assert (reaper_module.PINNED_TYPE, reaper_module.DATASET_TYPE, reaper_module.ZONE_TYPE) == (
        names.PINNED_TYPE,
        names.DATASET_TYPE,
        names.ZONE_TYPE,
    )


# --- the fleet's zone, picked at deploy time ----------------------------------------------------


def zone_request(request_type: str, preferred: str, fixed: bool = False, **extra) -> dict:
    slots = extra.pop("move_slots", None)
    return {
        "RequestType": request_type,
        "ResponseURL": "https://cloudformation-response.example/abc",
        "StackId": "arn:aws:cloudformation:us-east-1:123456789012:stack/TrainStack/guid",
        "RequestId": "req-4",
        "ResourceType": "Custom::HorovodFleetZone",
        "LogicalResourceId": "Zone",
        "ResourceProperties": {
            "ServiceToken": FUNCTION_ARN,
            "InstanceType": extra.pop("instance_type", "p4d.24xlarge"),
            "PreferredZone": preferred,
            "Fixed": str(fixed).lower(),
            **({} if slots is None else {"MoveSlots": str(slots)}),
        },
        **extra,
    }


# moto's offerings (its copy of AWS's data): p4d.24xlarge in us-east-1a to 1d, not 1e or 1f.
OFFERING_ZONES = ("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d")


def test_the_preferred_zone_is_kept_when_it_offers_the_type(reaper, monkeypatch):
    replies = Replies()
    monkeypatch.setattr(reaper_module.urllib.request, "urlopen", replies)
    assert parse_event(zone_request("Create", "us-east-1b")) == {"trigger": "zone"}
    reaper.handle(zone_request("Create", "us-east-1b"))
    # The zone, then the others that offer the type: where a run may move (zone_move.py).
    assert replies.bodies[-1]["Data"] == {
        "Zone": "us-east-1b",
        "Zones": "us-east-1b,us-east-1a,us-east-1c,us-east-1d",
    }


def test_a_fixed_zone_offers_nowhere_to_move(reaper, monkeypatch):
    replies = Replies()
    monkeypatch.setattr(reaper_module.urllib.request, "urlopen", replies)
    reaper.handle(zone_request("Create", "us-east-1c", fixed=True))
    assert replies.bodies[-1]["Data"] == {"Zone": "us-east-1c", "Zones": "us-east-1c"}


def test_a_fixed_zone_without_the_type_fails_the_deploy_in_one_line(reaper, monkeypatch):
    replies = Replies()
    monkeypatch.setattr(reaper_module.urllib.request, "urlopen", replies)
    reaper.handle(zone_request("Create", "us-east-1e", fixed=True))
    [reply] = replies.bodies
    assert reply["Status"] == "FAILED"
    assert reply["Reason"] == (
        "p4d.24xlarge is not offered in zone us-east-1e for this account: try a subnet in a zone "
        "that does (us-east-1a, us-east-1b, us-east-1c, us-east-1d), a capacity reservation "
        "(-c capacityReservationId=...) or a Capacity Block"
    )


def test_a_type_no_zone_offers_fails_naming_the_region(reaper, monkeypatch):
    replies = Replies()
    monkeypatch.setattr(reaper_module.urllib.request, "urlopen", replies)
    reaper.handle(zone_request("Create", "us-east-1a", instance_type="p9.mega"))
    [reply] = replies.bodies
    assert reply["Reason"].startswith(
        "p9.mega is not offered in any zone of us-east-1 for this account: try another region"
    )


# moto's zones (its copy of one account's mapping): use1-az4 is us-east-1d, use1-az3 us-east-1e.
@pytest.mark.parametrize(
    ("preferred", "answered"),
    [
        ("us-east-1e", "us-east-1a"),  # a zone without the type gives way to one that has it
        ("use1-az4", "us-east-1d"),  # a zone ID is answered as this account's zone name
    ],
)
def test_the_zone_answered_is_a_name_that_offers_the_type_and_redeploys_keep_it(
    reaper, monkeypatch, preferred, answered
):
    replies = Replies()
    monkeypatch.setattr(reaper_module.urllib.request, "urlopen", replies)
    reaper.handle(zone_request("Create", preferred))
    [reply] = replies.bodies
    others = ",".join(z for z in OFFERING_ZONES if z != answered)
    assert (reply["Status"], reply["Data"], reply["PhysicalResourceId"]) == (
        "SUCCESS",
        {"Zone": answered, "Zones": f"{answered},{others}"},
        answered,
    )
    # A redeploy with the same preference keeps the subnet where it is.
    update = zone_request(
        "Update",
        preferred,
        PhysicalResourceId=answered,
        OldResourceProperties=zone_request("Create", preferred)["ResourceProperties"],
    )
    reaper.handle(update)
    assert replies.bodies[-1]["Data"] == {"Zone": answered, "Zones": f"{answered},{others}"}


def test_a_zone_id_without_the_type_gives_way_unless_fixed(reaper, monkeypatch):
    replies = Replies()
    monkeypatch.setattr(reaper_module.urllib.request, "urlopen", replies)
    reaper.handle(zone_request("Create", "use1-az3"))
    assert replies.bodies[-1]["Data"]["Zone"] == "us-east-1a"
    reaper.handle(zone_request("Create", "use1-az3", fixed=True))
    assert replies.bodies[-1]["Status"] == "FAILED"
    assert replies.bodies[-1]["Reason"].startswith(
        "p4d.24xlarge is not offered in zone us-east-1e (use1-az3) for this account: try a "
        "subnet in a zone that does (us-east-1a, us-east-1b, us-east-1c, us-east-1d)"
    )


def test_each_move_slot_answers_another_offering_zone_then_the_zone_itself(reaper, monkeypatch):
    """TrainStack's move slots (a subnet and a placement group each): the other zones that
    offer the type, then spares in the fleet's own zone; the physical id remembers them."""
    replies = Replies()
    monkeypatch.setattr(reaper_module.urllib.request, "urlopen", replies)
    reaper.handle(zone_request("Create", "us-east-1b", move_slots=5))
    [reply] = replies.bodies
    assert reply["Data"] == {
        "Zone": "us-east-1b",
        "Zones": "us-east-1b,us-east-1a,us-east-1c,us-east-1d",
        "Zone1": "us-east-1a",
        "Zone2": "us-east-1c",
        "Zone3": "us-east-1d",
        "Zone4": "us-east-1b",
        "Zone5": "us-east-1b",
    }
    assert reply["PhysicalResourceId"] == (
        "us-east-1b:us-east-1a,us-east-1c,us-east-1d,us-east-1b,us-east-1b"
    )


def test_a_fixed_zone_has_no_move_slots(reaper, monkeypatch):
    replies = Replies()
    monkeypatch.setattr(reaper_module.urllib.request, "urlopen", replies)
    reaper.handle(zone_request("Create", "us-east-1c", fixed=True, move_slots=5))
    [reply] = replies.bodies
    assert (reply["Data"], reply["PhysicalResourceId"]) == (
        {"Zone": "us-east-1c", "Zones": "us-east-1c"},
        "us-east-1c",
    )


@pytest.mark.parametrize("instance_type", ["p4d.24xlarge", "g5.xlarge"])
def test_move_slots_keep_their_zones_on_every_update(reaper, monkeypatch, instance_type):
    """A slot's subnet cannot change zone in an update (its replacement would need the CIDR
    block the old one holds): whatever the offerings or the type now, the slots stay; a new
    slot takes a zone no slot holds yet."""
    replies = Replies()
    monkeypatch.setattr(reaper_module.urllib.request, "urlopen", replies)
    monkeypatch.setattr(Reaper, "offering_zones", lambda self, _: ["us-east-1b", "us-east-1f"])
    deployed = "us-east-1b:us-east-1a,us-east-1c"
    reaper.handle(
        zone_request(
            "Update",
            "us-east-1b",
            move_slots=3,
            instance_type=instance_type,
            PhysicalResourceId=deployed,
            OldResourceProperties=zone_request("Create", "us-east-1b", move_slots=2)[
                "ResourceProperties"
            ],
        )
    )
    [reply] = replies.bodies
    assert {k: v for k, v in reply["Data"].items() if k != "Zones"} == {
        "Zone": "us-east-1b",
        "Zone1": "us-east-1a",
        "Zone2": "us-east-1c",
        "Zone3": "us-east-1f",
    }
    assert reply["PhysicalResourceId"] == "us-east-1b:us-east-1a,us-east-1c,us-east-1f"


def test_a_stack_answered_before_move_slots_gets_them_at_its_next_update(reaper, monkeypatch):
    replies = Replies()
    monkeypatch.setattr(reaper_module.urllib.request, "urlopen", replies)
    reaper.handle(
        zone_request(
            "Update",
            "us-east-1b",
            move_slots=2,
            PhysicalResourceId="us-east-1b",
            OldResourceProperties=zone_request("Create", "us-east-1b")["ResourceProperties"],
        )
    )
    [reply] = replies.bodies
    assert (reply["Data"]["Zone1"], reply["Data"]["Zone2"]) == ("us-east-1a", "us-east-1c")
    assert reply["PhysicalResourceId"] == "us-east-1b:us-east-1a,us-east-1c"


def test_a_zone_id_of_another_region_fails_the_deploy_in_one_line(reaper, monkeypatch):
    replies = Replies()
    monkeypatch.setattr(reaper_module.urllib.request, "urlopen", replies)
    reaper.handle(zone_request("Create", "usw2-az1"))
    [reply] = replies.bodies
    assert (reply["Status"], reply["Reason"]) == (
        "FAILED",
        "zone ID usw2-az1 is not a zone of us-east-1 this account can use: see aws ec2 "
        "describe-availability-zones --region us-east-1",
    )


# --- the guard's mail ---------------------------------------------------------------------------


class RecordingSns:
    def __init__(self, fails: bool = False):
        self.published, self.fails = [], fails

    def publish(self, **kwargs):
        if self.fails:
            raise ClientError({"Error": {"Code": "AuthorizationError", "Message": "no"}}, "Publish")
        self.published.append(kwargs)


def deploy_with_topic(topic: str) -> None:
    cloudformation = boto3.client("cloudformation", region_name=REGION)
    cloudformation.delete_stack(StackName="TrainStack")
    template = json.loads(stack_template(RUN))
    template["Outputs"]["NotifyTopic"] = {"Value": topic}
    cloudformation.create_stack(StackName="TrainStack", TemplateBody=json.dumps(template))


TOPIC = f"arn:aws:sns:{REGION}:123456789012:horovod-fleet-notify-{RUN}"


def test_the_guard_mails_the_notify_address_when_it_ends_a_fleet(reaper, capsys):
    deploy_with_topic(TOPIC)
    reaper.sns = RecordingSns()
    reaper.handle({"trigger": "hard-cap", "run": RUN})
    [mail] = reaper.sns.published
    assert mail["TopicArn"] == TOPIC
    assert mail["Subject"] == f"horovod-fleet: run {RUN} stopped by its guard"
    assert "hard cap" in mail["Message"] and f"runs/{RUN}/" in mail["Message"]


def test_a_mail_that_fails_never_stops_the_teardown(reaper, capsys):
    deploy_with_topic(TOPIC)
    reaper.sns = RecordingSns(fails=True)
    reaper.handle({"trigger": "hard-cap", "run": RUN})
    assert stack_status("TrainStack") in (None, "DELETE_COMPLETE")
    assert "notify-failed" in [d["decision"] for d in decisions(capsys)]


def test_without_a_topic_no_mail(reaper):
    reaper.sns = RecordingSns()
    reaper.handle({"trigger": "hard-cap", "run": RUN})
    assert reaper.sns.published == []


# --- the run controller: relaunch instead of teardown ---------------------------------------

NODE_LOST = "step 'training' failed: RuntimeError: node 1 (i-0abc, 10.0.0.12) lost: no heartbeat"


def deploy_outputs(max_restarts: int, deadline: datetime.datetime) -> None:
    """TrainStack as RunGuard deploys it: the run, maxRestarts and the hard cap's time."""
    template = {
        "Resources": {"Handle": {"Type": "AWS::SNS::Topic"}},
        "Outputs": {
            "HorovodFleetRun": {"Value": RUN},
            "HorovodFleetMaxRestarts": {"Value": str(max_restarts)},
            "HorovodFleetDeadline": {"Value": f"{deadline:%Y-%m-%dT%H:%M:%S}Z"},
        },
    }
    cloudformation = boto3.client("cloudformation", region_name=REGION)
    cloudformation.update_stack(StackName="TrainStack", TemplateBody=json.dumps(template))


def fleet() -> list[str]:
    tags = {"aws:cloudformation:stack-id": train_stack_id(), "Project": "horovod-fleet"}
    return [launch(tags), launch(tags)]


def states(ids: list[str]) -> list[str]:
    ec2 = boto3.client("ec2", region_name=REGION)
    reservations = ec2.describe_instances(InstanceIds=ids)["Reservations"]
    found = {i["InstanceId"]: i["State"]["Name"] for r in reservations for i in r["Instances"]}
    return [found[i] for i in ids]


def fail_attempt(reason: str = NODE_LOST, attempt: int = 1, cause: str = "node_lost") -> None:
    done = {"run": RUN, "status": "failed", "cause": cause, "reason": reason, "attempt": attempt}
    s3 = boto3.client("s3", region_name=REGION)
    s3.put_object(Bucket=BUCKET, Key=f"runs/{RUN}/DONE.json", Body=json.dumps(done).encode())
    s3.put_object(Bucket=BUCKET, Key=f"runs/{RUN}/logs/node-0.log", Body=b"log")


def relaunch_recheck() -> dict:
    [payload] = [
        json.loads(s["Target"]["Input"])
        for s in schedules()
        if json.loads(s["Target"]["Input"])["reason"] == "relaunch"
    ]
    return payload


def test_a_lost_node_relaunches_the_fleet_instead_of_deleting_it(reaper, capsys):
    deploy_outputs(3, NOW + datetime.timedelta(hours=3))
    nodes = fleet()
    bystander = launch({"Project": "horovod-fleet"})
    fail_attempt()
    reaper.handle(s3_event(f"runs/{RUN}/DONE.json"))
    ended, stopping = decisions(capsys)
    assert ended["decision"] == "attempt-ended"
    assert ended["attempt"]["decision"] == "relaunch"
    assert stopping["decision"] == "relaunch-stop"
    assert stopping["stopped"] == sorted(nodes)
    assert set(states(nodes)) <= {"stopping", "stopped"}
    assert stack_status("TrainStack") == "UPDATE_COMPLETE"  # not deleted
    payload = relaunch_recheck()
    # The first try of the relaunch after attempt 1; a stack without a zone move plan (its
    # subnet given) has no zones to try.
    assert payload == {
        "trigger": "recheck",
        "reason": "relaunch",
        "run": RUN,
        "check": 1,
        "zones": [],
        "attempt": 1,
    }
    reaper.handle(payload)  # a minute later: every node stopped
    [started] = decisions(capsys)
    assert started["decision"] == "relaunched"
    assert (started["started"], started["replaced"]) == (sorted(nodes), {})
    assert states(nodes) == ["running", "running"]
    assert states([bystander]) == ["running"]
    reaper.handle(payload)  # a repeated re-check changes nothing
    assert decisions(capsys)[0]["decision"] == "relaunched"
    # The event again (S3 delivers at least once): DONE.json is gone, the attempt counted once.
    reaper.handle(s3_event(f"runs/{RUN}/DONE.json"))
    assert [d["decision"] for d in decisions(capsys)] == ["relaunch-under-way"]


def test_no_capacity_tries_again_later(reaper, capsys, monkeypatch):
    deploy_outputs(3, NOW + datetime.timedelta(hours=3))
    nodes = fleet()
    fail_attempt()
    reaper.handle(s3_event(f"runs/{RUN}/DONE.json"))
    decisions(capsys)

    def no_capacity(**kwargs):
        error = {"Code": "InsufficientInstanceCapacity", "Message": "no p4d.24xlarge capacity"}
        raise ClientError({"Error": error}, "StartInstances")

    monkeypatch.setattr(reaper.ec2, "start_instances", no_capacity)
    reaper.handle(relaunch_recheck())
    [waiting] = decisions(capsys)
    assert waiting["decision"] == "relaunch-no-capacity"
    assert waiting["error"] == "InsufficientInstanceCapacity"
    assert set(states(nodes)) <= {"stopping", "stopped"}
    assert len([s for s in schedules() if "relaunch" in s["Name"]]) == 2


def test_cdk_destroy_during_a_relaunch_starts_nothing(reaper, capsys):
    deploy_outputs(3, NOW + datetime.timedelta(hours=3))
    nodes = fleet()
    fail_attempt()
    reaper.handle(s3_event(f"runs/{RUN}/DONE.json"))
    decisions(capsys)
    set_train_stack_status("DELETE_IN_PROGRESS")
    reaper.handle(relaunch_recheck())
    [dropped] = decisions(capsys)
    assert dropped["decision"] == "relaunch-dropped"
    assert set(states(nodes)) <= {"stopping", "stopped"}


def test_restarts_exhausted_tears_the_fleet_down(reaper, capsys):
    deploy_outputs(0, NOW + datetime.timedelta(hours=3))
    nodes = fleet()
    fail_attempt()
    reaper.handle(s3_event(f"runs/{RUN}/DONE.json"))
    recorded = [d for d in decisions(capsys) if d["decision"] != "notified"]
    assert [d["decision"] for d in recorded] == ["attempt-ended", "delete-stack", "follow-delete"]
    assert recorded[0]["attempt"]["why"] == "restarts exhausted (0 of maxRestarts 0)"
    assert states(nodes) == ["running", "running"]  # CloudFormation's delete ends them


def test_a_non_retryable_end_is_not_relaunched(reaper, capsys):
    deploy_outputs(3, NOW + datetime.timedelta(hours=3))
    fleet()
    fail_attempt(
        "step 'training' failed: RuntimeError: horovodrun exited 1: error: bad flag",
        cause="trainer_input",
    )
    reaper.handle(s3_event(f"runs/{RUN}/DONE.json"))
    recorded = decisions(capsys)
    assert recorded[0]["attempt"]["decision"] == "teardown"
    assert "delete-stack" in [d["decision"] for d in recorded]


def test_the_hard_cap_near_stops_instead_of_relaunching(reaper, capsys):
    deploy_outputs(3, NOW + datetime.timedelta(minutes=10))
    fleet()
    fail_attempt()
    reaper.handle(s3_event(f"runs/{RUN}/DONE.json"))
    recorded = decisions(capsys)
    assert recorded[0]["attempt"]["decision"] == "stop"
    assert "hard cap" in recorded[0]["attempt"]["why"]


def test_a_node_ec2_terminated_cannot_be_relaunched_so_the_fleet_goes(reaper, capsys):
    """A retired host's instance is gone: starting the others would wait for it until restarts
    ran out. The fleet is deleted at once, and the e-mail says to deploy again."""
    template = {
        "Resources": {"Node0": {"Type": "AWS::EC2::Instance",
                                "Properties": {"ImageId": "ami-12c6146b"}}},
        "Outputs": {"HorovodFleetRun": {"Value": RUN}, "HorovodFleetMaxRestarts": {"Value": "3"},
                    "HorovodFleetDeadline": {"Value": "2026-11-22T09:00:00Z"}},
    }  # fmt: skip
    cloudformation = boto3.client("cloudformation", region_name=REGION)
    cloudformation.update_stack(StackName="TrainStack", TemplateBody=json.dumps(template))
    [node] = reaper.stack_instances(train_stack_id())
    boto3.client("ec2", region_name=REGION).terminate_instances(InstanceIds=[node])
    fail_attempt()
    reaper.handle(s3_event(f"runs/{RUN}/DONE.json"))
    recorded = decisions(capsys)
    assert [d["decision"] for d in recorded] == ["attempt-ended", "delete-stack", "follow-delete"]
    assert recorded[1]["reason"] == "relaunch-impossible" and recorded[1]["gone"] == [node]
    assert stack_status("TrainStack") in (None, "DELETE_COMPLETE")


# --- replacements: nodes EC2 terminated (Spot interruptions, retired hosts) -------------------


def launch_node(index: int, spot: bool) -> str:
    """Node `index` as CloudFormation launches it: its stack's tags and the fleet's."""
    ec2 = boto3.client("ec2", region_name=REGION)
    tags = {
        "aws:cloudformation:stack-id": train_stack_id(),
        "Project": "horovod-fleet",
        "horovod-fleet:stack": train_stack_id(),
        "horovod-fleet:node": str(index),
    }
    spec = [{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}]
    market = {"InstanceMarketOptions": {"MarketType": "spot"}} if spot else {}
    reservation = ec2.run_instances(
        ImageId="ami-12c6146b", MinCount=1, MaxCount=1, TagSpecifications=spec, **market
    )
    return reservation["Instances"][0]["InstanceId"]


def fleet_tags(stack_id: str, index: int) -> list[dict]:
    """The tags a node's replacement template puts on what it launches (stacks/train/fleet.py)."""
    return [
        {"Key": "Project", "Value": "horovod-fleet"},
        {"Key": "horovod-fleet:stack", "Value": stack_id},
        {"Key": "horovod-fleet:node", "Value": str(index)},
    ]


def deploy_replaceable_fleet(nodes: int, spot: bool) -> tuple[list[str], list[str]]:
    """TrainStack with a replacement template per node (stacks/train/fleet.py) and its nodes;
    returns the templates' ids and the instances' ids, in node order."""
    ec2 = boto3.client("ec2", region_name=REGION)
    stack_id = train_stack_id()
    templates = []
    for index in range(nodes):
        tags = fleet_tags(stack_id, index)
        created = ec2.create_launch_template(
            LaunchTemplateName=f"node{index}",
            LaunchTemplateData={
                "ImageId": "ami-12c6146b",
                "InstanceType": "p4d.24xlarge",
                "TagSpecifications": [{"ResourceType": "instance", "Tags": tags}],
            },
        )
        templates.append(created["LaunchTemplate"]["LaunchTemplateId"])
    template = {
        "Resources": {"Handle": {"Type": "AWS::SNS::Topic"}},
        "Outputs": {
            "HorovodFleetRun": {"Value": RUN},
            "HorovodFleetMaxRestarts": {"Value": "3"},
            "HorovodFleetDeadline": {"Value": "2026-11-22T09:00:00Z"},
            "HorovodFleetReplacementTemplates": {"Value": ",".join(templates)},
        },
    }
    boto3.client("cloudformation", region_name=REGION).update_stack(
        StackName="TrainStack", TemplateBody=json.dumps(template)
    )
    return templates, [launch_node(index, spot) for index in range(nodes)]


def node_instances() -> dict[str, list[str]]:
    """Live instances of the fleet by node index (the fleet's tag)."""
    ec2 = boto3.client("ec2", region_name=REGION)
    found: dict[str, list[str]] = {}
    pages = ec2.get_paginator("describe_instances").paginate(
        Filters=[
            {"Name": "tag:horovod-fleet:stack", "Values": [train_stack_id()]},
            {"Name": "instance-state-name", "Values": ["pending", "running", "stopped"]},
        ]
    )
    for instance in (i for p in pages for r in p["Reservations"] for i in r["Instances"]):
        tags = {t["Key"]: t["Value"] for t in instance["Tags"]}
        found.setdefault(tags["horovod-fleet:node"], []).append(instance["InstanceId"])
    return found


def interrupt(instance: str) -> None:
    """EC2's part in a Spot interruption: the instance is terminated."""
    boto3.client("ec2", region_name=REGION).terminate_instances(InstanceIds=[instance])


SPOT_INTERRUPTED = (
    "Spot interruption of node 1 (i-0abc, 10.0.1.23), terminate at 2026-11-22T04:30:00Z: "
    "every rank stopped at step 1200 and its checkpoint was saved"
)


def test_a_spot_interruption_replaces_every_node_from_its_template(reaper, capsys):
    """One-time Spot Instances cannot be stopped: the survivors are terminated too, and each
    node comes back as a new instance launched from its replacement template alone."""
    templates, nodes = deploy_replaceable_fleet(2, spot=True)
    interrupt(nodes[1])
    fail_attempt(SPOT_INTERRUPTED, cause="interrupted")
    reaper.handle(s3_event(f"runs/{RUN}/DONE.json"))
    ended, stopping = decisions(capsys)
    assert ended["attempt"]["decision"] == "relaunch"
    assert (stopping["stopped"], stopping["terminated"]) == ([], [nodes[0]])
    assert states(nodes) == ["terminated", "terminated"]
    reaper.handle(relaunch_recheck())
    [relaunched] = decisions(capsys)
    assert relaunched["decision"] == "relaunched" and relaunched["started"] == []
    assert sorted(relaunched["replaced"]) == ["0", "1"]
    by_node = node_instances()
    assert by_node == {node: [relaunched["replaced"][node]] for node in ("0", "1")}
    assert not set(relaunched["replaced"].values()) & set(nodes)
    ec2 = boto3.client("ec2", region_name=REGION)
    for node, instance in relaunched["replaced"].items():
        [reservation] = ec2.describe_instances(InstanceIds=[instance])["Reservations"]
        tags = {t["Key"]: t["Value"] for t in reservation["Instances"][0]["Tags"]}
        assert tags["aws:ec2launchtemplate:id"] == templates[int(node)]
    reaper.handle(relaunch_recheck())  # the same re-check again: every node is served
    [again] = decisions(capsys)
    assert again["replaced"] == {} and node_instances() == by_node


def test_an_on_demand_node_ec2_retired_is_replaced_and_the_rest_stop_and_start(reaper, capsys):
    _, nodes = deploy_replaceable_fleet(3, spot=False)
    interrupt(nodes[2])  # a retired host
    fail_attempt()
    reaper.handle(s3_event(f"runs/{RUN}/DONE.json"))
    _, stopping = decisions(capsys)
    assert (stopping["stopped"], stopping["terminated"]) == (sorted(nodes[:2]), [])
    reaper.handle(relaunch_recheck())
    [relaunched] = decisions(capsys)
    assert relaunched["started"] == sorted(nodes[:2])
    assert list(relaunched["replaced"]) == ["2"]
    assert states(nodes[:2]) == ["running", "running"]
    assert stack_status("TrainStack") == "UPDATE_COMPLETE"


def test_nodes_started_for_a_replacement_without_capacity_are_stopped_again(
    reaper, capsys, monkeypatch
):
    """They would bill while the fleet waits, up to an hour, for its missing node."""
    _, nodes = deploy_replaceable_fleet(3, spot=False)
    interrupt(nodes[2])
    fail_attempt()
    reaper.handle(s3_event(f"runs/{RUN}/DONE.json"))
    decisions(capsys)

    def no_capacity(**kwargs):
        error = {"Code": "InsufficientInstanceCapacity", "Message": "no p4d.24xlarge capacity"}
        raise ClientError({"Error": error}, "RunInstances")

    monkeypatch.setattr(reaper.ec2, "run_instances", no_capacity)
    reaper.handle(relaunch_recheck())
    [waiting] = decisions(capsys)
    assert waiting["decision"] == "relaunch-no-capacity"
    assert set(states(nodes[:2])) <= {"stopping", "stopped"}


def test_replacements_without_capacity_are_all_or_none_and_retried_later_and_later(
    reaper, capsys, monkeypatch
):
    deploy_replaceable_fleet(2, spot=True)
    fail_attempt(SPOT_INTERRUPTED, cause="interrupted")
    reaper.handle(s3_event(f"runs/{RUN}/DONE.json"))
    decisions(capsys)
    real_run = reaper.ec2.run_instances
    calls = []

    def second_finds_no_capacity(**kwargs):
        calls.append(kwargs)
        if len(calls) % 2 == 0:
            error = {"Code": "InsufficientInstanceCapacity", "Message": "no Spot capacity"}
            raise ClientError({"Error": error}, "RunInstances")
        return real_run(**kwargs)

    monkeypatch.setattr(reaper.ec2, "run_instances", second_finds_no_capacity)
    waits = []
    for check in (1, 2, 3):
        payload = relaunch_recheck()
        assert payload["check"] == check
        for schedule in schedules():
            boto3.client("scheduler", region_name=REGION).delete_schedule(Name=schedule["Name"])
        reaper.handle(payload)
        [waiting] = decisions(capsys)
        assert waiting["decision"] == "relaunch-no-capacity" and waiting["tries"] == check
        assert node_instances() == {}  # the one launched was terminated again
        waits.append(parse_at(relaunch_recheck_schedule()) - NOW)
    doubling = [NOW + datetime.timedelta(minutes=m) for m in (10, 20, 40)]
    assert waits == [reaper_module.recheck_time(NOW, 10, due) - NOW for due in doubling]
    assert len({call["ClientToken"] for call in calls}) == len(calls)


def relaunch_recheck_schedule() -> str:
    [expression] = [
        s["ScheduleExpression"]
        for s in schedules()
        if json.loads(s["Target"]["Input"])["reason"] == "relaunch"
    ]
    return expression


def parse_at(expression: str) -> datetime.datetime:
    moment = datetime.datetime.fromisoformat(expression.removeprefix("at(").removesuffix(")"))
    return moment.replace(tzinfo=datetime.timezone.utc)


def replacements_request(request_type: str) -> dict:
    return {
        "RequestType": request_type,
        "ResponseURL": "https://cloudformation-response.example/abc",
        "StackId": train_stack_id(),
        "RequestId": "req-9",
        "ResourceType": "Custom::HorovodFleetReplacements",
        "LogicalResourceId": "Replacements",
        "PhysicalResourceId": f"{RUN}-replacements",
        "ResourceProperties": {"ServiceToken": FUNCTION_ARN, "Run": RUN},
    }


def test_deleting_the_stack_terminates_the_replacements_cloudformation_does_not_know(
    reaper, capsys, monkeypatch
):
    replies = Replies()
    monkeypatch.setattr(reaper_module.urllib.request, "urlopen", replies)
    _, nodes = deploy_replaceable_fleet(2, spot=True)
    interrupt(nodes[1])
    fail_attempt(SPOT_INTERRUPTED, cause="interrupted")
    reaper.handle(s3_event(f"runs/{RUN}/DONE.json"))
    reaper.handle(relaunch_recheck())
    replaced = decisions(capsys)[-1]["replaced"]
    bystander = launch({"Project": "horovod-fleet"})
    reaper.handle(replacements_request("Create"))
    reaper.handle(replacements_request("Delete"))
    assert [r["Status"] for r in replies.bodies] == ["SUCCESS", "SUCCESS"]
    assert states(list(replaced.values())) == ["terminated", "terminated"]
    assert states([bystander]) == ["running"]
    recorded = decisions(capsys)
    assert recorded[-1]["decision"] == "replacements"
    assert sorted(recorded[-1]["terminated"]) == sorted(replaced.values())
    # The delete is followed: a DELETE_FAILED (an interface still held) is retried.
    assert any(json.loads(s["Target"]["Input"])["reason"] == "deleting" for s in schedules())
