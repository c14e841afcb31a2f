"""The head's launch templates (stacks/train/head.py): its instance's, whose root volume is ready
at boot as the nodes' are, and the one the run controller launches the head again from when EC2
ended it (TrainStack's output HorovodFleetHeadTemplate, docs/contracts.md)."""

import pytest
import train_stack
from conftest import head_instance, head_template, node_document, replacement_template
from test_node_json_contract import bootstrap_reads
from test_teardown import role_statements

from stacks.instance_types import HEAD_TYPE
from stacks.root_volume import head_init_rate, init_rate
from stacks.teardown.names import FLEET_TAG, HEAD_NODE, HEAD_TEMPLATE_OUTPUT_KEY, NODE_TAG
from stacks.train.head import HEAD_ROOT_GIB


@pytest.fixture(scope="module")
def train(default):
    return default["TrainStack"]


def data(template: dict) -> dict:
    return template["Properties"]["LaunchTemplateData"]


def test_the_heads_root_volume_is_initialized_at_boot_as_the_nodes_are(train):
    """HeadLaunchTemplate, the head instance's, sets VolumeInitializationRate like the nodes'
    two templates: a head is not slowed by a lazily loaded image."""
    logical_id, _ = head_template(train, "LaunchTemplate")
    assert head_instance(train)[1]["Properties"]["LaunchTemplate"]["LaunchTemplateId"] == {
        "Ref": logical_id
    }
    for _, found in (head_template(train, "LaunchTemplate"), head_template(train, "Replacement")):
        [root] = data(found)["BlockDeviceMappings"]
        assert root["Ebs"]["VolumeInitializationRate"] == 300
        assert root["Ebs"]["VolumeSize"] == HEAD_ROOT_GIB
        assert root["Ebs"]["Encrypted"] is True


@pytest.mark.parametrize(("nodes", "rate"), [(1, 300), (8, 300), (16, 200), (17, None), (51, 300)])
def test_the_heads_rate_fits_beside_every_nodes_in_the_regions_5000_mib_s(nodes, rate):
    """The head's root is created with the nodes': together within the region's cumulative
    5,000 MiB/s; past 50 nodes theirs load at EBS's default rate and leave it all."""
    assert head_init_rate(nodes) == rate
    assert nodes * (init_rate(nodes) or 0) + (rate or 0) <= 5000


def test_the_head_template_is_a_whole_launch_of_the_head_in_its_subnet_and_group(train):
    """Everything the run controller's role may launch only from a template: the head's image,
    type, role, subnet and security group (the instance's own), no placement group, no market,
    IMDSv2, the head's tags on the instance and the fleet's on the template itself."""
    _, head = head_instance(train)
    props = head["Properties"]
    _, template = head_template(train, "Replacement")
    found = data(template)
    assert found["ImageId"] == props["ImageId"]
    assert found["InstanceType"] == HEAD_TYPE.name
    [interface] = found["NetworkInterfaces"]
    assert interface["SubnetId"] == props["SubnetId"]
    assert interface["Groups"] == props["SecurityGroupIds"]
    assert "Placement" not in found and "InstanceMarketOptions" not in found
    assert found["MetadataOptions"] == {"HttpEndpoint": "enabled", "HttpTokens": "required"}
    _, node_template = replacement_template(train)
    assert found["IamInstanceProfile"] == data(node_template)["IamInstanceProfile"]
    [instance_tags] = [s["Tags"] for s in found["TagSpecifications"] if s["ResourceType"] == "instance"]  # fmt: skip
    tags = {t["Key"]: t["Value"] for t in instance_tags}
    assert tags[NODE_TAG] == HEAD_NODE and tags[FLEET_TAG] == {"Ref": "AWS::StackId"}
    [own] = template["Properties"]["TagSpecifications"]
    assert own["ResourceType"] == "launch-template"
    assert {t["Key"]: t["Value"] for t in own["Tags"]}[FLEET_TAG] == {"Ref": "AWS::StackId"}


def test_the_launched_head_runs_the_heads_node_json_without_a_signal(train, tmp_path):
    """The head's own node.json, but the CreationPolicy is the first head's: bootstrap accepts it
    as it is."""
    _, head = head_instance(train)
    _, template = head_template(train, "Replacement")
    document = node_document({"Properties": {"UserData": data(template)["UserData"]}})
    first = node_document(head)
    assert document["signal"] is None
    assert {k: v for k, v in document.items() if k != "signal"} == {
        k: v for k, v in first.items() if k != "signal"
    }
    result = bootstrap_reads(document, "role", tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "head"


def test_the_head_template_is_trainstacks_output_for_the_controller_and_waits_for_the_guard(train):
    logical_id, template = head_template(train, "Replacement")
    output = train.find_outputs(HEAD_TEMPLATE_OUTPUT_KEY)[HEAD_TEMPLATE_OUTPUT_KEY]
    assert output["Value"] == {"Ref": logical_id}
    assert HEAD_TEMPLATE_OUTPUT_KEY == train_stack.HEAD_TEMPLATE_OUTPUT_KEY
    [guard] = train.find_resources("Custom::HorovodFleetCodeGuard")
    assert guard in template["DependsOn"]


def test_the_controller_may_reboot_the_fleet_and_read_its_status_checks(default):
    """RebootInstances beside stop, start and terminate, on the fleet's instances only, and
    DescribeInstanceStatus (read-only, no resource-level permission)."""
    found = role_statements(default["TeardownStack"], "RunControllerStepsRole")
    reboot = [s for s in found if "ec2:RebootInstances" in s["Action"]]
    assert reboot and all(s.get("Condition") for s in reboot)
    assert all("ec2:StopInstances" in s["Action"] for s in reboot)
    described = [s for s in found if "ec2:DescribeInstanceStatus" in s["Action"]]
    assert described and all(s["Resource"] == "*" for s in described)
