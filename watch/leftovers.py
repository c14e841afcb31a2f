"""`horovod-fleet leftovers`: what stays billed in the account after a run and its `cdk destroy`,
read from the account, each thing with its monthly cost at list price, why it was kept and the
command that removes it (docs/cost.md, "What stays billed after a run").

- The dataset bucket (retained: no `cdk destroy` deletes data), by prefix: `raw/`, the dataset's
  TFRecords (the prefix holding `manifest.json`), each `runs/<run>/`, and the old versions the
  bucket keeps for 30 days (its ExpireOldVersions rule); and the bucket of its access logs.
- A stopped instance's volumes (PreprocessStack's converter stops itself and keeps its volumes
  until the stack is deleted), and volumes of the app that nothing holds.
- The preprocessing data volume's snapshots: CloudFormation takes one when PreprocessStack is
  deleted (the volume's DeletionPolicy Snapshot), the preprocessing stop another with
  `-c snapshotDataVolume=true` (tagged `horovod-fleet:manifest`). The first is untagged, so it
  is found by its volume, which CloudFormation's record of PreprocessStack names: "For deleted
  stacks, ListStackResources returns resource information for up to 90 days after the stack has
  been deleted" (https://docs.aws.amazon.com/AWSCloudFormation/latest/APIReference/API_ListStackResources.html).
  Older ones are not found.
- ImageStack's images (tagged Project=horovod-fleet) and the snapshots behind them.
- The log groups of the app's stacks.

Sizes are what AWS reports: an object's size, a volume's provisioned size, a log group's stored
bytes, and a snapshot's `FullSnapshotSizeInBytes` ("the size of all the blocks that were written
to the source volume at the time the snapshot was created", EC2 API reference, Snapshot), an
upper bound of what an incremental snapshot bills; without it, the volume's size.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime

from botocore.exceptions import ClientError

from contract import names, runs

GIB = 2**30
# List prices in USD per GB-month, us-east-1, as of PRICES_AS_OF, applied per GiB (EBS sizes are
# GiB; the pricing pages say GB). Not read from AWS's pages here (they are rendered by script);
# check them there: S3 Standard's first 50 TB, https://aws.amazon.com/s3/pricing/; EBS snapshots'
# standard tier and volumes, https://aws.amazon.com/ebs/pricing/ (sc1 as stacks/instance_types.py
# has it; a test keeps the two equal); CloudWatch Logs' stored data,
# https://aws.amazon.com/cloudwatch/pricing/.
PRICES_AS_OF = "us-east-1 list prices of 2025-06"
S3_STANDARD_USD = 0.023
SNAPSHOT_USD = 0.05
LOGS_STORED_USD = 0.03
VOLUME_USD = {"sc1": 0.015, "gp3": 0.08, "gp2": 0.10}

PROJECT_TAG = {"Name": f"tag:{names.PROJECT_TAG}", "Values": [names.PROJECT]}
KEPT_LOGS = (names.TRAIN_STACK, names.PREPROCESS_STACK)  # their nodes' log groups outlive the stack
ACCESS_LOG_BUCKET = "DatasetAccessLogBucket"  # DatasetStack's logical ID (stacks/dataset)
OLD_VERSIONS_DAYS = 30  # the bucket's ExpireOldVersions rule (stacks/dataset/bucket.py)


@dataclass(frozen=True)
class Leftover:
    """One thing that bills every month: what, how big, what it costs, why kept, how to remove."""

    what: str
    gib: float
    usd_per_month: float | None  # None: no list price here for it
    why: str
    remove: str
    at_most: bool = False  # the size is an upper bound (a snapshot's full size)


@dataclass
class Account:
    """The clients the command reads with (watch.aws.Fleet.client), and the dataset bucket."""

    client: object
    bucket: str
    notes: list[str] = field(default_factory=list)

    def leftovers(self) -> list[Leftover]:
        ec2 = self.client("ec2")
        images, image_snapshots = self.images(ec2)
        return [
            *self.bucket_rows(),
            *self.access_log_rows(),
            *self.volume_rows(ec2),
            *self.data_snapshot_rows(ec2, exclude=image_snapshots),
            *images,
            *self.log_rows(),
        ]

    # --- S3 -------------------------------------------------------------------------------------

    def bucket_rows(self) -> list[Leftover]:
        current: dict[str, list[int]] = {}
        old: dict[str, list[int]] = {}
        datasets = set()  # the prefixes holding a manifest.json
        pages = self.client("s3").get_paginator("list_object_versions")
        try:
            for page in pages.paginate(Bucket=self.bucket):
                for version in page.get("Versions", []):
                    prefix = prefix_of(version["Key"])
                    sizes = current if version["IsLatest"] else old
                    sizes.setdefault(prefix, []).append(version["Size"])
                    if version["IsLatest"] and version["Key"].endswith("/manifest.json"):
                        datasets.add(prefix)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "NoSuchBucket":
                raise
            self.notes.append(f"no bucket {self.bucket}: pass --bucket if yours has another name")
            return []
        rows = [
            s3_row(
                f"s3://{self.bucket}/{prefix} ({count(sizes, 'object')})",
                sum(sizes),
                why_kept(prefix, prefix in datasets),
                f"aws s3 rm s3://{self.bucket}/{prefix} --recursive (the bucket then keeps "
                f"them {OLD_VERSIONS_DAYS} days as old versions)",
            )
            for prefix, sizes in sorted(current.items())
        ]
        return rows + [
            s3_row(
                f"s3://{self.bucket}/{prefix}: {count(sizes, 'old version')}",
                sum(sizes),
                "objects replaced or removed: the bucket keeps each old version "
                f"{OLD_VERSIONS_DAYS} days (its ExpireOldVersions rule), against a mistake",
                f"nothing to run: each expires {OLD_VERSIONS_DAYS} days after it was replaced",
            )
            for prefix, sizes in sorted(old.items())
        ]

    def access_log_rows(self) -> list[Leftover]:
        try:
            resource = self.client("cloudformation").describe_stack_resource(
                StackName="DatasetStack", LogicalResourceId=ACCESS_LOG_BUCKET
            )["StackResourceDetail"]
        except ClientError:  # DatasetStack not deployed (-c datasetBucket=), or gone
            return []
        logs = resource["PhysicalResourceId"]
        sizes = [
            obj["Size"]
            for page in self.client("s3").get_paginator("list_objects_v2").paginate(Bucket=logs)
            for obj in page.get("Contents", [])
        ]
        if not sizes:
            return []
        return [
            s3_row(
                f"s3://{logs}/ ({count(sizes, 'object')})",
                sum(sizes),
                "the dataset bucket's S3 access logs, each kept a year (DatasetStack, retained)",
                f"aws s3 rm s3://{logs}/ --recursive",
            )
        ]

    # --- EC2 ------------------------------------------------------------------------------------

    def volume_rows(self, ec2) -> list[Leftover]:
        rows = []
        stopped = ec2.describe_instances(
            Filters=[PROJECT_TAG, {"Name": "instance-state-name", "Values": ["stopped"]}]
        )
        for instance in (i for r in stopped["Reservations"] for i in r["Instances"]):
            ids = [m["Ebs"]["VolumeId"] for m in instance.get("BlockDeviceMappings", [])]
            volumes = ec2.describe_volumes(VolumeIds=ids)["Volumes"] if ids else []
            stack = tag(instance, "aws:cloudformation:stack-name")
            remove = (
                f"npx cdk destroy {stack}" if stack
                else f"aws ec2 terminate-instances --instance-ids {instance['InstanceId']}"
            )  # fmt: skip
            if stack == "PreprocessStack":
                remove += " (it snapshots the data volume first: listed here once taken)"
            rows.append(
                volume_row(
                    f"{stack or 'instance'} {instance['InstanceId']}, stopped: {sizes_of(volumes)}",
                    volumes,
                    "a stopped instance bills its volumes"
                    + (
                        "; the preprocessing node stops itself once manifest.json is written"
                        if stack == "PreprocessStack"
                        else ""
                    ),
                    remove,
                )
            )
        free = ec2.describe_volumes(
            Filters=[PROJECT_TAG, {"Name": "status", "Values": ["available"]}]
        )["Volumes"]
        for volume in free:
            rows.append(
                volume_row(
                    f"volume {volume['VolumeId']}: {sizes_of([volume])}",
                    [volume],
                    "a volume of the app that no instance holds",
                    f"aws ec2 delete-volume --volume-id {volume['VolumeId']}",
                )
            )
        return rows

    def data_volume_ids(self) -> set[str]:
        """PreprocessStack's volumes, from CloudFormation's record of every PreprocessStack,
        deleted ones included (for 90 days)."""
        cloudformation = self.client("cloudformation")
        ids = set()
        for page in cloudformation.get_paginator("list_stacks").paginate():
            for stack in page["StackSummaries"]:
                if stack["StackName"] != "PreprocessStack":
                    continue
                resources = cloudformation.get_paginator("list_stack_resources")
                for listing in resources.paginate(StackName=stack["StackId"]):
                    ids |= {
                        r["PhysicalResourceId"]
                        for r in listing["StackResourceSummaries"]
                        if r["ResourceType"] == "AWS::EC2::Volume" and r.get("PhysicalResourceId")
                    }
        return ids

    def data_snapshot_rows(self, ec2, exclude: set[str]) -> list[Leftover]:
        volumes = sorted(self.data_volume_ids())
        found = {}
        for chunk in chunks(volumes, 200):
            for snapshot in own_snapshots(ec2, [{"Name": "volume-id", "Values": chunk}]):
                found[snapshot["SnapshotId"]] = snapshot
        for snapshot in own_snapshots(ec2, [{"Name": "tag-key", "Values": [names.MANIFEST_TAG]}]):
            found[snapshot["SnapshotId"]] = snapshot
        return [
            snapshot_row(
                f"snapshot {s['SnapshotId']} of the preprocessing data volume {s['VolumeId']} "
                f"({day(s['StartTime'])})",
                [s],
                "taken when PreprocessStack is deleted (and with -c snapshotDataVolume=true): "
                "only preprocessing again would read it, and the dataset is in S3",
                f"aws ec2 delete-snapshot --snapshot-id {s['SnapshotId']}",
            )
            for sid, s in sorted(found.items())
            if sid not in exclude
        ]

    def images(self, ec2) -> tuple[list[Leftover], set[str]]:
        """ImageStack's images, and every snapshot behind them."""
        try:
            booted = self.client("ssm").get_parameter(Name=names.IMAGE_PARAMETER)["Parameter"][
                "Value"
            ]
        except ClientError:
            booted = None
        rows, behind = [], set()
        images = ec2.describe_images(Owners=["self"], Filters=[PROJECT_TAG])["Images"]
        for image in sorted(images, key=lambda i: i["CreationDate"]):
            ids = [
                m["Ebs"]["SnapshotId"]
                for m in image.get("BlockDeviceMappings", [])
                if m.get("Ebs", {}).get("SnapshotId")
            ]
            behind |= set(ids)
            snapshots = ec2.describe_snapshots(SnapshotIds=ids)["Snapshots"] if ids else []
            in_use = image["ImageId"] == booted
            what = f"image {image['ImageId']} {image.get('Name', '')} ({day(image['CreationDate'])}"
            why = "ImageStack's bake (Image Builder keeps the newest 2 of each image)"
            if in_use:
                what += f", the one TrainStack boots: {names.IMAGE_PARAMETER}"
                why += "; without it the next run needs a new bake (-c imageRevision=N+1)"
            remove = [f"aws ec2 deregister-image --image-id {image['ImageId']}"]
            remove += [f"aws ec2 delete-snapshot --snapshot-id {sid}" for sid in ids]
            rows.append(snapshot_row(f"{what})", snapshots, why, " && ".join(remove)))
        return rows, behind

    # --- CloudWatch Logs ------------------------------------------------------------------------

    def log_rows(self) -> list[Leftover]:
        rows = []
        for page in self.client("logs").get_paginator("describe_log_groups").paginate():
            for group in page["logGroups"]:
                stack = stack_of_log_group(group["logGroupName"])
                if stack is None:
                    continue
                stored = group.get("storedBytes", 0)
                rows.append(
                    Leftover(
                        what=f"log group {group['logGroupName']}",
                        gib=stored / GIB,
                        usd_per_month=stored / GIB * LOGS_STORED_USD,
                        why=f"{stack}'s logs, kept after cdk destroy {stack}: a failed run's "
                        "logs may not have reached S3"
                        if stack in KEPT_LOGS
                        else f"{stack}'s logs",
                        remove=f"aws logs delete-log-group --log-group-name "
                        f"{group['logGroupName']}",
                    )
                )
        return rows

    def deployed_stacks(self) -> list[str]:
        cloudformation = self.client("cloudformation")
        deployed = []
        for name in names.STACKS:
            try:
                stack = cloudformation.describe_stacks(StackName=name)["Stacks"][0]
            except ClientError:
                continue
            if stack["StackStatus"] != "DELETE_COMPLETE":
                deployed.append(name)
        return deployed


def prefix_of(key: str) -> str:
    """The prefix a key is counted under: its first folder, or `runs/<run>/`."""
    parts = key.split("/")
    if key.startswith(runs.RUNS) and len(parts) > 2:
        return runs.prefix(parts[1])
    return f"{parts[0]}/" if len(parts) > 1 else key


def why_kept(prefix: str, dataset: bool) -> str:
    if prefix == "raw/":
        return (
            "ImageNet's archives: only preprocessing reads them, and it is done once the "
            "dataset's manifest.json is written"
        )
    if dataset:
        return "the dataset every run trains on: without it the next run preprocesses again"
    if prefix.startswith(runs.RUNS):
        return f"run {prefix[len(runs.RUNS) : -1]}'s model, checkpoints, logs and DONE.json: the only copy"
    return "objects of the bucket"


def s3_row(what: str, size: int, why: str, remove: str) -> Leftover:
    return Leftover(what, size / GIB, size / GIB * S3_STANDARD_USD, why, remove)


def volume_row(what: str, volumes: list[dict], why: str, remove: str) -> Leftover:
    prices = [VOLUME_USD.get(v["VolumeType"]) for v in volumes]
    gib = sum(v["Size"] for v in volumes)
    cost = (
        None if None in prices else sum(v["Size"] * p for v, p in zip(volumes, prices, strict=True))
    )
    return Leftover(what, gib, cost, why, remove)


def snapshot_row(what: str, snapshots: list[dict], why: str, remove: str) -> Leftover:
    gib = sum(
        s["FullSnapshotSizeInBytes"] / GIB if s.get("FullSnapshotSizeInBytes") else s["VolumeSize"]
        for s in snapshots
    )
    return Leftover(what, gib, gib * SNAPSHOT_USD, why, remove, at_most=True)


def sizes_of(volumes: list[dict]) -> str:
    return " + ".join(f"{v['Size']} GiB {v['VolumeType']}" for v in volumes) or "no volumes"


def own_snapshots(ec2, filters: list[dict]) -> Iterator[dict]:
    for page in ec2.get_paginator("describe_snapshots").paginate(
        OwnerIds=["self"], Filters=filters
    ):
        yield from page["Snapshots"]


def stack_of_log_group(name: str) -> str | None:
    """The app's stack a log group belongs to: CloudFormation names it `<stack>-...`, Lambda
    `/aws/lambda/<function>` (CloudFormation names functions `<stack>-...`), Image Builder
    `/aws/imagebuilder/horovod-fleet-...`."""
    if name.startswith("/aws/imagebuilder/horovod-fleet"):
        return "ImageStack"
    bare = name.removeprefix("/aws/lambda/")
    return next((stack for stack in names.STACKS if bare.startswith(f"{stack}-")), None)


def tag(resource: dict, key: str) -> str | None:
    return next((t["Value"] for t in resource.get("Tags", []) if t["Key"] == key), None)


def chunks(items: list[str], size: int) -> Iterable[list[str]]:
    return (items[i : i + size] for i in range(0, len(items), size))


def day(value: datetime | str) -> str:
    return value.strftime("%Y-%m-%d") if isinstance(value, datetime) else str(value)[:10]


def count(sizes: list[int], noun: str) -> str:
    return f"{len(sizes)} {noun}{'' if len(sizes) == 1 else 's'}"


def size(gib: float) -> str:
    for unit, scale in (("GiB", 1), ("MiB", 2**10), ("KiB", 2**20)):
        if gib * scale >= 1:
            return f"{gib * scale:,.1f} {unit}"
    return f"{gib * GIB:.0f} B"


def report(rows: list[Leftover], notes: list[str], where: str) -> str:
    """The screen: each thing with its cost, why it is kept and its removal, then the total.
    "<=" marks a cost of a snapshot's full size, which an incremental one bills less than."""
    lines = [f"horovod-fleet leftovers: what bills every month in {where}, at {PRICES_AS_OF}", ""]
    for row in sorted(rows, key=lambda r: (-(r.usd_per_month or 0), r.what)):
        cost = "?" if row.usd_per_month is None else f"${row.usd_per_month:,.2f}"
        lines += [
            f"{('<=' if row.at_most else '') + cost:>11}  {size(row.gib):>11}  {row.what}",
            f"{'':26}why: {row.why}",
            f"{'':26}remove: {row.remove}",
        ]
    total = sum(r.usd_per_month or 0 for r in rows)
    at_most = "<=" if any(r.at_most for r in rows) else ""
    lines += [
        "" if rows else "nothing left behind that bills",
        f"{at_most + f'${total:,.2f}':>11}  a month",
    ]
    return "\n".join(lines + notes) + "\n"
