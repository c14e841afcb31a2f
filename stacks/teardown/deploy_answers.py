"""DeployAnswers: the read-mostly function that answers the deploy-time custom resources
(controller/answers.py), behind CDK's custom-resource Provider framework, in TeardownStack."""

from aws_cdk import (
    Acknowledgment,
    CrossStackReferences,
    ReferenceStrength,
    Stack,
    Validations,
    aws_lambda,
    custom_resources,
)
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct

from contract import runs
from contract.names import TRAIN_STACK
from stacks.nag import acknowledge_wildcard_resources, allow_implied_role_dependency, nag_text
from stacks.teardown.functions import (
    ANSWERS_CODE,
    checkov_function_reasons,
    function_role,
    python_function,
)


class DeployAnswers(Construct):
    """`service_token` for the custom resources; `role` may read, and write nothing but each
    run's record, runs/*/config.json: it holds no action that starts, stops or deletes anything
    (tests/stacks/test_deploy_answers.py)."""

    def __init__(
        self, scope: Construct, construct_id: str, *, bucket: s3.IBucket, manifest_key: str
    ) -> None:
        super().__init__(scope, construct_id)
        self.role = function_role(
            self,
            "Role",
            "horovod-fleet deploy-time answers: reads the hard cap's start, the pinned image, "
            "the dataset manifest, the zones that offer the fleet's type, whether a run "
            "relaunches and ImageStack's image",
        )
        function = python_function(
            self,
            "Function",
            code=ANSWERS_CODE,
            handler="answers.on_event",
            role=self.role,
            description="Answers horovod-fleet's deploy-time custom resources (read only)",
        )
        train_stack = Stack.of(self).format_arn(
            service="cloudformation", resource="stack", resource_name=f"{TRAIN_STACK}/*"
        )
        # The image check reads ImageStack's status and outputs (train/image_check.py).
        image_stack = Stack.of(self).format_arn(
            service="cloudformation", resource="stack", resource_name="ImageStack/*"
        )
        policy = iam.Policy(
            self,
            "Reads",
            roles=[self.role],
            statements=[
                # The manifest (the dataset check), and each run's attempts.json (the code
                # guard: a relaunch under way is a live run).
                iam.PolicyStatement(
                    actions=["s3:GetObject"],
                    resources=[
                        bucket.arn_for_objects(manifest_key),
                        bucket.arn_for_objects(runs.key("*", runs.ATTEMPTS)),
                    ],
                ),
                # Each run's record: read by the run check, written by the run record once the
                # fleet is up (stacks/train/run_record.py), and nothing else of the bucket.
                iam.PolicyStatement(
                    actions=["s3:GetObject", "s3:PutObject"],
                    resources=[bucket.arn_for_objects("runs/*/config.json")],
                ),
                # So that S3 answers a missing key 404, not 403 (GetObject's permissions).
                iam.PolicyStatement(actions=["s3:ListBucket"], resources=[bucket.bucket_arn]),
                # Describe calls support no resource-level permissions; they are read-only.
                iam.PolicyStatement(
                    actions=[
                        "ec2:DescribeInstanceTypeOfferings",
                        # A zone ID (-c az=use1-az4) is answered as this account's zone name.
                        "ec2:DescribeAvailabilityZones",
                        # The code guard looks for a live node of the fleet.
                        "ec2:DescribeInstances",
                    ],
                    resources=["*"],
                ),
                # ... and whether CloudFormation is rolling TrainStack back, and ImageStack's
                # image (the image check).
                iam.PolicyStatement(
                    actions=["cloudformation:DescribeStacks"],
                    resources=[train_stack, image_stack],
                ),
            ],
        )
        acknowledge_wildcard_resources(
            policy,
            [
                "*",
                train_stack,
                image_stack,
                bucket.arn_for_objects(runs.key("*", runs.ATTEMPTS)),
                bucket.arn_for_objects(runs.key("*", runs.CONFIG)),
            ],
            "The read-only EC2 Describe calls of the zone answer and the code guard, which "
            "support no resource-level permissions, DescribeStacks on TrainStack and ImageStack, "
            "whose stack-id suffixes are only known once they are deployed, each run's "
            "attempts.json, read only, and each run's config.json, the record of its deploy.",
        )
        provider = custom_resources.Provider(self, "Provider", on_event_handler=function)
        framework = provider.node.find_child("framework-onEvent")
        acknowledge_provider_framework(provider, function)
        checkov_function_reasons(framework.node.default_child)
        allow_implied_role_dependency(framework.node.default_child)
        # Strong whatever the app's default: the guarded stacks import them, so CloudFormation
        # refuses to delete TeardownStack while a stack still needs its answers.
        for referenced in (framework, self.role):
            CrossStackReferences.of(referenced).produce(ReferenceStrength.STRONG)
        self.service_token = provider.service_token


def acknowledge_provider_framework(
    provider: custom_resources.Provider, handler: aws_lambda.IFunction
) -> None:
    """cdk-nag's findings on the Provider framework's own function, which CDK makes."""
    Validations.of(provider).acknowledge(
        Acknowledgment(
            id="AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/"
            "AWSLambdaBasicExecutionRole]",
            reason="The Provider framework's function writes its own log with AWS's "
            "CloudWatch Logs policy for Lambda, and does nothing else.",
        ),
        Acknowledgment(
            id=f"AwsSolutions-IAM5[Resource::{nag_text(provider, handler.function_arn)}:*]",
            reason="The framework invokes the one answering function, any of its versions.",
        ),
    )
