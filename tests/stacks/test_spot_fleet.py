"""-c market=spot, and the replacement template the run controller relaunches nodes from:
a Spot fleet is one-time Spot Instances that EC2 terminates on interruption, and every node,
Spot or on demand, can be launched again from the one template, all but its index."""

import pytest
from conftest import (
    fleet_launch_template,
    fleet_nodes,
    node_document,
    replacement_template,
    user_data,
)

from contract.names import FLEET_TAG, NODE_TAG, REPLACEMENT_OUTPUT_KEY, REPLACEMENTS_TYPE
from stacks.config import ConfigError, FleetConfig
from stacks.instance_types import GPU_TYPES, quota_note, spot_estimate

SPOT = {"market": "spot"}


def context(**overrides):
    import app

    return {**app.default_context(), **overrides}


@pytest.fixture(scope="module")
def spot(synth):
    return synth(**SPOT)["TrainStack"]


def instances(template) -> dict[str, dict]:
    return fleet_nodes(template)


def test_spot_fleet_is_one_time_spot_terminated_on_interruption(spot):
    _, shared = fleet_launch_template(spot)
    assert shared["Properties"]["LaunchTemplateData"]["InstanceMarketOptions"] == {
        "MarketType": "spot",
        "SpotOptions": {
            "SpotInstanceType": "one-time",
            "InstanceInterruptionBehavior": "terminate",
        },
    }
    _, replacement = replacement_template(spot)
    data = replacement["Properties"]["LaunchTemplateData"]
    assert data["InstanceMarketOptions"]["MarketType"] == "spot"


def test_on_demand_fleet_has_no_market_options(default):
    template = default["TrainStack"]
    for resource in template.find_resources("AWS::EC2::LaunchTemplate").values():
        assert "InstanceMarketOptions" not in resource["Properties"]["LaunchTemplateData"]


def test_every_node_learns_its_market(spot, default):
    for template, market in ((spot, "spot"), (default["TrainStack"], "on-demand")):
        for instance in instances(template).values():
            assert node_document(instance)["market"] == market


@pytest.mark.parametrize("overrides", [{}, SPOT, {"nodes": 2, "instanceType": "g5.12xlarge"}])
def test_one_replacement_template_is_every_node_but_its_index(synth, overrides):
    """What the run controller's one RunInstances gets is the template alone (in another zone,
    with its subnet and placement group): it must launch the nodes CloudFormation launched, down
    to their node.json, except what is a node's own: its index (read at boot from the launch
    assignment), its index tag (the controller tags it) and its CreationPolicy signal."""
    template = synth(**overrides)["TrainStack"]
    _, shared = fleet_launch_template(template)
    nodes = instances(template)
    assert len(nodes) == overrides.get("nodes", 8)
    replacement_id, replacement = replacement_template(template)
    output = template.to_json()["Outputs"][REPLACEMENT_OUTPUT_KEY]["Value"]
    assert output == {"Ref": replacement_id}
    data = replacement["Properties"]["LaunchTemplateData"]
    for key, value in shared["Properties"]["LaunchTemplateData"].items():
        assert data[key] == value, key
    [node0] = [i for k, i in nodes.items() if k.startswith("FleetNode0")]
    props = node0["Properties"]
    assert data["ImageId"] == props["ImageId"]
    assert data["InstanceType"] == props["InstanceType"]
    assert data["Placement"]["GroupName"] == props["PlacementGroupName"]
    assert data["IamInstanceProfile"]["Arn"]["Fn::GetAtt"][0] == props["IamInstanceProfile"]["Ref"]
    assert data["Monitoring"] == {"Enabled": True} and data["EbsOptimized"] is True
    launched = {"Properties": {"UserData": data["UserData"]}}
    document = node_document(launched)
    assert "node_index" not in document and document["signal"] is None
    for instance in nodes.values():
        own = node_document(instance)
        assert own.pop("node_index") in range(len(nodes)) and own.pop("signal")
        assert own == {k: v for k, v in document.items() if k != "signal"}
    # A replacement that fails before its bootstrap halts; it has no resource to signal.
    assert "signal-resource" not in user_data(launched)
    tags = {
        spec["ResourceType"]: {t["Key"]: t["Value"] for t in spec["Tags"]}
        for spec in data["TagSpecifications"]
    }
    assert set(tags) == {"instance", "volume", "network-interface"}
    for kind_tags in tags.values():
        assert NODE_TAG not in kind_tags
        assert kind_tags[FLEET_TAG] == {"Ref": "AWS::StackId"}
        assert kind_tags["Project"] == "horovod-fleet"
    [own] = replacement["Properties"]["TagSpecifications"]
    assert own["ResourceType"] == "launch-template"
    assert {t["Key"]: t["Value"] for t in own["Tags"]}[FLEET_TAG] == {"Ref": "AWS::StackId"}
    for index in range(len(nodes)):
        [instance] = [i for k, i in nodes.items() if k.startswith(f"FleetNode{index}")]
        assert node_document(instance)["node_index"] == index
        instance_tags = {t["Key"]: t["Value"] for t in instance["Properties"]["Tags"]}
        assert instance_tags[NODE_TAG] == str(index)
        assert instance_tags[FLEET_TAG] == {"Ref": "AWS::StackId"}


def test_the_replacements_resource_is_deleted_before_anything_of_the_fleet(spot):
    """Its Delete terminates the replacements CloudFormation does not know; deleted first, it
    must depend on every instance, interface owner and network resource of the fleet."""
    [(logical_id, resource)] = spot.find_resources(REPLACEMENTS_TYPE).items()
    depends = set(resource["DependsOn"])
    everything = spot.to_json()["Resources"]
    fleet = {k for k in everything if k.startswith(("Fleet", "Network"))}
    assert fleet <= depends
    assert not any(logical_id in (r.get("DependsOn") or []) for r in everything.values())


def test_spot_with_a_capacity_reservation_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"market='spot'.*reservation holds On-Demand capacity"):
        FleetConfig.from_context(
            context(market="spot", capacityReservationId="cr-0123456789abcdef0")
        )


@pytest.mark.parametrize("value", ["Spot", "spot ", "reserved", ""])
def test_other_markets_are_refused(value):
    with pytest.raises(ConfigError, match="allowed: on-demand or spot"):
        FleetConfig.from_context(context(market=value))


def test_synthesis_prints_the_spot_estimate_with_its_source():
    line = spot_estimate(GPU_TYPES["p4d.24xlarge"], 8, "us-east-1")
    assert "8 x p4d.24xlarge at $6.289-14.1051/h + head $0.17/h on demand = $50.48-113.01/h" in line
    assert "on demand $175.83/h" in line
    assert "@e385a0d" in line and "describe-spot-price-history --region us-east-1" in line
    unknown = spot_estimate(GPU_TYPES["g5.xlarge"], 1, "eu-west-1")
    assert "no recorded price for g5.xlarge" in unknown and "--region eu-west-1" in unknown


def test_a_spot_fleet_is_told_its_spot_quota():
    assert "'All P4, P3 and P2 Spot Instance Requests'" in quota_note(
        GPU_TYPES["p4d.24xlarge"], 8, "spot"
    )
    assert "'All P5 Spot Instance Requests'" in quota_note(GPU_TYPES["p5.48xlarge"], 2, "spot")
    assert "L-417A185B" in quota_note(GPU_TYPES["p4d.24xlarge"], 8)
