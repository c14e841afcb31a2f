"""The image, then the fleet: TrainStack boots the AMI ImageStack baked, which a deploy-time answer
reads from ImageStack when TrainStack deploys (Custom::HorovodFleetImage,
controller/run_answers.py), instead of a stack dependency that made `cdk deploy
TrainStack` bake first for 3 hours, or a reference that failed in CloudFormation's words while
ImageStack was still baking. The answer refuses the deploy in one line, before any instance
launches, while ImageStack bakes, before any image is baked, or when ImageStack holds another
checkout's image; `-c ami=` needs none of it."""

from aws_cdk import CustomResource, Stack
from constructs import Construct

from contract.names import IMAGE_TYPE
from stacks.teardown.answered import answered
from stacks.teardown.guards import FleetGuards


def baked_image(scope: Construct, *, guards: FleetGuards, version: str) -> CustomResource:
    """The answer whose `ImageId` is the AMI ImageStack baked as `version` (its name/version)."""
    return answered(
        scope,
        "BakedImage",
        guards=guards,
        resource_type=IMAGE_TYPE,
        properties={"Version": version, "Region": Stack.of(scope).region},
    )
