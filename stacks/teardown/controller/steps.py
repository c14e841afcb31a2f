"""The run controller's first and last states (stacks/teardown/workflow.py): Record, which
judges the trigger and records the attempt, and StopBilling, where every failure ends.

Each handler takes the execution's state (the starter's input plus what earlier states put
under their result paths) and returns its own result; the workflow chooses the next state on
`next`. Every handler is idempotent: a retried state does what it did once.
Only boto3 and the standard library: part of the run controller's Lambda asset.
"""

import datetime
import json
import math

import ec2_fleet
import executions
import records
import recovery
import train_stack
import zones
from clients import client, log, now, parse_stamp, setting, stamp, step
from notify import notify

# How long a state waits before it looks again at what it waits for.
RECHECK = datetime.timedelta(minutes=10)
# After EC2 said a node went (a Spot notice, a state change) and no DONE.json is there: the
# leader's own DONE.json is awaited this long first (a Spot notice comes two minutes ahead).
# https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html
NOTICE = datetime.timedelta(minutes=3)
EC2_TRIGGERS = ("spot-warning", "instance-state")


def seconds(delta: datetime.timedelta) -> int:
    """A Wait state's SecondsPath takes a whole number of seconds, 0 or more."""
    return max(math.ceil(delta.total_seconds()), 0)


def wait(delta: datetime.timedelta, **fields) -> dict:
    return {"next": "wait", "wait_s": seconds(delta), **fields}


@step
def record(event: dict) -> dict:
    """Judge the trigger against TrainStack and the fleet as they are now (a late or repeated
    trigger finds nothing to do), then record the attempt it ends."""
    run, trigger = event["run"], event["trigger"]
    stack = train_stack.describe(event.get("stack_id") or train_stack.TRAIN_STACK)
    if train_stack.gone(stack):
        log("already-gone", run=run, trigger=trigger)
        return {"next": "nothing", "stack_id": None}
    seen = {"stack_id": stack["id"]}
    if train_stack.deleting(stack):
        return {"next": "follow", **seen}
    if train_stack.busy(stack):
        log("stack-busy", run=run, trigger=trigger, status=stack["status"])
        return wait(RECHECK, **seen)
    if stack["run"] != run:
        log("other-run-deployed", run=run, deployed=stack["run"], trigger=trigger)
        return {"next": "nothing", **seen}
    if trigger in EC2_TRIGGERS:
        return {**watch(event, stack), **seen}
    if trigger != "idle":  # an idle alarm's execution may only wait: the run's is elsewhere
        tell(event, "Record")
    if trigger == "hard-cap":
        executions.stop_others(run, event["execution"]["arn"], "the hard cap ends the run")
        notify(stack, run, "reached its hard cap: the run controller is deleting its fleet")
        return {"next": "delete", "reason": "hard-cap", **seen}
    if trigger == "idle":
        return {**judge_idle(event, stack), **seen}
    return {**end_attempt(event, stack), **seen}


def tell(event: dict, state: str, **fields) -> None:
    """controller.json names the execution that handles the run now, and its state."""
    records.update_controller(
        client("s3"),
        setting("BUCKET"),
        event["run"],
        at=stamp(now()),
        execution=event["execution"]["arn"],
        controller_state=state,
        **fields,
    )


def end_attempt(event: dict, stack: dict) -> dict:
    """The attempt's entry in attempts.json, recorded now from its DONE.json or found recorded
    (a retried state), and where the workflow goes with it."""
    run, attempt = event["run"], event["attempt"]
    entry = recorded(run, attempt) or record_done(stack, run, attempt)
    if entry is None:
        log("nothing-ended", run=run, attempt=attempt)
        return {"next": "nothing"}
    log("attempt-ended", run=run, attempt=entry)
    if entry["decision"] == "relaunch":
        return relaunch(event, stack, entry)
    if entry["decision"] == "stop":
        notify(stack, run, f"ended attempt {entry['attempt']}: {entry['why']}")
    return {"next": "teardown", "entry": entry}


def watch(event: dict, stack: dict) -> dict:
    """EC2 said a node of the fleet goes or went. The leader's DONE.json is awaited for the
    notice; when none came and the fleet is not whole, the controller writes the attempt's
    (its nodes could not: a whole fleet reclaimed, a leader lost without a word). Then the
    attempt's own execution is started, which records it: by its name, once."""
    run, attempt = event["run"], event["attempt"]
    if recorded(run, attempt) is None and done_of(run, attempt) is None:
        if not (event.get("record") or {}).get("noticed"):
            return wait(NOTICE, noticed=True)
        fleet = ec2_fleet.nodes(stack["id"])
        count = train_stack.node_count(stack)
        if ec2_fleet.whole(count, fleet):
            log("fleet-whole", run=run, attempt=attempt, trigger=event["trigger"])
            return {"next": "nothing"}
        spot = any(n["spot"] for n in fleet) or event.get("spot")
        cause, status = ("interrupted", "interrupted") if spot else ("node_lost", "failed")
        lost = [n["id"] for n in fleet if n["state"] not in ec2_fleet.UP_STATES]
        reason = (
            f"EC2 ended node(s) {', '.join(lost) or event.get('instance')} of the fleet "
            f"({event['trigger']}) and no node wrote DONE.json"
        )
        records.write_done(
            client("s3"),
            setting("BUCKET"),
            run,
            attempt=attempt,
            status=status,
            cause=cause,
            reason=reason,
            at=stamp(now()),
        )
    name = executions.attempt_name(run, attempt, stack["id"])
    executions.start(name, {"run": run, "attempt": attempt, "trigger": "done"})
    return {"next": "nothing", "handled_by": name}


def recorded(run: str, attempt: int) -> dict | None:
    found = [
        e
        for e in records.attempts(client("s3"), setting("BUCKET"), run)
        if e.get("attempt") == attempt
    ]
    return found[-1] if found else None


def done_of(run: str, attempt: int) -> dict | None:
    """The run's DONE.json when it is this attempt's."""
    done = records.read_json(client("s3"), setting("BUCKET"), records.key(run, "DONE.json"))
    return done if done is not None and done.get("attempt", attempt) == attempt else None


def record_done(stack: dict, run: str, attempt: int) -> dict | None:
    """controller.end_attempt for this attempt's DONE.json; None when there is none."""
    if done_of(run, attempt) is None:
        return None
    s3, bucket = client("s3"), setting("BUCKET")
    return recovery.end_attempt(
        s3,
        bucket,
        run,
        max_restarts=stack["max_restarts"],
        now=now(),
        deadline=train_stack.deadline_of(stack),
    )


def relaunch(event: dict, stack: dict, entry: dict) -> dict:
    """Where the relaunch goes: the fleet's zones in try order, its current one first. A
    fleet without the replacement template cannot bring back a node EC2 terminated: it goes
    now, its results being in S3."""
    run = event["run"]
    fleet = ec2_fleet.nodes(stack["id"])
    lost = sorted(set(train_stack.instances(stack["id"])) - {n["id"] for n in fleet})
    if not stack["template"] and lost:
        notify(
            stack,
            run,
            f"ended attempt {entry['attempt']} ({entry['reason']}); it cannot be relaunched: "
            f"instance(s) {', '.join(lost)} no longer exist, so the run controller is deleting "
            "the fleet; deploy again to resume from the newest checkpoint",
        )
        return {"next": "delete", "reason": "relaunch-impossible", "entry": entry}
    here = next((n["zone"] for n in fleet if n["state"] in ec2_fleet.LIVE_STATES), None)
    order = zones.try_order(stack["zones"], here)
    notify(
        stack,
        run,
        f"ended attempt {entry['attempt']} ({entry['reason']}); the fleet is relaunched "
        f"({entry['why']}) and resumes from its newest checkpoint",
    )
    nodes = train_stack.node_count(stack)
    return {"next": "relaunch", "entry": entry, "zones": order, "nodes": nodes}


def judge_idle(event: dict, stack: dict) -> dict:
    """The idle alarm: the fleet goes once it has been quiet for the idle window since its last
    progress (the alarm's onset or its newest checkpoint) and has had the launch grace since it
    was deployed or relaunched. The alarm is asked live; an attempt's execution that is live
    (a relaunch waiting for capacity, whose nodes publish no metric) is waited for first."""
    run = event["run"]
    if others := executions.live(run, attempts_only=True):
        log("idle-deferred", run=run, to=[e["name"] for e in others])
        return wait(RECHECK, deferred_to=[e["name"] for e in others])
    name = f"{setting('IDLE_ALARM_PREFIX')}{run}"
    alarms = client("cloudwatch").describe_alarms(AlarmNames=[name])["MetricAlarms"]
    if not alarms or alarms[0]["StateValue"] != "ALARM":
        log("idle-cleared", run=run)
        return {"next": "nothing"}
    idle_since = alarms[0]["StateUpdatedTimestamp"]
    window = datetime.timedelta(minutes=int(setting("IDLE_MINUTES")))
    grace = datetime.timedelta(minutes=int(setting("LAUNCH_GRACE_MINUTES")))
    checkpoint = records.newest_checkpoint(client("s3"), setting("BUCKET"), run)
    relaunched = [
        parse_stamp(e["decided_at"])
        for e in records.attempts(client("s3"), setting("BUCKET"), run)
        if e.get("decision") == "relaunch" and e.get("decided_at")
    ]
    deployed = max([train_stack.deployed_at(stack["id"], now()), *relaunched])
    quiet_from = idle_since - window
    progress = max(quiet_from, checkpoint) if checkpoint else quiet_from
    due = max(progress + window, deployed + grace)
    facts = {"idle_since": idle_since, "checkpoint": checkpoint, "deployed": deployed}
    if now() < due:
        log("idle-wait", run=run, due=due, **facts)
        return wait(due - now())
    tell(event, "Record")
    notify(stack, run, f"sat idle since {idle_since}: the run controller is deleting its fleet")
    return {"next": "delete", "reason": "idle", "facts": json.loads(json.dumps(facts, default=str))}


@step
def stop_billing(event: dict) -> dict:
    """Where every failure of the workflow ends (its Catch): the run's nodes stop billing, and
    attempts.json and controller.json say that the controller failed, where and why. The execution
    fails next, and its alarm mails the budget address."""
    run = event["run"]
    error = event.get("error") or {}
    try:
        cause = json.loads(error.get("Cause") or "{}").get("errorMessage") or error.get("Cause")
    except ValueError:
        cause = error.get("Cause")
    stack = train_stack.describe((event.get("record") or {}).get("stack_id") or "TrainStack")
    stopped = {"stopped": [], "terminated": []}
    if stack is not None and stack["run"] == run:
        stopped = ec2_fleet.stop_billing(ec2_fleet.nodes(stack["id"]))
    arn = event["execution"]["arn"]
    failure = {
        "execution": arn,
        "error": error.get("Error"),
        "cause": (cause or "")[:1000],
        "at": stamp(now()),
        **stopped,
    }
    records.record_failure(client("s3"), setting("BUCKET"), run, failure)
    tell(
        event,
        "Failed",
        reason=f"the run controller failed ({failure['error']}: {failure['cause'][:200]}); the "
        "fleet's nodes were stopped; see the execution in the Step Functions console",
    )
    log("controller-failed", run=run, **failure)
    return failure
