"""Head: the elastic fleet's one CPU instance, which runs horovodrun's elastic driver.

Horovod's elastic driver holds the rendezvous server and the ssh session of every rank
(horovod/runner/gloo_run.py and elastic/driver.py, v0.28.1): it dies with its host. On node 0 a
loss of node 0 would still end the attempt, so the driver, and what the leader did besides
training (the fleet check, status.json, the uploads, DONE.json), run on a small on-demand
instance in the fleet's subnet, as ParallelCluster's head node and Ray's head do. Every GPU node
is a worker. The head's own loss ends the attempt, as a node's did before (docs/contracts.md),
and when EC2 ended its instance the run controller's relaunch launches it again from its own
launch template (`HeadReplacement`, TrainStack's output HorovodFleetHeadTemplate): the new head
takes the run over from S3.
"""

from aws_cdk import CfnCreationPolicy, CfnResourceSignal, CfnTag, Stack, Tags
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct

from stacks.image.recipe import ROOT_GIB as IMAGE_ROOT_GIB
from stacks.instance_types import HEAD_TYPE
from stacks.nag import acknowledge_no_termination_protection
from stacks.node_code import PROJECT, NodeCode, common_document
from stacks.teardown.names import FLEET_TAG, HEAD_NODE, NODE_TAG

# The training image's root (its snapshot sets the least a volume from it may have) plus the
# head's own files: the run's newest checkpoints (~205 MB each for ResNet-50), the mirror of
# rank 0's model dir and the logs.
HEAD_ROOT_GIB = IMAGE_ROOT_GIB + 40


class Head(Construct):
    """One on-demand instance of HEAD_TYPE (never Spot: its loss ends the attempt) in the
    fleet's subnet and security group, outside the cluster placement group (it carries no
    collective), with the nodes' role and code. Its CreationPolicy is signalled once the fleet
    met and passed its checks, like every node's."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        subnet: ec2.ISubnet,
        security_group: ec2.ISecurityGroup,
        profile: iam.CfnInstanceProfile,
        policy: iam.Policy,
        code: NodeCode,
        image_id: str,
        bucket: s3.IBucket,
        log_group_name: str,
        run: str,
        fleet_document: dict,
        signal_timeout: str,
        init_rate: int | None,
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        self.log_group_name = log_group_name
        # The root volume in a launch template, as the nodes have it: cdk-nag's EBS encryption
        # rule (EC26, cdk-nag 3.0.2) cannot judge an instance without one in a stack with one;
        # and its image's blocks downloaded at `init_rate` from the volume's creation, as the
        # nodes' are (stacks/root_volume.py), which AWS::EC2::Instance cannot say.
        template = ec2.CfnLaunchTemplate(
            self,
            "LaunchTemplate",
            launch_template_data=ec2.CfnLaunchTemplate.LaunchTemplateDataProperty(
                block_device_mappings=[_root_volume(init_rate)],
                metadata_options=ec2.CfnLaunchTemplate.MetadataOptionsProperty(
                    http_endpoint="enabled", http_tokens="required"
                ),
            ),
        )
        self.instance = instance = ec2.CfnInstance(
            self,
            "Instance",
            image_id=image_id,
            instance_type=HEAD_TYPE.name,
            launch_template=ec2.CfnInstance.LaunchTemplateSpecificationProperty(
                launch_template_id=template.ref, version=template.attr_latest_version_number
            ),
            subnet_id=subnet.subnet_id,
            security_group_ids=[security_group.security_group_id],
            iam_instance_profile=profile.ref,
            metadata_options=ec2.CfnInstance.MetadataOptionsProperty(
                http_endpoint="enabled", http_tokens="required"
            ),
            monitoring=True,
            ebs_optimized=True,
            propagate_tags_to_volume_on_creation=True,
        )
        # Permissions and a way out must exist before the bootstrap's first download.
        instance.add_resource_dependency(policy.node.default_child)
        instance.node.add_dependency(subnet.internet_connectivity_established)
        instance.cfn_options.creation_policy = CfnCreationPolicy(
            resource_signal=CfnResourceSignal(count=1, timeout=signal_timeout)
        )
        acknowledge_no_termination_protection(instance, "the fleet's head")
        logical_id = stack.get_logical_id(instance)
        self.document = common_document(
            role="head",
            region=stack.region,
            bucket_name=bucket.bucket_name,
            log_group_name=log_group_name,
            signal_stack=stack.stack_name,
            signal_resource=logical_id,
        ) | {"run": run, **fleet_document}
        instance.user_data = code.user_data(
            node_document=self.document, script="train_node.sh", signal_resource=logical_id
        )
        # What the run controller finds the fleet by: the head is a fleet instance (a relaunch
        # reboots, stops and starts it), but no node index.
        Tags.of(instance).add(NODE_TAG, HEAD_NODE)
        Tags.of(instance).add(FLEET_TAG, stack.stack_id)
        self.replacement = self._replacement(
            image_id=image_id,
            subnet=subnet,
            security_group=security_group,
            profile=profile,
            code=code,
            run=run,
            init_rate=init_rate,
        )

    def _replacement(
        self,
        *,
        image_id: str,
        subnet: ec2.ISubnet,
        security_group: ec2.ISecurityGroup,
        profile: iam.CfnInstanceProfile,
        code: NodeCode,
        run: str,
        init_rate: int | None,
    ) -> ec2.CfnLaunchTemplate:
        """The head again, for the run controller, when EC2 ended the head's instance: a whole
        launch, so its role may launch it only from this template (ec2:IsLaunchTemplateResource),
        in the fleet's subnet and security group, with the head's tags, node.json and role. Its
        node.json signals nothing (the CreationPolicy is the first head's). A template of its
        own: the head's instance keeps its properties, so an update of TrainStack stops and
        starts it, where a new version of the template it names would replace it."""
        stack = Stack.of(self)
        document = common_document(
            role="head",
            region=stack.region,
            bucket_name=self.document["bucket"],
            log_group_name=self.log_group_name,
            signal_stack=None,
            signal_resource=None,
        ) | {k: v for k, v in self.document.items() if k not in _COMMON_KEYS}
        tags = [
            CfnTag(key="Project", value=PROJECT),
            CfnTag(key=f"{PROJECT}:run", value=run),
            CfnTag(key=FLEET_TAG, value=stack.stack_id),
        ]
        node = [*tags, CfnTag(key=NODE_TAG, value=HEAD_NODE)]
        return ec2.CfnLaunchTemplate(
            self,
            "Replacement",
            launch_template_data=ec2.CfnLaunchTemplate.LaunchTemplateDataProperty(
                image_id=image_id,
                instance_type=HEAD_TYPE.name,
                iam_instance_profile=ec2.CfnLaunchTemplate.IamInstanceProfileProperty(
                    arn=profile.attr_arn
                ),
                network_interfaces=[
                    ec2.CfnLaunchTemplate.NetworkInterfaceProperty(
                        device_index=0,
                        subnet_id=subnet.subnet_id,
                        groups=[security_group.security_group_id],
                        delete_on_termination=True,
                    )
                ],
                block_device_mappings=[_root_volume(init_rate)],
                metadata_options=ec2.CfnLaunchTemplate.MetadataOptionsProperty(
                    http_endpoint="enabled", http_tokens="required"
                ),
                monitoring=ec2.CfnLaunchTemplate.MonitoringProperty(enabled=True),
                ebs_optimized=True,
                user_data=code.user_data(
                    node_document=document, script="train_node.sh", signal_resource=None
                ),
                tag_specifications=[
                    ec2.CfnLaunchTemplate.TagSpecificationProperty(
                        resource_type="instance", tags=node
                    ),
                    *(
                        ec2.CfnLaunchTemplate.TagSpecificationProperty(
                            resource_type=kind, tags=tags
                        )
                        for kind in ("volume", "network-interface")
                    ),
                ],
            ),
            tag_specifications=[
                ec2.CfnLaunchTemplate.LaunchTemplateTagSpecificationProperty(
                    resource_type="launch-template", tags=tags
                )
            ],
        )


# The keys common_document makes, which the head's replacement makes again without a signal.
_COMMON_KEYS = ("role", "region", "bucket", "log_group", "project", "signal", "mount_point")


def _root_volume(init_rate: int | None) -> ec2.CfnLaunchTemplate.BlockDeviceMappingProperty:
    """The head's encrypted gp3 root at Ubuntu's device name, its image's blocks downloaded at
    `init_rate` MiB/s from its creation (None: EBS's default, on first read)."""
    return ec2.CfnLaunchTemplate.BlockDeviceMappingProperty(
        device_name="/dev/sda1",
        ebs=ec2.CfnLaunchTemplate.EbsProperty(
            volume_size=HEAD_ROOT_GIB,
            volume_type="gp3",
            encrypted=True,
            delete_on_termination=True,
            volume_initialization_rate=init_rate,
        ),
    )
