"""TrainStack as the run controller sees it through CloudFormation: its status, its tags and
outputs, the one delete it may ask for, and when it last finished deploying.

What the controller needs while the stack is still being created is in its stack-level tags,
which CloudFormation holds from CreateStack on (the CDK CLI passes the stack's tags to
CreateStack and CreateChangeSet: aws-cdk-cli @aws-cdk/toolkit-lib api/deployments/deploy-stack.ts
`commonPrepareOptions`, `Tags: this.options.tags`, from the manifest's tags,
https://github.com/aws/aws-cdk-cli/blob/main/packages/%40aws-cdk/toolkit-lib/lib/api/deployments/deploy-stack.ts).
Only values that cannot change while a fleet lives are tags (each is in the nodes' node.json,
which the code guard keeps): CloudFormation applies a stack's tags to its resources, and a
changed stack tag has replaced a resource (aws-cloudformation/cloudformation-coverage-roadmap
issue 538). Outputs exist only once a create has finished: the replacement templates, the zones,
maxRestarts and the hard cap's exact time are read there; while the stack is created, the cap's
time from its schedule (observe.py).
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
# ... and the one the head is launched again from when EC2 ended it (stacks/train/head.py).
HEAD_TEMPLATE_OUTPUT_KEY = "HorovodFleetHeadTemplate"
NODES_OUTPUT_KEY = "HorovodFleetNodes"
# The fewest nodes the elastic fleet trains on (stacks/teardown/names.py).
MIN_NODES_OUTPUT_KEY = "HorovodFleetMinNodes"
# TrainStack's stack-level tags (stacks/train/stack.py): the run, how many nodes, how stale a
# node's heartbeat may be, how long an attempt's nodes get to start before silence counts.
RUN_TAG = "horovod-fleet:run"
NODES_TAG = "horovod-fleet:nodes"
HEARTBEAT_TAG = "horovod-fleet:heartbeatTimeoutS"
STARTUP_GRACE_TAG = "horovod-fleet:startupGraceS"
# A stack from before the tags: bootstrap/node_config.py's default heartbeat timeout, and the
# rendezvous timeout plus ten minutes for the start.
DEFAULT_HEARTBEAT_S = 120
DEFAULT_STARTUP_GRACE_S = 2400
# ROLLBACK_COMPLETE is a create that failed and was rolled back: nothing of it bills.
GONE_STATES = ("DELETE_COMPLETE", "ROLLBACK_COMPLETE")
# The statuses in which the stack itself finished a deployment: the fleet's launch.
DEPLOYED_STATES = ("CREATE_COMPLETE", "UPDATE_COMPLETE", "UPDATE_ROLLBACK_COMPLETE")


class RefusedStack(Exception):
    """Raised instead of deleting a stack that is not this app's TrainStack."""


def describe(name_or_id: str = TRAIN_STACK) -> dict | None:
    """TrainStack as the controller reads it (`of`); None when there is no such stack."""
    try:
        stacks = client("cloudformation").describe_stacks(StackName=name_or_id)["Stacks"]
    except ClientError as error:
        if "does not exist" in error.response["Error"].get("Message", ""):
            return None
        raise
    return of(stacks[0])


def of(stack: dict) -> dict:
    """A DescribeStacks answer's stack: id, name, status, when it was created, and what its
    tags and outputs say ("" or 0 for what neither holds: a stack being created has no outputs,
    a stack from before the tags none of them)."""
    tags = {t["Key"]: t["Value"] for t in stack.get("Tags", [])}
    outputs = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}
    deadline = outputs.get(DEADLINE_OUTPUT_KEY)
    return {
        "id": stack["StackId"],
        "name": stack["StackName"],
        "status": stack["StackStatus"],
        "status_reason": stack.get("StackStatusReason", ""),
        "created_at": stack["CreationTime"],
        "run": tags.get(RUN_TAG) or outputs.get(RUN_OUTPUT_KEY, ""),
        "nodes": int(tags.get(NODES_TAG) or outputs.get(NODES_OUTPUT_KEY) or 0),
        # 0 while the stack is created, or for one from before the elastic fleet.
        "min_nodes": int(outputs.get(MIN_NODES_OUTPUT_KEY) or 0),
        # A stack without them (deployed before the controller) is never relaunched.
        "max_restarts": int(outputs.get(MAX_RESTARTS_OUTPUT_KEY) or 0),
        # The hard cap's time; None while the stack is created (observe.py reads its schedule).
        "deadline": parse_stamp(deadline) if deadline else None,
        "heartbeat_timeout_s": int(tags.get(HEARTBEAT_TAG) or DEFAULT_HEARTBEAT_S),
        "startup_grace_s": int(tags.get(STARTUP_GRACE_TAG) or DEFAULT_STARTUP_GRACE_S),
        "notify_topic": outputs.get(NOTIFY_OUTPUT_KEY, ""),
        # "" for a stack deployed before the one template (its nodes' own templates held their
        # index): a node of it that EC2 terminated is never replaced.
        "template": outputs.get(REPLACEMENT_OUTPUT_KEY, ""),
        # "" for a stack deployed before the head's template: its head, once EC2 ended it,
        # cannot come back, and the run stops for a person.
        "head_template": outputs.get(HEAD_TEMPLATE_OUTPUT_KEY, ""),
        # [] for a fleet whose zone is fixed, or a stack from before zones were made at deploy.
        "zones": parse_zones(outputs.get(ZONES_OUTPUT_KEY, "")),
    }


def deadline_of(stack: dict) -> datetime.datetime | None:
    return stack.get("deadline")


def busy(stack: dict) -> bool:
    """A create, update or rollback under way: the outputs may be absent or about to change."""
    status = stack["status"]
    return status.endswith("_IN_PROGRESS") and status != "DELETE_IN_PROGRESS"


def creating(stack: dict) -> bool:
    return stack["status"] in ("CREATE_IN_PROGRESS", "REVIEW_IN_PROGRESS")


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
