"""RunWorkflow: the run controller's state machine (AWS Step Functions, Standard), a few declared
states over small functions (controller/steps*.py), in JSONPath.

    Identify -> Record -> Record?  wait:     WaitToRecord -> Record
                                   relaunch: StopFleet -> CheckSettled -> Launch
                                   teardown: ResultsReady -> DeleteStack -> FollowDelete
                                   delete:   DeleteStack;  follow: FollowDelete
    CheckSettled?  launch: Launch;  wait: WaitToSettle -> CheckSettled
    Launch?        launched: Relaunched;  settle: CheckSettled
                   no_capacity: StopForCapacity -> WaitForCapacity -> CheckSettled
                   gave_up: StopAfterGivingUp -> ResultsReady
    ResultsReady?  delete: DeleteStack;  wait: WaitForResults -> ResultsReady
    FollowDelete?  gone: Deleted;  wait: WaitForDelete -> FollowDelete
                   unconfirmed: DeleteUnconfirmed (fails)
    any state's failure, after its retries: StopBilling -> ControllerFailed (fails)

Every wait is a Wait state whose seconds the state before it chose (its `wait_s`), so the
schedule lives in the step code (controller/zones.py, steps*.py) and a test reads it there.
Standard workflows run each state once unless a Retry says otherwise
(https://docs.aws.amazon.com/step-functions/latest/dg/concepts-standard-vs-express.html).
"""

from aws_cdk import Acknowledgment, Duration, Validations, aws_lambda
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from stacks.nag import allow_implied_role_dependency, nag_text

# An execution lasts at most this long; the results wait and the capacity wait end far sooner,
# and the hard cap ends any execution of its run.
EXECUTION_TIMEOUT = Duration.days(14)
STEPS = (
    "record",
    "stop_fleet",
    "settled",
    "launch",
    "results",
    "delete_stack",
    "follow_delete",
    "stop_billing",
)


def choice_on(scope: Construct, state_id: str, path: str, routes: dict, otherwise: sfn.IChainable):
    choice = sfn.Choice(scope, state_id)
    for value, target in routes.items():
        choice.when(sfn.Condition.string_equals(path, value), target)
    return choice.otherwise(otherwise)


def wait_on(scope: Construct, state_id: str, path: str) -> sfn.Wait:
    return sfn.Wait(scope, state_id, time=sfn.WaitTime.seconds_path(path))


class RunWorkflow(Construct):
    """The state machine, named `name` (so every function can know its ARN without a reference
    that would make a cycle), over `steps` (controller/steps*.py by STEPS name)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        name: str,
        steps: dict[str, aws_lambda.IFunction],
    ) -> None:
        super().__init__(scope, construct_id)
        failed = sfn.Fail(
            self,
            "ControllerFailed",
            error="RunControllerFailed",
            cause="a state failed after its retries; StopBilling stopped the run's nodes and "
            "recorded why in attempts.json and controller.json",
        )
        stop_billing = self.task("StopBilling", steps["stop_billing"], "$.failure", catch=None)
        stop_billing.add_catch(failed, errors=["States.ALL"], result_path="$.failure_error")
        stop_billing.next(failed)

        def task(state_id: str, step: str, result_path: str, **kwargs) -> tasks.LambdaInvoke:
            return self.task(state_id, steps[step], result_path, catch=stop_billing, **kwargs)

        nothing = sfn.Succeed(self, "NothingToDo")
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
        delete = task("DeleteStack", "delete_stack", "$.delete").next(follow)
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
        gave_up = task("StopAfterGivingUp", "stop_fleet", "$.stop", pending=True).next(results)
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
        stop = task("StopFleet", "stop_fleet", "$.stop", pending=True).next(settled)
        record = task("Record", "record", "$.record")
        record.next(
            choice_on(
                self,
                "RecordDecision",
                "$.record.next",
                {
                    "wait": wait_on(self, "WaitToRecord", "$.record.wait_s").next(record),
                    "relaunch": stop,
                    "teardown": results,
                    "delete": delete,
                    "follow": follow,
                },
                nothing,
            )
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
            comment="horovod-fleet run controller: one execution per ended attempt of a run",
            state_machine_type=sfn.StateMachineType.STANDARD,
            definition_body=sfn.DefinitionBody.from_chainable(identify.next(record)),
            timeout=EXECUTION_TIMEOUT,
        )
        allow_implied_role_dependency(self.state_machine.node.default_child)
        self.acknowledge(steps)

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
        function: aws_lambda.IFunction,
        result_path: str,
        *,
        catch: sfn.IChainable | None,
        pending: bool = False,
    ) -> tasks.LambdaInvoke:
        """A state over one function: Lambda's own faults and AWS throttling retried with
        backoff, a node still pending (`pending`) retried until it can be stopped, anything
        else retried twice; then `catch`."""
        task = tasks.LambdaInvoke(
            self,
            state_id,
            lambda_function=function,
            payload_response_only=True,
            retry_on_service_exceptions=True,
            result_path=result_path,
        )
        task.add_retry(
            errors=["AwsThrottled"],
            interval=Duration.seconds(5),
            max_attempts=8,
            backoff_rate=2,
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
