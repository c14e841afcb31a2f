"""RunController: the run controller in TeardownStack. Its engine is one function, the tick
(controller/tick.py), which reads the whole run every minute and takes the next step; its long
actions are executions of the workflow (workflow.py, controller/steps*.py) that the tick starts
and watches. EventBridge Scheduler runs the tick every minute, whatever happens; the rules on
DONE.json and on EC2's own events, the idle alarm and the hard cap run it at once. Also the
Replacements resource's answer (controller/cleanup.py), and the alarms on the controller's
failures.

The tick as a loop follows AWS ParallelCluster's cluster manager, which reads the fleet and
repairs it every 60 s (`LOOP_TIME = 60`, aws/aws-parallelcluster-node
src/slurm_plugin/clustermgtd.py,
https://github.com/aws/aws-parallelcluster-node/blob/2e8f9a8e325d447cbfc36bb3ebd118cbd6439d6d/src/slurm_plugin/clustermgtd.py).
"""

from aws_cdk import CrossStackReferences, Duration, ReferenceStrength, Stack, custom_resources
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_scheduler as scheduler
from constructs import Construct

from contract import runs
from contract.names import IDLE_ALARM_PREFIX, IDLE_MINUTES, REPLACEMENTS_PER_NODE
from stacks.nag import acknowledge_wildcard_resources, allow_implied_role_dependency
from stacks.teardown import controller_policy
from stacks.teardown.deploy_answers import acknowledge_provider_framework
from stacks.teardown.functions import (
    CONTROLLER_CODE,
    checkov_function_reasons,
    function_role,
    python_function,
)
from stacks.teardown.workflow import STEPS, RunWorkflow

STATE_MACHINE_NAME = "horovod-fleet-run-controller"
# The tick's schedule: every minute, as clustermgtd's loop.
TICK_RATE = "rate(1 minute)"
# An event only brings the tick forward; one lost costs a minute, the next tick's. EventBridge
# invokes a Lambda target asynchronously (its list of targets,
# https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-targets.html): these retries are
# for an event Lambda did not accept, a throttled tick waits in Lambda's queue.
TICK_EVENT_RETRIES = 2
TICK_EVENT_AGE = Duration.minutes(5)
# The states of EC2's state-change events that bring the tick forward: a node stopping or going.
# https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/monitoring-instance-state-changes.html
NODE_GONE_STATES = ["stopping", "stopped", "shutting-down", "terminated"]
# One RunInstances, then an S3 put and a CreateTags per launched node.
STEP_TIMEOUT_MINUTES = {"launch": 5}
# The tick reads a few dozen things and starts at most a few; a minute, the schedule's rate.
TICK_TIMEOUT_MINUTES = 1
# One tick at a time: two at once could each judge the same loss before either's launch shows.
# Every invoker (Scheduler, the rules, the idle alarm, the cap) invokes it asynchronously, and
# Lambda answers an event its reserved concurrency throttles by putting it back in the queue
# and trying again ("For throttling errors (429) ... Lambda returns the event to the queue and
# attempts to run the function again", backing off from 1 s,
# https://docs.aws.amazon.com/lambda/latest/dg/invocation-async-error-handling.html), for at
# most TICK_EVENT_QUEUE_AGE, after which it is discarded ("The maximum amount of time Lambda
# retains an event in the asynchronous event queue",
# https://docs.aws.amazon.com/lambda/latest/dg/invocation-async-configuring.html): by then the
# next minute's tick has run. Lambda keeps 100 of the account's concurrency unreserved
# (https://docs.aws.amazon.com/lambda/latest/api/API_PutFunctionConcurrency.html): an account
# whose Lambda concurrency quota is 100 or less cannot deploy TeardownStack until it is raised.
TICK_CONCURRENCY = 1
TICK_EVENT_QUEUE_AGE = Duration.minutes(1)
# The tick's errors that mean the run may not be handled: a few minutes of them in a row.
TICK_ERROR_MINUTES = 5


class RunController(Construct):
    """`tick` for the per-run triggers (RunGuard), `cleanup_token` for TrainStack's Replacements
    resource, `alarms` on the controller's failures."""

    def __init__(self, scope: Construct, construct_id: str, *, bucket: s3.IBucket) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        arns = controller_policy.ControllerArns(stack, bucket, STATE_MACHINE_NAME)
        environment = {
            "BUCKET": bucket.bucket_name,
            # Named, not referenced: the steps' functions are in the state machine's definition.
            "STATE_MACHINE_ARN": arns.state_machine,
            "IDLE_ALARM_PREFIX": IDLE_ALARM_PREFIX,
            "IDLE_MINUTES": str(IDLE_MINUTES),
            # How often the tick replaces one node of an elastic fleet within an attempt.
            "REPLACEMENTS_PER_NODE": str(REPLACEMENTS_PER_NODE),
        }
        # One role for the tick and the steps: they read and act on the same run.
        role = self.role(
            "StepsRole",
            "horovod-fleet run controller: reads the run, records it, stops, starts and launches "
            "its fleet, deletes TrainStack, starts and stops its own executions",
            controller_policy.steps_statements(arns),
            arns,
        )
        steps = {
            name: python_function(
                self,
                "Step" + name.title().replace("_", ""),
                code=CONTROLLER_CODE,
                handler=f"{module_of(name)}.{name}",
                role=role,
                description=f"horovod-fleet run controller step: {name}",
                environment=environment,
                timeout_minutes=STEP_TIMEOUT_MINUTES.get(name, 1),
            )
            for name in STEPS
        }
        self.workflow = RunWorkflow(
            self, "Workflow", name=STATE_MACHINE_NAME, steps=steps, timeouts=STEP_TIMEOUT_MINUTES
        )
        self.tick = python_function(
            self,
            "Tick",
            code=CONTROLLER_CODE,
            handler="tick.handler",
            role=role,
            description="The horovod-fleet run controller's tick: reads the run, takes its next step",
            environment=environment,
            timeout_minutes=TICK_TIMEOUT_MINUTES,
            reserved_concurrency=TICK_CONCURRENCY,
        )
        # Invoked asynchronously by the schedule, the rules, the alarm and the cap: a tick that
        # failed is not retried (retries count only the function's errors, "The maximum number
        # of times that Lambda retries events when the function returns an error"), the next
        # minute's tick is; one throttled while another runs waits in the queue for a minute.
        self.tick.configure_async_invoke(retry_attempts=0, max_event_age=TICK_EVENT_QUEUE_AGE)
        self.schedule()
        self.rules(bucket)
        self.cleanup_token = self.cleanup(arns, environment)
        for referenced in (self.tick, role):
            CrossStackReferences.of(referenced).produce(ReferenceStrength.STRONG)
        self.steps_role = role
        self.alarms = self.failure_alarms()
        [self.tick_errors_alarm] = [a for a in self.alarms if a.node.id == "TickErrorsAlarm"]

    def role(self, construct_id: str, description: str, statements: list, arns) -> iam.Role:
        role = function_role(self, construct_id, description)
        policy = iam.Policy(self, f"{construct_id}Policy", statements=statements, roles=[role])
        acknowledge_wildcard_resources(
            policy,
            arns.wildcards(),
            "The wildcards are TrainStack's stack-id suffix, the run name in runs/<run>/ "
            "(DONE.json, attempts.json, controller.json, launches/: the controller's record; "
            "status.json and an operator's hold.json, read only), the "
            "controller's "
            "own executions, TrainStack's instances (stopped, started or terminated only with "
            "CloudFormation's stack-name tag TrainStack or the fleet's tag holding TrainStack's "
            "id, and Project=horovod-fleet), RunInstances only from a launch template tagged as "
            "TrainStack's, into a subnet, security group and placement group TrainStack made, "
            "tags only at RunInstances or the node index tag on the fleet's instances, PassRole only "
            "of TrainStack's roles and only to EC2, the "
            "runs' notification topics by name prefix, read-only DescribeAlarms on the region's "
            "alarms (CloudWatch may authorise it against alarm:*), and the read-only EC2 "
            "Describe calls, which support no resource-level permissions.",
        )
        return role

    def schedule(self) -> None:
        """The tick every minute, whatever happens (a stack being created or deleted, a fleet
        gone, instances left over). Scheduler invokes Lambda asynchronously ("EventBridge
        Scheduler invokes your Lambda function asynchronously",
        https://docs.aws.amazon.com/lambda/latest/dg/with-eventbridge-scheduler.html): its own
        retries are for an invocation Lambda did not accept, and there are none, as the next
        minute's tick retries it; a tick throttled by the reserved concurrency waits in Lambda's
        queue instead (TICK_CONCURRENCY)."""
        invoke = iam.Role(
            self,
            "TickScheduleRole",
            assumed_by=iam.ServicePrincipal(
                "scheduler.amazonaws.com",
                conditions={"StringEquals": {"aws:SourceAccount": Stack.of(self).account}},
            ),
            description="EventBridge Scheduler runs the horovod-fleet run controller's tick",
        )
        invoke.add_to_policy(
            iam.PolicyStatement(
                actions=["lambda:InvokeFunction"], resources=[self.tick.function_arn]
            )
        )
        scheduler.CfnSchedule(
            self,
            "TickSchedule",
            description="The horovod-fleet run controller's tick, every minute",
            schedule_expression=TICK_RATE,
            flexible_time_window=scheduler.CfnSchedule.FlexibleTimeWindowProperty(mode="OFF"),
            target=scheduler.CfnSchedule.TargetProperty(
                arn=self.tick.function_arn,
                role_arn=invoke.role_arn,
                input='{"trigger": "schedule"}',
                retry_policy=scheduler.CfnSchedule.RetryPolicyProperty(
                    maximum_retry_attempts=0, maximum_event_age_in_seconds=60
                ),
            ),
        )

    def rules(self, bucket: s3.IBucket) -> None:
        target = targets.LambdaFunction(
            self.tick, retry_attempts=TICK_EVENT_RETRIES, max_event_age=TICK_EVENT_AGE
        )
        for rule_id, description, pattern in (
            (
                "RunDoneRule",
                "a run wrote DONE.json",
                events.EventPattern(
                    source=["aws.s3"],
                    detail_type=["Object Created"],
                    detail={
                        "bucket": {"name": [bucket.bucket_name]},
                        "object": {"key": events.Match.wildcard(runs.key("*", runs.DONE))},
                    },
                ),
            ),
            (
                "SpotWarningRule",
                "EC2 warned of a Spot interruption",
                events.EventPattern(
                    source=["aws.ec2"], detail_type=["EC2 Spot Instance Interruption Warning"]
                ),
            ),
            (
                "NodeStateRule",
                "an instance stopped or went",
                events.EventPattern(
                    source=["aws.ec2"],
                    detail_type=["EC2 Instance State-change Notification"],
                    detail={"state": NODE_GONE_STATES},
                ),
            ),
        ):
            events.Rule(
                self,
                rule_id,
                description=f"Run the horovod-fleet run controller's tick when {description}",
                event_pattern=pattern,
                targets=[target],
            )

    def cleanup(self, arns, environment: dict) -> str:
        role = self.role(
            "CleanupRole",
            "horovod-fleet Replacements resource: ends the instances the run controller "
            "launched when TrainStack is deleted",
            controller_policy.cleanup_statements(arns),
            arns,
        )
        function = python_function(
            self,
            "Cleanup",
            code=CONTROLLER_CODE,
            handler="cleanup.on_event",
            role=role,
            description="Ends the instances of a deleted TrainStack that CloudFormation does not know",
            environment=environment,
            timeout_minutes=5,
        )
        provider = custom_resources.Provider(self, "CleanupProvider", on_event_handler=function)
        framework = provider.node.find_child("framework-onEvent")
        checkov_function_reasons(framework.node.default_child)
        allow_implied_role_dependency(framework.node.default_child)
        acknowledge_provider_framework(provider, function)
        CrossStackReferences.of(framework).produce(ReferenceStrength.STRONG)
        return provider.service_token

    def failure_alarms(self) -> list[cloudwatch.Alarm]:
        """An execution that failed or timed out (after StopBilling, or without it), and a tick
        that keeps failing: each may leave a run unhandled."""
        machine = self.workflow.state_machine
        five = Duration.minutes(5)
        return [
            self.alarm(
                "ExecutionsFailedAlarm",
                "The horovod-fleet run controller failed: it stopped the run's nodes and wrote "
                "why into attempts.json and controller.json; its tick resumes the action a few "
                "times. See the execution in the Step Functions console",
                machine.metric_failed(period=five, statistic="Sum"),
            ),
            self.alarm(
                "ExecutionsTimedOutAlarm",
                "A horovod-fleet run controller execution timed out: check the fleet",
                machine.metric_timed_out(period=five, statistic="Sum"),
            ),
            self.alarm(
                "TickErrorsAlarm",
                f"The horovod-fleet run controller's tick failed every minute for "
                f"{TICK_ERROR_MINUTES} minutes: no run is being looked after. Its log says why",
                self.tick.metric_errors(period=Duration.minutes(1), statistic="Sum"),
                periods=TICK_ERROR_MINUTES,
            ),
        ]

    def alarm(self, alarm_id: str, description: str, metric, periods: int = 1) -> cloudwatch.Alarm:
        return cloudwatch.Alarm(
            self,
            alarm_id,
            alarm_description=description,
            metric=metric,
            threshold=1,
            evaluation_periods=periods,
            datapoints_to_alarm=periods,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )


def module_of(step: str) -> str:
    """The module of the asset that holds a step's handler."""
    if step in ("stop_fleet", "settled", "launch"):
        return "steps_fleet"
    if step in ("results", "delete_stack", "follow_delete"):
        return "steps_teardown"
    return "steps"
