"""horovod-fleet leftovers against an account after a run and its `cdk destroy` (moto): what stays
billed, at what monthly cost, and whether the command it prints removes it."""

import json
import re
import shlex
from pathlib import Path

import boto3
import botocore.session
import pytest
from moto import mock_aws

from contract import names
from stacks.instance_types import SC1_USD_PER_GIB_MONTH
from stacks.preprocess.preprocessor import DATA_VOLUME_LOGICAL_ID
from watch import cli, leftovers
from watch.leftovers import GIB, Account

REGION = "us-east-1"
BUCKET = "horovod-fleet-123456789012-us-east-1"
PROJECT = [{"Key": "Project", "Value": "horovod-fleet"}]
SIZES = {
    "raw/ILSVRC2012_img_train.tar": 7000,
    "raw/ILSVRC2012_img_val.tar": 3000,
    "tfrecords/train-00000-of-00001": 5000,
    "tfrecords/validation-00000-of-00001": 1000,
    "runs/r1/model/checkpoints/ckpt-1.data-00000-of-00001": 4000,
    "runs/r1/DONE.json": 100,
    "runs/r2/logs/node0.log": 50,
}
# PreprocessStack as CloudFormation keeps it: its data volume under the stack's pinned logical ID,
# with the DeletionPolicy tests/stacks/test_preprocess_stack.py asserts of the synthesized stack.
PREPROCESS_TEMPLATE = {
    "Resources": {
        DATA_VOLUME_LOGICAL_ID: {
            "Type": "AWS::EC2::Volume",
            "DeletionPolicy": "Snapshot",
            "Properties": {"AvailabilityZone": "us-east-1a", "Size": 1000, "Tags": PROJECT},
        },
        "Node": {
            "Type": "AWS::EC2::Instance",
            "Properties": {"ImageId": "ami-12c6146b", "InstanceType": "t2.large", "Tags": PROJECT},
        },
    }
}
DATASET_TEMPLATE = {"Resources": {"DatasetAccessLogBucket": {"Type": "AWS::S3::Bucket"}}}


@pytest.fixture
def aws(monkeypatch):
    for name in ("AWS_ENDPOINT_URL", "AWS_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    with mock_aws():
        yield lambda service: boto3.client(service, region_name=REGION)


def a_finished_run(client) -> dict:
    """The account after a run: the bucket (one manifest rewritten), DatasetStack, ImageStack's
    image, the converter stopped with its sc1 volume, the preprocessing stop's snapshot, and the
    nodes' log group kept after `cdk destroy TrainStack`."""
    s3, ec2, cloudformation = client("s3"), client("ec2"), client("cloudformation")
    s3.create_bucket(Bucket=BUCKET)
    s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
    for key, size in SIZES.items():
        s3.put_object(Bucket=BUCKET, Key=key, Body=b"x" * size)
    s3.put_object(Bucket=BUCKET, Key="tfrecords/manifest.json", Body=b"{}" * 100)
    s3.put_object(Bucket=BUCKET, Key="tfrecords/manifest.json", Body=b"{}" * 150)
    cloudformation.create_stack(StackName="DatasetStack", TemplateBody=json.dumps(DATASET_TEMPLATE))
    logs_bucket = cloudformation.describe_stack_resource(
        StackName="DatasetStack", LogicalResourceId="DatasetAccessLogBucket"
    )["StackResourceDetail"]["PhysicalResourceId"]
    s3.put_object(Bucket=logs_bucket, Key="dataset/2026-11-27-access", Body=b"l" * 300)

    cloudformation.create_stack(
        StackName="PreprocessStack", TemplateBody=json.dumps(PREPROCESS_TEMPLATE)
    )
    node = ec2.describe_instances(Filters=[{"Name": "tag:Project", "Values": ["horovod-fleet"]}])
    node = node["Reservations"][0]["Instances"][0]["InstanceId"]
    data = cloudformation.describe_stack_resource(
        StackName="PreprocessStack", LogicalResourceId=DATA_VOLUME_LOGICAL_ID
    )["StackResourceDetail"]["PhysicalResourceId"]
    # moto makes CloudFormation's volumes gp2 and attaches none: sc1 and attached, by hand.
    ec2.modify_volume(VolumeId=data, VolumeType="sc1")
    ec2.attach_volume(VolumeId=data, InstanceId=node, Device="/dev/sdf")
    ec2.stop_instances(InstanceIds=[node])
    stop_snapshot = ec2.create_snapshot(
        VolumeId=data,
        TagSpecifications=[
            {"ResourceType": "snapshot", "Tags": [{"Key": names.MANIFEST_TAG, "Value": "e"}]}
        ],
    )["SnapshotId"]

    image = ec2.register_image(
        Name="horovod-fleet-training-2026-11-27",
        RootDeviceName="/dev/sda1",
        BlockDeviceMappings=[{"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": 60}}],
    )["ImageId"]
    ec2.create_tags(Resources=[image], Tags=PROJECT)
    # moto gives a registered image a snapshot of its own making (15 GiB): the one it names.
    mapping = ec2.describe_images(ImageIds=[image])["Images"][0]["BlockDeviceMappings"][0]
    image_snapshot = mapping["Ebs"]["SnapshotId"]
    client("ssm").put_parameter(Name=names.IMAGE_PARAMETER, Value=image, Type="String")

    client("logs").create_log_group(logGroupName="TrainStack-FleetLogs0A1B2C3D-xyz")
    client("logs").create_log_group(logGroupName="someone-elses-group")
    return {
        "node": node, "data": data, "stop_snapshot": stop_snapshot, "image": image,
        "image_snapshot": image_snapshot, "logs_bucket": logs_bucket,
    }  # fmt: skip


def by_what(rows) -> dict[str, leftovers.Leftover]:
    return {row.what: row for row in rows}


def test_the_bucket_is_listed_by_prefix_with_its_old_versions_and_access_logs(aws):
    made = a_finished_run(aws)
    rows = by_what(Account(aws, BUCKET).leftovers())
    raw = rows[f"s3://{BUCKET}/raw/ (2 objects)"]
    assert raw.gib * GIB == 10000
    assert raw.usd_per_month == pytest.approx(10000 / GIB * leftovers.S3_STANDARD_USD)
    assert raw.remove == (
        f"aws s3 rm s3://{BUCKET}/raw/ --recursive (the bucket then keeps them 30 days as old "
        "versions)"
    )
    dataset = rows[f"s3://{BUCKET}/tfrecords/ (3 objects)"]
    assert dataset.gib * GIB == 5000 + 1000 + 300
    assert "the dataset every run trains on" in dataset.why
    assert "run r1's model" in rows[f"s3://{BUCKET}/runs/r1/ (2 objects)"].why
    assert f"s3://{BUCKET}/runs/r2/ (1 object)" in rows
    old = rows[f"s3://{BUCKET}/tfrecords/: 1 old version"]
    assert old.gib * GIB == 200
    assert "expires 30 days after" in old.remove
    assert rows[f"s3://{made['logs_bucket']}/ (1 object)"].gib * GIB == 300


def test_the_stopped_converter_its_snapshot_the_image_and_the_kept_log_group(aws):
    made = a_finished_run(aws)
    rows = by_what(Account(aws, BUCKET).leftovers())
    converter = next(r for w, r in rows.items() if made["node"] in w)
    assert "1000 GiB sc1" in converter.what and converter.gib >= 1000
    assert converter.remove.startswith("npx cdk destroy PreprocessStack")
    assert converter.usd_per_month >= 1000 * SC1_USD_PER_GIB_MONTH
    snapshot = next(r for w, r in rows.items() if made["stop_snapshot"] in w)
    assert snapshot.usd_per_month == 1000 * leftovers.SNAPSHOT_USD  # moto: no full size
    image = next(r for w, r in rows.items() if made["image"] in w)
    assert "the one TrainStack boots" in image.what
    behind = aws("ec2").describe_snapshots(SnapshotIds=[made["image_snapshot"]])["Snapshots"]
    assert image.gib == behind[0]["VolumeSize"]
    assert image.remove == (
        f"aws ec2 deregister-image --image-id {made['image']} && "
        f"aws ec2 delete-snapshot --snapshot-id {made['image_snapshot']}"
    )
    assert not any(made["image_snapshot"] in w and "snapshot " in w[:9] for w in rows)
    assert "log group TrainStack-FleetLogs0A1B2C3D-xyz" in rows
    assert not any("someone-elses-group" in w for w in rows)


def test_a_deleted_preprocess_stack_s_snapshot_is_found_by_its_volume(aws):
    """CloudFormation's DeletionPolicy Snapshot leaves an untagged snapshot; ListStackResources
    still names the deleted stack's volume for 90 days. moto answers a deleted stack's listing
    with new ids, so the record is replayed as AWS keeps it."""
    cloudformation = aws("cloudformation")
    stack = cloudformation.create_stack(
        StackName="PreprocessStack", TemplateBody=json.dumps(PREPROCESS_TEMPLATE)
    )["StackId"]
    record = cloudformation.list_stack_resources(StackName=stack)["StackResourceSummaries"]
    volume = next(r for r in record if r["LogicalResourceId"] == DATA_VOLUME_LOGICAL_ID)
    deletion = aws("ec2").create_snapshot(VolumeId=volume["PhysicalResourceId"])["SnapshotId"]
    cloudformation.delete_stack(StackName="PreprocessStack")
    aws("s3").create_bucket(Bucket=BUCKET)

    class Recorded:
        def __init__(self, real):
            self.real = real

        def get_paginator(self, name):
            if name != "list_stack_resources":
                return self.real.get_paginator(name)
            return type("P", (), {"paginate": lambda _, StackName: [
                {"StackResourceSummaries": record if StackName == stack else []}]})()  # fmt: skip

        def __getattr__(self, name):
            return getattr(self.real, name)

    def client(service):
        return Recorded(aws(service)) if service == "cloudformation" else aws(service)

    rows = Account(client, BUCKET).leftovers()
    found = [r for r in rows if deletion in r.what]
    assert (
        len(found) == 1 and found[0].remove == f"aws ec2 delete-snapshot --snapshot-id {deletion}"
    )


def destroy(aws, stack: str) -> None:
    """`npx cdk destroy STACK` as CloudFormation does it, where moto does not: the stack's
    instances terminated, each volume with DeletionPolicy Snapshot snapshotted, then deleted."""
    ec2, cloudformation = aws("ec2"), aws("cloudformation")
    template = cloudformation.get_template(StackName=stack)["TemplateBody"]
    for resource in cloudformation.list_stack_resources(StackName=stack)["StackResourceSummaries"]:
        kind, physical = resource["ResourceType"], resource["PhysicalResourceId"]
        if kind == "AWS::EC2::Instance":
            ec2.terminate_instances(InstanceIds=[physical])
    for resource in cloudformation.list_stack_resources(StackName=stack)["StackResourceSummaries"]:
        kind, physical = resource["ResourceType"], resource["PhysicalResourceId"]
        policy = template["Resources"][resource["LogicalResourceId"]].get("DeletionPolicy")
        if kind == "AWS::EC2::Volume" and policy == "Snapshot":
            volume = ec2.describe_volumes(VolumeIds=[physical])["Volumes"][0]
            if volume["Attachments"]:  # moto keeps it attached to the terminated instance
                ec2.detach_volume(
                    VolumeId=physical, InstanceId=volume["Attachments"][0]["InstanceId"]
                )
            ec2.create_snapshot(VolumeId=physical)
            ec2.delete_volume(VolumeId=physical)
    cloudformation.delete_stack(StackName=stack)


def run_removal(aws, command: str) -> None:
    """A printed removal, run as the AWS CLI would: `aws <service> <operation> --<param> V` is
    the botocore operation of that name (checked against botocore's model), `aws s3 rm ...
    --recursive` removes every current object under the prefix, `npx cdk destroy` deletes the
    stack (and, here, terminates its instance: moto does not)."""
    model = botocore.session.get_session()
    for part in command.split(" && "):
        words = shlex.split(re.sub(r" \(.*\)$", "", part))
        if words[:3] == ["npx", "cdk", "destroy"]:
            destroy(aws, words[3])
        elif words[:3] == ["aws", "s3", "rm"]:
            bucket, prefix = words[3][len("s3://") :].split("/", 1)
            s3 = aws("s3")
            for obj in s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", []):
                s3.delete_object(Bucket=bucket, Key=obj["Key"])
        else:
            assert words[0] == "aws", command
            service = model.get_service_model(words[1])
            operation = next(
                name for name in service.operation_names
                if re.sub(r"(?<!^)([A-Z])", r"-\1", name).lower() == words[2]
            )  # fmt: skip
            members = service.operation_model(operation).input_shape.members
            params = {}
            for flag, value in zip(words[3::2], words[4::2], strict=True):
                params[next(m for m in members if m.lower() == flag[2:].replace("-", ""))] = value
            client = aws(words[1])
            getattr(client, re.sub(r"(?<!^)([A-Z])", r"_\1", operation).lower())(**params)


def test_each_printed_command_removes_what_it_names(aws):
    a_finished_run(aws)
    for row in Account(aws, BUCKET).leftovers():
        if row.remove.startswith("nothing to run"):
            continue
        run_removal(aws, row.remove)
        assert row.what not in by_what(Account(aws, BUCKET).leftovers()), row.remove
    # Left: the old versions the bucket keeps 30 days, and the data volume's snapshot that
    # `cdk destroy PreprocessStack` took (moto's record of a deleted stack does not name its
    # volume, see above: on AWS it is listed too).
    left = Account(aws, BUCKET).leftovers()
    assert all("old version" in row.what for row in left), [row.what for row in left]


def test_the_command_prints_each_cost_why_and_removal_and_the_total(aws, capsys):
    a_finished_run(aws)
    assert cli.main(["leftovers"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"horovod-fleet leftovers: what bills every month in {REGION}, bucket ")
    assert f"s3://{BUCKET}/raw/ (2 objects)" in out
    assert "why: ImageNet's archives" in out and "remove: aws s3 rm" in out
    total = sum(r.usd_per_month or 0 for r in Account(aws, BUCKET).leftovers())
    assert re.search(rf"\${total:,.2f}  a month", out)
    assert "still deployed: PreprocessStack" in out


def test_an_account_without_the_bucket_says_so_in_one_line(aws, capsys):
    assert cli.main(["leftovers"]) == 0
    out = capsys.readouterr().out
    assert "nothing left behind that bills" in out
    assert f"no bucket {BUCKET}: pass --bucket" in out


def test_the_sc1_price_is_the_one_synthesis_prints():
    assert leftovers.VOLUME_USD["sc1"] == SC1_USD_PER_GIB_MONTH


def test_docs_cost_md_prices_what_stays_as_the_command_does():
    text = (Path(__file__).resolve().parents[2] / "docs" / "cost.md").read_text()
    section = text[text.index("## What stays billed after a run") :]
    for sentence in (
        f"S3 Standard ${leftovers.S3_STANDARD_USD} per GB-month",
        f"EBS\nsnapshots ${leftovers.SNAPSHOT_USD}, sc1 ${leftovers.VOLUME_USD['sc1']} and gp3 "
        f"${leftovers.VOLUME_USD['gp3']} per GB-month",
        f"stored logs ${leftovers.LOGS_STORED_USD} per GB-month",
    ):
        assert " ".join(sentence.split()) in " ".join(section.split()), sentence
