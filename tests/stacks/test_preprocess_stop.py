"""The preprocessing node's stop (controller/preprocess.py) against moto: once the
manifest is written the registered node stops, and its volume is snapshotted once."""

import json

import boto3
import pytest
from moto import mock_aws

from controller import clients, preprocess

REGION = "us-east-1"
PARAMETER = "/horovod-fleet/preprocess"


@pytest.fixture
def aws(aws_credentials, monkeypatch):
    monkeypatch.setenv("MANIFEST_KEY", "tfrecords/manifest.json")
    monkeypatch.setenv("PREPROCESS_PARAMETER", PARAMETER)
    with mock_aws():
        yield


def manifest_event(key: str = "tfrecords/manifest.json", etag: str = "m1") -> dict:
    return {
        "detail-type": "Object Created",
        "source": "aws.s3",
        "detail": {"bucket": {"name": "b"}, "object": {"key": key, "etag": etag}},
    }


def register(snapshot_volume: bool) -> tuple[str, str]:
    ec2 = clients.client("ec2")
    instance = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1)["Instances"][0]
    volume = ec2.create_volume(AvailabilityZone=f"{REGION}a", Size=1000, VolumeType="sc1")
    value = {"instance_id": instance["InstanceId"], "volume_id": volume["VolumeId"],
             "snapshot_volume": snapshot_volume}  # fmt: skip
    boto3.client("ssm", region_name=REGION).put_parameter(
        Name=PARAMETER, Value=json.dumps(value), Type="String"
    )
    return instance["InstanceId"], volume["VolumeId"]


def state(instance_id: str) -> str:
    reservations = clients.client("ec2").describe_instances(InstanceIds=[instance_id])
    return reservations["Reservations"][0]["Instances"][0]["State"]["Name"]


def snapshots(volume_id: str) -> list[dict]:
    filters = [{"Name": "volume-id", "Values": [volume_id]}]
    return clients.client("ec2").describe_snapshots(OwnerIds=["self"], Filters=filters)["Snapshots"]


def test_the_manifest_stops_the_node_then_snapshots_its_volume_once(aws):
    instance_id, volume_id = register(snapshot_volume=True)
    preprocess.handler(manifest_event())
    preprocess.handler(manifest_event())  # S3 delivers at least once
    assert state(instance_id) == "stopped"
    [snapshot] = snapshots(volume_id)
    assert {"Key": "horovod-fleet:manifest", "Value": "m1"} in snapshot["Tags"]


def test_without_a_snapshot_the_node_only_stops(aws):
    instance_id, volume_id = register(snapshot_volume=False)
    preprocess.handler(manifest_event())
    assert state(instance_id) == "stopped"
    assert snapshots(volume_id) == []


def test_only_the_configured_manifest_stops_the_node(aws, monkeypatch):
    instance_id, _ = register(snapshot_volume=False)
    monkeypatch.setenv("MANIFEST_KEY", "imagenet/v2/manifest.json")
    assert "ignored" in preprocess.handler(manifest_event())
    assert state(instance_id) == "running"
    preprocess.handler(manifest_event("imagenet/v2/manifest.json"))
    assert state(instance_id) == "stopped"


def test_a_manifest_without_a_preprocess_stack_does_nothing(aws, capsys):
    preprocess.handler(manifest_event())
    assert (
        json.loads(capsys.readouterr().out.splitlines()[-1])["decision"] == "no-preprocess-instance"
    )
