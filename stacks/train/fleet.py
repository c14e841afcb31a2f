"""GpuFleet: `nodes` identical GPU instances in one cluster placement group, one subnet, one AZ."""

from aws_cdk import (
    CfnCreationPolicy,
    CfnResourceSignal,
    CfnTag,
    RemovalPolicy,
    Stack,
    Tags,
)
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sns as sns
from constructs import Construct

from contract import runs
from contract.names import (
    FLEET_TAG,
    NODE_TAG,
    PROJECT,
    PROJECT_TAG,
    ROLE_TAG,
    RUN_TAG,
    TRAIN_ROLE,
)
from stacks import root_volume
from stacks.config_values import CapacityReservation
from stacks.instance_types import GpuType
from stacks.nag import (
    SSM_MANAGED_POLICY,
    acknowledge_no_termination_protection,
    acknowledge_ssm_policy,
    acknowledge_wildcard_resources,
)
from stacks.node_code import NodeCode, common_document, log_statements
from stacks.train import node_document

# Booting the baked image (nothing is installed) and pulling and verifying ~150 GB of TFRecords.
SIGNAL_TIMEOUT = "PT60M"


class GpuFleet(Construct):
    """The training nodes, their placement group, security group, role and log group.

    Each node holds a CreationPolicy: the deployment succeeds only when every node has signalled
    that its GPUs, EFA and data are ready, and one failure rolls the whole fleet back.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc: ec2.IVpc,
        subnet: ec2.ISubnet,
        gpu: GpuType,
        nodes: int,
        image_id: str,
        bucket: s3.IBucket,
        dataset_prefix: str,
        run: str,
        trainer: dict,
        max_hours: float,
        benchmark: dict | None = None,
        market: str = "on-demand",
        capacity_reservation: CapacityReservation | None = None,
        notify_topic: sns.ITopic | None = None,
        move_slots: int = 0,
        elastic: dict | None = None,
        init_rate: int | None = None,
        drill: dict | None = None,
    ) -> None:
        """`init_rate`: the roots' (root_volume.py; None: lazily). `drill`: node.json's, and the
        role tag on every replacement node, which its experiments aim at (train/drill.py)."""
        super().__init__(scope, construct_id)
        self.market = market
        self._role_tags = [CfnTag(key=ROLE_TAG, value=TRAIN_ROLE)] if drill else []
        runs_prefix = runs.prefix(run)
        self.code = code = NodeCode(self, "Code")
        self.log_group = logs.LogGroup(
            self,
            "Logs",
            retention=logs.RetentionDays.ONE_MONTH,
            # Kept after teardown: a failed run may not have reached S3 with its logs.
            removal_policy=RemovalPolicy.RETAIN,
        )
        self.security_group = self._security_group(vpc, run)
        self.placement_group = ec2.PlacementGroup(
            self, "PlacementGroup", strategy=ec2.PlacementGroupStrategy.CLUSTER
        )
        self.move_groups = [self._move_group(slot) for slot in range(1, move_slots + 1)]
        self.role, self.policy = self._role_and_policy(
            code, bucket, dataset_prefix=dataset_prefix, runs_prefix=runs_prefix, run=run
        )
        if notify_topic is not None:
            # The leader's two e-mails: training started, the run ended (bootstrap/records/status.py).
            self.policy.add_statements(
                iam.PolicyStatement(actions=["sns:Publish"], resources=[notify_topic.topic_arn])
            )
        self.profile = profile = iam.CfnInstanceProfile(
            self, "Profile", roles=[self.role.role_name]
        )
        self.launch_fields = self._launch_fields(
            gpu, subnet, capacity_reservation, market, init_rate
        )
        launch_template = ec2.CfnLaunchTemplate(
            self,
            "LaunchTemplate",
            launch_template_data=ec2.CfnLaunchTemplate.LaunchTemplateDataProperty(
                **self.launch_fields
            ),
        )
        # Every node's node.json holds these after its run and index (docs/contracts.md).
        self.fleet_document = fleet_document = node_document.fleet_document(
            gpu=gpu,
            nodes=nodes,
            image_id=image_id,
            dataset_prefix=dataset_prefix,
            run=run,
            trainer=trainer,
            max_hours=max_hours,
            benchmark=benchmark,
            market=market,
            notify_topic_arn=notify_topic.topic_arn if notify_topic else None,
            init_rate=init_rate,
            elastic=elastic,
            drill=drill,
        )
        self.instances = [
            self._node(
                index,
                run=run,
                code=code,
                gpu=gpu,
                image_id=image_id,
                launch_template=launch_template,
                profile=profile,
                subnet=subnet,
                bucket=bucket,
                fleet_document=fleet_document,
            )
            for index in range(nodes)
        ]
        self.replacement_template = self._replacement_template(
            self.instances[0],
            profile,
            code=code,
            run=run,
            document=common_document(
                role="train",
                region=Stack.of(self).region,
                bucket_name=bucket.bucket_name,
                log_group_name=self.log_group.log_group_name,
                signal_stack=None,
                signal_resource=None,
            )
            | {"run": run, **fleet_document},
        )

    def _move_group(self, slot: int) -> ec2.PlacementGroup:
        """The cluster placement group of move slot `slot`, used only with that slot's subnet
        (stacks/network.py move_subnets): a cluster group takes the zone of its first instance.
        Free ("There is no charge for creating a placement group") and few: an account may
        have 500 per region
        (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/placement-groups.html)."""
        group = ec2.PlacementGroup(
            self, f"Move{slot}PlacementGroup", strategy=ec2.PlacementGroupStrategy.CLUSTER
        )
        Tags.of(group).add(FLEET_TAG, Stack.of(self).stack_id)
        return group

    def _security_group(self, vpc: ec2.IVpc, run: str) -> ec2.SecurityGroup:
        """All traffic between fleet members, and HTTPS out; nothing else in or out."""
        group = ec2.SecurityGroup(
            self,
            "Security",
            vpc=vpc,
            description=f"horovod-fleet {run}: all traffic between fleet members only",
            allow_all_outbound=False,
        )
        # EFA needs all traffic to and from the group itself; SSH and NCCL use it too.
        group.add_ingress_rule(group, ec2.Port.all_traffic(), "fleet members")
        group.add_egress_rule(group, ec2.Port.all_traffic(), "fleet members")
        # The baked image installs nothing at boot: HTTPS to AWS APIs is the only way out.
        group.add_egress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(443), "HTTPS to AWS APIs")
        # A launch in a move slot names the group in its interfaces, so the run controller may
        # use it only so tagged (a tag change does not interrupt the group).
        Tags.of(group).add(FLEET_TAG, Stack.of(self).stack_id)
        return group

    def _role_and_policy(
        self,
        code: NodeCode,
        bucket: s3.IBucket,
        *,
        dataset_prefix: str,
        runs_prefix: str,
        run: str,
    ) -> tuple[iam.Role, iam.Policy]:
        """The nodes' role: read the code and the dataset, write this run's prefix, signal."""
        role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            description=f"horovod-fleet {run}: reads the dataset, writes runs/{run}/",
            managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(SSM_MANAGED_POLICY)],
        )
        acknowledge_ssm_policy(role)
        policy = iam.Policy(
            self,
            "Policy",
            roles=[role],
            statements=[
                code.read_statement(),
                iam.PolicyStatement(
                    actions=["s3:GetObject"],
                    resources=[bucket.arn_for_objects(f"{dataset_prefix}*")],
                ),
                iam.PolicyStatement(
                    actions=["s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload"],
                    resources=[bucket.arn_for_objects(f"{runs_prefix}*")],
                ),
                # A rerun removes the previous attempt's DONE.json so nothing reacts to it.
                iam.PolicyStatement(
                    actions=["s3:DeleteObject"],
                    resources=[bucket.arn_for_objects(f"{runs_prefix}DONE.json")],
                ),
                iam.PolicyStatement(
                    actions=["s3:ListBucket"],
                    resources=[bucket.bucket_arn],
                    conditions={
                        "StringLike": {"s3:prefix": [f"{dataset_prefix}*", f"{runs_prefix}*"]}
                    },
                ),
                iam.PolicyStatement(
                    actions=["cloudformation:SignalResource"],
                    resources=[Stack.of(self).stack_id],
                ),
                # The node's launch time for its start-up record (bootstrap/records/phases.py), and
                # the head's discovery, which lists a node only while EC2 runs it: "Amazon EC2
                # ec2:Describe* API actions do not support resource-level permissions"
                # (https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazonec2.html).
                iam.PolicyStatement(actions=["ec2:DescribeInstances"], resources=["*"]),
                *log_statements(self.log_group),
            ],
        )
        acknowledge_wildcard_resources(
            policy,
            [bucket.arn_for_objects(f"{prefix}*") for prefix in (dataset_prefix, runs_prefix)],
            "Read: the dataset's shards, named in its manifest. Write: only under this run's "
            "prefix, where the checkpoints, logs and rendezvous files are named at run time.",
        )
        acknowledge_wildcard_resources(
            policy,
            ["*"],
            "cloudwatch:PutMetricData and ec2:DescribeInstances support no resource-level "
            "permissions: the metric statement's condition limits it to the HorovodFleet "
            "namespace; DescribeInstances only reads (the node's own launch time, the states of "
            "the nodes the head's discovery lists).",
        )
        return role, policy

    def _launch_fields(
        self,
        gpu: GpuType,
        subnet: ec2.ISubnet,
        capacity_reservation: CapacityReservation | None,
        market: str,
        init_rate: int | None,
    ) -> dict:
        """What AWS::EC2::Instance cannot express: EFA interfaces, network cards, the root
        volume's initialization rate and gp3 throughput, the capacity reservation, the Spot
        market. The instances set everything else themselves."""
        return {
            "network_interfaces": self._interfaces(gpu, subnet),
            "block_device_mappings": [_root_volume(init_rate)],
            # The instances require IMDSv2 themselves; the template says so too (checkov).
            "metadata_options": ec2.CfnLaunchTemplate.MetadataOptionsProperty(
                http_endpoint="enabled", http_tokens="required"
            ),
            **_capacity(capacity_reservation),
            **_market(market),
        }

    def _node(
        self,
        index: int,
        *,
        run: str,
        code: NodeCode,
        gpu: GpuType,
        image_id: str,
        launch_template: ec2.CfnLaunchTemplate,
        profile: iam.CfnInstanceProfile,
        subnet: ec2.ISubnet,
        bucket: s3.IBucket,
        fleet_document: dict,
    ) -> ec2.CfnInstance:
        """Node `index`: its instance, the signal it owes the CreationPolicy, its node.json."""
        stack = Stack.of(self)
        instance = ec2.CfnInstance(
            self,
            f"Node{index}",
            image_id=image_id,
            instance_type=gpu.name,
            placement_group_name=self.placement_group.placement_group_name,
            launch_template=ec2.CfnInstance.LaunchTemplateSpecificationProperty(
                launch_template_id=launch_template.ref,
                version=launch_template.attr_latest_version_number,
            ),
            iam_instance_profile=profile.ref,
            metadata_options=ec2.CfnInstance.MetadataOptionsProperty(
                http_endpoint="enabled", http_tokens="required"
            ),
            monitoring=True,
            ebs_optimized=True,
            propagate_tags_to_volume_on_creation=True,
        )
        # Permissions and a way out must exist before the bootstrap's first download.
        instance.add_resource_dependency(self.policy.node.default_child)
        instance.node.add_dependency(subnet.internet_connectivity_established)
        instance.cfn_options.creation_policy = CfnCreationPolicy(
            resource_signal=CfnResourceSignal(count=1, timeout=SIGNAL_TIMEOUT)
        )
        acknowledge_no_termination_protection(instance, "a training node")
        logical_id = stack.get_logical_id(instance)
        document = common_document(
            role="train",
            region=stack.region,
            bucket_name=bucket.bucket_name,
            log_group_name=self.log_group.log_group_name,
            signal_stack=stack.stack_name,
            signal_resource=logical_id,
        ) | {"run": run, "node_index": index, **fleet_document}
        instance.user_data = code.user_data(
            node_document=document, script="train_node.sh", signal_resource=logical_id
        )
        # What the run controller finds a node by; a replacement gets its index tag at launch.
        Tags.of(instance).add(NODE_TAG, str(index))
        Tags.of(instance).add(FLEET_TAG, stack.stack_id)
        return instance

    def _replacement_template(
        self,
        instance: ec2.CfnInstance,
        profile: iam.CfnInstanceProfile,
        *,
        code: NodeCode,
        run: str,
        document: dict,
    ) -> ec2.CfnLaunchTemplate:
        """Every replacement node, for the run controller: an instance EC2 has terminated (a Spot
        interruption, a retired host) cannot be started again, so the controller launches all
        the missing nodes in one all-or-nothing request from this template, with nothing of
        their own. Their node.json has no `node_index`: each reads its index at boot from the
        controller's launch assignment in S3, and none signals (the CreationPolicy signals are
        the nodes' own). The nodes' instances keep their properties: an update of TrainStack
        stops and starts them, where a launch template version would replace them under a
        running fleet (docs/contracts.md)."""
        stack = Stack.of(self)
        tags = [
            CfnTag(key=PROJECT_TAG, value=PROJECT),
            CfnTag(key=RUN_TAG, value=run),
            CfnTag(key=FLEET_TAG, value=stack.stack_id),
            *self._role_tags,
        ]
        return ec2.CfnLaunchTemplate(
            self,
            "NodeReplacement",
            launch_template_data=ec2.CfnLaunchTemplate.LaunchTemplateDataProperty(
                **self.launch_fields,
                image_id=instance.image_id,
                instance_type=instance.instance_type,
                iam_instance_profile=ec2.CfnLaunchTemplate.IamInstanceProfileProperty(
                    arn=profile.attr_arn
                ),
                placement=ec2.CfnLaunchTemplate.PlacementProperty(
                    group_name=self.placement_group.placement_group_name
                ),
                monitoring=ec2.CfnLaunchTemplate.MonitoringProperty(enabled=True),
                ebs_optimized=True,
                user_data=code.user_data(
                    node_document=document, script="train_node.sh", signal_resource=None
                ),
                tag_specifications=[
                    ec2.CfnLaunchTemplate.TagSpecificationProperty(resource_type=kind, tags=tags)
                    for kind in ("instance", "volume", "network-interface")
                ],
            ),
            tag_specifications=[
                ec2.CfnLaunchTemplate.LaunchTemplateTagSpecificationProperty(
                    resource_type="launch-template", tags=tags
                )
            ],
        )

    def _interfaces(
        self, gpu: GpuType, subnet: ec2.ISubnet
    ) -> list[ec2.CfnLaunchTemplate.NetworkInterfaceProperty]:
        """One EFA (with ENA) per network card, p4d 4 and p5 32, or one plain interface: the
        primary at card 0 device 0, the others at device 1 of their card, as AWS documents for
        types with several network cards (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html)
        and ParallelCluster launches them (cli/src/pcluster/templates/queues_stack.py)."""
        return [
            ec2.CfnLaunchTemplate.NetworkInterfaceProperty(
                device_index=0 if card == 0 else 1,
                network_card_index=card,
                interface_type="efa" if gpu.efa else None,
                subnet_id=subnet.subnet_id,
                groups=[self.security_group.security_group_id],
                delete_on_termination=True,
            )
            for card in range(max(gpu.efa_interfaces, 1))
        ]


def _capacity(reservation: CapacityReservation | None) -> dict:
    """Launch template settings that put every node into the reservation, and only there: a
    Capacity Block also needs the capacity-block market type.
    https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-launch.html"""
    if reservation is None:
        return {}
    settings: dict = {
        "capacity_reservation_specification": (
            ec2.CfnLaunchTemplate.CapacityReservationSpecificationProperty(
                capacity_reservation_target=ec2.CfnLaunchTemplate.CapacityReservationTargetProperty(
                    capacity_reservation_id=reservation.id
                )
            )
        )
    }
    if reservation.block:
        settings["instance_market_options"] = ec2.CfnLaunchTemplate.InstanceMarketOptionsProperty(
            market_type="capacity-block"
        )
    return settings


def _market(market: str) -> dict:
    """Spot: one-time requests that EC2 terminates on interruption, the only Spot behaviour a
    cluster placement group allows (stop and hibernate are refused there).
    https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/placement-groups-limitations.html"""
    if market == "on-demand":
        return {}
    assert market == "spot", market
    return {
        "instance_market_options": ec2.CfnLaunchTemplate.InstanceMarketOptionsProperty(
            market_type="spot",
            spot_options=ec2.CfnLaunchTemplate.SpotOptionsProperty(
                spot_instance_type="one-time", instance_interruption_behavior="terminate"
            ),
        )
    }


def _root_volume(init_rate: int | None) -> ec2.CfnLaunchTemplate.BlockDeviceMappingProperty:
    """Encrypted gp3 root at Ubuntu's device name, its image's blocks downloaded at init_rate
    MiB/s from its creation, and read at THROUGHPUT_MIB_S (stacks/root_volume.py)."""
    return ec2.CfnLaunchTemplate.BlockDeviceMappingProperty(
        device_name="/dev/sda1",
        ebs=ec2.CfnLaunchTemplate.EbsProperty(
            volume_size=root_volume.ROOT_VOLUME_GIB,
            volume_type="gp3",
            throughput=root_volume.THROUGHPUT_MIB_S,
            volume_initialization_rate=init_rate,
            encrypted=True,
            delete_on_termination=True,
        ),
    )
