"""Deploy-time answers: the custom resources CloudFormation asks while it deploys a stack.

    Custom::HorovodFleetDeadline  the hard cap's time, counted from the first deploy
    Custom::HorovodFleetPinned    an AMI id and code URLs as they were on the first deploy
    Custom::HorovodFleetDataset   the fleet's dataset manifest is in S3
    Custom::HorovodFleetZone      a zone of the region that offers the fleet's instance type
    Custom::HorovodFleetCodeGuard no deploy changes what a live fleet's nodes run
    Custom::HorovodFleetImage, ...RunCheck, ...RunRecord   the baked image, a run's values
                                  kept, its record (run_answers.py)

CDK's custom-resource Provider framework (stacks/teardown/deploy_answers.py) invokes `on_event`
and answers CloudFormation itself: the return value's `PhysicalResourceId` and `Data` on
success, and an exception's message, one line, as the reason of a failed deploy
(aws-cdk-lib custom-resources/lib/provider-framework/runtime/framework.js: the message, then a
line naming the log group). Every answer reads and never changes anything (the code guard's
refusal is what rolls a deploy back), and the same request
gets the same answer, as CloudFormation may ask again: an Update that fails is followed by an
Update back to the old properties, and a new physical id by a Delete of the old one
(https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/crpg-ref-responses.html).
Only boto3 and the standard library: this file is the Lambda asset.
"""

import datetime
import functools
import json
import re
import sys
from collections.abc import Callable, Mapping

import boto3
import run_answers
from botocore.exceptions import ClientError

DEADLINE_TYPE = "Custom::HorovodFleetDeadline"
PINNED_TYPE = "Custom::HorovodFleetPinned"
DATASET_TYPE = "Custom::HorovodFleetDataset"
ZONE_TYPE = "Custom::HorovodFleetZone"
CODE_GUARD_TYPE = "Custom::HorovodFleetCodeGuard"
# How S3 answers a read of a missing key: 404, or 403 to a role whose read is key-conditioned
# (https://docs.aws.amazon.com/AmazonS3/latest/API/API_HeadObject.html).
ABSENT_KEY_CODES = ("NoSuchKey", "404", "AccessDenied", "403")
ZONE_ID = re.compile(r"[a-z]+\d+-az\d+")  # use1-az4; stacks/config.py validates it
# A hard-cap deadline pushed into the past by an update still needs a time Scheduler accepts.
MIN_DEADLINE_LEAD = datetime.timedelta(minutes=5)


class Refused(Exception):
    """The deploy cannot go on: the message says why and what to do, in one line."""


@functools.cache
def client(name: str):
    """One client per service for the function's life, as Lambda reuses the process."""
    return boto3.client(name)


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def log(answer: str, **fields) -> None:
    """One JSON line per answer, so CloudWatch Logs Insights can filter on `answer`."""
    print(json.dumps({"answer": answer, **fields}, sort_keys=True, default=str))


def on_event(event: Mapping, _context=None) -> dict:
    """The Provider framework's onEvent: {"PhysicalResourceId", "Data"} for `event`."""
    answer = ANSWERS.get(event.get("ResourceType", ""))
    if answer is None:
        raise Refused(f"no deploy-time answer for {event.get('ResourceType')!r}")
    if event["RequestType"] == "Delete":  # nothing was made, so nothing is removed
        return {"PhysicalResourceId": event["PhysicalResourceId"]}
    response = answer(event)
    log(event["ResourceType"], request=event["RequestType"], **response)
    return response


# --- Custom::HorovodFleetDeadline -----------------------------------------------------------


def deadline(start: datetime.datetime, max_hours: float, at_least: datetime.datetime) -> dict:
    """The hard-cap time for a fleet deployed at `start`, as a Scheduler `at()` expression."""
    if not max_hours > 0:
        raise ValueError(f"MaxHours must be positive, got {max_hours!r}")
    at = max(start + datetime.timedelta(hours=max_hours), at_least + MIN_DEADLINE_LEAD)
    at = at.astimezone(datetime.timezone.utc).replace(microsecond=0, tzinfo=None)
    return {"ScheduleExpression": f"at({at.isoformat()})", "Deadline": f"{at.isoformat()}Z"}


def answer_deadline(event: Mapping) -> dict:
    """The clock starts on Create and keeps its start. The physical id is "<run>@<start>", so an
    Update that changes MaxHours moves the deadline relative to the original start, and a new
    run name starts a new clock."""
    moment = now().replace(microsecond=0)
    props = event.get("ResourceProperties", {})
    run = props.get("Run", "")
    old_run, _, old_start = (event.get("PhysicalResourceId") or "").rpartition("@")
    keep = event["RequestType"] == "Update" and old_run == run and old_start
    start = datetime.datetime.fromisoformat(old_start) if keep else moment
    try:
        data = deadline(start, float(props.get("MaxHours", "nan")), moment)
    except ValueError as error:
        raise Refused(str(error)) from error
    return {"PhysicalResourceId": f"{run}@{start.isoformat()}", "Data": data}


# --- Custom::HorovodFleetPinned ---------------------------------------------------------------


def answer_pinned(event: Mapping) -> dict:
    """The AMI id its `ImageParameter` names and its `Code` URLs, as on the stack's first deploy.

    An Update keeps them (the image is the physical id, the code comes from the old properties),
    so neither a new image behind the SSM parameter nor a code change stops, starts or replaces
    the node on a redeploy; a new stack (destroy, deploy) takes the new.
    """
    props = event.get("ResourceProperties", {})
    parameter = props.get("ImageParameter", "")
    old = event.get("OldResourceProperties") or {}
    physical_id = event.get("PhysicalResourceId") or ""
    update = event["RequestType"] == "Update"
    old_code = old.get("Code", {}) if update else {}
    code = {name: old_code.get(name, url) for name, url in props.get("Code", {}).items()}
    keep = update and old.get("ImageParameter") == parameter and physical_id.startswith("ami-")
    image = physical_id if keep else None
    if image is None:
        try:
            image = client("ssm").get_parameter(Name=parameter)["Parameter"]["Value"]
        except ClientError as error:
            raise Refused(f"cannot read {parameter}: {error}"[:1000]) from error
    return {"PhysicalResourceId": image, "Data": {"ImageId": image, **code}}


# --- Custom::HorovodFleetDataset --------------------------------------------------------------


def answer_dataset(event: Mapping) -> dict:
    """Its manifest (`Bucket`, `Key`) exists, or the deploy fails in one line saying what to do.
    The fleet's instances depend on it, so a missing dataset fails the deploy before any of them
    launches."""
    props = event.get("ResourceProperties", {})
    bucket, key = props.get("Bucket", ""), props.get("Key", "")
    url = f"s3://{bucket}/{key}"
    try:
        client("s3").head_object(Bucket=bucket, Key=key)
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") not in ABSENT_KEY_CODES:
            raise Refused(f"cannot read {url}: {error}"[:1000]) from error
        raise Refused(
            f"no {url}: the fleet has no dataset to train on. Deploy PreprocessStack and wait "
            "until its node writes the manifest (it does so last), or point -c datasetBucket= "
            "and -c datasetPrefix= at your TFRecords, indexed first by horovod-fleet dataset "
            f"index s3://{bucket}/{key.removesuffix('manifest.json')}; -c benchmark=true needs "
            "no dataset"
        ) from error
    return {"PhysicalResourceId": url}


# --- Custom::HorovodFleetZone -----------------------------------------------------------------


def answer_zone(event: Mapping) -> dict:
    """The zone the fleet's subnet goes in: its `PreferredZone` when that zone offers
    `InstanceType` and `HeadInstanceType` (the head's), else (unless `Fixed` is "true": the user's subnet or capacity reservation
    decides) the first zone that does. An empty `PreferredZone` (no -c az) prefers none: the
    first zone by name that offers them, or on an Update the one deployed while it does. No zone fails the deploy in one line before anything is
    created. The zone keeps its answer across updates of the same type, so a redeploy never
    moves the subnet. Zone names differ between accounts, so only this account's answer can say
    (DescribeInstanceTypeOfferings,
    https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeInstanceTypeOfferings.html).
    A `PreferredZone` given as a zone ID (use1-az4, the same zone in every account) is turned
    into this account's zone name first, and the answer is always a name: subnets, volumes and
    instances take it (DescribeAvailabilityZones with ZoneIds,
    https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeAvailabilityZones.html).

    `MoveSlots` more zones are answered as `Zone1`, `Zone2`, ... (zone_data): TrainStack makes a
    subnet and a placement group in each. The physical id holds them after the zone
    ("us-east-1a:us-east-1b,us-east-1c"), so that every later Update answers them again
    whatever changed."""
    props = event.get("ResourceProperties", {})
    instance_type, preferred = props.get("InstanceType", ""), props.get("PreferredZone", "")
    fixed = props.get("Fixed") == "true"
    slots = 0 if fixed else int(props.get("MoveSlots") or 0)
    physical_id = event.get("PhysicalResourceId") or ""
    deployed, _, kept = physical_id.partition(":")
    moves = [z for z in kept.split(",") if z] if event["RequestType"] == "Update" else []
    old = event.get("OldResourceProperties") or {}
    unchanged = all(old.get(k) == props.get(k) for k in ("InstanceType", "PreferredZone"))
    if event["RequestType"] == "Update" and physical_id and unchanged:
        offered = offering_zones(instance_type)
        return zone_answer(zone_data(deployed, offered, fixed, slots, moves))
    region = client("ec2").meta.region_name
    if not preferred and event["RequestType"] == "Update":
        # No -c az: any zone that offers the type, so the one deployed while it still does; a
        # stack deployed with a zone keeps it when the key is dropped (the subnet never moves).
        preferred = deployed
    shown = preferred
    if ZONE_ID.fullmatch(preferred):
        named = zone_name(preferred)
        if not named:
            raise Refused(
                f"zone ID {preferred} is not a zone of {region} this account can use: see aws "
                f"ec2 describe-availability-zones --region {region}"
            )
        shown, preferred = f"{named} ({preferred})", named
    offered = offering_zones(instance_type)
    # The fleet's head stays in the deployed zone (a move takes only the nodes): that zone must
    # offer its type too. A stack from before the head names none.
    head = props.get("HeadInstanceType")
    both = [z for z in offered if z in offering_zones(head)] if head else offered
    if preferred in both or (both and not fixed):
        zone = preferred if preferred in both else both[0]
        return zone_answer(zone_data(zone, offered, fixed, slots, moves))
    where = f"zone {shown}" if fixed else f"any zone of {region}"
    elsewhere = (
        f"a subnet in a zone that does ({', '.join(both)})"
        if both
        else "another region (-c region=...)"
    )
    if head and (preferred in offered if fixed else offered):  # the nodes' type is offered
        raise Refused(
            f"{head}, the fleet's head, is not offered for this account in {where} where "
            f"{instance_type} is: try {elsewhere}"
        )
    raise Refused(
        f"{instance_type} is not offered in {where} for this account: try {elsewhere}, a "
        "capacity reservation (-c capacityReservationId=...) or a Capacity Block"
    )


def offering_zones(instance_type: str) -> list[str]:
    """The region's zones that offer the type to this account, by name."""
    pages = (
        client("ec2")
        .get_paginator("describe_instance_type_offerings")
        .paginate(
            LocationType="availability-zone",
            Filters=[{"Name": "instance-type", "Values": [instance_type]}],
        )
    )
    return sorted(o["Location"] for p in pages for o in p["InstanceTypeOfferings"])


def zone_name(zone_id: str) -> str:
    """This account's name for the zone with this zone ID; "" when it has none (an ID of
    another region, or of a zone the account cannot use)."""
    try:
        zones = client("ec2").describe_availability_zones(ZoneIds=[zone_id])["AvailabilityZones"]
    except ClientError as error:  # InvalidParameterValue: no such zone ID here
        log(ZONE_TYPE, zone_id=zone_id, error=str(error))
        return ""
    return next((z["ZoneName"] for z in zones if z.get("ZoneId") == zone_id), "")


def zone_data(
    zone: str, offered: list[str], fixed: bool, slots: int = 0, kept: list[str] | None = None
) -> dict:
    """The zone, and where a run may move when it has no capacity: the others that offer the
    type (`Zones`, the zone first), unless the user's subnet or reservation fixes the zone; and
    the zone of each of TrainStack's `slots` move slots (`Zone1`, ...). A slot keeps the zone it
    was `kept` at: CloudFormation replaces a subnet whose zone changes by creating the new one
    first, on the slot's CIDR block, which the old one still holds, so the update would fail
    (https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/aws-resource-ec2-subnet.html).
    The other slots take the offering zones no slot holds yet, then the zone itself: a spare
    subnet and group beside the fleet's, which cost nothing."""
    others = [] if fixed else [z for z in offered if z != zone]
    moves = (kept or [])[:slots]
    spare = [z for z in others if z not in moves] + [zone] * slots
    moves = moves + spare[: slots - len(moves)]
    return {
        "Zone": zone,
        "Zones": ",".join([zone, *others]),
        **{f"Zone{slot}": move for slot, move in enumerate(moves, 1)},
    }


def zone_answer(data: dict) -> dict:
    """The zone check's answer; its physical id is the zone, then its move slots' zones in slot
    order."""
    moves = [zone for key, zone in data.items() if key.removeprefix("Zone").isdigit()]
    physical_id = ":".join([data["Zone"], ",".join(moves)]) if moves else data["Zone"]
    return {"PhysicalResourceId": physical_id, "Data": data}


# --- Custom::HorovodFleetCodeGuard -----------------------------------------------------------

# What a node instance runs, as TrainStack gives it to the guard (stacks/train/code_guard.py):
# a change of any of these stops and starts the node, or replaces it.
NODE_PROPERTIES = ("ImageId", "InstanceType", "UserData", "LaunchTemplateVersion")
# A node in these states runs, or will run again, the code it booted with: user data runs only
# at an instance's first boot (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/user-data.html).
LIVE_STATES = ("pending", "running", "stopping", "stopped")
FLEET_TAG = "horovod-fleet:stack"  # stacks/teardown/names.py: every node of a TrainStack has it


def answer_code_guard(event: Mapping) -> dict:
    """Refuses, in one line, a deploy that would change what TrainStack's nodes run while its
    run is live: CloudFormation would stop and start each node on its old code, as user data
    runs only at first boot, and a relaunch would launch new nodes from the new template beside
    old ones. Every node instance and the replacement template depend on this resource, so
    CloudFormation updates it first and rolls the update back before any node is touched
    (stacks/train/code_guard.py). A run is live while a node of the fleet lives, and until its
    final record whatever its instances do: a relaunch (its newest attempts.json entry, in this
    stack, says `relaunch`) may have every node terminated. A rollback's own Update, and an
    update of nothing the nodes run, pass."""
    props = event.get("ResourceProperties", {})
    old = event.get("OldResourceProperties") or {}
    stack_id = event["StackId"]
    changed = event["RequestType"] == "Create" or any(
        old.get(k) != props.get(k) for k in NODE_PROPERTIES
    )
    answer = {"PhysicalResourceId": event.get("PhysicalResourceId") or stack_id}
    if not changed or rolling_back(stack_id):
        return answer
    run, code = (old or props).get("Run"), (old or props).get("Code")
    live = live_nodes(stack_id)
    if live:
        raise Refused(
            f"run {run} is live on code {code} (node(s) {', '.join(live[:4])}); wait for it "
            "to end or cdk destroy TrainStack, then deploy"
        )
    if relaunch := relaunch_under_way(props.get("Bucket", ""), run, stack_id):
        raise Refused(
            f"run {run} is live on code {code} (relaunching after attempt {relaunch['attempt']}: "
            f"{relaunch.get('why')}); wait for it to end or cdk destroy TrainStack, then deploy"
        )
    return answer


def relaunch_under_way(bucket: str, run: str, stack_id: str) -> dict | None:
    """The run's newest attempts.json entry when it is this stack's and says `relaunch`: the
    run is live, whatever its instances do. A read S3 refuses fails the deploy in one line."""
    if not bucket:  # a guard from before the property: instances alone decide
        return None
    key = f"runs/{run}/attempts.json"
    try:
        body = client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
            return None
        raise Refused(f"cannot read s3://{bucket}/{key}: {error}"[:1000]) from error
    entries = [e for e in json.loads(body).get("attempts", []) if isinstance(e, dict)]
    newest = max(entries, key=lambda e: e.get("attempt") or 0, default=None)
    if newest and newest.get("stack_id") == stack_id and newest.get("decision") == "relaunch":
        return newest
    return None


def rolling_back(stack_id: str) -> bool:
    """Whether CloudFormation is rolling the stack back: "If the update fails, you will get a
    subsequent `Update` event to roll back to the previous state (with `ResourceProperties` and
    `OldResourceProperties` reversed)" (aws-cdk-lib 2.275 custom-resources README,
    https://github.com/aws/aws-cdk/blob/main/packages/aws-cdk-lib/custom-resources/README.md),
    and that one must pass, or the stack is left in UPDATE_ROLLBACK_FAILED."""
    [stack] = client("cloudformation").describe_stacks(StackName=stack_id)["Stacks"]
    return stack["StackStatus"].startswith(("UPDATE_ROLLBACK", "ROLLBACK"))


def live_nodes(stack_id: str) -> list[str]:
    """The stack's instances that are not terminated or on their way: CloudFormation's and the
    run controller's alike carry its id in FLEET_TAG."""
    pages = (
        client("ec2")
        .get_paginator("describe_instances")
        .paginate(
            Filters=[
                {"Name": f"tag:{FLEET_TAG}", "Values": [stack_id]},
                {"Name": "instance-state-name", "Values": list(LIVE_STATES)},
            ]
        )
    )
    return sorted(i["InstanceId"] for p in pages for r in p["Reservations"] for i in r["Instances"])


ANSWERS: dict[str, Callable[[Mapping], dict]] = {
    DEADLINE_TYPE: answer_deadline,
    PINNED_TYPE: answer_pinned,
    DATASET_TYPE: answer_dataset,
    ZONE_TYPE: answer_zone,
    CODE_GUARD_TYPE: answer_code_guard,
    # run_answers.py's take this module for its clients, clock, log and refusal, as an argument:
    # an import back would be a cycle.
    **{
        kind: functools.partial(answer, base=sys.modules[__name__])
        for kind, answer in (
            (run_answers.IMAGE_TYPE, run_answers.answer_image),
            (run_answers.RUN_CHECK_TYPE, run_answers.answer_run_check),
            (run_answers.RUN_RECORD_TYPE, run_answers.answer_run_record),
        )
    },
}
