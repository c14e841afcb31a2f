"""TrainStack as the run controller sees it through CloudFormation: its status and outputs, the
one delete it may ask for, and when it last finished deploying.
Only boto3 and the standard library: part of the run controller's Lambda asset.
"""

import datetime

from botocore.exceptions import ClientError
from clients import client, log, parse_stamp
from zones import ZONES_OUTPUT_KEY, parse_zones

TRAIN_STACK = "TrainStack"  # the only stack the controller may ever delete (contracts.md names it)
RUN_OUTPUT_KEY = "HorovodFleetRun"
NOTIFY_OUTPUT_KEY = "NotifyTopic"
MAX_RESTARTS_OUTPUT_KEY = "HorovodFleetMaxRestarts"
DEADLINE_OUTPUT_KEY = "HorovodFleetDeadline"
# The one launch template every replacement node is launched from (stacks/train/fleet.py).
REPLACEMENT_OUTPUT_KEY = "HorovodFleetReplacementTemplate"
NODES_OUTPUT_KEY = "HorovodFleetNodes"
# ROLLBACK_COMPLETE is a create that failed and was rolled back: nothing of it bills.
GONE_STATES = ("DELETE_COMPLETE", "ROLLBACK_COMPLETE")
# The statuses in which the stack itself finished a deployment: the fleet's launch.
DEPLOYED_STATES = ("CREATE_COMPLETE", "UPDATE_COMPLETE", "UPDATE_ROLLBACK_COMPLETE")


class RefusedStack(Exception):
    """Raised instead of deleting a stack that is not this app's TrainStack."""


def describe(name_or_id: str = TRAIN_STACK) -> dict | None:
    """TrainStack's id, name, status, status reason and outputs the controller reads ("" for a
    run while its outputs are not there, as during its creation); None when there is no such
    stack."""
    try:
        stacks = client("cloudformation").describe_stacks(StackName=name_or_id)["Stacks"]
    except ClientError as error:
        if "does not exist" in error.response["Error"].get("Message", ""):
            return None
        raise
    stack = stacks[0]
    outputs = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}
    deadline = outputs.get(DEADLINE_OUTPUT_KEY)
    return {
        "id": stack["StackId"],
        "name": stack["StackName"],
        "status": stack["StackStatus"],
        "status_reason": stack.get("StackStatusReason", ""),
        "run": outputs.get(RUN_OUTPUT_KEY, ""),
        "notify_topic": outputs.get(NOTIFY_OUTPUT_KEY, ""),
        # A stack without them (deployed before the controller) is never relaunched.
        "max_restarts": int(outputs.get(MAX_RESTARTS_OUTPUT_KEY) or 0),
        "deadline": deadline,
        # "" for a stack deployed before the one template (its nodes' own templates held their
        # index): a node of it that EC2 terminated is never replaced.
        "template": outputs.get(REPLACEMENT_OUTPUT_KEY, ""),
        "nodes": int(outputs.get(NODES_OUTPUT_KEY) or 0),
        # [] for a fleet whose zone is fixed, or a stack from before zones were made at deploy.
        "zones": parse_zones(outputs.get(ZONES_OUTPUT_KEY, "")),
    }


def deadline_of(stack: dict) -> datetime.datetime | None:
    return parse_stamp(stack["deadline"]) if stack.get("deadline") else None


def busy(stack: dict) -> bool:
    """A create, update or rollback under way: DeleteStack would fail, the outputs may be absent."""
    status = stack["status"]
    return status.endswith("_IN_PROGRESS") and status != "DELETE_IN_PROGRESS"


def gone(stack: dict | None) -> bool:
    return stack is None or stack["status"] in GONE_STATES


def deleting(stack: dict | None) -> bool:
    return stack is not None and stack["status"] in ("DELETE_IN_PROGRESS", "DELETE_FAILED")


def delete(stack: dict, **fields) -> None:
    """DeleteStack, by id, refusing every stack but TrainStack; CloudFormation uses the stack's
    own role."""
    if stack["name"] != TRAIN_STACK:
        log("refused", stack=stack["name"], **fields)
        raise RefusedStack(f"the run controller deletes only {TRAIN_STACK}, not {stack['name']}")
    client("cloudformation").delete_stack(StackName=stack["id"])
    log("delete-stack", stack=stack["name"], **fields)


def node_count(stack: dict) -> int:
    """How many nodes the fleet has; for a stack from before its output, as many as the
    instances CloudFormation made, one per node."""
    return stack["nodes"] or len(instances(stack["id"]))


def instances(stack_id: str) -> list[str]:
    """The instance ids CloudFormation created for the stack, whatever their state now."""
    resources = client("cloudformation").describe_stack_resources(StackName=stack_id)
    return [
        r["PhysicalResourceId"]
        for r in resources["StackResources"]
        if r["ResourceType"] == "AWS::EC2::Instance" and r.get("PhysicalResourceId")
    ]


def deployed_at(stack_id: str, default: datetime.datetime) -> datetime.datetime:
    """When the stack last finished a create or update: every node was up with its data."""
    pages = (
        client("cloudformation").get_paginator("describe_stack_events").paginate(StackName=stack_id)
    )
    finished = [
        event["Timestamp"]
        for page in pages
        for event in page["StackEvents"]
        if event["LogicalResourceId"] == TRAIN_STACK and event["ResourceStatus"] in DEPLOYED_STATES
    ]
    return max(finished, default=default)
