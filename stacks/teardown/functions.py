"""The Lambda functions of TeardownStack, all made alike: Python, their own role and log group,
code from one of two directory assets of the controller package (controller/), each with
contract/ beside it (stacks/staging.py)."""

from dataclasses import dataclass

from aws_cdk import Duration, RemovalPolicy, aws_lambda
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from stacks.nag import checkov_reason
from stacks.staging import CONTRACT, ROOT, staged

PACKAGE = ROOT / "controller"
# Lambda names a handler `<module>.<function>` of the asset's top level. So each asset holds, for
# each module of the package whose functions are handlers, a top-level module of that name that
# imports them from the package: handler `tick.handler` runs controller.tick.handler, and the
# handlers read as they did when the package's modules were the asset's top level.
ENTRY = (
    "# Lambda's handler module `{module}`: controller.{module}'s functions.\n"
    "from controller.{module} import *  # noqa: F403\n"
)


@dataclass(frozen=True)
class LambdaCode:
    """One asset of the functions: `modules` of the package, contract/, and an entry module for
    each of `entries`."""

    name: str
    modules: tuple[str, ...]
    entries: tuple[str, ...]

    def asset(self, scope: Construct) -> aws_lambda.Code:
        parts = {
            "contract": CONTRACT,
            **{f"controller/{m}.py": PACKAGE / f"{m}.py" for m in ("__init__", *self.modules)},
        }
        entries = {f"{m}.py": ENTRY.format(module=m) for m in self.entries}
        return aws_lambda.Code.from_asset(
            str(staged(scope, f"lambda-{self.name}", parts, entries)),
            exclude=["__pycache__", "*.pyc"],
        )


# The deploy-time answers: a read-only function's code, in an asset of its own.
ANSWER_MODULES = ("answers", "run_answers", "answer_kit")
ANSWERS_CODE = LambdaCode("answers", ANSWER_MODULES, ("answers",))
# The run controller's tick, its steps and cleanup, and the preprocessing stop: the rest.
CONTROLLER_CODE = LambdaCode(
    "controller",
    tuple(
        sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", *ANSWER_MODULES))
    ),
    ("tick", "steps", "steps_fleet", "steps_teardown", "cleanup", "preprocess"),
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
    code: LambdaCode,
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
        code=code.asset(scope),
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
