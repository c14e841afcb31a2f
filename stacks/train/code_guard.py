"""The code guard: a deploy-time answer that refuses, in one line, a `cdk deploy` that would
change what TrainStack's nodes run while its fleet has a live node (controller/answers.py
`answer_code_guard`).

CloudFormation applies a changed UserData by stopping and starting the instance, and user data
runs only at an instance's first boot, so every node would come back on its old code
(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/user-data.html); the replacement template
would hold the new code, and a relaunch would mix the two. The guard holds node 0's ImageId,
InstanceType, UserData (its code URLs and node.json) and launch template version, the same
values the node's own properties take, and every node and the replacement template depend on it.
A resource is updated after the resources it depends on: "Resource B is updated before resource
A" (https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/aws-attribute-dependson.html),
so the guard's refusal fails the update, and CloudFormation rolls it back, before any node or
template is touched.
"""

from aws_cdk import CustomResource, Fn
from aws_cdk import aws_ec2 as ec2
from constructs import Construct

from contract.names import CODE_GUARD_TYPE
from stacks.teardown.answered import answered
from stacks.teardown.guards import FleetGuards
from stacks.train.fleet import GpuFleet


def code_guard(
    scope: Construct, *, guards: FleetGuards, run: str, bucket: str, fleet: GpuFleet
) -> CustomResource:
    node: ec2.CfnInstance = fleet.instances[0]
    guard = answered(
        scope,
        "CodeGuard",
        guards=guards,
        resource_type=CODE_GUARD_TYPE,
        properties={
            "Run": run,
            # Where the run's attempts.json says whether a relaunch is under way.
            "Bucket": bucket,
            # What the refusal names: the code assets' keys are their content hashes.
            "Code": Fn.join(",", [a.s3_object_key for a in fleet.code.assets.values()]),
            "ImageId": node.image_id,
            "InstanceType": node.instance_type,
            "UserData": node.user_data,
            "LaunchTemplateVersion": node.launch_template.version,
        },
    )
    for resource in (*fleet.instances, fleet.replacement_template):
        resource.add_resource_dependency(guard.node.default_child)
    return guard
