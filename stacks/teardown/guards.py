"""FleetGuards: what TeardownStack hands the stacks it guards (TrainStack and PreprocessStack
take it as their `guards`), so each construct there finds the function, role or token it needs."""

from dataclasses import dataclass

from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda
from aws_cdk import aws_sqs as sqs


@dataclass(frozen=True)
class FleetGuards:
    # The Provider framework's function that answers the deploy-time custom resources, and the
    # role of the answers (Pinned lets it read its image parameter).
    answers_token: str
    answers_role: iam.IRole
    # The run controller's tick, which the hard cap and the idle alarm invoke (they only bring it
    # forward: it runs every minute anyway), and the queue where an invocation of the cap that
    # failed all its retries lands.
    tick: aws_lambda.IFunction
    dead_letters: sqs.IQueue
    # The Provider framework's function that answers TrainStack's Replacements resource.
    cleanup_token: str
    # The preprocessing node's stop: PreprocessGuard lets it stop that node, snapshot its volume.
    preprocess_role: iam.IRole
    # The run controller's role (its tick and steps) and the alarm on its tick's errors: a drill's
    # FIS experiments throttle and refuse that role's EC2 calls, and stop when the alarm fires
    # (stacks/train/drill.py). Only a drill's TrainStack imports them.
    controller_role: iam.IRole
    tick_errors_alarm: cloudwatch.IAlarm
