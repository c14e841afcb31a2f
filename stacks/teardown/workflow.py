"""RunWorkflow: the run controller's long actions as a state machine (AWS Step Functions,
Standard), a few declared states over small functions (controller/steps*.py), in JSONPath. The
tick (controller/tick.py) starts each action under a name of its own, watches it, and resumes it
under a new name when it fails (controller/executions.py).

    Identify -> Route:  relaunch: StopFleet -> CheckSettled -> Launch
                        teardown: ResultsReady -> DeleteStack -> FollowDelete
                        delete:   DeleteStack -> FollowDelete
                        follow:   FollowDelete
    CheckSettled?  launch: Launch;  wait: WaitToSettle -> CheckSettled
    Launch?        launched: Relaunched;  settle: CheckSettled
                   no_capacity: StopForCapacity -> WaitForCapacity -> CheckSettled
                   gave_up: StopAfterGivingUp -> GaveUp (the tick records the attempt)
    ResultsReady?  delete: DeleteStack;  wait: WaitForResults -> ResultsReady
    DeleteStack?   follow: FollowDelete;  wait: WaitToDelete -> DeleteStack
    FollowDelete?  gone: Deleted;  wait: WaitForDelete -> FollowDelete
                   unconfirmed: DeleteUnconfirmed (fails)
    any state's failure, after its retries: StopBilling -> ControllerFailed (fails)

Every wait is a Wait state whose seconds the state before it chose (its `wait_s`), so the
schedule lives in the step code (controller/zones.py, steps*.py) and a test reads it there.
Standard workflows run each state once unless a Retry says otherwise
(https://docs.aws.amazon.com/step-functions/latest/dg/concepts-standard-vs-express.html).

Every Task has a timeout (its function's, and a minute more), and retries what Lambda itself
answers, a throttled invocation (`Lambda.TooManyRequestsException`, "When Lambda hits the
maximum number of invocations") and its service errors
(https://docs.aws.amazon.com/step-functions/latest/dg/bp-lambda-serviceexception.html), for
LAMBDA_RETRY_S at least (StopBilling, which stops the bill after everything else failed, for
STOP_BILLING_RETRY_S): a new account's Lambda concurrency can be 10.
"""

from collections.abc import Callable

from aws_cdk import Acknowledgment, Duration, Validations, aws_lambda
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from stacks.nag import allow_implied_role_dependency, nag_text

# A state over one step function, caught by StopBilling (RunWorkflow.__init__'s `task`).
Task = Callable[..., tasks.LambdaInvoke]
# An execution lasts at most this long; the results wait and the capacity wait end far sooner,
# and the hard cap ends any execution of its run.
EXECUTION_TIMEOUT = Duration.days(14)
STEPS = (
    "stop_fleet",
    "settled",
    "launch",
    "results",
    "delete_stack",
    "follow_delete",
    "stop_billing",
)
# What Step Functions answers when Lambda does not run the function: throttled, or a passing
# fault of the service (the page above).
LAMBDA_ERRORS = [
    "Lambda.TooManyRequestsException",
    "Lambda.ServiceException",
    "Lambda.AWSLambdaException",
    "Lambda.SdkClientException",
    "Lambda.ClientExecutionTimeoutException",
]
# Waits of 2, 4, 8, 16, 32 s, then a minute each (MaxDelaySeconds), without jitter, so that the
# whole wait is at least what it says: 362 s over 10 retries, 962 s over 20.
LAMBDA_RETRY = {"interval_s": 2, "backoff": 2, "max_delay_s": 60}
LAMBDA_RETRIES, STOP_BILLING_RETRIES = 10, 20
LAMBDA_RETRY_S, STOP_BILLING_RETRY_S = 5 * 60, 15 * 60


def retry_span(retries: int, interval_s: float, backoff: float, max_delay_s: float) -> float:
    """How long a Retry keeps retrying: the sum of its waits, each capped at MaxDelaySeconds."""
    return sum(min(interval_s * backoff**n, max_delay_s) for n in range(retries))


def choice_on(scope: Construct, state_id: str, path: str, routes: dict, otherwise: sfn.IChainable):
    choice = sfn.Choice(scope, state_id)
    for value, target in routes.items():
        choice.when(sfn.Condition.string_equals(path, value), target)
    return choice.otherwise(otherwise)


def wait_on(scope: Construct, state_id: str, path: str) -> sfn.Wait:
    return sfn.Wait(scope, state_id, time=sfn.WaitTime.seconds_path(path))


class RunWorkflow(Construct):
    """The state machine, named `name` (so every function can know its ARN without a reference
    that would make a cycle), over `steps` (controller/steps*.py by STEPS name), each Task timed
    out after its function's `timeouts` (minutes) and one more."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        name: str,
        steps: dict[str, aws_lambda.IFunction],
        timeouts: dict[str, int],
    ) -> None:
        super().__init__(scope, construct_id)
        self.timeouts = timeouts
        stop_billing = self.failure_path(steps)

        def task(state_id: str, step: str, result_path: str, **kwargs) -> tasks.LambdaInvoke:
            return self.task(state_id, step, steps, result_path, catch=stop_billing, **kwargs)

        nothing = sfn.Succeed(self, "NothingToDo")
        follow, delete, results = self.teardown_path(task, nothing)
        settled = self.relaunch_path(task, follow, nothing)
        stop = task("StopFleet", "stop_fleet", "$.stop", pending=True).next(settled)
        route = choice_on(
            self,
            "Route",
            "$.action",
            {"relaunch": stop, "teardown": results, "delete": delete, "follow": follow},
            nothing,
        )
        identify = sfn.Pass(
            self,
            "Identify",
            comment="The execution's ARN, which controller.json and attempts.json name",
            parameters={"arn.$": "$$.Execution.Id"},
            result_path="$.execution",
        )
        self.state_machine = sfn.StateMachine(
            self,
            "StateMachine",
            state_machine_name=name,
            comment="horovod-fleet run controller: the long actions the tick starts and watches",
            state_machine_type=sfn.StateMachineType.STANDARD,
            definition_body=sfn.DefinitionBody.from_chainable(identify.next(route)),
            timeout=EXECUTION_TIMEOUT,
        )
        allow_implied_role_dependency(self.state_machine.node.default_child)
        self.acknowledge(steps)

    def failure_path(self, steps: dict[str, aws_lambda.IFunction]) -> sfn.IChainable:
        """StopBilling -> ControllerFailed: where any state goes after its retries."""
        failed = sfn.Fail(
            self,
            "ControllerFailed",
            error="RunControllerFailed",
            cause="a state failed after its retries; StopBilling stopped the run's nodes and "
            "recorded why in attempts.json and controller.json; the tick resumes the action",
        )
        stop_billing = self.task(
            "StopBilling",
            "stop_billing",
            steps,
            "$.failure",
            catch=None,
            retries=STOP_BILLING_RETRIES,
        )
        stop_billing.add_catch(failed, errors=["States.ALL"], result_path="$.failure_error")
        stop_billing.next(failed)

        return stop_billing

    def teardown_path(
        self, task: Task, nothing: sfn.IChainable
    ) -> tuple[tasks.LambdaInvoke, tasks.LambdaInvoke, tasks.LambdaInvoke]:
        """ResultsReady -> DeleteStack -> FollowDelete, with their waits: (follow, delete,
        results)."""
        follow = task("FollowDelete", "follow_delete", "$.follow")
        follow.next(
            choice_on(
                self,
                "FollowDecision",
                "$.follow.status",
                {
                    "gone": sfn.Succeed(self, "Deleted"),
                    "wait": wait_on(self, "WaitForDelete", "$.follow.wait_s").next(follow),
                    "unconfirmed": sfn.Fail(
                        self,
                        "DeleteUnconfirmed",
                        error="DeleteUnconfirmed",
                        cause="TrainStack is still not deleted after the follow's hours; its "
                        "instances were terminated on each DELETE_FAILED",
                    ),
                },
                nothing,
            )
        )
        delete = task("DeleteStack", "delete_stack", "$.delete")
        delete.next(
            choice_on(
                self,
                "DeleteDecision",
                "$.delete.next",
                {
                    "follow": follow,
                    "wait": wait_on(self, "WaitToDelete", "$.delete.wait_s").next(delete),
                },
                nothing,
            )
        )
        results = task("ResultsReady", "results", "$.results")
        results.next(
            choice_on(
                self,
                "ResultsDecision",
                "$.results.next",
                {
                    "delete": delete,
                    "wait": wait_on(self, "WaitForResults", "$.results.wait_s").next(results),
                    "follow": follow,
                },
                nothing,
            )
        )
        return follow, delete, results

    def relaunch_path(
        self, task: Task, follow: sfn.IChainable, nothing: sfn.IChainable
    ) -> tasks.LambdaInvoke:
        """CheckSettled -> Launch, with the capacity wait and the giving up: CheckSettled."""
        settled = task("CheckSettled", "settled", "$.settle")
        launch = task("Launch", "launch", "$.launch")
        settled.next(
            choice_on(
                self,
                "SettledDecision",
                "$.settle.next",
                {
                    "launch": launch,
                    "wait": wait_on(self, "WaitToSettle", "$.settle.wait_s").next(settled),
                    "follow": follow,
                },
                nothing,
            )
        )
        stop_for_capacity = task("StopForCapacity", "stop_fleet", "$.stop", pending=True)
        stop_for_capacity.next(wait_on(self, "WaitForCapacity", "$.launch.wait_s").next(settled))
        gave_up = task("StopAfterGivingUp", "stop_fleet", "$.stop", pending=True).next(
            sfn.Succeed(self, "GaveUp", comment="The tick records the attempt that never started")
        )
        launch.next(
            choice_on(
                self,
                "LaunchDecision",
                "$.launch.outcome",
                {
                    "launched": sfn.Succeed(self, "Relaunched"),
                    "settle": settled,
                    "no_capacity": stop_for_capacity,
                    "gave_up": gave_up,
                    "follow": follow,
                },
                nothing,
            )
        )
        return settled

    def acknowledge(self, steps: dict[str, aws_lambda.IFunction]) -> None:
        """cdk-nag's findings on the state machine and the role CDK makes for it."""
        machine = self.state_machine
        Validations.of(machine).acknowledge(
            *(
                Acknowledgment(
                    id=f"AwsSolutions-IAM5[Resource::{nag_text(machine, f.function_arn)}:*]",
                    reason="The state machine invokes its own step functions, any version.",
                )
                for f in steps.values()
            ),
            Acknowledgment(
                id="AwsSolutions-SF1",
                reason="Every state's input, output and error is in the execution's history, "
                "which the Step Functions console shows for 90 days (controller.json links it); "
                "delivering it to CloudWatch Logs too would need log-delivery actions, "
                "deletes among them, on every resource.",
            ),
            Acknowledgment(
                id="AwsSolutions-SF2",
                reason="X-Ray would trace a few calls per hour of a run; every state's input, "
                "output and error is in the execution's history.",
            ),
        )

    def task(
        self,
        state_id: str,
        step: str,
        steps: dict[str, aws_lambda.IFunction],
        result_path: str,
        *,
        catch: sfn.IChainable | None,
        pending: bool = False,
        retries: int = LAMBDA_RETRIES,
    ) -> tasks.LambdaInvoke:
        """A state over one function: Lambda's throttling and faults retried `retries` times,
        AWS throttling in the function with backoff and jitter, a node still pending
        (`pending`) until it can be stopped, anything else twice; then `catch`."""
        task = tasks.LambdaInvoke(
            self,
            state_id,
            lambda_function=steps[step],
            payload_response_only=True,
            retry_on_service_exceptions=False,
            result_path=result_path,
            task_timeout=sfn.Timeout.duration(Duration.minutes(self.timeouts.get(step, 1) + 1)),
        )
        task.add_retry(
            errors=LAMBDA_ERRORS,
            interval=Duration.seconds(LAMBDA_RETRY["interval_s"]),
            backoff_rate=LAMBDA_RETRY["backoff"],
            max_delay=Duration.seconds(LAMBDA_RETRY["max_delay_s"]),
            max_attempts=retries,
        )
        task.add_retry(
            errors=["AwsThrottled"],
            interval=Duration.seconds(5),
            max_attempts=8,
            backoff_rate=2,
            max_delay=Duration.minutes(2),
            jitter_strategy=sfn.JitterType.FULL,
        )
        if pending:
            # A pending p4d reaches running within minutes; 40 x 15 s is ten of them.
            task.add_retry(
                errors=["NodePending"],
                interval=Duration.seconds(15),
                max_attempts=40,
                backoff_rate=1,
            )
        task.add_retry(
            errors=["States.ALL"], interval=Duration.seconds(10), max_attempts=2, backoff_rate=2
        )
        if catch is not None:
            task.add_catch(catch, errors=["States.ALL"], result_path="$.error")
        return task
