"""TrainStack's HorovodFleetZoneMove output (stacks/train/stack.py): the zones that offer the
type and free blocks of its VPC. The run controller no longer reads it: it launches into the
zones TrainStack made at deploy (HorovodFleetZones)."""

import ipaddress
import json

import pytest

from stacks.network import MOVE_CIDRS, VPC_CIDR
from stacks.teardown.names import ZONE_MOVE_OUTPUT_KEY

RESERVATION = "cr-0123456789abcdef0"


def move_output(train) -> dict | None:
    outputs = train.to_json().get("Outputs", {})
    return outputs.get(ZONE_MOVE_OUTPUT_KEY, {}).get("Value")


def test_a_fleet_in_its_own_vpc_may_move_to_the_zones_that_offer_its_type(default):
    train = default["TrainStack"].to_json()
    value = move_output(default["TrainStack"])
    parts = value["Fn::Join"][1]
    tokens = [p for p in parts if not isinstance(p, str)]
    [zone] = [k for k, r in train["Resources"].items() if r["Type"] == "Custom::HorovodFleetZone"]
    [vpc] = [k for k, r in train["Resources"].items() if r["Type"] == "AWS::EC2::VPC"]
    [template] = [
        r
        for k, r in train["Resources"].items()
        if r["Type"] == "AWS::EC2::LaunchTemplate" and k.startswith("FleetLaunchTemplate")
    ]
    fleet_subnet = template["Properties"]["LaunchTemplateData"]["NetworkInterfaces"][0]["SubnetId"]
    [table] = [
        r["Properties"]["RouteTableId"]
        for r in train["Resources"].values()
        if r["Type"] == "AWS::EC2::SubnetRouteTableAssociation"
        and r["Properties"]["SubnetId"] == fleet_subnet
    ]
    assert tokens == [{"Fn::GetAtt": [zone, "Zones"]}, {"Ref": vpc}, table]
    rendered = "".join(p if isinstance(p, str) else '"x"' for p in parts).replace('""x""', '"x"')
    assert json.loads(rendered)["cidrs"] == list(MOVE_CIDRS)


def test_the_blocks_for_moved_subnets_are_free_in_the_vpc(default):
    """Inside the VPC, and clear of every subnet CloudFormation makes there."""
    vpc = ipaddress.ip_network(VPC_CIDR)
    used = [
        ipaddress.ip_network(r["Properties"]["CidrBlock"])
        for r in default["TrainStack"].to_json()["Resources"].values()
        if r["Type"] == "AWS::EC2::Subnet"
    ]
    blocks = [ipaddress.ip_network(c) for c in MOVE_CIDRS]
    assert used and all(b.subnet_of(vpc) for b in blocks)
    assert not [
        (b, u) for b in blocks for u in used + [x for x in blocks if x != b] if b.overlaps(u)
    ]


@pytest.mark.parametrize(
    "overrides",
    [
        {"vpcId": "vpc-0123abcd", "subnetId": "subnet-0123abcd"},
        {"capacityReservationId": RESERVATION},
    ],
    ids=["own subnet", "capacity reservation"],
)
def test_a_fleet_whose_zone_is_fixed_never_moves(synth, overrides):
    assert move_output(synth(**overrides)["TrainStack"]) is None


def test_the_zone_answer_names_its_attributes_so_older_stacks_get_an_update(default):
    """A TrainStack deployed before `Zones` existed stored an answer without it; only a
    changed property makes CloudFormation ask the reaper again instead of failing on it."""
    [zone] = default["TrainStack"].find_resources("Custom::HorovodFleetZone").values()
    value = move_output(default["TrainStack"])
    asked = {p["Fn::GetAtt"][1] for p in value["Fn::Join"][1] if "Fn::GetAtt" in p}
    assert set(zone["Properties"]["Answers"].split(",")) == {"Zone"} | asked
