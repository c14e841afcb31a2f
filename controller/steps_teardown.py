"""The run controller's teardown states (stacks/teardown/workflow.py): ResultsReady, DeleteStack
and FollowDelete.

The fleet goes once the run's results are in S3; the hard cap and the idle guard do not wait
for them. Only TrainStack is ever deleted. A delete is followed by the stack's id (a fleet
deployed again under the name is never touched) until the stack is gone: one that ends in
DELETE_FAILED has the stack's remaining instances terminated (they are what bills, and what
failed, say a network interface, may fail again) and is deleted again, for a bounded time.
Only boto3, the standard library and contract/: part of the run controller's Lambda asset.
"""

import datetime

from botocore.exceptions import ClientError

from contract.runs import stamp
from controller import ec2_fleet, records, train_stack
from controller.clients import client, error_code, log, now, setting, step
from controller.steps import RECHECK, fleet_stack, tell, wait

FOLLOW_DELETE_FOR = datetime.timedelta(hours=3)
# A stack CloudFormation will not delete yet (an update under way) is asked again this often.
DELETE_RETRY = datetime.timedelta(minutes=1)


@step
def results(event: dict) -> dict:
    """Whether the run's checkpoints and logs are in S3 (records.missing_results), so the fleet
    may go."""
    run, stack = event["run"], fleet_stack(event)
    if train_stack.gone(stack) or stack["run"] != run:
        log("already-gone", run=run)
        return {"next": "nothing"}
    if train_stack.deleting(stack):
        return {"next": "follow"}
    if train_stack.busy(stack):
        return wait(RECHECK)
    missing = records.missing_results(client("s3"), setting("BUCKET"), run)
    if missing:
        log("wait-for-results", run=run, missing=missing)
        return wait(RECHECK, missing=missing)
    return {"next": "delete"}


@step
def delete_stack(event: dict) -> dict:
    """Delete TrainStack, the stack the tick judged, and nothing else; `follow` the delete, or
    `wait` and ask again while CloudFormation refuses it (an update under way: it answers
    ValidationError). Whether CloudFormation takes a delete while the stack is still being
    created is not verified here: asked then, it either starts the delete or refuses it like
    an update's, and is asked again a minute later."""
    run, stack = event["run"], fleet_stack(event)
    if train_stack.gone(stack):
        return {"next": "follow", "at": stamp(now())}
    reason = event.get("reason") or "done"
    try:
        train_stack.delete(stack, run=run, reason=reason)
    except ClientError as error:
        if error_code(error) != "ValidationError" or not train_stack.busy(stack):
            raise
        log("delete-refused", run=run, status=stack["status"], error=str(error)[:300])
        return wait(DELETE_RETRY)
    tell(event, "DeleteStack", reason=f"the run controller is deleting TrainStack ({reason})")
    return {"next": "follow", "at": stamp(now())}


@step
def follow_delete(event: dict) -> dict:
    """Look at the deleted stack again: `gone`, `wait` (still deleting, or deleted again after
    DELETE_FAILED), `stopped` (not being deleted any more), or `unconfirmed` once its looks
    cover FOLLOW_DELETE_FOR, which fails the execution and mails."""
    run, stack_id = event["run"], event["stack_id"]
    checks = (event.get("follow") or {}).get("checks", 0) + 1
    stack = train_stack.describe(stack_id)
    status = "DELETE_COMPLETE" if stack is None else stack["status"]
    if status == "DELETE_COMPLETE":
        log("deleted", stack=train_stack.TRAIN_STACK, run=run)
        return {"status": "gone"}
    if status == "DELETE_FAILED":
        left = [n["id"] for n in ec2_fleet.nodes(stack_id) if n["state"] in ec2_fleet.LIVE_STATES]
        ec2_fleet.terminate(left)
        train_stack.delete(
            stack,
            run=run,
            reason="retry-failed-delete",
            status_reason=stack["status_reason"],
            terminated=left,
        )
    elif status != "DELETE_IN_PROGRESS":
        log("follow-delete-stopped", stack=train_stack.TRAIN_STACK, run=run, status=status)
        return {"status": "stopped"}
    if checks * RECHECK >= FOLLOW_DELETE_FOR:
        log("delete-unconfirmed", stack=train_stack.TRAIN_STACK, run=run, status=status)
        return {"status": "unconfirmed", "checks": checks}
    log("follow-delete", stack=train_stack.TRAIN_STACK, run=run, status=status, checks=checks)
    return {"status": "wait", "wait_s": int(RECHECK.total_seconds()), "checks": checks}
