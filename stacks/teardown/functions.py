"""The Lambda functions of TeardownStack, all made alike: Python, their own role and log group,
code from a directory asset whose modules import each other by file name, with contract/ beside
them (stacks/staging.py)."""

from pathlib import Path

from aws_cdk import Duration, RemovalPolicy, aws_lambda
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from stacks.nag import checkov_reason
from stacks.staging import CONTRACT, staged

HERE = Path(__file__).parent
CONTROLLER_CODE = HERE / "controller"  # the run controller's tick, its steps, the cleanup
ANSWERS_CODE = HERE / "answers"  # the deploy-time answers


def lambda_code(scope: Construct, code: Path) -> aws_lambda.Code:
    """`code`'s modules with contract/ beside them, as one asset."""
    return aws_lambda.Code.from_asset(
        str(staged(scope, f"lambda-{code.name}", {".": code, "contract": CONTRACT})),
        exclude=["__pycache__", "*.pyc"],
    )


def function_role(scope: Construct, construct_id: str, description: str) -> iam.Role:
    return iam.Role(
        scope,
        construct_id,
        assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
        description=description,
    )


def python_function(
    scope: Construct,
    construct_id: str,
    *,
    code: Path,
    handler: str,
    role: iam.Role,
    description: str,
    environment: dict[str, str] | None = None,
    timeout_minutes: int = 1,
    dead_letters: sqs.IQueue | None = None,
    reserved_concurrency: int | None = None,
) -> aws_lambda.Function:
    """A function whose role may write only to its own log group; `dead_letters` for one that
    is invoked asynchronously (EventBridge, Scheduler, an alarm): Lambda retries it twice, and
    an event still failing lands there, where an alarm sees it.
    https://docs.aws.amazon.com/lambda/latest/dg/invocation-async-error-handling.html
    `reserved_concurrency`: at most that many invocations at once (the run controller's tick)."""
    log_group = logs.LogGroup(
        scope,
        f"{construct_id}Logs",
        retention=logs.RetentionDays.THREE_MONTHS,
        removal_policy=RemovalPolicy.DESTROY,
    )
    asynchronous = (
        {"retry_attempts": 2, "max_event_age": Duration.hours(6), "dead_letter_queue": dead_letters}
        if dead_letters is not None
        else {}
    )
    function = aws_lambda.Function(
        scope,
        construct_id,
        runtime=aws_lambda.Runtime.PYTHON_3_14,
        handler=handler,
        code=lambda_code(scope, code),
        role=role,
        log_group=log_group,
        timeout=Duration.minutes(timeout_minutes),
        memory_size=256,
        description=description,
        environment=environment or {},
        reserved_concurrent_executions=reserved_concurrency,
        **asynchronous,
    )
    role.add_to_principal_policy(
        iam.PolicyStatement(
            actions=["logs:CreateLogStream", "logs:PutLogEvents"],
            resources=[log_group.log_group_arn],
        )
    )
    # Function adds a DependsOn on its role that the role's GetAtt already implies (cfn-lint
    # W3005 on every synth); dropping it keeps the templates warning-free.
    function.node.default_child.add_deletion_override("DependsOn")
    checkov_function_reasons(function.node.default_child, reserved=reserved_concurrency)
    return function


def checkov_function_reasons(function: aws_lambda.CfnFunction, reserved: int | None = None) -> None:
    """Why checkov's Lambda checks do not apply; CKV_AWS_115 only to a function without
    `reserved` concurrency."""
    reasons = (
        (
            "CKV_AWS_115",
            "No reserved concurrency: only the run controller's tick reserves some (one, so that "
            "one tick runs at a time); each reservation takes from the account's unreserved "
            "pool, of which Lambda keeps 100 "
            "(https://docs.aws.amazon.com/lambda/latest/api/API_PutFunctionConcurrency.html), and "
            "these functions are called a few times per run. A throttled invocation is retried by "
            "its caller (Step Functions, CloudFormation, or Lambda's own queue).",
        ),
        (
            "CKV_AWS_116",
            "Invoked synchronously (by Step Functions, whose Retry and Catch handle a failure, "
            "or by CloudFormation's Provider framework), with a dead-letter queue of its own, or "
            "the run controller's tick, which its schedule runs again every minute: a failed "
            "invocation is repeated by the next one, and its error alarm says so.",
        ),
        (
            "CKV_AWS_117",
            "It calls only AWS APIs and reaches no private resource; in a VPC it would need a "
            "NAT gateway or interface endpoints, more ways to fail.",
        ),
        (
            "CKV_AWS_173",
            "The environment holds resource names, ARNs and minutes, no secrets; Lambda "
            "encrypts it at rest with an AWS managed key.",
        ),
    )
    for check_id, reason in reasons:
        if check_id != "CKV_AWS_115" or reserved is None:
            checkov_reason(function, check_id, reason)
