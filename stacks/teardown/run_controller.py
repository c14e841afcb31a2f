"""RunController: the run controller on AWS Step Functions in TeardownStack: the workflow and
its steps (workflow.py, controller/steps*.py), the starter every trigger invokes
(controller/starter.py) with the EventBridge rules of DONE.json and of EC2's own events, the
Replacements resource's answer (controller/cleanup.py), and the alarms on their failures."""

from aws_cdk import CrossStackReferences, Duration, ReferenceStrength, Stack, custom_resources
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from stacks.nag import acknowledge_wildcard_resources, allow_implied_role_dependency
from stacks.teardown import controller_policy
from stacks.teardown.deploy_answers import acknowledge_provider_framework
from stacks.teardown.functions import (
    CONTROLLER_CODE,
    checkov_function_reasons,
    function_role,
    python_function,
)
from stacks.teardown.names import IDLE_ALARM_PREFIX, IDLE_MINUTES
from stacks.teardown.workflow import STEPS, RunWorkflow

STATE_MACHINE_NAME = "horovod-fleet-run-controller"
# An idle fleet is deleted no sooner than this after TrainStack finished deploying (or the
# controller relaunched it): the nodes get the rendezvous timeout (stacks/train/fleet.py, 30
# minutes) to meet, then 10 minutes for the allreduce check and the trainer's start.
LAUNCH_GRACE_MINUTES = 40
# EventBridge's limits for a rule target: 185 retries, a day of event age.
EVENT_RETRIES = 185
# The states of EC2's state-change events the starter judges: a node stopping or going.
# https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/monitoring-instance-state-changes.html
NODE_GONE_STATES = ["stopping", "stopped", "shutting-down", "terminated"]
# One RunInstances, then an S3 put and a CreateTags per launched node.
STEP_TIMEOUT_MINUTES = {"launch": 5}


class RunController(Construct):
    """`starter` for the per-run triggers (RunGuard), `cleanup_token` for TrainStack's
    Replacements resource, `alarms` on the controller's failures."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        bucket: s3.IBucket,
        dead_letters: sqs.IQueue,
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        arns = controller_policy.ControllerArns(stack, bucket, STATE_MACHINE_NAME)
        environment = {
            "BUCKET": bucket.bucket_name,
            # Named, not referenced: the steps' functions are in the state machine's definition.
            "STATE_MACHINE_ARN": arns.state_machine,
            "IDLE_ALARM_PREFIX": IDLE_ALARM_PREFIX,
            "IDLE_MINUTES": str(IDLE_MINUTES),
            "LAUNCH_GRACE_MINUTES": str(LAUNCH_GRACE_MINUTES),
        }
        steps_role = self.role(
            "StepsRole",
            "horovod-fleet run controller's steps: record the run, stop, start and launch its "
            "fleet, delete TrainStack",
            controller_policy.steps_statements(arns),
            arns,
        )
        steps = {
            name: python_function(
                self,
                "Step" + name.title().replace("_", ""),
                code=CONTROLLER_CODE,
                handler=f"{module_of(name)}.{name}",
                role=steps_role,
                description=f"horovod-fleet run controller step: {name}",
                environment=environment,
                timeout_minutes=STEP_TIMEOUT_MINUTES.get(name, 1),
            )
            for name in STEPS
        }
        self.workflow = RunWorkflow(self, "Workflow", name=STATE_MACHINE_NAME, steps=steps)
        starter_role = self.role(
            "StarterRole",
            "horovod-fleet run controller's starter: names and starts an execution per trigger",
            controller_policy.starter_statements(arns),
            arns,
        )
        self.starter = python_function(
            self,
            "Starter",
            code=CONTROLLER_CODE,
            handler="starter.handler",
            role=starter_role,
            description="Starts the horovod-fleet run controller's execution for a trigger",
            environment=environment,
            dead_letters=dead_letters,
        )
        self.rules(bucket, dead_letters)
        self.cleanup_token = self.cleanup(arns, environment)
        for referenced in (self.starter, starter_role):
            CrossStackReferences.of(referenced).produce(ReferenceStrength.STRONG)
        self.alarms = self.failure_alarms()

    def role(self, construct_id: str, description: str, statements: list, arns) -> iam.Role:
        role = function_role(self, construct_id, description)
        policy = iam.Policy(self, f"{construct_id}Policy", statements=statements, roles=[role])
        acknowledge_wildcard_resources(
            policy,
            arns.wildcards(),
            "The wildcards are TrainStack's stack-id suffix, the run name in runs/<run>/ "
            "(DONE.json, attempts.json, controller.json, launches/: the controller's record), the "
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

    def rules(self, bucket: s3.IBucket, dead_letters: sqs.IQueue) -> None:
        target = targets.LambdaFunction(
            self.starter,
            retry_attempts=EVENT_RETRIES,
            max_event_age=Duration.hours(24),
            dead_letter_queue=dead_letters,
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
                        "object": {"key": events.Match.wildcard("runs/*/DONE.json")},
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
                description=f"Start the horovod-fleet run controller when {description}",
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
        """An execution that failed or timed out (after StopBilling, or without it), and a
        starter that failed: each may leave a run unhandled."""
        machine = self.workflow.state_machine
        five = Duration.minutes(5)
        return [
            self.alarm(
                "ExecutionsFailedAlarm",
                "The horovod-fleet run controller failed: it stopped the run's nodes and wrote "
                "why into attempts.json and controller.json. See the execution in the Step "
                "Functions console, then deploy again or delete TrainStack",
                machine.metric_failed(period=five, statistic="Sum"),
            ),
            self.alarm(
                "ExecutionsTimedOutAlarm",
                "A horovod-fleet run controller execution timed out: check the fleet",
                machine.metric_timed_out(period=five, statistic="Sum"),
            ),
            self.alarm(
                "StarterErrorsAlarm",
                "The horovod-fleet run controller's starter failed; Lambda retries it, then "
                "moves the event to the dead-letter queue",
                self.starter.metric_errors(period=five, statistic="Sum"),
            ),
        ]

    def alarm(self, alarm_id: str, description: str, metric) -> cloudwatch.Alarm:
        return cloudwatch.Alarm(
            self,
            alarm_id,
            alarm_description=description,
            metric=metric,
            threshold=1,
            evaluation_periods=1,
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
