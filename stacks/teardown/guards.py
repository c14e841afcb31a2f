"""FleetGuards: what TeardownStack hands the stacks it guards (TrainStack and PreprocessStack
take it as their `reaper`), so each construct there finds the function or role it needs."""

from dataclasses import dataclass

from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda


@dataclass(frozen=True)
class FleetGuards:
    # The Provider framework's function that answers the deploy-time custom resources, and the
    # role of the answers (Pinned lets it read its image parameter).
    answers_token: str
    answers_role: iam.IRole
    # The reaper: the run-time triggers and the Replacements resource invoke it.
    reaper: aws_lambda.Function
