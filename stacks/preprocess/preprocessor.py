"""Preprocessor: one burstable CPU node with an sc1 data volume that turns raw/ into TFRecords."""

from aws_cdk import (
    RemovalPolicy,
    Size,
    Stack,
)
from aws_cdk import aws_cloudformation as cloudformation
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from constructs import Construct

from stacks.instance_types import BurstableType
from stacks.nag import (
    SSM_MANAGED_POLICY,
    acknowledge_metric_data,
    acknowledge_no_termination_protection,
    acknowledge_ssm_policy,
    acknowledge_wildcard_resources,
    allow_fixed_zone,
)
from stacks.network import web_egress_security_group
from stacks.node_code import (
    UBUNTU_AMI_PARAMETER,
    NodeCode,
    common_document,
    log_statements,
    root_volume,
)
from stacks.preprocess.pinned import Pinned
from stacks.teardown.guards import FleetGuards

# Pinned: a new logical ID would mean a new, empty volume.
DATA_VOLUME_LOGICAL_ID = "DataVolume"
DATA_DEVICE = "/dev/sdf"
ROOT_VOLUME_GIB = 30
RAW_PREFIX = "raw/"
TRAIN_SHARDS = 1024
VAL_SHARDS = 128
# Booting, the AWS CLI snap, the code, python3-venv, the pip installs and the CloudWatch agent
# take minutes; a node that has not signalled in half an hour is not going to.
READY_TIMEOUT_S = 1800


class Preprocessor(Construct):
    """The preprocessing instance, its data volume, its role and its log group.

    `availability_zone` is the subnet's zone by name (a volume and an instance take no zone ID):
    SingleZoneNetwork.availability_zone.

    Each part is built by a helper on this construct, with the construct id it always had: a
    logical ID is made of its resource's construct path and a hash of it, so a part moved into a
    construct of its own would be a new resource to CloudFormation (a new, empty data volume).
    https://docs.aws.amazon.com/cdk/v2/guide/identifiers.html#identifiers-logical-ids"""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc: ec2.IVpc,
        subnet: ec2.ISubnet,
        availability_zone: str,
        node_type: BurstableType,
        guards: FleetGuards,
        volume_gib: int,
        bucket: s3.IBucket,
        output_prefix: str,
        download_secret_arn: str | None,
        raw_prefix: str = RAW_PREFIX,
        shards: tuple[int, int] = (TRAIN_SHARDS, VAL_SHARDS),
    ) -> None:
        """`raw_prefix` and `shards` (train, validation): ImageNet's, or a drill's dataset."""
        super().__init__(scope, construct_id)
        self._raw_prefix = raw_prefix
        code = NodeCode(self, "Code")
        pinned = Pinned(
            self,
            "Pinned",
            guards=guards,
            # Read once, on the stack's first deploy: resolved at every deploy, a new Canonical
            # image would replace the node mid-conversion.
            image_parameter=UBUNTU_AMI_PARAMETER,
            code={name: asset.s3_object_url for name, asset in code.assets.items()},
        )
        self.log_group = logs.LogGroup(
            self,
            "Logs",
            retention=logs.RetentionDays.ONE_MONTH,
            # Kept on delete: the only record of why a conversion failed.
            removal_policy=RemovalPolicy.RETAIN,
        )
        role, policy = self._role_and_policy(
            code, bucket, output_prefix=output_prefix, download_secret_arn=download_secret_arn
        )
        profile = iam.CfnInstanceProfile(self, "Profile", roles=[role.role_name])
        group = web_egress_security_group(
            self, "Security", vpc=vpc, description="horovod-fleet preprocessing: no ingress"
        )
        self.volume = self._data_volume(availability_zone, volume_gib)
        self.cfn_volume: ec2.CfnVolume = self.volume.node.default_child
        self.instance = self._instance(
            image_id=pinned.image_id,
            node_type=node_type,
            availability_zone=availability_zone,
            subnet=subnet,
            group=group,
            profile=profile,
            policy=policy,
        )
        ec2.CfnVolumeAttachment(
            self,
            "DataVolumeAttachment",
            instance_id=self.instance.ref,
            volume_id=self.volume.volume_id,
            device=DATA_DEVICE,
        )
        ready_signal_url = self._ready_signal()
        document = common_document(
            role="preprocess",
            region=Stack.of(self).region,
            bucket_name=bucket.bucket_name,
            log_group_name=self.log_group.log_group_name,
            signal_stack=None,
            signal_resource=None,
        ) | {
            "raw_prefix": raw_prefix,
            "output_prefix": output_prefix,
            "volume_id": self.volume.volume_id,
            "download_secret_arn": download_secret_arn,
            "train_shards": shards[0],
            "val_shards": shards[1],
            "stop_when_done": True,
            "ready_signal_url": ready_signal_url,
        }
        self.instance.user_data = code.user_data(
            node_document=document,
            script="preprocess_node.sh",
            signal_resource=None,
            code_urls=pinned.code_urls,
        )

    def _role_and_policy(
        self,
        code: NodeCode,
        bucket: s3.IBucket,
        *,
        output_prefix: str,
        download_secret_arn: str | None,
    ) -> tuple[iam.Role, iam.Policy]:
        """The node's role: read its code and raw/, write the TFRecords, log, read the secret."""
        role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            description="horovod-fleet preprocessing node: reads raw/, writes the TFRecords",
            managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(SSM_MANAGED_POLICY)],
        )
        acknowledge_ssm_policy(role)
        statements = [
            code.read_statement(),
            # The pinned code may be an earlier deploy's assets, which a replacement node reads.
            iam.PolicyStatement(
                actions=["s3:GetObject"],
                resources=list(
                    {a.bucket.arn_for_objects("*.zip"): None for a in code.assets.values()}
                ),
            ),
            iam.PolicyStatement(
                actions=["s3:GetObject"],
                resources=[bucket.arn_for_objects(f"{self._raw_prefix}*")],
            ),
            iam.PolicyStatement(
                actions=["s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload"],
                resources=[bucket.arn_for_objects(f"{output_prefix}*")],
            ),
            iam.PolicyStatement(
                actions=["s3:ListBucket"],
                resources=[bucket.bucket_arn],
                conditions={
                    "StringLike": {"s3:prefix": [f"{self._raw_prefix}*", f"{output_prefix}*"]}
                },
            ),
            *log_statements(self.log_group),
        ]
        if download_secret_arn:
            statements.append(
                iam.PolicyStatement(
                    actions=["secretsmanager:GetSecretValue"], resources=[download_secret_arn]
                )
            )
        policy = iam.Policy(self, "Policy", statements=statements, roles=[role])
        acknowledge_wildcard_resources(
            policy,
            [bucket.arn_for_objects(f"{p}*") for p in (self._raw_prefix, output_prefix)],
            "Objects under raw/ and the TFRecords prefix are the inputs and outputs of "
            "preprocessing; their names are known only at run time.",
        )
        acknowledge_wildcard_resources(
            policy,
            [a.bucket.arn_for_objects("*.zip") for a in code.assets.values()],
            "Read-only: the CDK asset zips of this account and region. The node's code is pinned "
            "at its first deploy, so a replacement node may need an earlier deploy's asset.",
        )
        acknowledge_metric_data(policy)
        return role, policy

    def _data_volume(self, availability_zone: str, volume_gib: int) -> ec2.Volume:
        """The sc1 volume the archives are extracted to, under its pinned logical ID."""
        volume = ec2.Volume(
            self,
            "DataVolume",
            availability_zone=availability_zone,
            size=Size.gibibytes(volume_gib),
            volume_type=ec2.EbsDeviceVolumeType.SC1,
            encrypted=True,
            # Deleting the stack leaves a snapshot: the extracted archives survive, the volume's
            # bill stops.
            removal_policy=RemovalPolicy.SNAPSHOT,
        )
        cfn_volume: ec2.CfnVolume = volume.node.default_child
        cfn_volume.override_logical_id(DATA_VOLUME_LOGICAL_ID)
        allow_fixed_zone(cfn_volume)
        return volume

    def _instance(
        self,
        *,
        image_id: str,
        node_type: BurstableType,
        availability_zone: str,
        subnet: ec2.ISubnet,
        group: ec2.SecurityGroup,
        profile: iam.CfnInstanceProfile,
        policy: iam.Policy,
    ) -> ec2.CfnInstance:
        """The node, in unlimited mode, that stops itself when the dataset is ready."""
        instance = ec2.CfnInstance(
            self,
            "Instance",
            image_id=image_id,
            instance_type=node_type.name,
            # The 30% baseline of standard mode would throttle a conversion that runs for hours.
            credit_specification=ec2.CfnInstance.CreditSpecificationProperty(
                cpu_credits="unlimited"
            ),
            availability_zone=availability_zone,
            subnet_id=subnet.subnet_id,
            security_group_ids=[group.security_group_id],
            iam_instance_profile=profile.ref,
            metadata_options=ec2.CfnInstance.MetadataOptionsProperty(
                http_endpoint="enabled", http_tokens="required"
            ),
            monitoring=True,
            # The bootstrap halts the node when the dataset is ready; stopped, it bills nothing.
            instance_initiated_shutdown_behavior="stop",
            block_device_mappings=[root_volume(ROOT_VOLUME_GIB)],
            propagate_tags_to_volume_on_creation=True,
        )
        # Permissions and a way out must exist before the bootstrap's first download.
        instance.add_resource_dependency(policy.node.default_child)
        instance.node.add_dependency(subnet.internet_connectivity_established)
        acknowledge_no_termination_protection(instance, "the preprocessing node")
        allow_fixed_zone(instance)
        return instance

    def _ready_signal(self) -> str:
        """The URL the node signals once its environment is ready; the deployment waits for it."""
        # Not for the dataset, hours later: a wait condition rather than a CreationPolicy,
        # because a handle's signal carries a reason, and CloudFormation shows a FAILURE's reason
        # in the deploy output.
        # https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/using-cfn-waitcondition.html
        ready_handle = cloudformation.CfnWaitConditionHandle(self, "ReadyHandle")
        ready = cloudformation.CfnWaitCondition(
            self,
            "Ready",
            handle=ready_handle.ref,
            timeout=str(READY_TIMEOUT_S),
            count=1,
        )
        ready.add_resource_dependency(self.instance)
        return ready_handle.ref
