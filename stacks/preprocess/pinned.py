"""Pinned: an AMI id and code URLs as they were on the stack's first deploy."""

from aws_cdk import Stack
from aws_cdk import aws_iam as iam
from constructs import Construct

from contract.names import PINNED_TYPE
from stacks.teardown.answered import answered
from stacks.teardown.guards import FleetGuards


class Pinned(Construct):
    """The AMI id `image_parameter` names and the code URLs, as on the stack's first deploy.

    A deploy-time answer (controller/answers.py) gives the values and every later
    deploy gets the same values, so the instance's properties never change under it: a new Ubuntu
    image or a code change reaches the node only when the stack is deployed anew (`cdk destroy
    PreprocessStack`, then deploy).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        guards: FleetGuards,
        image_parameter: str,
        code: dict[str, str],
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        read = iam.Policy(
            self,
            "ImageParameterRead",
            roles=[guards.answers_role],
            statements=[
                iam.PolicyStatement(
                    actions=["ssm:GetParameter"],
                    # Public parameters have no account in their ARN.
                    resources=[
                        stack.format_arn(
                            service="ssm",
                            account="",
                            resource="parameter",
                            resource_name=image_parameter[1:],
                        )
                    ],
                )
            ],
        )
        pin = answered(
            self,
            "Values",
            guards=guards,
            resource_type=PINNED_TYPE,
            properties={"ImageParameter": image_parameter, "Code": code},
        )
        pin.node.add_dependency(read)
        self.image_id = pin.get_att_string("ImageId")
        self.code_urls = {name: pin.get_att_string(name) for name in code}
