"""What the tick reads of the run, every time, into one plain snapshot (decide.py judges it), in
two parts: first the world the guards are decided on, then the run's records in S3.

`world`: what CloudFormation, EC2, Scheduler, Step Functions and CloudWatch say:
- TrainStack: its status and stack-level tags (a stack being created has no outputs), and the
  outputs it has (the replacement template, the zones, the cap's exact time); while it is
  created, the hard cap's time from its one-time schedule's `at()` (named after the run,
  contract/names.py CAP_SCHEDULE_PREFIX);
- every instance carrying the fleet's tag, whatever stack it names: state, launch time, launch
  token, node tag (orphans included);
- the run's executions of the state machine (its long actions);
- the idle alarm's state, read, not waited for; when it is in ALARM, when the stack last
  finished deploying, and the newest checkpoint's time (S3);
- an operator's hold (runs/<run>/hold.json, S3).
The two reads of S3 among them are the guards' only ones, and a failing one is taken as no
answer: it is kept in `failed` (the tick raises it once the guards have acted) and the guards
decide without it (decide_guards.py says how).

`run_records`: the run's records in S3, read once no guard owns the tick: attempts.json, DONE.json
(and its ETag), controller.json, status.json, the nodes' heartbeats (their registrations'
LastModified), the launch assignments; for an elastic fleet (one with a head) the head's
heartbeat (head.json's LastModified) and every launch assignment's content. A refused read
fails the tick (records.py).

With no TrainStack it reads only the stack and the instances (orphans).
Only boto3, the standard library and contract/: part of the run controller's Lambda asset.
"""

import datetime

from contract import runs
from contract.names import CAP_SCHEDULE_PREFIX, HEAD_NODE
from controller import ec2_fleet, executions, records, train_stack
from controller.clients import client, log, setting
from controller.snapshot import Alarm, Records, Snapshot


def world(now: datetime.datetime, failed: list[Exception]) -> Snapshot:
    """The snapshot the guards are decided on, `records` None; each failed read of S3 in
    `failed`."""
    stack = train_stack.describe()
    snapshot: Snapshot = {
        "stack": stack,
        "instances": ec2_fleet.every_fleet_instance(),
        "records": None,
        "executions": [],
        "alarm": None,
        "checkpoint_at": None,
        "hold": None,
        "settings": {
            "idle_minutes": int(setting("IDLE_MINUTES")),
            "replacements_per_node": int(setting("REPLACEMENTS_PER_NODE")),
        },
    }
    if train_stack.gone(stack) or not stack["run"]:
        return snapshot
    run, s3, bucket = stack["run"], client("s3"), setting("BUCKET")
    if stack["deadline"] is None:
        stack["deadline"] = cap_schedule(run)
    snapshot["executions"] = executions.of_run(run, stack["id"])
    snapshot["alarm"] = idle_alarm(run)
    if (snapshot["alarm"] or {}).get("state") == "ALARM":
        stack["deployed_at"] = train_stack.deployed_at(stack["id"], stack["created_at"])
        snapshot["checkpoint_at"] = unless_failed(
            lambda: records.newest_checkpoint(s3, bucket, run), failed
        )
    snapshot["hold"] = unless_failed(lambda: records.hold(s3, bucket, run), failed)
    return snapshot


def unless_failed(read, failed: list[Exception]):
    """`read()`, or None with its error kept in `failed`."""
    try:
        return read()
    except Exception as error:  # any failure: the guards go on without this read
        log("read-failed", error=f"{type(error).__name__}: {error}"[:300])
        failed.append(error)
        return None


def run_records(snapshot: Snapshot) -> Records:
    """The run's records in S3 (a refused read raises)."""
    stack = snapshot["stack"]
    run, s3, bucket = stack["run"], client("s3"), setting("BUCKET")
    history = records.read_json(s3, bucket, runs.key(run, runs.ATTEMPTS)) or {}
    done, done_etag = records.read(s3, bucket, runs.key(run, runs.DONE))
    unclaimed = [
        i
        for i in snapshot["instances"]
        if i["stack"] == stack["id"] and not i["cloudformation"] and not i["node"]
    ]
    found = {
        "attempts": records.entries(history),
        "controller_failures": history.get("controller_failures") or [],
        "done": done,
        "done_etag": done_etag,
        "controller": records.read_json(s3, bucket, runs.key(run, runs.CONTROLLER)) or {},
        "status": records.read_json(s3, bucket, runs.key(run, runs.STATUS)),
        "heartbeats": records.heartbeats(s3, bucket, run),
        # Only asked for when an instance of the stack has no node tag yet.
        "assigned": records.assigned(s3, bucket, run) if unclaimed else set(),
    }
    if any(i["stack"] == stack["id"] and i["node"] == HEAD_NODE for i in snapshot["instances"]):
        # An elastic fleet: what replace_lost judges a node by (replace.py).
        found["head_beat"] = records.last_modified(s3, bucket, runs.key(run, runs.HEAD))
        found["assignments"] = records.assignments(s3, bucket, run)
    return found


def idle_alarm(run: str) -> Alarm | None:
    """The run's idle alarm as CloudWatch holds it now: {"state", "since"}; None without one."""
    alarm_name = f"{setting('IDLE_ALARM_PREFIX')}{run}"
    alarms = client("cloudwatch").describe_alarms(AlarmNames=[alarm_name])["MetricAlarms"]
    if not alarms:
        return None
    return {"state": alarms[0]["StateValue"], "since": alarms[0]["StateUpdatedTimestamp"]}


def cap_schedule(run: str) -> datetime.datetime | None:
    """When the run's hard-cap schedule fires (its `at(YYYY-MM-DDTHH:MM:SS)` in UTC); None
    before CloudFormation made it."""
    scheduler = client("scheduler")
    try:
        found = scheduler.get_schedule(Name=f"{CAP_SCHEDULE_PREFIX}{run}")
    except scheduler.exceptions.ResourceNotFoundException:
        return None
    at = found["ScheduleExpression"].removeprefix("at(").removesuffix(")")
    return datetime.datetime.fromisoformat(at).replace(tzinfo=datetime.timezone.utc)
