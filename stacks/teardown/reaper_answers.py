"""A custom resource the reaper Lambda answers (reaper/handler.py dispatches on its type)."""

from typing import Any

from aws_cdk import CustomResource, Duration, aws_lambda
from constructs import Construct

# A reaper that cannot answer fails the deploy in minutes, not in CloudFormation's hour.
ANSWER_TIMEOUT = Duration.minutes(5)


def reaper_answers(
    scope: Construct,
    construct_id: str,
    *,
    reaper: aws_lambda.IFunction,
    resource_type: str,
    properties: dict[str, Any],
) -> CustomResource:
    return CustomResource(
        scope,
        construct_id,
        service_token=reaper.function_arn,
        resource_type=resource_type,
        properties=properties,
        service_timeout=ANSWER_TIMEOUT,
    )
