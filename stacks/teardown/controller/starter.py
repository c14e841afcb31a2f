"""The run controller's starter: every trigger invokes it, and it starts the one execution that
handles what the trigger says, by name (executions.py), or nothing.

    S3 "Object Created" runs/<run>/DONE.json      the attempt it names ended
    EC2 Spot Instance Interruption Warning         a fleet node will be reclaimed
    EC2 Instance State-change Notification         a fleet node stopped or went
    the idle alarm (its Lambda action)             the fleet's GPUs sat idle
    the hard cap (its Scheduler schedule)          the run's time is up

EventBridge rules cannot name an execution (a rule target has no Step Functions parameters), so
this function does, and a duplicate delivery of any trigger finds its name taken and does
nothing. EC2's events carry no tags: the instance is looked up, and anything but a node of the
deployed TrainStack is dropped. They are judged against the fleet as it is, not the event: while
an attempt's execution is live the fleet is its own (its stops and starts make such events),
and a fleet whose every node is up has nothing to recover.
Only boto3 and the standard library: part of the run controller's Lambda asset.
"""

import re

import ec2_fleet
import executions
import records
import train_stack
from clients import client, log, setting

DONE_KEY = re.compile(r"^runs/(?P<run>[^/]+)/DONE\.json$")
SPOT_WARNING = "EC2 Spot Instance Interruption Warning"
STATE_CHANGE = "EC2 Instance State-change Notification"


def handler(event: dict, _context=None) -> dict:
    """Start the execution for `event`; returns what was decided (for the log and tests)."""
    if event.get("source") == "aws.s3":
        key = event.get("detail", {}).get("object", {}).get("key", "")
        match = DONE_KEY.match(key)
        decided = done(match["run"]) if match else {"ignored": key}
    elif event.get("source") == "aws.ec2" and event.get("detail-type") in (
        SPOT_WARNING,
        STATE_CHANGE,
    ):
        decided = ec2(event)
    elif event.get("source") == "aws.cloudwatch" and "alarmData" in event:
        decided = idle(event["alarmData"])
    elif event.get("trigger") == "hard-cap" and event.get("run"):
        decided = hard_cap(event["run"])
    else:
        decided = {"ignored": event.get("detail-type") or event.get("source")}
    log("starter", event=decided)
    return decided


def deployed(run: str) -> dict | None:
    """TrainStack when it is deployed for `run` and not going away."""
    stack = train_stack.describe()
    if train_stack.gone(stack) or stack["run"] != run:
        return None
    return stack


def done(run: str) -> dict:
    """A DONE.json: the execution of the attempt it names."""
    s3, bucket = client("s3"), setting("BUCKET")
    document = records.read_json(s3, bucket, records.key(run, "DONE.json"))
    stack = deployed(run)
    # The controller's own (a relaunch given up, an attempt EC2 ended) is handled by the
    # execution that wrote it.
    if document is None or document.get("written_by") == "controller" or stack is None:
        return {"ignored": "done", "run": run, "deployed": stack is not None}
    attempt = document.get("attempt") or records.current_attempt(s3, bucket, run)
    name = executions.attempt_name(run, attempt, stack["id"])
    return begin(name, {"run": run, "attempt": attempt, "trigger": "done"})


def ec2(event: dict) -> dict:
    """A fleet node's Spot notice or state change, when no attempt's execution of the run is
    live and the fleet is no longer whole: an execution that waits for the attempt's DONE.json
    and writes it when none comes (steps.watch)."""
    kind = "spot-warning" if event["detail-type"] == SPOT_WARNING else "instance-state"
    detail = event.get("detail", {})
    instance_id = detail.get("instance-id", "")
    node = ec2_fleet.instance(instance_id) if instance_id else None
    stack = train_stack.describe()
    fleet_node = node is not None and stack is not None and node["stack"] == stack["id"]
    if not fleet_node or train_stack.gone(stack) or train_stack.busy(stack):
        return {"ignored": kind, "instance": instance_id}
    if train_stack.deleting(stack) or not stack["run"]:
        return {"ignored": kind, "instance": instance_id, "stack": stack["status"]}
    run = stack["run"]
    if live := executions.live(run, attempts_only=True):
        return {"deferred": kind, "instance": instance_id, "to": [e["name"] for e in live]}
    fleet = ec2_fleet.nodes(stack["id"])
    count = train_stack.node_count(stack)
    if kind == "instance-state" and ec2_fleet.whole(count, fleet):
        return {"ignored": kind, "instance": instance_id, "fleet": "whole"}
    if kind == "spot-warning" and node["state"] not in ec2_fleet.LIVE_STATES:
        # A notice delivered after its node went: the node's state change speaks for it.
        return {"ignored": kind, "instance": instance_id, "node": node["state"]}
    attempt = records.current_attempt(client("s3"), setting("BUCKET"), run)
    document = {
        "run": run,
        "attempt": attempt,
        "trigger": kind,
        "instance": instance_id,
        "spot": node["spot"],
    }
    what = detail.get("state") or detail.get("instance-action") or kind
    return begin(executions.ec2_name(run, attempt, stack["id"], instance_id, what), document)


def idle(alarm: dict) -> dict:
    """The idle alarm entered ALARM: an execution for this ALARM (its state's timestamp), which
    waits for a live attempt's execution before it judges."""
    metrics = alarm.get("configuration", {}).get("metrics") or [{}]
    dimensions = metrics[0].get("metricStat", {}).get("metric", {}).get("dimensions", {})
    run, stack = dimensions.get("Run"), None
    if run:
        stack = deployed(run)
    if stack is None:
        return {"ignored": "idle", "alarm": alarm.get("alarmName")}
    at = alarm.get("state", {}).get("timestamp", "")
    attempt = records.current_attempt(client("s3"), setting("BUCKET"), run)
    name = executions.idle_name(run, attempt, stack["id"], at)
    return begin(name, {"run": run, "attempt": attempt, "trigger": "idle"})


def hard_cap(run: str) -> dict:
    stack = deployed(run)
    if stack is None:
        return {"ignored": "hard-cap", "run": run}
    attempt = records.current_attempt(client("s3"), setting("BUCKET"), run)
    name = executions.cap_name(run, stack["id"])
    return begin(name, {"run": run, "attempt": attempt, "trigger": "hard-cap"})


def begin(name: str, document: dict) -> dict:
    arn = executions.start(name, document)
    return {"execution": name, "started": arn is not None, **document}
