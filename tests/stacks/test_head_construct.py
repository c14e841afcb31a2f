"""TrainStack's head (stacks/train/head.py): the one on-demand CPU instance that runs the
elastic horovodrun, outside every GPU node's fate."""

import pytest
from conftest import fleet_launch_template, fleet_nodes, head_instance, node_document, statements

from stacks.config import ConfigError, FleetConfig
from stacks.instance_types import HEAD_TYPE
from stacks.teardown.names import MIN_NODES_OUTPUT_KEY, REPLACEMENTS_PER_NODE
from stacks.train.fleet import SIGNAL_TIMEOUT
from stacks.train.head import HEAD_ROOT_GIB
from stacks.train.stack import ELASTIC_TIMEOUT_S


@pytest.fixture(scope="module")
def train(default):
    return default["TrainStack"]


def properties(template) -> dict:
    return head_instance(template)[1]["Properties"]


def tags(template) -> dict:
    return {t["Key"]: t["Value"] for t in properties(template)["Tags"]}


def test_one_head_beside_the_nodes_of_its_own_cpu_type_and_never_spot(synth, train):
    assert len(fleet_nodes(train)) == 8
    for stack in (train, synth(market="spot")["TrainStack"]):
        head = properties(stack)
        assert head["InstanceType"] == HEAD_TYPE.name
        # Not the nodes' launch template (where their Spot market is), no market of its own.
        assert "InstanceMarketOptions" not in head
        [(template_id, template)] = [
            (k, t) for k, t in stack.find_resources("AWS::EC2::LaunchTemplate").items()
            if k.startswith("HeadLaunchTemplate")
        ]  # fmt: skip
        assert head["LaunchTemplate"]["LaunchTemplateId"] == {"Ref": template_id}
        assert "InstanceMarketOptions" not in template["Properties"]["LaunchTemplateData"]


def test_the_head_is_in_the_fleets_subnet_and_group_but_not_its_placement_group(train):
    head = properties(train)
    _, launch_template = fleet_launch_template(train)
    [interface, *_] = launch_template["Properties"]["LaunchTemplateData"]["NetworkInterfaces"]
    assert head["SubnetId"] == interface["SubnetId"]
    assert head["SecurityGroupIds"] == interface["Groups"]
    assert "PlacementGroupName" not in head  # it carries no collective
    [node, *_] = fleet_nodes(train).values()
    assert head["IamInstanceProfile"] == node["Properties"]["IamInstanceProfile"]
    assert head["ImageId"] == node["Properties"]["ImageId"]


def test_the_head_requires_imdsv2_and_boots_an_encrypted_gp3_root_big_enough_for_the_image(
    train,
):
    head = properties(train)
    assert head["MetadataOptions"] == {"HttpEndpoint": "enabled", "HttpTokens": "required"}
    [(template_id, template)] = [
        (k, t) for k, t in train.find_resources("AWS::EC2::LaunchTemplate").items()
        if k.startswith("HeadLaunchTemplate")
    ]  # fmt: skip
    assert head["LaunchTemplate"]["LaunchTemplateId"] == {"Ref": template_id}
    data = template["Properties"]["LaunchTemplateData"]
    assert data["MetadataOptions"] == {"HttpEndpoint": "enabled", "HttpTokens": "required"}
    [root] = data["BlockDeviceMappings"]
    assert root["Ebs"]["VolumeType"] == "gp3" and root["Ebs"]["Encrypted"] is True
    assert root["Ebs"]["VolumeSize"] == HEAD_ROOT_GIB > 60  # the training image's root is 60


def test_the_head_is_a_fleet_instance_with_no_node_index(train):
    found = tags(train)
    assert found["horovod-fleet:node"] == "head"
    assert found["horovod-fleet:stack"] == {"Ref": "AWS::StackId"}


def test_the_head_signals_like_a_node_and_waits_for_the_deadline_zone_and_code_guard(train):
    logical_id, head = head_instance(train)
    assert head["CreationPolicy"] == {"ResourceSignal": {"Count": 1, "Timeout": SIGNAL_TIMEOUT}}
    document = node_document(head)
    assert document["role"] == "head" and "node_index" not in document
    assert document["signal"] == {"stack": "TrainStack", "resource": logical_id}
    [deadline] = train.find_resources("Custom::HorovodFleetDeadline")
    [zone] = train.find_resources("Custom::HorovodFleetZone")
    [guard] = train.find_resources("Custom::HorovodFleetCodeGuard")
    assert {deadline, zone, guard} <= set(head["DependsOn"])


def test_the_heads_node_json_is_the_nodes_with_the_elastic_settings(train):
    _, head = head_instance(train)
    [node, *_] = fleet_nodes(train).values()
    head_doc, node_doc = node_document(head), node_document(node)
    differ = {k for k in head_doc.keys() | node_doc.keys() if head_doc.get(k) != node_doc.get(k)}
    assert differ == {"role", "signal", "node_index"}
    assert head_doc["min_nodes"] == 7
    assert head_doc["reset_limit"] == 8 * (2 * REPLACEMENTS_PER_NODE + 1)
    assert head_doc["elastic_timeout_s"] == ELASTIC_TIMEOUT_S


def test_min_nodes_is_an_output_and_follows_its_key(synth, train):
    assert train.find_outputs(MIN_NODES_OUTPUT_KEY)[MIN_NODES_OUTPUT_KEY]["Value"] == "7"
    three = synth(minNodes=3)["TrainStack"]
    assert three.find_outputs(MIN_NODES_OUTPUT_KEY)[MIN_NODES_OUTPUT_KEY]["Value"] == "3"
    assert node_document(head_instance(three)[1])["min_nodes"] == 3


@pytest.mark.parametrize(("nodes", "expected"), [(1, 1), (2, 1), (8, 7)])
def test_min_nodes_defaults_to_one_fewer_than_the_nodes_and_at_least_one(nodes, expected):
    assert config(nodes=nodes).min_nodes == expected


@pytest.mark.parametrize("value", ["0", "9", "two", True])
def test_a_bad_min_nodes_is_one_line_naming_what_is_allowed(value):
    with pytest.raises(ConfigError) as raised:
        config(minNodes=value)
    assert str(raised.value) == (
        f"error: context key minNodes={value!r} is invalid; allowed: an integer from 1 to 8"
    )


def config(**context) -> FleetConfig:
    import app

    return FleetConfig.from_context({**app.default_context(), **context})


def test_the_fleet_may_describe_instances_for_the_heads_discovery(train):
    described = [
        s for s in statements(train, "FleetPolicy") if "ec2:DescribeInstances" in s["Action"]
    ]
    assert described and all(s["Resource"] == "*" for s in described)


def test_the_head_session_output_opens_a_shell_on_the_head(train):
    logical_id, _ = head_instance(train)
    [output] = train.find_outputs("HeadSession").values()
    assert {"Ref": logical_id} in output["Value"]["Fn::Join"][1]
