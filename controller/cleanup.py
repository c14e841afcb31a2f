"""TrainStack's Replacements resource (Custom::HorovodFleetReplacements), answered through CDK's
Provider framework: when the stack itself is deleted, it ends every instance of the fleet that
CloudFormation does not know (the run controller launched them), before their network
interfaces hold up the delete. The tick follows the delete (tick.py: a stack being deleted).

Its physical id names the stack, never the run, and stays the same across updates: an update
that renames the run (cdk deploy -c run=<new>) replaces nothing, so CloudFormation sends no
Delete for it. A Delete comes anyway when an update or a rolled-back update replaces the
resource (CloudFormation deletes "the old resources" in UPDATE_COMPLETE_CLEANUP_IN_PROGRESS and
"new resources it created" in UPDATE_ROLLBACK_COMPLETE_CLEANUP_IN_PROGRESS,
https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/using-cfn-describing-stacks.html):
such a Delete ends nothing, as only a stack being deleted (DELETE_IN_PROGRESS, or a create rolled
back) is. A Delete always answers success, whatever fails here: the resource is deleted before
any of the fleet, and a failed Delete would hold up the whole stack's delete while every node
bills. What it could not end, the followed delete ends (steps_teardown.follow_delete), the tick
ends as an orphan once the stack is gone, and the docs give the one command that finishes it by
hand.
Only boto3, the standard library and contract/: part of the run controller's Lambda asset.
"""

import time

from controller import ec2_fleet, executions, train_stack
from controller.clients import client, log

# A stack being deleted: by the user or the controller, or a create being rolled back.
STACK_DELETED = ("DELETE_IN_PROGRESS", "ROLLBACK_IN_PROGRESS")
# How long the Delete waits for the instances to terminate, within the function's timeout.
TERMINATE_WAIT_S = 200
POLL_S = 10


def on_event(event: dict, _context=None) -> dict:
    """The Provider framework's onEvent."""
    stack_id = event["StackId"]
    if event["RequestType"] != "Delete":
        return {"PhysicalResourceId": f"replacements-{executions.digest(stack_id)}"}
    physical_id = event["PhysicalResourceId"]
    try:
        stack = train_stack.describe(stack_id)
        status = stack["status"] if stack else "DELETE_COMPLETE"
        if status not in STACK_DELETED:
            log("replacements-kept", status=status, physical_id=physical_id)
            return {"PhysicalResourceId": physical_id}
        ours = [
            n["id"]
            for n in ec2_fleet.nodes(stack_id)
            if not n["cloudformation"] and n["state"] in ec2_fleet.LIVE_STATES
        ]
        ec2_fleet.terminate(ours)
        wait_terminated(ours)
        log("replacements", request="Delete", terminated=ours)
    except Exception as error:  # the Delete answers whatever failed
        log("replacements-cleanup-failed", error=f"{type(error).__name__}: {error}")
    return {"PhysicalResourceId": physical_id}


def wait_terminated(ids: list[str]) -> None:
    deadline = time.monotonic() + TERMINATE_WAIT_S
    while ids and time.monotonic() < deadline:
        reservations = client("ec2").describe_instances(InstanceIds=ids)["Reservations"]
        states = {i["State"]["Name"] for r in reservations for i in r["Instances"]}
        if states <= {"terminated"}:
            return
        time.sleep(POLL_S)
