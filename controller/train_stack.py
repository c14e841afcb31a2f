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
Only boto3, the standard library and contract/: part of the run controller's Lambda asset.
"""

import datetime

from botocore.exceptions import ClientError

from contract.names import (
    DEADLINE_OUTPUT_KEY,
    HEAD_TEMPLATE_OUTPUT_KEY,
    HEARTBEAT_TAG,
    MAX_RESTARTS_OUTPUT_KEY,
    MIN_NODES_OUTPUT_KEY,
    NODES_OUTPUT_KEY,
    NODES_TAG,
    NOTIFY_OUTPUT_KEY,
    REPLACEMENT_OUTPUT_KEY,
    RUN_OUTPUT_KEY,
    RUN_TAG,
    STARTUP_GRACE_TAG,
    TRAIN_STACK,
    ZONES_OUTPUT_KEY,
)
from contract.runs import parse_stamp
from controller.clients import client, log
from controller.snapshot import Stack
from controller.zones import parse_zones

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


def describe(name_or_id: str = TRAIN_STACK) -> Stack | None:
    """TrainStack as the controller reads it (`of`); None when there is no such stack."""
    try:
        stacks = client("cloudformation").describe_stacks(StackName=name_or_id)["Stacks"]
    except ClientError as error:
        if "does not exist" in error.response["Error"].get("Message", ""):
            return None
        raise
    return of(stacks[0])


def of(stack: dict) -> Stack:
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


def deadline_of(stack: Stack) -> datetime.datetime | None:
    return stack.get("deadline")


def busy(stack: Stack) -> bool:
    """A create, update or rollback under way: the outputs may be absent or about to change."""
    status = stack["status"]
    return status.endswith("_IN_PROGRESS") and status != "DELETE_IN_PROGRESS"


def creating(stack: Stack) -> bool:
    return stack["status"] in ("CREATE_IN_PROGRESS", "REVIEW_IN_PROGRESS")


def gone(stack: Stack | None) -> bool:
    return stack is None or stack["status"] in GONE_STATES


def deleting(stack: Stack | None) -> bool:
    return stack is not None and stack["status"] in ("DELETE_IN_PROGRESS", "DELETE_FAILED")


def delete(stack: Stack, **fields) -> None:
    """DeleteStack, by id, refusing every stack but TrainStack; CloudFormation uses the stack's
    own role."""
    if stack["name"] != TRAIN_STACK:
        log("refused", stack=stack["name"], **fields)
        raise RefusedStack(f"the run controller deletes only {TRAIN_STACK}, not {stack['name']}")
    client("cloudformation").delete_stack(StackName=stack["id"])
    log("delete-stack", stack=stack["name"], **fields)


def node_count(stack: Stack) -> int:
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
