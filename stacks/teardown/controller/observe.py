"""What the tick reads of the run, every time, into one plain snapshot (decide.py judges it):

- TrainStack: its status and stack-level tags (a stack being created has no outputs), and the
  outputs it has (the replacement template, the zones, the cap's exact time);
- every instance carrying the fleet's tag, whatever stack it names: state, launch time, launch
  token, node tag (orphans included);
- the run's records in S3: attempts.json, DONE.json (and its ETag), controller.json,
  status.json, the nodes' heartbeats (their registrations' LastModified), the launch
  assignments; for an elastic fleet (one with a head) the head's heartbeat (head.json's
  LastModified) and every launch assignment's content;
- the run's executions of the state machine (its long actions);
- the idle alarm's state, read, not waited for; when it is in ALARM, the newest checkpoint's
  time and when the stack last finished deploying;
- the hard cap's time: TrainStack's output, or while it is created (no outputs yet) its
  one-time schedule's `at()` (the cap's schedule is named after the run: CAP_SCHEDULE_PREFIX).

With no TrainStack it reads only the stack and the instances (orphans).
Only boto3, the standard library and contract/: part of the run controller's Lambda asset.
"""

import datetime

import ec2_fleet
import executions
import records
import train_stack
from clients import client, setting

from contract import runs
from contract.names import CAP_SCHEDULE_PREFIX, HEAD_NODE


def observe(now: datetime.datetime) -> dict:
    stack = train_stack.describe()
    snapshot = {
        "stack": stack,
        "instances": ec2_fleet.every_fleet_instance(),
        "records": None,
        "executions": [],
        "alarm": None,
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
    history = records.read_json(s3, bucket, runs.key(run, runs.ATTEMPTS)) or {}
    done, done_etag = records.read(s3, bucket, runs.key(run, runs.DONE))
    unclaimed = [
        i
        for i in snapshot["instances"]
        if i["stack"] == stack["id"] and not i["cloudformation"] and not i["node"]
    ]
    snapshot["records"] = {
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
        # An elastic fleet: what replace_lost judges a node by (decide.py).
        snapshot["records"]["head_beat"] = records.last_modified(
            s3, bucket, runs.key(run, runs.HEAD)
        )
        snapshot["records"]["assignments"] = records.assignments(s3, bucket, run)
    snapshot["executions"] = executions.of_run(run, stack["id"])
    snapshot["alarm"] = idle_alarm(run)
    if (snapshot["alarm"] or {}).get("state") == "ALARM":
        snapshot["records"]["checkpoint_at"] = records.newest_checkpoint(s3, bucket, run)
        stack["deployed_at"] = train_stack.deployed_at(stack["id"], stack["created_at"])
    return snapshot


def idle_alarm(run: str) -> dict | None:
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
