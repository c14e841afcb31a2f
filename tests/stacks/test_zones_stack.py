"""TrainStack makes, at deploy, a subnet and a cluster placement group in every zone its fleet may
move to (a move slot each), and names them in HorovodFleetZones: a relaunch only chooses."""

import ipaddress
import json

import boto3
import pytest
from conftest import replacement_template, statements
from moto import mock_aws
from test_teardown import render

from contract.names import FLEET_TAG, ZONES_OUTPUT_KEY
from stacks.network import MOVE_CIDRS, VPC_CIDR, move_slots

# TrainStack's output for the old controller's run-time zone move, and the tag of what it made.
ZONE_MOVE_OUTPUT_KEY = "HorovodFleetZoneMove"
ZONE_TAG = "horovod-fleet:zone"

RESERVATION = "cr-0123456789abcdef0"
FIXED_ZONE = {
    "own subnet": {"vpcId": "vpc-0123abcd", "subnetId": "subnet-0123abcd", "az": "us-east-1a"},
    "capacity reservation": {"capacityReservationId": RESERVATION, "az": "us-east-1a"},
}
# What each interface of a node's template holds besides its subnet: a launch in a move slot
# gives every card whole with its slot's subnet, so it may copy these (docs/contracts.md).
INTERFACE_FIELDS = {
    "DeviceIndex",
    "NetworkCardIndex",
    "InterfaceType",
    "Groups",
    "DeleteOnTermination",
}


@pytest.fixture(scope="module")
def train(default) -> dict:
    return default["TrainStack"].to_json()


def of_type(template: dict, kind: str) -> dict[str, dict]:
    return {k: r for k, r in template["Resources"].items() if r["Type"] == kind}


def zone_check(template: dict) -> tuple[str, dict]:
    [(logical_id, check)] = of_type(template, "Custom::HorovodFleetZone").items()
    return logical_id, check["Properties"]


def slot_subnets(template: dict) -> dict[str, dict]:
    return {k: r for k, r in of_type(template, "AWS::EC2::Subnet").items() if "Move" in k}


def slot_groups(template: dict) -> dict[str, dict]:
    return {k: r for k, r in of_type(template, "AWS::EC2::PlacementGroup").items() if "Move" in k}


def fleet_subnet(template: dict) -> str:
    [subnet] = [k for k in of_type(template, "AWS::EC2::Subnet") if "FleetSubnet" in k]
    return subnet


def route_table_of(template: dict, subnet: str) -> dict:
    [table] = [
        r["Properties"]["RouteTableId"]
        for r in of_type(template, "AWS::EC2::SubnetRouteTableAssociation").values()
        if r["Properties"]["SubnetId"] == {"Ref": subnet}
    ]
    return table


def tags(resource: dict) -> dict:
    return {t["Key"]: t["Value"] for t in resource["Properties"]["Tags"]}


def zones_output(template: dict) -> list[dict]:
    """HorovodFleetZones with each token as ${LogicalId} or ${LogicalId.Attribute}."""
    return json.loads(render(template["Outputs"][ZONES_OUTPUT_KEY]["Value"]))["zones"]


def test_us_east_1_has_a_move_slot_per_other_zone(train):
    _, check = zone_check(train)
    assert (check["MoveSlots"], check["Fixed"]) == ("5", "false")
    # The answer's attributes the stack reads: a new one makes older stacks ask again.
    assert check["Answers"] == "Zone,Zones,Zone1,Zone2,Zone3,Zone4,Zone5"
    subnets = slot_subnets(train)
    assert sorted(
        r["Properties"]["AvailabilityZone"]["Fn::GetAtt"][1] for r in subnets.values()
    ) == [f"Zone{slot}" for slot in range(1, 6)]
    assert len(slot_groups(train)) == 5


@pytest.mark.parametrize(
    ("region", "slots"), [("us-east-1", 5), ("us-east-2", 2), ("us-west-2", 3), ("eu-west-1", 5)]
)
def test_move_slots_follow_the_regions_zones(region, slots):
    """One fewer than the region has zones; a region config.py has no table for gets as many as
    the largest it has."""
    assert move_slots(region) == slots <= len(MOVE_CIDRS)


def test_each_slot_subnet_is_in_its_answered_zone_on_its_own_block(train):
    check_id, _ = zone_check(train)
    [vpc] = of_type(train, "AWS::EC2::VPC")
    for slot in range(1, 6):
        [subnet] = [r for k, r in slot_subnets(train).items() if k.startswith(f"NetworkMove{slot}")]
        props = subnet["Properties"]
        assert props["AvailabilityZone"] == {"Fn::GetAtt": [check_id, f"Zone{slot}"]}
        assert props["CidrBlock"] == MOVE_CIDRS[slot - 1]
        assert props["VpcId"] == {"Ref": vpc}
        assert props["MapPublicIpOnLaunch"] is False


def test_the_slot_blocks_lie_in_the_vpc_clear_of_every_other_subnet(train):
    vpc = ipaddress.ip_network(VPC_CIDR)
    blocks = [ipaddress.ip_network(c) for c in MOVE_CIDRS]
    others = [
        ipaddress.ip_network(r["Properties"]["CidrBlock"])
        for k, r in of_type(train, "AWS::EC2::Subnet").items()
        if "Move" not in k
    ]
    assert others and all(b.subnet_of(vpc) for b in blocks)
    assert not [
        (b, o) for b in blocks for o in others + [x for x in blocks if x != b] if b.overlaps(o)
    ]


def test_slot_subnets_are_routed_like_the_fleets_through_its_nat_and_s3_endpoint(train):
    table = route_table_of(train, fleet_subnet(train))
    assert slot_subnets(train)
    for logical_id in slot_subnets(train):
        assert route_table_of(train, logical_id) == table
    [nat_route] = [
        r["Properties"]
        for r in of_type(train, "AWS::EC2::Route").values()
        if r["Properties"]["RouteTableId"] == table
    ]
    assert nat_route["DestinationCidrBlock"] == "0.0.0.0/0" and "NatGatewayId" in nat_route
    [endpoint] = of_type(train, "AWS::EC2::VPCEndpoint").values()
    assert table in endpoint["Properties"]["RouteTableIds"]


def test_slot_subnets_and_groups_carry_the_fleet_tag(train):
    """The run controller may launch only into what carries TrainStack's id (so does the
    security group every card names); the fleet's own group keeps its tags, as a change of
    them would replace it under the running nodes. No slot carries the zone tag of the old controller's
    run-time moves, whose cleanup deletes what carries it."""
    slots = {**slot_subnets(train), **slot_groups(train)}
    assert len(slots) == 10
    for logical_id, resource in slots.items():
        assert tags(resource)[FLEET_TAG] == {"Ref": "AWS::StackId"}, logical_id
        assert tags(resource)["Project"] == "horovod-fleet", logical_id
        assert ZONE_TAG not in tags(resource), logical_id
    for group in slot_groups(train).values():
        assert group["Properties"]["Strategy"] == "cluster"
    [security] = of_type(train, "AWS::EC2::SecurityGroup").values()
    assert tags(security)[FLEET_TAG] == {"Ref": "AWS::StackId"}
    [own] = [g for k, g in of_type(train, "AWS::EC2::PlacementGroup").items() if "Move" not in k]
    assert FLEET_TAG not in tags(own)


def test_horovod_fleet_zones_lists_the_deployed_zone_then_each_slot(train):
    check_id, _ = zone_check(train)
    [own_group] = [k for k in of_type(train, "AWS::EC2::PlacementGroup") if "Move" not in k]
    expected = [
        {
            "zone": f"${{{check_id}.Zone}}",
            "subnet": f"${{{fleet_subnet(train)}}}",
            "group": f"${{{own_group}.GroupName}}",
        }
    ]
    for slot in range(1, 6):
        [subnet] = [k for k in slot_subnets(train) if k.startswith(f"NetworkMove{slot}")]
        [group] = [k for k in slot_groups(train) if k.startswith(f"FleetMove{slot}")]
        expected.append(
            {
                "zone": f"${{{check_id}.Zone{slot}}}",
                "subnet": f"${{{subnet}}}",
                "group": f"${{{group}.GroupName}}",
            }
        )
    assert zones_output(train) == expected
    assert ZONE_MOVE_OUTPUT_KEY not in train["Outputs"]


@pytest.mark.parametrize("overrides", FIXED_ZONE.values(), ids=FIXED_ZONE.keys())
def test_a_fixed_zone_has_no_move_slots_and_one_place(synth, overrides):
    template = synth(**overrides)["TrainStack"].to_json()
    check_id, check = zone_check(template)
    assert (check["MoveSlots"], check["Answers"]) == ("0", "Zone,Zones")
    assert not slot_subnets(template) and not slot_groups(template)
    [place] = zones_output(template)
    assert place["zone"] == f"${{{check_id}.Zone}}"
    given = overrides.get("subnetId")
    assert place["subnet"] == (given or f"${{{fleet_subnet(template)}}}")
    assert ZONE_MOVE_OUTPUT_KEY not in template["Outputs"]


def test_nothing_in_train_stack_may_make_network_at_run_time(train, default):
    actions = {
        a
        for s in statements(default["TrainStack"], "")
        for a in (s["Action"] if isinstance(s["Action"], list) else [s["Action"]])
    }
    assert not actions & {
        "ec2:CreateSubnet",
        "ec2:CreatePlacementGroup",
        "ec2:CreateLaunchTemplateVersion",
        "ec2:*",
        "*",
    }


def test_the_replacement_template_lets_a_launch_override_its_whole_network(default):
    """A launch in a move slot gives NetworkInterfaces (every card, with the slot's subnet)
    and Placement.GroupName, which overwrite the template's. Nothing else of the template
    names a network that could conflict: no SubnetId or security groups beside the
    interfaces, no zone in the placement, and interfaces with nothing but INTERFACE_FIELDS."""
    _, resource = replacement_template(default["TrainStack"])
    data = resource["Properties"]["LaunchTemplateData"]
    assert not {"SubnetId", "SecurityGroupIds", "SecurityGroups"} & data.keys()
    assert set(data["Placement"]) == {"GroupName"}
    for interface in data["NetworkInterfaces"]:
        assert set(interface) == INTERFACE_FIELDS | {"SubnetId"}, interface


def resolve(value, refs: dict):
    """A template value with each Ref and Fn::GetAtt replaced by refs[logical id]."""
    if isinstance(value, dict) and "Ref" in value:
        return refs[value["Ref"]]
    if isinstance(value, dict) and "Fn::GetAtt" in value:
        return refs[value["Fn::GetAtt"][0]]
    if isinstance(value, dict):
        return {k: resolve(v, refs) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, refs) for v in value]
    return value


@mock_aws
def test_nodes_launch_in_a_move_slot_from_the_replacement_template(default, monkeypatch):
    """The template TrainStack deploys, launched as a relaunch does in slot 1: moto puts the
    instances in the slot's subnet and zone (it does not model EFA or placement: the request
    itself is what is checked, research §2d)."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    train = default["TrainStack"].to_json()
    ec2 = boto3.client("ec2", region_name="us-east-1")
    vpc = ec2.create_vpc(CidrBlock=VPC_CIDR)["Vpc"]["VpcId"]
    own = ec2.create_subnet(VpcId=vpc, CidrBlock="10.42.0.0/20", AvailabilityZone="us-east-1a")
    slot = ec2.create_subnet(VpcId=vpc, CidrBlock=MOVE_CIDRS[0], AvailabilityZone="us-east-1c")
    group = ec2.create_security_group(GroupName="fleet", Description="fleet", VpcId=vpc)
    profile = boto3.client("iam").create_instance_profile(InstanceProfileName="fleet")
    _, template = replacement_template(default["TrainStack"])
    data = dict(template["Properties"]["LaunchTemplateData"])
    data.pop("UserData")
    refs = {
        fleet_subnet(train): own["Subnet"]["SubnetId"],
        **{k: group["GroupId"] for k in of_type(train, "AWS::EC2::SecurityGroup")},
        **{k: f"group-{k}" for k in of_type(train, "AWS::EC2::PlacementGroup")},
        **{
            k: profile["InstanceProfile"]["Arn"]
            for k in of_type(train, "AWS::IAM::InstanceProfile")
        },
        "AWS::StackId": "arn:aws:cloudformation:us-east-1:123456789012:stack/TrainStack/guid",
    }
    data = resolve({**data, "ImageId": "ami-12c6146b"}, refs)
    launch_template = ec2.create_launch_template(
        LaunchTemplateName="node0", LaunchTemplateData=data
    )
    [slot_entry] = [p for p in zones_output(train) if p["zone"].endswith(".Zone1}")]
    interfaces = [
        {**{k: i[k] for k in INTERFACE_FIELDS if k in i}, "SubnetId": slot["Subnet"]["SubnetId"]}
        for i in ec2.describe_launch_template_versions(
            LaunchTemplateId=launch_template["LaunchTemplate"]["LaunchTemplateId"]
        )["LaunchTemplateVersions"][0]["LaunchTemplateData"]["NetworkInterfaces"]
    ]
    assert len(interfaces) == 4  # every EFA card of a p4d
    launched = ec2.run_instances(
        LaunchTemplate={
            "LaunchTemplateId": launch_template["LaunchTemplate"]["LaunchTemplateId"],
            "Version": "$Latest",
        },
        MinCount=2,
        MaxCount=2,
        NetworkInterfaces=interfaces,
        Placement={"GroupName": slot_entry["group"]},
    )["Instances"]
    assert {(i["SubnetId"], i["Placement"]["AvailabilityZone"]) for i in launched} == {
        (slot["Subnet"]["SubnetId"], "us-east-1c")
    }
