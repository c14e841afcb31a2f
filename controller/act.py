"""The tick's actions (decide.py lists them), done in order. Each is idempotent, so a tick that
dies midway, or two ticks at once, leave the run as one tick would: executions by name, records
by conditional write, terminations and stops of what is already ended changing nothing. A
failing action raises: the tick fails loudly (its error alarm), and the next tick decides again
from the world.
Only boto3, the standard library and contract/: part of the run controller's Lambda asset.
"""

import datetime

from botocore.exceptions import ClientError

from contract.runs import stamp
from controller import ec2_fleet, executions, records
from controller.actions import (
    Action,
    DeleteDone,
    Record,
    RecordFailure,
    Replace,
    Start,
    StopBilling,
    StopExecutions,
    Tag,
    Tell,
    Terminate,
    WriteDone,
)
from controller.clients import client, error_code, error_message, log, setting, throttled
from controller.notify import notify
from controller.snapshot import Snapshot


def act(actions: list[Action], snapshot: Snapshot, now: datetime.datetime) -> None:
    for action in actions:
        log("act", **{k: v for k, v in action.items() if k not in ("input", "fleet")})
        DO[action["do"]](action, snapshot, now)


def context(snapshot: Snapshot) -> tuple:
    return client("s3"), setting("BUCKET"), snapshot["stack"]["run"]


def terminate(action: Terminate, snapshot: Snapshot, now) -> None:
    ec2_fleet.terminate(action["ids"])


def replace(action: Replace, snapshot: Snapshot, now) -> None:
    """One new instance for a lost node of the elastic fleet (replace.replace_lost), launched
    from the replacement template in the fleet's zone under the loss's own ClientToken
    (ec2_fleet.replacement_token: the run, the attempt, the node, the instance lost). An
    instance that token launched already, by this tick or another that overlapped it or died
    after its launch, is found by the token first and not launched again; were EC2's answer to
    that lag too, RunInstances with the same token answers with the same instance. Then its
    launch assignment, which the node waits for at boot, written only where none is (so the
    first tick's number stands and the node's budget is spent once), and its node tag. A
    refusal (no capacity, say) is a spent try, in controller.json; a throttled call fails the
    tick, and the next one asks again."""
    stack = snapshot["stack"]
    s3, bucket, run = context(snapshot)
    index, attempt, number = action["node"], action["attempt"], action["number"]
    token = ec2_fleet.replacement_token(run, attempt, index, action["replaces"])
    zone = action["zone"]
    entry = {"stack_id": stack["id"], "attempt": attempt, "node": index, "number": number,
             "replaces": action["replaces"], "why": action["why"], "at": stamp(now)}  # fmt: skip
    try:
        earlier = ec2_fleet.launched_with(token)
        [instance_id] = earlier[:1] or ec2_fleet.run_instances(stack["template"], 1, zone, token)
    except ClientError as error:
        if (retry := throttled(error)) is not None:
            raise retry from error
        refused = f"{error_code(error)}: {error_message(error)}"
        log("replace-refused", run=run, node=index, error=refused)
        records.note_replacement(
            s3, bucket, run, {**entry, "instance_id": None, "refused": refused}, stamp(now)
        )
        return
    assignment = {"node_index": index, "instance_id": instance_id, "run": run, "attempt": attempt,
                  "zone": zone["zone"], "replacement": number, "replaces": action["replaces"],
                  "launched_at": stamp(now)}  # fmt: skip
    number = records.claim_launch(s3, bucket, run, instance_id, assignment).get("replacement")
    ec2_fleet.tag_node(instance_id, index)
    records.note_replacement(
        s3, bucket, run, {**entry, "number": number, "instance_id": instance_id}, stamp(now)
    )
    log("replaced", run=run, node=index, instance=instance_id, number=number, found=bool(earlier))
    if not earlier:
        notify(stack, run, f"node {index} was lost ({action['why']}): the fleet trains on "
               f"without it, and {instance_id} replaces it")  # fmt: skip


def tag(action: Tag, snapshot: Snapshot, now) -> None:
    """The node tag of a replacement an earlier tick launched and assigned, then died."""
    s3, bucket, run = context(snapshot)
    ec2_fleet.tag_node(action["id"], action["node"])
    entry = {"stack_id": snapshot["stack"]["id"], "attempt": action["attempt"],
             "node": action["node"], "number": action["number"], "instance_id": action["id"],
             "at": stamp(now)}  # fmt: skip
    records.note_replacement(s3, bucket, run, entry, stamp(now))


def stop_billing(action: StopBilling, snapshot: Snapshot, now) -> None:
    ec2_fleet.stop_billing(action["fleet"])


def record(action: Record, snapshot: Snapshot, now) -> None:
    s3, bucket, run = context(snapshot)
    records.append_attempt(s3, bucket, run, action["entry"], snapshot["stack"]["max_restarts"])


def delete_done(action: DeleteDone, snapshot: Snapshot, now) -> None:
    s3, bucket, run = context(snapshot)
    if action["etag"]:
        records.delete_done(s3, bucket, run, action["etag"])


def write_done(action: WriteDone, snapshot: Snapshot, now) -> None:
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


def start(action: Start, snapshot: Snapshot, now) -> None:
    """The long action's execution; only a start that started it says so and mails."""
    arn = executions.start(action["name"], action["input"])
    if arn is None:
        return
    s3, bucket, run = context(snapshot)
    # The mail first: it never raises (notify.py), and a guard's mail must not wait on a
    # record that cannot be written (the tick acts on the guards before any record is read).
    if action.get("mail"):
        notify(snapshot["stack"], run, action["mail"])
    fields = {"execution": arn, "controller_state": "Started", **action["tell"]}
    records.update_controller(
        s3, bucket, run, at=stamp(now), stack_id=snapshot["stack"]["id"], **fields
    )


def stop_executions(action: StopExecutions, snapshot: Snapshot, now) -> None:
    executions.stop(action["arns"], action["why"])


def record_failure(action: RecordFailure, snapshot: Snapshot, now) -> None:
    s3, bucket, run = context(snapshot)
    records.record_failure(s3, bucket, run, action["failure"])


def tell(action: Tell, snapshot: Snapshot, now) -> None:
    s3, bucket, run = context(snapshot)
    records.update_controller(s3, bucket, run, at=stamp(now), **action["fields"])


DO = {
    "terminate": terminate,
    "stop_billing": stop_billing,
    "replace": replace,
    "tag": tag,
    "record": record,
    "delete_done": delete_done,
    "write_done": write_done,
    "start": start,
    "stop_executions": stop_executions,
    "record_failure": record_failure,
    "tell": tell,
}
