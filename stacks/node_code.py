"""The code every instance runs (bootstrap/ and trainer/ as CDK assets) and the user-data that
installs it, writes /etc/horovod-fleet/node.json and starts the node's bootstrap script.

User-data unzips each asset into its own folder under /opt/horovod-fleet/. The packages the
bootstrap imports from outside its folder (contract/) come inside its asset, under
bootstrap/packages/: bootstrap/lib.sh links each next to bootstrap/ before any of it runs, so
`python3 -m bootstrap.X` finds them wherever it starts from /opt/horovod-fleet (PYTHONPATH, or
the head's `cd /opt/horovod-fleet && python3 -m ...` over ssh)."""

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aws_cdk import Fn, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3_assets as s3_assets
from constructs import Construct

from contract.names import PROJECT
from stacks.staging import CONTRACT, EXCLUDE, staged

CODE_ROOT = Path(__file__).resolve().parent.parent
CODE_DIRECTORIES = ("bootstrap", "trainer")
CODE_EXCLUDE = list(EXCLUDE)
# What each folder's asset holds besides the folder: bootstrap/ imports contract/ (trainer/
# imports nothing outside itself).
SHIPPED = {"bootstrap": {"packages/contract": CONTRACT}, "trainer": {}}
INSTALL_DIR = "/opt/horovod-fleet"
NODE_JSON = "/etc/horovod-fleet/node.json"
LOG_DIR = "/var/log/horovod-fleet"
MOUNT_POINT = "/data"
# Canonical's Ubuntu 24.04 LTS (standard support to April 2029), moved by Canonical to each new
# image; releases from 23.10 on have gp3 parameters ("VOL_TYPE: ebs-gp3 (for >=23.10)"). The
# training image starts from it (bootstrap/image/pins.env UBUNTU_RELEASE) and so does the
# preprocessing node (docs/preprocessing.md says why).
#   https://documentation.ubuntu.com/aws/en/latest/aws-how-to/instances/find-ubuntu-images/
#   (source: github.com/canonical/ubuntu-cloud-docs, aws/aws-how-to/instances/find-ubuntu-images.rst)
UBUNTU_AMI_PARAMETER = (
    "/aws/service/canonical/ubuntu/server/24.04/stable/current/amd64/hvm/ebs-gp3/ami-id"
)


class NodeCode(Construct):
    """bootstrap/ and trainer/ zipped as assets; user-data unzips them under /opt/horovod-fleet."""

    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        self.assets = {
            name: s3_assets.Asset(
                self,
                name.capitalize(),
                path=str(staged(self, name, {".": CODE_ROOT / name, **SHIPPED[name]})),
                exclude=CODE_EXCLUDE,
            )
            for name in CODE_DIRECTORIES
        }

    def read_statement(self) -> iam.PolicyStatement:
        """GetObject on exactly the two asset objects (Asset.grant_read would allow List*)."""
        return iam.PolicyStatement(
            actions=["s3:GetObject"],
            resources=[a.bucket.arn_for_objects(a.s3_object_key) for a in self.assets.values()],
        )

    def user_data(
        self,
        *,
        node_document: Mapping[str, Any],
        script: str,
        signal_resource: str | None,
        code_urls: Mapping[str, str] | None = None,
    ) -> str:
        """Base64 user-data for one instance. A failure before the bootstrap script takes over
        stops the bill at once: a node with a CreationPolicy signals FAILURE (the deployment
        rolls back instead of timing out), a node without one halts. `code_urls` replaces the
        assets' URLs (PreprocessStack pins them, so a code change does not restart its node)."""
        stack = Stack.of(self)
        region = stack.region
        # Before IMDS answers there is no instance id: any unique id fails the resource. Without
        # a signal (no credentials either) the node halts, which stops its compute bill.
        on_failure = (
            f"aws cloudformation signal-resource --region {region} --stack-name "
            f"{stack.stack_name} --logical-resource-id {signal_resource} "
            '--unique-id "${instance_id:-$(hostname)}" --status FAILURE || shutdown -h +1'
            if signal_resource
            else "shutdown -h +1"
        )
        urls = {name: asset.s3_object_url for name, asset in self.assets.items()}
        urls |= code_urls or {}
        downloads = "\n".join(
            f"aws s3 cp --only-show-errors --region {region} {urls[name]} /tmp/{name}.zip\n"
            f"rm -rf {INSTALL_DIR}/{name}\n"
            f"python3 -m zipfile -e /tmp/{name}.zip {INSTALL_DIR}/{name}"
            for name in self.assets
        )
        lines = [
            "#!/bin/bash",
            "set -Eeuo pipefail",
            "export PATH=$PATH:/snap/bin",
            f"mkdir -p {LOG_DIR} {INSTALL_DIR} {Path(NODE_JSON).parent}",
            # The bootstrap script tees itself into bootstrap.log; this file keeps what ran
            # before it (and its early failures) without writing each of its lines twice.
            f"exec > >(tee -a {LOG_DIR}/user-data.log) 2>&1",
            "imds() {",
            "  local token",
            "  token=$(curl -sSf -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 60' "
            "http://169.254.169.254/latest/api/token)",
            '  curl -sSf -H "X-aws-ec2-metadata-token: $token" '
            '"http://169.254.169.254/latest/meta-data/$1"',
            "}",
            f"on_failure() {{ {on_failure}; }}",
            "trap on_failure ERR",
            "instance_id=$(imds instance-id)",
            # Canonical's Ubuntu image has no AWS CLI; the Deep Learning AMI has one.
            # snapd refuses installs until it has seeded, which a fresh boot may not have done.
            "command -v aws >/dev/null || { snap wait system seed.loaded && "
            "snap install aws-cli --classic; }",
            f"cat > {NODE_JSON} <<'NODE_JSON'",
            # json.dumps, not Stack.to_json_string, which drops null keys the contract requires;
            # the tokens inside become bucket, log group and volume names: nothing to escape.
            json.dumps(dict(node_document), separators=(",", ":")),
            "NODE_JSON",
            downloads,
            f"NODE_JSON={NODE_JSON} bash {INSTALL_DIR}/bootstrap/{script} {NODE_JSON}",
        ]
        return Fn.base64("\n".join(lines) + "\n")


def common_document(
    *,
    role: str,
    region: str,
    bucket_name: str,
    log_group_name: str,
    signal_stack: str | None,
    signal_resource: str | None,
) -> dict[str, Any]:
    """The node.json keys both roles share (docs/contracts.md)."""
    return {
        "role": role,
        "region": region,
        "bucket": bucket_name,
        "log_group": log_group_name,
        "project": PROJECT,
        "signal": (
            {"stack": signal_stack, "resource": signal_resource}
            if signal_stack and signal_resource
            else None
        ),
        "mount_point": MOUNT_POINT,
    }


def root_volume(size_gib: int) -> ec2.CfnInstance.BlockDeviceMappingProperty:
    """An encrypted gp3 root volume at Ubuntu's root device name."""
    return ec2.CfnInstance.BlockDeviceMappingProperty(
        device_name="/dev/sda1",
        ebs=ec2.CfnInstance.EbsProperty(
            volume_size=size_gib,
            volume_type="gp3",
            encrypted=True,
            delete_on_termination=True,
        ),
    )


def log_statements(log_group: logs.ILogGroup) -> list[iam.PolicyStatement]:
    """What the CloudWatch agent needs: write to this log group, GPU metrics to our namespace."""
    return [
        iam.PolicyStatement(
            actions=["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
            resources=[log_group.log_group_arn],
        ),
        iam.PolicyStatement(
            actions=["cloudwatch:PutMetricData"],
            resources=["*"],
            conditions={"StringEquals": {"cloudwatch:namespace": "HorovodFleet"}},
        ),
    ]
