"""The preprocessing node's stop: when its conversion writes the dataset's manifest.json
(EventBridge S3 "Object Created" for <datasetPrefix>manifest.json), stop the node PreprocessStack
registered, then snapshot its data volume if configured. Not the run controller's work: a
function and role of its own (stacks/teardown/stack.py), with rights on that node and volume
only (stacks/teardown/preprocess_guard.py).
Only boto3, the standard library and contract/: part of TeardownStack's Lambda asset.
"""

import json

from botocore.exceptions import ClientError

from contract.names import MANIFEST_TAG, PROJECT, PROJECT_TAG
from controller.clients import client, log, setting


def handler(event: dict, _context=None) -> dict:
    detail = event.get("detail", {}).get("object", {})
    if detail.get("key") != setting("MANIFEST_KEY"):
        log("ignored", key=detail.get("key"))
        return {"ignored": detail.get("key")}
    etag = detail.get("etag") or detail.get("sequencer") or "unknown"
    stop_preprocessing(etag)
    return {"manifest": etag}


def stop_preprocessing(manifest_etag: str) -> None:
    """Stop the registered preprocessing instance, then snapshot its volume if configured."""
    parameter = setting("PREPROCESS_PARAMETER")
    try:
        value = client("ssm").get_parameter(Name=parameter)["Parameter"]["Value"]
    except ClientError as error:
        if error.response["Error"]["Code"] != "ParameterNotFound":
            raise
        log("no-preprocess-instance", parameter=parameter)
        return
    registered = json.loads(value)
    instance_id, volume_id = registered["instance_id"], registered["volume_id"]
    try:
        reservations = client("ec2").describe_instances(InstanceIds=[instance_id])["Reservations"]
    except ClientError as error:
        if error.response["Error"]["Code"] != "InvalidInstanceID.NotFound":
            raise
        reservations = []
    state = reservations[0]["Instances"][0]["State"]["Name"] if reservations else "terminated"
    if state in ("terminated", "shutting-down"):
        log("preprocess-instance-gone", instance=instance_id, state=state)
        return
    if state in ("stopped", "stopping"):
        log("already-stopped", instance=instance_id, state=state)
    else:
        client("ec2").stop_instances(InstanceIds=[instance_id])
        log("stop-instance", instance=instance_id, state=state)
    if registered.get("snapshot_volume"):
        snapshot_volume(instance_id, volume_id, manifest_etag)


def snapshot_volume(instance_id: str, volume_id: str, manifest_etag: str) -> None:
    """One snapshot per volume and manifest, taken once the instance has stopped."""
    ec2 = client("ec2")
    ec2.get_waiter("instance_stopped").wait(
        InstanceIds=[instance_id], WaiterConfig={"Delay": 15, "MaxAttempts": 40}
    )
    existing = ec2.describe_snapshots(
        OwnerIds=["self"],
        Filters=[
            {"Name": "volume-id", "Values": [volume_id]},
            {"Name": f"tag:{MANIFEST_TAG}", "Values": [manifest_etag]},
        ],
    )["Snapshots"]
    kept = [s["SnapshotId"] for s in existing if s["State"] != "error"]
    if kept:
        log("snapshot-exists", volume=volume_id, snapshots=kept)
        return
    snapshot = ec2.create_snapshot(
        VolumeId=volume_id,
        Description="horovod-fleet preprocessing volume after the manifest was written",
        TagSpecifications=[
            {
                "ResourceType": "snapshot",
                "Tags": [
                    {"Key": PROJECT_TAG, "Value": PROJECT},
                    {"Key": MANIFEST_TAG, "Value": manifest_etag},
                ],
            }
        ],
    )
    log("snapshot", volume=volume_id, snapshot=snapshot["SnapshotId"])
