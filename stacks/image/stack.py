"""ImageStack: the proven training AMI, its SSM parameter and outputs."""

from typing import Any

from aws_cdk import (
    CfnOutput,
    Fn,
    Stack,
    Tags,
)
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from contract.names import (
    AMI_OUTPUT_KEY,
    IMAGE_PARAMETER,
    IMAGE_VERSION_OUTPUT_KEY,
    PROJECT,
    PROJECT_TAG,
)
from stacks.config_values import Placement
from stacks.image.recipe import BASE_NAME, PROVEN_NAME
from stacks.image.training_image import TrainingImage
from stacks.instance_types import GpuType, JitProofType


class ImageStack(Stack):
    """The training AMI, its SSM parameter, and the lifecycle that keeps the newest two."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        test_type: GpuType,
        revision: int,
        placement: Placement,
        jit_type: JitProofType | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        Tags.of(self).add(PROJECT_TAG, PROJECT)
        image = TrainingImage(
            self,
            "TrainingImage",
            test_type=test_type,
            revision=revision,
            placement=placement,
            jit_type=jit_type,
        )
        self.image_id = image.image_id
        # What TrainStack's image check compares with what this checkout bakes.
        self.version = image.version
        ssm.StringParameter(
            self,
            "AmiParameter",
            parameter_name=IMAGE_PARAMETER,
            string_value=image.image_id,
            data_type=ssm.ParameterDataType.AWS_EC2_IMAGE,
            description="horovod-fleet: the newest proven training AMI",
        )
        CfnOutput(self, AMI_OUTPUT_KEY, value=image.image_id, description="the proven training AMI")
        CfnOutput(self, "AmiParameterName", value=IMAGE_PARAMETER)
        CfnOutput(
            self,
            IMAGE_VERSION_OUTPUT_KEY,
            value=image.version,
            description="the baked image's name and version, from the content of its files",
        )
        CfnOutput(
            self,
            "BakeLogs",
            value=Fn.join(
                "", ["/aws/imagebuilder/", BASE_NAME, " and /aws/imagebuilder/", PROVEN_NAME]
            ),
        )
