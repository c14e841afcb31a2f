"""The tick's actions (decide.py lists them), done in order. Each is idempotent, so a tick that
dies midway, or two ticks at once, leave the run as one tick would: executions by name, records
by conditional write, terminations and stops of what is already ended changing nothing. A
failing action raises: the tick fails loudly (its error alarm), and the next tick decides again
from the world.
Only boto3 and the standard library: part of the run controller's Lambda asset.
"""

import datetime

import ec2_fleet
import executions
import records
from clients import client, log, setting, stamp
from notify import notify


def act(actions: list[dict], snapshot: dict, now: datetime.datetime) -> None:
    for action in actions:
        log("act", **{k: v for k, v in action.items() if k not in ("input", "fleet")})
        DO[action["do"]](action, snapshot, now)


def context(snapshot: dict) -> tuple:
    return client("s3"), setting("BUCKET"), snapshot["stack"]["run"]


def terminate(action: dict, snapshot: dict, now) -> None:
    ec2_fleet.terminate(action["ids"])


def stop_billing(action: dict, snapshot: dict, now) -> None:
    ec2_fleet.stop_billing(action["fleet"])


def record(action: dict, snapshot: dict, now) -> None:
    s3, bucket, run = context(snapshot)
    records.append_attempt(s3, bucket, run, action["entry"], snapshot["stack"]["max_restarts"])


def delete_done(action: dict, snapshot: dict, now) -> None:
    s3, bucket, run = context(snapshot)
    if action["etag"]:
        records.delete_done(s3, bucket, run, action["etag"])


def write_done(action: dict, snapshot: dict, now) -> None:
    s3, bucket, run = context(snapshot)
    written = records.write_done(
        s3,
        bucket,
        run,
        attempt=action["attempt"],
        status=action["status"],
        cause=action["cause"],
        reason=action["reason"],
        at=stamp(now),
        earlier=(snapshot["records"] or {}).get("attempts") or [],
    )
    log("done-written" if written else "done-was-there", run=run, attempt=action["attempt"])


def start(action: dict, snapshot: dict, now) -> None:
    """The long action's execution; only a start that started it says so and mails."""
    arn = executions.start(action["name"], action["input"])
    if arn is None:
        return
    s3, bucket, run = context(snapshot)
    fields = {"execution": arn, "controller_state": "Started", **action["tell"]}
    records.update_controller(
        s3, bucket, run, at=stamp(now), stack_id=snapshot["stack"]["id"], **fields
    )
    if action.get("mail"):
        notify(snapshot["stack"], run, action["mail"])


def stop_executions(action: dict, snapshot: dict, now) -> None:
    executions.stop(action["arns"], action["why"])


def record_failure(action: dict, snapshot: dict, now) -> None:
    s3, bucket, run = context(snapshot)
    records.record_failure(s3, bucket, run, action["failure"])


def tell(action: dict, snapshot: dict, now) -> None:
    s3, bucket, run = context(snapshot)
    records.update_controller(s3, bucket, run, at=stamp(now), **action["fields"])


DO = {
    "terminate": terminate,
    "stop_billing": stop_billing,
    "record": record,
    "delete_done": delete_done,
    "write_done": write_done,
    "start": start,
    "stop_executions": stop_executions,
    "record_failure": record_failure,
    "tell": tell,
}
