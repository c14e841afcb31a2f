"""What every deploy-time answer shares (controller/answers.py, run_answers.py): the one-line
refusal that fails a deploy, the clients, the time, the answer's log line, and whether
CloudFormation is rolling the stack back. Tests patch them here."""

import datetime
import functools
import json

import boto3


class Refused(Exception):
    """The deploy cannot go on: the message says why and what to do, in one line."""


@functools.cache
def client(name: str):
    """One client per service for the function's life, as Lambda reuses the process."""
    return boto3.client(name)


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def log(answer: str, **fields) -> None:
    """One JSON line per answer, so CloudWatch Logs Insights can filter on `answer`."""
    print(json.dumps({"answer": answer, **fields}, sort_keys=True, default=str))


def rolling_back(stack_id: str) -> bool:
    """Whether CloudFormation is rolling the stack back: "If the update fails, you will get a
    subsequent `Update` event to roll back to the previous state (with `ResourceProperties` and
    `OldResourceProperties` reversed)" (aws-cdk-lib 2.275 custom-resources README,
    https://github.com/aws/aws-cdk/blob/main/packages/aws-cdk-lib/custom-resources/README.md),
    and that one must pass, or the stack is left in UPDATE_ROLLBACK_FAILED."""
    [stack] = client("cloudformation").describe_stacks(StackName=stack_id)["Stacks"]
    return stack["StackStatus"].startswith(("UPDATE_ROLLBACK", "ROLLBACK"))
