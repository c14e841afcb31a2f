"""The reaper's run-time zone move may make a subnet, a placement group and a template version
only for TrainStack. TrainStack now makes its move slots at deploy (test_zones_stack.py) and no
longer outputs HorovodFleetZoneMove; these statements go with the run controller's rewrite."""

import json

import pytest
from test_teardown import as_list, render, statements_for

from stacks.teardown.names import FLEET_TAG

MOVE_ACTIONS = (
    "ec2:CreateSubnet",
    "ec2:AssociateRouteTable",
    "ec2:DisassociateRouteTable",
    "ec2:CreatePlacementGroup",
    "ec2:DeleteSubnet",
    "ec2:DeletePlacementGroup",
    "ec2:CreateLaunchTemplateVersion",
)
TRAIN_STACK_KEYS = {
    f"aws:RequestTag/{FLEET_TAG}",
    f"aws:ResourceTag/{FLEET_TAG}",
    "aws:ResourceTag/aws:cloudformation:stack-name",
}


@pytest.mark.parametrize("action", MOVE_ACTIONS)
def test_the_reaper_moves_only_train_stacks_network(default, action):
    """Each action a move takes is allowed only on resources tagged as TrainStack's, or
    created with that tag; none on every resource."""
    found = statements_for({"TeardownStack": default["TeardownStack"]}, action)
    assert found
    for statement in found:
        assert statement["Effect"] == "Allow" and "*" not in as_list(statement["Resource"])
        keys = {k for condition in statement["Condition"].values() for k in condition}
        assert keys & TRAIN_STACK_KEYS, statement
        for key, value in statement["Condition"].get("StringLike", {}).items():
            assert key.endswith(FLEET_TAG) and render(value).endswith("stack/TrainStack/*")


def test_the_reaper_tags_a_subnet_or_group_only_as_it_creates_it(default):
    [tagging] = [
        s
        for s in statements_for({"TeardownStack": default["TeardownStack"]}, "ec2:CreateTags")
        if "CreateSubnet" in json.dumps(s["Condition"])
    ]
    assert tagging["Condition"] == {
        "StringEquals": {"ec2:CreateAction": ["CreateSubnet", "CreatePlacementGroup"]}
    }
    assert sorted(render(r).rsplit(":", 1)[1] for r in tagging["Resource"]) == [
        "placement-group/*",
        "subnet/*",
    ]
