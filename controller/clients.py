"""What every function of the run controller shares: AWS clients, the clock, the log line, the
settings TeardownStack puts in the environment, and the error names its Retry policies match.

Step Functions names a Lambda error after the exception's class (`errorType`), and the state
machine (stacks/teardown/workflow.py) retries by those names: so a throttled call is raised as
`AwsThrottled`, a stop EC2 refuses for a node still pending as `NodePending`, whatever the call.
https://docs.aws.amazon.com/step-functions/latest/dg/concepts-error-handling.html
Only boto3, the standard library and contract/: this directory is the functions' Lambda asset.
"""

import datetime
import functools
import json
import os

import boto3
from botocore.exceptions import ClientError

# Answers that mean "the same call again soon"; botocore has retried them already.
THROTTLED_CODES = (
    "RequestLimitExceeded",
    "Throttling",
    "ThrottlingException",
    "TooManyRequestsException",
    "SlowDown",
    "InternalError",
    "InternalFailure",
    "ServiceUnavailable",
    "Unavailable",
)


class AwsThrottled(Exception):
    """An AWS API answered with throttling or a passing fault: the step is retried."""


class NodePending(Exception):
    """EC2 refused to stop a node that has not reached `running` yet (IncorrectInstanceState,
    "cannot be stopped as it has never reached the 'running' state"): the step is retried until
    the node can be stopped, never skipped, or the node would bill through the wait."""


@functools.cache
def client(name: str):
    """One client per service for the function's life, as Lambda reuses the process."""
    return boto3.client(name)


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def setting(name: str) -> str:
    return os.environ[name]


def log(decision: str, **fields) -> None:
    """One JSON line per decision, so CloudWatch Logs Insights can filter on `decision`."""
    print(json.dumps({"decision": decision, **fields}, sort_keys=True, default=str))


def error_code(error: Exception) -> str:
    if isinstance(error, ClientError):
        return error.response["Error"].get("Code", "")
    return type(error).__name__


def error_message(error: ClientError) -> str:
    return error.response["Error"].get("Message", "")[:300]


def throttled(error: ClientError) -> AwsThrottled | None:
    """The retryable form of `error`, when it is one."""
    code = error_code(error)
    return AwsThrottled(f"{code}: {error_message(error)}") if code in THROTTLED_CODES else None


def step(function):
    """A state's handler: a throttled AWS call is raised as AwsThrottled, which the state's
    Retry policy matches, and anything else as itself, which its Catch ends in."""

    @functools.wraps(function)
    def handler(event, _context=None):
        try:
            return function(event)
        except ClientError as error:
            if (retry := throttled(error)) is not None:
                raise retry from error
            raise

    return handler
