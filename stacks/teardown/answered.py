"""A custom resource TeardownStack's functions answer through CDK's Provider framework: the
deploy-time answers (deploy_answers.py), and TrainStack's Replacements resource, which the run
controller's cleanup answers (run_controller.py, controller/cleanup.py)."""

from typing import Any

from aws_cdk import CustomResource, Duration
from constructs import Construct

from contract.names import REPLACEMENTS_TYPE
from stacks.teardown.guards import FleetGuards

# A function that cannot answer fails the deploy in minutes, not in CloudFormation's hour.
ANSWER_TIMEOUT = Duration.minutes(5)


def answered(
    scope: Construct,
    construct_id: str,
    *,
    guards: FleetGuards,
    resource_type: str,
    properties: dict[str, Any],
) -> CustomResource:
    token = guards.cleanup_token if resource_type == REPLACEMENTS_TYPE else guards.answers_token
    return CustomResource(
        scope,
        construct_id,
        service_token=token,
        resource_type=resource_type,
        properties=properties,
        service_timeout=ANSWER_TIMEOUT,
    )
