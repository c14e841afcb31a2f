"""PreprocessStack: a t2.large in unlimited mode with an sc1 data volume, reachable only by SSM."""

import json

import pytest
from conftest import as_text, node_document, resources, statements, user_data
from synthesis import Templates, synthesize

from stacks.preprocess.preprocessor import (
    DATA_VOLUME_LOGICAL_ID,
    READY_TIMEOUT_S,
    UBUNTU_AMI_PARAMETER,
)

SECRET = "arn:aws:secretsmanager:us-east-1:123456789012:secret:imagenet-AbCdEf"
BIG_VOLUME_WITH_SECRET = {"dataVolumeGiB": 2000, "downloadSecretArn": SECRET}


@pytest.fixture(scope="module")
def template(default):
    return default["PreprocessStack"]


@pytest.fixture(scope="module")
def instance(template):
    [instance] = template.find_resources("AWS::EC2::Instance").values()
    return instance


def test_data_volume_logical_id_is_pinned(template):
    assert DATA_VOLUME_LOGICAL_ID == "DataVolume"
    assert template.to_json()["Resources"]["DataVolume"]["Type"] == "AWS::EC2::Volume"


def test_data_volume_is_1000_gib_encrypted_sc1_that_survives_a_delete(template):
    volume = template.to_json()["Resources"]["DataVolume"]
    assert volume["Properties"]["Size"] == 1000
    assert volume["Properties"]["VolumeType"] == "sc1"
    assert volume["Properties"]["Encrypted"] is True
    assert volume["DeletionPolicy"] == "Snapshot"
    assert volume["UpdateReplacePolicy"] == "Snapshot"


def test_volume_size_comes_from_context(synth):
    resources = synth(**BIG_VOLUME_WITH_SECRET)["PreprocessStack"].to_json()["Resources"]
    assert resources["DataVolume"]["Properties"]["Size"] == 2000


def test_volume_attached_at_sdf_in_the_instance_zone(template, instance):
    [attachment] = template.find_resources("AWS::EC2::VolumeAttachment").values()
    props = attachment["Properties"]
    assert props["Device"] == "/dev/sdf"
    assert props["VolumeId"] == {"Ref": "DataVolume"}
    volume = template.to_json()["Resources"]["DataVolume"]["Properties"]
    # Without -c az, the zone the deploy-time answer found for the node's type (issue 50).
    zone = volume["AvailabilityZone"]
    assert zone == instance["Properties"]["AvailabilityZone"] == {"Fn::GetAtt": ["Zone", "Zone"]}


def test_a_zone_id_places_the_subnet_by_id_and_the_volume_in_its_zone(synth):
    # Volumes and instances take no zone ID: both read the name back from the subnet. nodes=2:
    # test_train_stack.py's configuration, one synthesis (PreprocessStack does not read it).
    template = synth(az="use1-az4", nodes=2)["PreprocessStack"]
    [(subnet_id, subnet)] = template.find_resources("AWS::EC2::Subnet").items()
    assert subnet["Properties"]["AvailabilityZoneId"] == "use1-az4"
    assert "AvailabilityZone" not in subnet["Properties"]
    [instance] = template.find_resources("AWS::EC2::Instance").values()
    volume = template.to_json()["Resources"]["DataVolume"]["Properties"]
    named = {"Fn::GetAtt": [subnet_id, "AvailabilityZone"]}
    assert volume["AvailabilityZone"] == instance["Properties"]["AvailabilityZone"] == named
    assert not template.find_resources("Custom::HorovodFleetZone")


def test_a_zone_id_with_a_given_subnet_is_named_by_the_zone_check(synth):
    template = synth(az="use1-az4", vpcId="vpc-0123abcd", subnetId="subnet-0123abcd")[
        "PreprocessStack"
    ]
    [(zone_id, zone)] = template.find_resources("Custom::HorovodFleetZone").items()
    assert {k: zone["Properties"][k] for k in ("InstanceType", "PreferredZone", "Fixed")} == {
        "InstanceType": "t2.large",
        "PreferredZone": "use1-az4",
        "Fixed": "true",
    }
    [instance] = template.find_resources("AWS::EC2::Instance").values()
    volume = template.to_json()["Resources"]["DataVolume"]["Properties"]
    named = {"Fn::GetAtt": [zone_id, "Zone"]}
    assert volume["AvailabilityZone"] == instance["Properties"]["AvailabilityZone"] == named


def test_a_zone_name_with_a_given_subnet_needs_no_answer(synth):
    # nodes=2: test_train_stack.py's configuration, one synthesis (PreprocessStack does not read it)
    given = {"vpcId": "vpc-0123abcd", "subnetId": "subnet-0123abcd", "az": "us-east-1a"}
    template = synth(**given, nodes=2)["PreprocessStack"]
    assert not template.find_resources("Custom::HorovodFleetZone")
    volume = template.to_json()["Resources"]["DataVolume"]["Properties"]
    assert volume["AvailabilityZone"] == "us-east-1a"


def test_t2_large_with_unlimited_credits(instance):
    props = instance["Properties"]
    assert props["InstanceType"] == "t2.large"
    assert props["CreditSpecification"] == {"CPUCredits": "unlimited"}


def test_imdsv2_required_no_key_pair_no_ingress(template, instance):
    props = instance["Properties"]
    assert props["MetadataOptions"]["HttpTokens"] == "required"
    assert "KeyName" not in props
    for group in template.find_resources("AWS::EC2::SecurityGroup").values():
        assert "SecurityGroupIngress" not in group["Properties"]
    assert not template.find_resources("AWS::EC2::SecurityGroupIngress")


def test_ubuntu_ami_and_code_are_pinned_at_the_first_deploy(template, instance):
    """Not an SSM parameter type, which CloudFormation resolves again at every deploy (a new
    Canonical image would replace the node mid-conversion), and no asset URL in the user-data
    (a code change would stop and start it, and user-data would not run again)."""
    parameters = template.to_json().get("Parameters", {}).values()
    assert not [p for p in parameters if "AWS::EC2::Image::Id" in p["Type"]]
    [(pin_id, pin)] = template.find_resources("Custom::HorovodFleetPinned").items()
    assert instance["Properties"]["ImageId"] == {"Fn::GetAtt": [pin_id, "ImageId"]}
    assert pin["Properties"]["ImageParameter"] == UBUNTU_AMI_PARAMETER
    assert "/ubuntu/server/24.04/stable/current/amd64/hvm/ebs-gp3/" in UBUNTU_AMI_PARAMETER
    assert set(pin["Properties"]["Code"]) == {"bootstrap", "trainer"}
    assert "AnswersProvider" in json.dumps(pin["Properties"]["ServiceToken"])
    parts = instance["Properties"]["UserData"]["Fn::Base64"]["Fn::Join"][1]
    text = json.dumps(parts)
    assert "cdk-hnb659fds-assets" not in text
    for name in ("bootstrap", "trainer"):
        assert {"Fn::GetAtt": [pin_id, name]} in parts
    [read] = statements(template, "PreprocessorPinnedImageParameterRead")
    assert read["Action"] == "ssm:GetParameter"
    assert resources(read) == [f"arn:aws:ssm:us-east-1::parameter{UBUNTU_AMI_PARAMETER}"]
    [read_id] = [
        k
        for k in template.find_resources("AWS::IAM::Policy")
        if k.startswith("PreprocessorPinnedImageParameterRead")
    ]
    assert template.to_json()["Resources"][pin_id]["DependsOn"] == [read_id]


def test_node_may_read_an_earlier_deploys_code(template):
    found = statements(template, "PreprocessorPolicy")
    reads = {r for s in found if s["Action"] == "s3:GetObject" for r in resources(s)}
    assert any(r.endswith("/*.zip") and "cdk-hnb659fds-assets" in r for r in reads)


def test_deploy_waits_for_the_node_environment_and_takes_its_reason(template, instance):
    [(handle_id, _)] = template.find_resources("AWS::CloudFormation::WaitConditionHandle").items()
    [condition] = template.find_resources("AWS::CloudFormation::WaitCondition").values()
    assert condition["Properties"]["Handle"] == {"Ref": handle_id}
    assert condition["Properties"]["Count"] == 1
    assert int(condition["Properties"]["Timeout"]) == READY_TIMEOUT_S <= 3600
    [instance_id] = template.find_resources("AWS::EC2::Instance")
    assert condition["DependsOn"] == [instance_id]
    assert "Ref" in json.dumps(node_document_raw(instance))


def node_document_raw(instance: dict) -> str:
    """The user-data parts around node.json's ready_signal_url: it is the handle's Ref."""
    parts = instance["Properties"]["UserData"]["Fn::Base64"]["Fn::Join"][1]
    index = next(
        i for i, p in enumerate(parts) if isinstance(p, str) and p.endswith('"ready_signal_url":"')
    )
    return parts[index + 1]


def test_a_second_synth_with_the_same_inputs_leaves_every_instance_untouched(tmp_path):
    """CloudFormation updates (or replaces) an instance only when its properties change."""

    def instance_properties() -> str:
        templates = Templates(synthesize(tmp_path / f"out{len(list(tmp_path.iterdir()))}"))
        found = {
            f"{name}/{logical_id}": resource
            for name in ("PreprocessStack", "TrainStack")
            for kind in ("AWS::EC2::Instance", "AWS::EC2::LaunchTemplate", "AWS::EC2::Volume")
            for logical_id, resource in templates[name].find_resources(kind).items()
        }
        assert any("/Preprocessor" in k for k in found) and len(found) > 3
        return json.dumps(found, sort_keys=True)

    assert instance_properties() == instance_properties()


def test_role_reads_raw_and_writes_only_the_tfrecords_prefix(template):
    found = statements(template, "PreprocessorPolicy")
    writes = [s for s in found if "s3:PutObject" in s["Action"]]
    assert [r for s in writes for r in resources(s)] == [
        "arn:<AWS::Partition>:s3:::horovod-fleet-<AWS::AccountId>-us-east-1/tfrecords/*"
    ]
    reads = {r for s in found if s["Action"] == "s3:GetObject" for r in resources(s)}
    assert "arn:<AWS::Partition>:s3:::horovod-fleet-<AWS::AccountId>-us-east-1/raw/*" in reads
    [listing] = [s for s in found if s["Action"] == "s3:ListBucket"]
    assert listing["Condition"] == {"StringLike": {"s3:prefix": ["raw/*", "tfrecords/*"]}}
    assert not [s for s in found if "s3:DeleteObject" in s["Action"]]


def test_role_has_session_manager_and_no_other_managed_policy(template):
    [role] = template.find_resources(
        "AWS::IAM::Role",
        {
            "Properties": {
                "Description": "horovod-fleet preprocessing node: reads raw/, writes the TFRecords"
            }
        },
    ).values()
    [policy] = role["Properties"]["ManagedPolicyArns"]
    assert as_text(policy).endswith(":iam::aws:policy/AmazonSSMManagedInstanceCore")


def test_log_group_has_retention(template):
    for group in template.find_resources("AWS::Logs::LogGroup").values():
        assert group["Properties"]["RetentionInDays"] == 30


def test_user_data_installs_code_and_runs_the_preprocess_bootstrap(instance):
    text = user_data(instance)
    assert text.startswith("#!/bin/bash\nset -Eeuo pipefail\n")
    assert "/opt/horovod-fleet/bootstrap" in text and "/opt/horovod-fleet/trainer" in text
    assert (
        "bash /opt/horovod-fleet/bootstrap/preprocess_node.sh /etc/horovod-fleet/node.json" in text
    )
    assert "exec > >(tee -a /var/log/horovod-fleet/user-data.log) 2>&1" in text
    assert "on_failure() { shutdown -h +1; }\ntrap on_failure ERR\n" in text


def test_node_document_follows_the_contract(instance):
    document = node_document(instance)
    assert document["role"] == "preprocess"
    assert document["project"] == "horovod-fleet"
    assert document["raw_prefix"] == "raw/" and document["output_prefix"] == "tfrecords/"
    assert (document["train_shards"], document["val_shards"]) == (1024, 128)
    assert document["stop_when_done"] is True
    assert document["volume_id"] == "<token>" and document["log_group"] == "<token>"
    assert document["signal"] is None
    assert document["download_secret_arn"] is None
    assert document["ready_signal_url"] == "<token>"


def test_download_secret_is_readable_when_given(synth):
    template = synth(**BIG_VOLUME_WITH_SECRET)["PreprocessStack"]
    found = statements(template, "PreprocessorPolicy")
    assert {
        "Action": "secretsmanager:GetSecretValue",
        "Effect": "Allow",
        "Resource": SECRET,
    } in found
