"""TrainStack: exactly `nodes` GPU instances in one cluster placement group and one subnet."""

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import (
    fleet_launch_template,
    fleet_nodes,
    node_document,
    replacement_template,
    resources,
    statements,
    user_data,
)

from stacks import startup_estimate
from stacks.instance_types import GPU_TYPES
from stacks.root_volume import init_rate
from stacks.train.fleet import SIGNAL_TIMEOUT

# Each distinct configuration costs a synthesis: tests share these.
SMALL_G5 = {
    "instanceType": "g5.xlarge",
    "nodes": 2,
    "epochs": 5,
    "batchPerGpu": 64,
    "arch": "resnet18",
    "imageSize": 128,
}
ONE_NODE_OWN_AMI = {"ami": "ami-0123456789abcdef0", "nodes": 1, "run": "exp-7"}
P4D = {"instanceType": "p4d.24xlarge", "nodes": 3}
RESERVATION = "cr-0123456789abcdef0"


def instances(template) -> dict[str, dict]:
    return fleet_nodes(template)


def interfaces(template) -> list[dict]:
    _, launch_template = fleet_launch_template(template)
    return launch_template["Properties"]["LaunchTemplateData"]["NetworkInterfaces"]


@pytest.fixture(scope="module")
def template(default):
    return default["TrainStack"]


@pytest.mark.parametrize("context", [{}, SMALL_G5, ONE_NODE_OWN_AMI, P4D])
def test_exactly_nodes_instances(synth, context):
    assert len(instances(synth(**context)["TrainStack"])) == context.get("nodes", 8)


def test_one_cluster_placement_group_holds_every_node(template):
    # The others are the move slots' (test_zones_stack.py), empty until a relaunch moves.
    [(group_id, group)] = [
        (k, g)
        for k, g in template.find_resources("AWS::EC2::PlacementGroup").items()
        if "Move" not in k
    ]
    assert group["Properties"]["Strategy"] == "cluster"
    for instance in instances(template).values():
        assert instance["Properties"]["PlacementGroupName"] == {
            "Fn::GetAtt": [group_id, "GroupName"]
        }


def test_every_node_uses_one_launch_template_in_one_private_subnet(template):
    template_id, _ = fleet_launch_template(template)
    for instance in instances(template).values():
        assert instance["Properties"]["LaunchTemplate"]["LaunchTemplateId"] == {"Ref": template_id}
        assert "SubnetId" not in instance["Properties"]
    [subnet_id] = {interface["SubnetId"]["Ref"] for interface in interfaces(template)}
    subnet = template.to_json()["Resources"][subnet_id]["Properties"]
    assert "Fn::GetAtt" in subnet["AvailabilityZone"]  # picked at deploy, see below
    assert subnet["MapPublicIpOnLaunch"] is False


def test_the_default_p4d_gets_an_efa_interface_per_network_card(template):
    found = interfaces(template)
    assert [(i["NetworkCardIndex"], i["DeviceIndex"]) for i in found] == [
        (0, 0),
        (1, 1),
        (2, 1),
        (3, 1),
    ]
    assert {i["InterfaceType"] for i in found} == {"efa"}
    document = node_document(next(iter(instances(template).values())))
    assert (document["instance_type"], document["gpudirect"]) == ("p4d.24xlarge", True)


def test_p5_gets_32_efa_interfaces_one_per_network_card(synth):
    found = interfaces(synth(instanceType="p5.48xlarge", nodes=2)["TrainStack"])
    assert [i["NetworkCardIndex"] for i in found] == list(range(32))
    assert [i["DeviceIndex"] for i in found] == [0] + [1] * 31
    assert {i["InterfaceType"] for i in found} == {"efa"}


def test_no_efa_where_the_type_has_none(synth):
    template = synth(**SMALL_G5)["TrainStack"]
    [interface] = interfaces(template)
    assert "InterfaceType" not in interface
    document = node_document(next(iter(instances(template).values())))
    assert (document["efa"], document["gpus_per_node"], document["instance_store"]) == (
        False,
        1,
        True,
    )


def test_security_group_allows_only_fleet_members_in(template):
    [(group_id, group)] = template.find_resources("AWS::EC2::SecurityGroup").items()
    assert "SecurityGroupIngress" not in group["Properties"]
    [ingress] = template.find_resources("AWS::EC2::SecurityGroupIngress").values()
    assert ingress["Properties"]["IpProtocol"] == "-1"
    assert ingress["Properties"]["SourceSecurityGroupId"] == {"Fn::GetAtt": [group_id, "GroupId"]}
    [egress_self] = template.find_resources("AWS::EC2::SecurityGroupEgress").values()
    assert egress_self["Properties"]["DestinationSecurityGroupId"] == {
        "Fn::GetAtt": [group_id, "GroupId"]
    }
    world = [
        r for r in group["Properties"]["SecurityGroupEgress"] if r.get("CidrIp") == "0.0.0.0/0"
    ]
    # The baked image installs nothing at boot: no apt mirrors, HTTPS to AWS APIs only.
    assert sorted(r["FromPort"] for r in world) == [443]
    assert interfaces(template)[0]["Groups"] == [{"Fn::GetAtt": [group_id, "GroupId"]}]


def test_no_world_open_ingress_anywhere(default):
    for template in default.values():
        for rule in template.find_resources("AWS::EC2::SecurityGroupIngress").values():
            assert "CidrIp" not in rule["Properties"]
        for group in template.find_resources("AWS::EC2::SecurityGroup").values():
            assert not group["Properties"].get("SecurityGroupIngress")


def test_s3_gateway_endpoint_serves_the_fleet_subnet(template):
    [endpoint] = template.find_resources("AWS::EC2::VPCEndpoint").values()
    assert endpoint["Properties"]["VpcEndpointType"] == "Gateway"
    assert "s3" in str(endpoint["Properties"]["ServiceName"])
    subnet_id = interfaces(template)[0]["SubnetId"]["Ref"]
    [association] = [
        a["Properties"]
        for a in template.find_resources("AWS::EC2::SubnetRouteTableAssociation").values()
        if a["Properties"]["SubnetId"] == {"Ref": subnet_id}
    ]
    assert association["RouteTableId"] in endpoint["Properties"]["RouteTableIds"]


def root_volume(template) -> dict:
    _, launch_template = fleet_launch_template(template)
    [root] = launch_template["Properties"]["LaunchTemplateData"]["BlockDeviceMappings"]
    return root


def test_imdsv2_encrypted_gp3_root_of_at_least_200_gib(template):
    for instance in instances(template).values():
        props = instance["Properties"]
        assert props["MetadataOptions"]["HttpTokens"] == "required"
        assert "KeyName" not in props
        assert "BlockDeviceMappings" not in props
    root = root_volume(template)
    assert root["DeviceName"] == "/dev/sda1"
    assert root["Ebs"]["Encrypted"] is True
    assert root["Ebs"]["VolumeType"] == "gp3"
    assert root["Ebs"]["VolumeSize"] >= 200


def test_the_root_volume_is_ready_at_boot_in_both_launch_templates(template):
    """The image's snapshot is downloaded at 300 MiB/s from the volume's creation, not block by
    block on first read, and read at 500 MiB/s: the fleet's nodes and their replacements."""
    for _, launch_template in (fleet_launch_template(template), replacement_template(template)):
        [root] = launch_template["Properties"]["LaunchTemplateData"]["BlockDeviceMappings"]
        assert root["Ebs"]["VolumeInitializationRate"] == 300
        assert root["Ebs"]["Throughput"] > 125


@pytest.mark.parametrize(("nodes", "rate"), [(1, 300), (16, 300), (17, 294), (50, 100), (51, None)])
def test_every_node_s_initialization_fits_the_region_s_5000_mib_s(nodes, rate):
    """Over the region's 5,000 MiB/s of concurrent initializations a launch fails: past 50
    nodes the volumes load at EBS's default rate."""
    assert init_rate(nodes) == rate
    assert rate is None or nodes * rate <= 5000


def test_nodes_may_read_their_own_launch_time_and_nothing_more_of_ec2(template):
    found = statements(template, "FleetPolicy")
    ec2 = [s for s in found if any(str(a).startswith("ec2:") for a in _actions(s))]
    assert [(_actions(s), s["Resource"]) for s in ec2] == [(["ec2:DescribeInstances"], "*")]


def _actions(statement: dict) -> list[str]:
    action = statement["Action"]
    return action if isinstance(action, list) else [action]


def test_node_json_carries_synthesis_s_start_up_budget(template):
    document = node_document(next(iter(instances(template).values())))
    phases = startup_estimate.startup_phases(GPU_TYPES["p4d.24xlarge"], 8, init_rate=300)
    assert document["startup_budget_s"] == startup_estimate.budget(phases)
    assert {"launch", "own_shards", "data_pull", "first_step"} <= set(document["startup_budget_s"])


def test_every_node_boots_the_image_imagestack_baked(default):
    """Read from ImageStack when TrainStack deploys (tests/stacks/test_image_check.py)."""
    template = default["TrainStack"]
    image_ids = [i["Properties"]["ImageId"] for i in instances(template).values()]
    assert all(image_id == image_ids[0] for image_id in image_ids)
    assert not template.to_json().get("Parameters", {}).keys() - {"BootstrapVersion"}
    [(function, (answer, attribute))] = image_ids[0].items()
    assert (function, attribute) == ("Fn::GetAtt", "ImageId")
    assert template.to_json()["Resources"][answer]["Type"] == "Custom::HorovodFleetImage"


def test_nodes_expect_a_horovod_fleet_image_with_the_pinned_versions(template):
    for instance in instances(template).values():
        image = node_document(instance)["image"]
        assert image["manifest"] == "/opt/horovod-fleet/image.json"
        assert (image["tensorflow"], image["horovod"]) == ("2.15.1", "0.28.1")
        assert image["ami"]


def test_an_ami_id_is_used_as_is_without_imagestack(synth):
    template = synth(**ONE_NODE_OWN_AMI)["TrainStack"]
    [instance] = instances(template).values()
    assert instance["Properties"]["ImageId"] == "ami-0123456789abcdef0"
    assert node_document(instance)["image"]["ami"] == "ami-0123456789abcdef0"
    assert "ImageStack" not in json.dumps(template.to_json())


def test_each_node_waits_for_its_signal(template):
    for instance in instances(template).values():
        assert instance["CreationPolicy"] == {
            "ResourceSignal": {"Count": 1, "Timeout": SIGNAL_TIMEOUT}
        }
    assert SIGNAL_TIMEOUT == "PT60M"


def run_user_data(instance: dict, tmp_path: Path, stubs: dict[str, str]) -> tuple[int, str]:
    """Run an instance's user-data with its directories under tmp_path and `stubs` (name ->
    bash body) first on PATH; every stub logs its arguments. Returns (exit status, calls)."""
    text = user_data(instance)
    for directory in ("/var/log/horovod-fleet", "/opt/horovod-fleet", "/etc/horovod-fleet"):
        text = text.replace(directory, f"{tmp_path}{directory}")
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    calls.touch()
    for name, body in stubs.items():
        (bin_dir / name).write_text(f'#!/bin/bash\necho "{name} $*" >>{calls}\n{body}\n')
        (bin_dir / name).chmod(0o755)
    script = tmp_path / "user-data.sh"
    script.write_text(text)
    result = subprocess.run(
        ["bash", str(script)],
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    return result.returncode, calls.read_text()


def test_an_imds_failure_signals_failure_at_once(template, tmp_path):
    """The first thing user-data does can fail: it must fail the node, not wait out the
    creation timeout."""
    logical_id, instance = next(iter(instances(template).items()))
    status, calls = run_user_data(
        instance, tmp_path, {"curl": "exit 7", "aws": "exit 0", "shutdown": "exit 0"}
    )
    assert status != 0
    assert "--status FAILURE" in calls and f"--logical-resource-id {logical_id}" in calls
    assert "shutdown" not in calls  # the signal went through


def test_a_node_that_cannot_signal_halts(template, tmp_path):
    _, instance = next(iter(instances(template).items()))
    status, calls = run_user_data(
        instance, tmp_path, {"curl": "exit 7", "aws": "exit 255", "shutdown": "exit 0"}
    )
    assert status != 0
    assert "shutdown -h +1" in calls


def test_user_data_names_each_node_and_starts_the_train_bootstrap(template):
    indexes = []
    for logical_id, instance in instances(template).items():
        text = user_data(instance)
        assert (
            "NODE_JSON=/etc/horovod-fleet/node.json bash /opt/horovod-fleet/bootstrap/"
            "train_node.sh /etc/horovod-fleet/node.json" in text
        )
        assert f"--logical-resource-id {logical_id} " in text
        assert "--status FAILURE || shutdown -h +1; }\ntrap on_failure ERR\n" in text
        document = node_document(instance)
        indexes.append(document["node_index"])
        assert document["signal"] == {"stack": "TrainStack", "resource": logical_id}
        assert document["role"] == "train"
        assert (document["nodes"], document["gpus_per_node"], document["efa"]) == (8, 8, True)
        assert document["run"] == "resnet50-1"
        assert document["runs_prefix"] == "runs/resnet50-1/"
        assert document["dataset_prefix"] == "tfrecords/"
        assert document["trainer"] == {
            "recipe": "goyal",
            "epochs": None,  # the recipe's: the trainer settles it
            "batch_per_gpu": 256,
            "arch": "resnet50",
            "image_size": 224,
            "eval_every": 10,
            "target_top1": None,
            "data_wait_s": 600,
            "checkpoint_every_s": 100,  # a tenth of the estimate (84 s) would cost 1.2% in saves
        }
        assert document["metrics"] == {
            "namespace": "HorovodFleet",
            "dimension": {"Run": "resnet50-1"},
        }
    assert sorted(indexes) == list(range(8))


def test_hyperparameters_reach_node_json(synth):
    template = synth(**SMALL_G5, evalEvery=5, targetTop1="0.759", recipe="fast")["TrainStack"]
    document = node_document(next(iter(instances(template).values())))
    assert document["trainer"] == {
        "recipe": "fast",
        "epochs": 5,
        "batch_per_gpu": 64,
        "arch": "resnet18",
        "image_size": 128,
        "eval_every": 5,
        "target_top1": 0.759,
        "data_wait_s": 600,
        "checkpoint_every_s": 600,  # no published figure for an A10G: the longest interval
    }


def test_role_writes_only_under_its_run(template):
    found = statements(template, "FleetPolicy")
    run_objects = (
        "arn:<AWS::Partition>:s3:::horovod-fleet-<AWS::AccountId>-us-east-1/runs/resnet50-1/"
    )
    for statement in found:
        actions = (
            statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        )
        if any(
            a in ("s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload") for a in actions
        ):
            assert all(r.startswith(run_objects) for r in resources(statement)), statement
        assert "*" not in actions and "s3:*" not in actions
    reads = [r for s in found if s["Action"] == "s3:GetObject" for r in resources(s)]
    assert "arn:<AWS::Partition>:s3:::horovod-fleet-<AWS::AccountId>-us-east-1/tfrecords/*" in reads
    [signal] = [s for s in found if s["Action"] == "cloudformation:SignalResource"]
    assert signal["Resource"] == {"Ref": "AWS::StackId"}


def test_run_name_scopes_the_role(synth):
    found = statements(synth(**ONE_NODE_OWN_AMI)["TrainStack"], "FleetPolicy")
    writes = [r for s in found if "s3:PutObject" in s["Action"] for r in resources(s)]
    assert writes == [
        "arn:<AWS::Partition>:s3:::horovod-fleet-<AWS::AccountId>-us-east-1/runs/exp-7/*"
    ]


def test_everything_taggable_carries_project_and_run(template):
    for logical_id, resource in template.to_json()["Resources"].items():
        tags = resource.get("Properties", {}).get("Tags")
        if isinstance(tags, list):
            pairs = {t["Key"]: t["Value"] for t in tags}
            assert pairs.get("Project") == "horovod-fleet", logical_id
            assert pairs.get("horovod-fleet:run") == "resnet50-1", logical_id


def test_an_existing_vpc_is_used_without_creating_one(synth):
    template = synth(vpcId="vpc-0123abcd", subnetId="subnet-0123abcd", nodes=2, az="us-east-1a")[
        "TrainStack"
    ]
    assert not template.find_resources("AWS::EC2::VPC")
    assert not template.find_resources("AWS::EC2::NatGateway")
    assert {i["SubnetId"] for i in interfaces(template)} == {"subnet-0123abcd"}
    [group] = template.find_resources("AWS::EC2::SecurityGroup").values()
    assert group["Properties"]["VpcId"] == "vpc-0123abcd"


def test_nodes_start_after_their_route_out_exists(template):
    for instance in instances(template).values():
        assert any("DefaultRoute" in d for d in instance["DependsOn"])


def test_no_node_launches_before_the_dataset_check_finds_the_manifest(template):
    [(check_id, check)] = template.find_resources("Custom::HorovodFleetDataset").items()
    assert check["Properties"]["Key"] == "tfrecords/manifest.json"
    assert "Bucket" in check["Properties"] and "ServiceToken" in check["Properties"]
    for instance in instances(template).values():
        assert check_id in instance["DependsOn"]


def test_a_synthetic_benchmark_needs_no_dataset(synth):
    template = synth(benchmark="true", nodes=2)["TrainStack"]
    assert not template.find_resources("Custom::HorovodFleetDataset")


def own_subnets(template) -> list[dict]:
    """The fleet's and the public subnet; the move slots' go in other zones (test_zones_stack.py)."""
    return [s for k, s in template.find_resources("AWS::EC2::Subnet").items() if "Move" not in k]


def test_the_fleets_subnets_go_in_the_zone_the_zone_check_picks_at_deploy(template):
    [(zone_id, zone)] = template.find_resources("Custom::HorovodFleetZone").items()
    assert zone["Properties"]["InstanceType"] == "p4d.24xlarge"
    # cdk.json names no zone: the first of the region that offers the type (issue 50).
    assert (zone["Properties"]["PreferredZone"], zone["Properties"]["Fixed"]) == ("", "false")
    subnets = own_subnets(template)
    assert subnets and all(
        s["Properties"]["AvailabilityZone"] == {"Fn::GetAtt": [zone_id, "Zone"]} for s in subnets
    )
    for instance in instances(template).values():
        assert zone_id in instance["DependsOn"]


def test_a_given_subnet_fixes_the_zone_which_must_offer_the_type(synth):
    template = synth(vpcId="vpc-0123abcd", subnetId="subnet-0123abcd", nodes=2, az="us-east-1a")[
        "TrainStack"
    ]
    [(zone_id, zone)] = template.find_resources("Custom::HorovodFleetZone").items()
    assert zone["Properties"]["Fixed"] == "true"
    for instance in instances(template).values():
        assert zone_id in instance["DependsOn"]


def test_a_zone_id_is_the_preferred_zone_the_zone_check_names_at_deploy(synth):
    # The zone check turns use1-az4 into this account's zone name (test_deploy_answers.py); the subnets
    # take its answer, never the ID as a name.
    template = synth(az="use1-az4", nodes=2)["TrainStack"]
    [(zone_id, zone)] = template.find_resources("Custom::HorovodFleetZone").items()
    assert (zone["Properties"]["PreferredZone"], zone["Properties"]["Fixed"]) == (
        "use1-az4",
        "false",
    )
    subnets = own_subnets(template)
    assert subnets and all(
        s["Properties"]["AvailabilityZone"] == {"Fn::GetAtt": [zone_id, "Zone"]}
        and "AvailabilityZoneId" not in s["Properties"]
        for s in subnets
    )


def test_a_zone_id_with_a_capacity_reservation_fixes_the_subnets_by_id(synth):
    template = synth(az="use1-az4", nodes=2, capacityReservationId=RESERVATION)["TrainStack"]
    [zone] = template.find_resources("Custom::HorovodFleetZone").values()
    assert (zone["Properties"]["PreferredZone"], zone["Properties"]["Fixed"]) == (
        "use1-az4",
        "true",
    )
    subnets = template.find_resources("AWS::EC2::Subnet").values()
    assert subnets and all(
        s["Properties"]["AvailabilityZoneId"] == "use1-az4"
        and "AvailabilityZone" not in s["Properties"]
        for s in subnets
    )


def test_the_run_has_a_dashboard_and_outputs_the_watch_command(template):
    [dashboard] = template.find_resources("AWS::CloudWatch::Dashboard").values()
    body = json.dumps(dashboard["Properties"]["DashboardBody"])
    for shown in (
        "images_per_s",
        "top1",
        "nvidia_smi_utilization_gpu",
        "nvidia_smi_memory_used",
        "NetworkOut",
        "usd_so_far",
        '\\"HorovodFleet\\",\\"attempt\\"',  # the attempt metric, not just the word
        "horovod-fleet status --run resnet50-1 --watch",
    ):
        assert shown in body, shown
    assert "alarm" in body  # the idle alarm's status widget
    outputs = template.to_json()["Outputs"]
    assert outputs["WatchCommand"]["Value"] == "horovod-fleet status --run resnet50-1 --watch"
    assert "dashboards/dashboard/horovod-fleet-resnet50-1" in json.dumps(outputs["Dashboard"])


def test_notify_email_subscribes_to_a_topic_the_nodes_may_publish_to(synth):
    # The configuration test_one_mail.py's ANY_REGION_MAILED, synthesized once for both.
    template = synth(
        region="us-west-2", notifyEmail="ml@example.com", budgetEmail="money@example.com", nodes=1
    )["TrainStack"]
    [(topic_id, topic)] = template.find_resources("AWS::SNS::Topic").items()
    # The run controller may publish only to this prefix, and finds the topic through the output.
    assert topic["Properties"]["TopicName"] == "horovod-fleet-notify-resnet50-1"
    assert template.to_json()["Outputs"]["NotifyTopic"]["Value"] == {"Ref": topic_id}
    [subscription] = template.find_resources("AWS::SNS::Subscription").values()
    assert subscription["Properties"]["Endpoint"] == "ml@example.com"
    document = node_document(next(iter(instances(template).values())))
    assert document["notify_topic_arn"] == "<token>"
    assert document["cost"] == {
        "usd_per_hour": 22.128,  # the node and the head
        "prices_as_of": "2025-06 (us-east-1, Linux, on-demand)",
        "max_hours": 4.0,
    }
    policies = json.dumps(template.find_resources("AWS::IAM::Policy"))
    assert '"sns:Publish"' in policies and topic_id in policies


def test_without_notify_email_no_topic(template):
    assert not template.find_resources("AWS::SNS::Topic")
    document = node_document(next(iter(instances(template).values())))
    assert document["notify_topic_arn"] is None
