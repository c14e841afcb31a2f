"""BakeInfrastructure: where Image Builder builds and tests the training image."""

from collections.abc import Iterable

from aws_cdk import (
    Stack,
)
from aws_cdk import aws_iam as iam
from aws_cdk import aws_imagebuilder as imagebuilder
from aws_cdk import aws_s3_assets as s3_assets
from constructs import Construct

from contract.names import PROJECT, PROJECT_TAG
from stacks.config_values import Placement
from stacks.nag import (
    SSM_MANAGED_POLICY,
    acknowledge_managed_policy,
    acknowledge_ssm_policy,
    acknowledge_wildcard_resources,
)
from stacks.network import SingleZoneNetwork, web_egress_security_group


class BakeInfrastructure(Construct):
    """What the build and test instances run with: a subnet that reaches the internet (apt,
    NVIDIA, PyPI, GitHub, AWS), a group with no ingress, a role and one infrastructure
    configuration per instance type."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        placement: Placement,
        assets: Iterable[s3_assets.Asset],
    ) -> None:
        super().__init__(scope, construct_id)
        network = SingleZoneNetwork(self, "Network", placement=placement, private=False)
        self.subnet = network.subnet
        self.security_group = web_egress_security_group(
            self,
            "Security",
            vpc=network.vpc,
            description="horovod-fleet image bake: no ingress; HTTPS and apt mirrors out",
        )
        self.role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            description="horovod-fleet image bake: Image Builder's build and test instances",
            managed_policies=[
                iam.ManagedPolicy.from_aws_managed_policy_name("EC2InstanceProfileForImageBuilder"),
                iam.ManagedPolicy.from_aws_managed_policy_name(SSM_MANAGED_POLICY),
            ],
        )
        acknowledge_ssm_policy(self.role)
        acknowledge_managed_policy(
            self.role,
            "EC2InstanceProfileForImageBuilder",
            "What Image Builder requires of its build instances (components, logs under "
            "/aws/imagebuilder/); AWS keeps it in step with the service.",
        )
        image_arn = Stack.of(self).format_arn(
            service="ec2", account="", resource="image", resource_name="*"
        )
        self.policy = iam.Policy(
            self,
            "Policy",
            roles=[self.role],
            statements=[
                iam.PolicyStatement(
                    actions=["s3:GetObject"],
                    resources=[a.bucket.arn_for_objects(a.s3_object_key) for a in assets],
                ),
                # The GPU proof's test instance tags the AMI it booted with what it measured.
                iam.PolicyStatement(
                    actions=["ec2:CreateTags"],
                    resources=[image_arn],
                    conditions={"StringEquals": {f"aws:ResourceTag/{PROJECT_TAG}": PROJECT}},
                ),
            ],
        )
        acknowledge_wildcard_resources(
            self.policy,
            [image_arn],
            "The AMI's id exists only once Image Builder has made it; the condition limits the "
            "tags to this project's AMIs.",
        )
        self.profile = iam.CfnInstanceProfile(self, "Profile", roles=[self.role.role_name])

    def configuration(self, construct_id: str, name: str, instance_type: str) -> str:
        """An infrastructure configuration for one instance type; returns its ARN."""
        configuration = imagebuilder.CfnInfrastructureConfiguration(
            self,
            construct_id,
            name=name,
            description=f"horovod-fleet image bake on {instance_type}",
            instance_profile_name=self.profile.ref,
            instance_types=[instance_type],
            subnet_id=self.subnet.subnet_id,
            security_group_ids=[self.security_group.security_group_id],
            terminate_instance_on_failure=True,
            instance_metadata_options=imagebuilder.CfnInfrastructureConfiguration.InstanceMetadataOptionsProperty(
                http_tokens="required", http_put_response_hop_limit=1
            ),
            resource_tags={PROJECT_TAG: PROJECT},
        )
        configuration.add_resource_dependency(self.policy.node.default_child)
        configuration.node.add_dependency(self.subnet.internet_connectivity_established)
        return configuration.attr_arn
