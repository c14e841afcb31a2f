"""The run controller's zone move: a fleet that finds no capacity in its zone tries the next one.

A cluster placement group "can't span multiple Availability Zones" and EFA traffic stays in
one zone, so the whole fleet moves together, one zone per try
(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/placement-groups.html). TrainStack's
`HorovodFleetZoneMove` output (stacks/train/stack.py, docs/contracts.md) names the zones that
offer the type, the deployed one first, the fleet's VPC and route table, and a free CIDR block
for each other zone. For a zone the reaper makes, once and tagged with the stack's id, a subnet
routed like the fleet's (the same NAT and S3 endpoint) and a cluster placement group, then a
version of each node's replacement template whose interfaces and placement name them. Nothing
else of the template changes, so a replacement is still launched from TrainStack's template
alone. The Replacements resource's Delete removes both after the instances (`remove`).
Only boto3 and the standard library: this file is part of the reaper's Lambda asset.
"""

import dataclasses
import datetime
import hashlib
import ipaddress
import json

from botocore.exceptions import ClientError

MOVE_OUTPUT_KEY = "HorovodFleetZoneMove"
ZONE_TAG = "horovod-fleet:zone"
# How the versions the reaper makes describe themselves; CloudFormation's have no description.
MOVED = "horovod-fleet zone move"
# Every zone is tried this many times, waiting longer after each round, before the run gives up.
CAPACITY_ROUNDS = 4
MAX_CAPACITY_WAIT = datetime.timedelta(hours=1)
# What stacks/train/fleet.py sets on each interface, copied into a moved version.
INTERFACE_FIELDS = (
    "DeviceIndex",
    "NetworkCardIndex",
    "InterfaceType",
    "Groups",
    "DeleteOnTermination",
    "Description",
)


@dataclasses.dataclass(frozen=True)
class ZonePlan:
    """Where a fleet may move: `zones` in the order they are tried, the deployed one first."""

    zones: tuple[str, ...]
    vpc: str
    route_table: str
    cidrs: tuple[str, ...]  # free blocks of the VPC, at least one per zone after the first


def parse_plan(text: str) -> ZonePlan | None:
    """TrainStack's output, or None when it has none (a given subnet, a capacity reservation, a
    stack deployed before the move): such a fleet is never moved."""
    try:
        document = json.loads(text)
        zones = tuple(z for z in document["zones"].split(",") if z)
        cidrs = tuple(document["cidrs"])
        plan = ZonePlan(zones[: len(cidrs) + 1], document["vpc"], document["route_table"], cidrs)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return plan if plan.zones else None


def try_order(zones: list[str], current: str | None) -> list[str]:
    """The zones a relaunch tries in turn: the fleet's current zone first, then the others."""
    if current not in zones:
        return list(zones)
    start = zones.index(current)
    return zones[start:] + zones[:start]


def zone_of_try(order: list[str], check: int) -> str | None:
    """The zone try `check` (from 1) launches in; None for a fleet that never moves."""
    return order[(check - 1) % len(order)] if order else None


def wait_after(check: int, zones: int, base: datetime.timedelta) -> datetime.timedelta | None:
    """How long to wait after try `check` found no capacity: nothing while the round has zones
    left, then twice as long after each round (up to an hour); None after the last round."""
    zones = max(zones, 1)
    if check % zones:
        return datetime.timedelta(0)
    rounds = check // zones
    if rounds >= CAPACITY_ROUNDS:
        return None
    return min(base * 2 ** (rounds - 1), MAX_CAPACITY_WAIT)


def placement_group_name(stack_id: str, zone: str) -> str:
    digest = hashlib.sha256(stack_id.encode()).hexdigest()[:10]
    return f"horovod-fleet-{digest}-{zone}"


def tags(stack_id: str, fleet_tag: str, zone: str) -> list[dict]:
    return [
        {"Key": "Project", "Value": "horovod-fleet"},
        {"Key": fleet_tag, "Value": stack_id},
        {"Key": ZONE_TAG, "Value": zone},
    ]


def moved_subnets(ec2, stack_id: str, fleet_tag: str) -> dict[str, str]:
    """The subnets the reaper made for the stack: zone -> subnet id."""
    subnets = ec2.describe_subnets(
        Filters=[
            {"Name": f"tag:{fleet_tag}", "Values": [stack_id]},
            {"Name": "tag-key", "Values": [ZONE_TAG]},
        ]
    )["Subnets"]
    return {s["AvailabilityZone"]: s["SubnetId"] for s in subnets}


def prepare(ec2, plan: ZonePlan, zone: str, stack_id: str, fleet_tag: str) -> tuple[str, str]:
    """The subnet and placement group of the fleet in `zone`, another than the deployed one,
    made when they are not there yet. Every step is checked again on each call, so a retried
    invocation finishes what a failed one began: above all the route, without which the nodes
    would boot with no way to S3 and bill until the idle alarm."""
    subnet = moved_subnets(ec2, stack_id, fleet_tag).get(zone)
    if subnet is None:
        subnet = ec2.create_subnet(
            VpcId=plan.vpc,
            CidrBlock=free_block(ec2, plan),
            AvailabilityZone=zone,
            TagSpecifications=[{"ResourceType": "subnet", "Tags": tags(stack_id, fleet_tag, zone)}],
        )["Subnet"]["SubnetId"]
    tables = ec2.describe_route_tables(
        Filters=[{"Name": "association.subnet-id", "Values": [subnet]}]
    )["RouteTables"]
    if not tables:
        ec2.associate_route_table(RouteTableId=plan.route_table, SubnetId=subnet)
    group = placement_group_name(stack_id, zone)
    try:
        ec2.create_placement_group(
            GroupName=group,
            Strategy="cluster",
            TagSpecifications=[
                {"ResourceType": "placement-group", "Tags": tags(stack_id, fleet_tag, zone)}
            ],
        )
    except ClientError as error:
        # "The specified placement group already exists in that AWS Region": a retried move.
        # https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html
        if error.response["Error"].get("Code") != "InvalidPlacementGroup.Duplicate":
            raise
    return subnet, group


def free_block(ec2, plan: ZonePlan) -> str:
    """The first of the plan's blocks that no subnet of the VPC overlaps."""
    subnets = ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [plan.vpc]}])["Subnets"]
    taken = [ipaddress.ip_network(s["CidrBlock"]) for s in subnets]
    for block in plan.cidrs:
        if not any(ipaddress.ip_network(block).overlaps(t) for t in taken):
            return block
    raise LookupError(f"no free block of {', '.join(plan.cidrs)} in {plan.vpc}")


def network_of(data: dict) -> tuple[str | None, str | None]:
    """The subnet and placement group a template version launches into."""
    interfaces = data.get("NetworkInterfaces") or [{}]
    return interfaces[0].get("SubnetId"), (data.get("Placement") or {}).get("GroupName")


def version_for(ec2, template: str, network: tuple[str, str] | None) -> str:
    """The version of `template` that launches into `network` (subnet, placement group): made
    from CloudFormation's newest version, with only its interfaces' subnet and its group
    changed; that version itself for None (the deployed zone). CloudFormation adds a version
    on each update of the template but leaves the default at the first
    (https://github.com/aws-cloudformation/cloudformation-coverage-roadmap/issues/1518), so the
    newest version the reaper did not make is the deployed one, found by the reaper's
    description. What a new version gives overwrites what it inherits from SourceVersion
    (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CreateLaunchTemplateVersion.html)."""
    pages = ec2.get_paginator("describe_launch_template_versions").paginate(
        LaunchTemplateId=template
    )
    versions = [v for p in pages for v in p["LaunchTemplateVersions"]]
    deployed = max(
        (v for v in versions if not v.get("VersionDescription", "").startswith(MOVED)),
        key=lambda v: v["VersionNumber"],
    )
    if network is None:
        return str(deployed["VersionNumber"])
    subnet, group = network
    description = f"{MOVED} from version {deployed['VersionNumber']} to {subnet} and {group}"
    made = [v["VersionNumber"] for v in versions if v.get("VersionDescription") == description]
    if made:
        return str(max(made))
    interfaces = [
        {**{k: i[k] for k in INTERFACE_FIELDS if k in i}, "SubnetId": subnet}
        for i in deployed["LaunchTemplateData"].get("NetworkInterfaces", [])
    ]
    created = ec2.create_launch_template_version(
        LaunchTemplateId=template,
        SourceVersion=str(deployed["VersionNumber"]),
        VersionDescription=description,
        # Every card's interface, as whether a list given is merged with the source's is not
        # documented; only the group of the placement, which stacks/train/fleet.py sets alone.
        LaunchTemplateData={"NetworkInterfaces": interfaces, "Placement": {"GroupName": group}},
    )
    return str(created["LaunchTemplateVersion"]["VersionNumber"])


def remove(ec2, stack_id: str, fleet_tag: str) -> list[str]:
    """Delete what moves made for the stack, once its instances are gone; returns what is left
    (an instance still terminating holds its group and subnet: the followed delete retries).
    The group goes first, so a subnet is never deleted before its group."""
    left = []
    for zone, subnet in moved_subnets(ec2, stack_id, fleet_tag).items():
        group = placement_group_name(stack_id, zone)
        try:
            try:
                ec2.delete_placement_group(GroupName=group)
            except ClientError as error:
                if error.response["Error"].get("Code") != "InvalidPlacementGroup.Unknown":
                    raise
            # Whether DeleteSubnet drops the subnet's route table association is not documented
            # (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DeleteSubnet.html);
            # an association left behind would hold up CloudFormation's delete of the table.
            tables = ec2.describe_route_tables(
                Filters=[{"Name": "association.subnet-id", "Values": [subnet]}]
            )["RouteTables"]
            for association in (a for t in tables for a in t.get("Associations", [])):
                if association.get("SubnetId") == subnet:
                    ec2.disassociate_route_table(
                        AssociationId=association["RouteTableAssociationId"]
                    )
            ec2.delete_subnet(SubnetId=subnet)
        except ClientError as error:
            code = error.response["Error"].get("Code", "")
            left.append(f"{zone}: {code}")
    return left
