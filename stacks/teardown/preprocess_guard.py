"""PreprocessGuard: registers the preprocessing instance for TeardownStack's preprocessing stop,
inside PreprocessStack."""

from aws_cdk import Stack, Tags
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from contract.names import PREPROCESS_PARAMETER, PROJECT, PROJECT_TAG
from stacks.nag import acknowledge_wildcard_resources
from stacks.teardown.guards import FleetGuards


class PreprocessGuard(Construct):
    """Registers the preprocessing instance and volume, and lets the preprocessing stop
    (controller/preprocess.py) stop and snapshot exactly them."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        guards: FleetGuards,
        instance: ec2.CfnInstance,
        volume: ec2.CfnVolume,
        snapshot_volume: bool,
    ) -> None:
        super().__init__(scope, construct_id)
        Tags.of(self).add(PROJECT_TAG, PROJECT)
        stack = Stack.of(self)
        ssm.StringParameter(
            self,
            "Registration",
            parameter_name=PREPROCESS_PARAMETER,
            description="The horovod-fleet preprocessing instance stopped on a new manifest",
            string_value=stack.to_json_string(
                {
                    "instance_id": instance.ref,
                    "volume_id": volume.ref,
                    "snapshot_volume": snapshot_volume,
                }
            ),
        )
        snapshots = stack.format_arn(
            service="ec2", account="", resource="snapshot", resource_name="*"
        )
        statements = [
            iam.PolicyStatement(
                actions=["ec2:StopInstances"],
                resources=[
                    stack.format_arn(service="ec2", resource="instance", resource_name=instance.ref)
                ],
            )
        ]
        if snapshot_volume:
            statements += [
                iam.PolicyStatement(
                    actions=["ec2:CreateSnapshot"],
                    resources=[
                        stack.format_arn(
                            service="ec2", resource="volume", resource_name=volume.ref
                        ),
                        snapshots,
                    ],
                ),
                iam.PolicyStatement(
                    actions=["ec2:CreateTags"],
                    resources=[snapshots],
                    conditions={"StringEquals": {"ec2:CreateAction": "CreateSnapshot"}},
                ),
            ]
        policy = iam.Policy(
            self, "StopPolicy", statements=statements, roles=[guards.preprocess_role]
        )
        if snapshot_volume:
            acknowledge_wildcard_resources(
                policy,
                [snapshots],
                "A snapshot's id is unknown until CreateSnapshot makes it; the volume and the "
                "instance are named exactly, and tagging is limited to CreateSnapshot.",
            )
