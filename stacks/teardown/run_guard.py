"""RunGuard: the per-run triggers of the run controller, deployed inside TrainStack."""

import json
from collections.abc import Sequence

import jsii
from aws_cdk import CfnOutput, Duration, Stack, Tags, aws_lambda
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_scheduler as scheduler
from constructs import Construct

from contract.names import (
    CAP_SCHEDULE_PREFIX,
    DEADLINE_OUTPUT_KEY,
    DEADLINE_TYPE,
    IDLE_ALARM_PREFIX,
    IDLE_EVALUATION_PERIODS,
    IDLE_MINUTES,
    IDLE_PERIOD_MINUTES,
    MAX_RESTARTS_OUTPUT_KEY,
    METRIC_NAMESPACE,
    PROJECT,
    PROJECT_TAG,
    RUN_OUTPUT_KEY,
    RUN_TAG,
)
from stacks.teardown.answered import answered
from stacks.teardown.guards import FleetGuards

GPU_METRIC = "nvidia_smi_utilization_gpu"
IDLE_PERIOD = Duration.minutes(IDLE_PERIOD_MINUTES)
IDLE_THRESHOLD_PERCENT = 5
# Scheduler retries a failed invocation for up to a day (its limits: 185 attempts, 86400 s).
SCHEDULE_RETRIES = 185
SCHEDULE_MAX_AGE_S = 86400


class RunGuard(Construct):
    """Per-run hard cap (one-time schedule) and idle alarm, both invoking the run controller's
    tick (controller/tick.py) at once; the tick reads the cap's time and the
    alarm's state every minute anyway.

    Also outputs the run as TrainStack's `HorovodFleetRun`, and `maxRestarts` and the cap's
    exact time, which bound the run controller's relaunches (`horovod-fleet status` reads them).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        guards: FleetGuards,
        run_name: str,
        max_hours: float,
        max_restarts: int,
        instances: Sequence[ec2.CfnInstance],
    ) -> None:
        super().__init__(scope, construct_id)
        if max_hours <= 0:
            raise ValueError(f"max_hours must be positive, got {max_hours!r}")
        tick = guards.tick
        self.max_hours = max_hours  # the cap the synthesis cost line multiplies by
        Tags.of(self).add(PROJECT_TAG, PROJECT)
        Tags.of(self).add(RUN_TAG, run_name)

        # CloudFormation has no "now": a deploy-time answer gives the deadline,
        # so the cap counts from this deployment and synthesis stays deterministic.
        deadline = answered(
            self,
            "Deadline",
            guards=guards,
            resource_type=DEADLINE_TYPE,
            properties={"Run": run_name, "MaxHours": str(max_hours)},
        )
        # The clock starts before the first instance launches, so the cap covers all billing.
        for instance in instances:
            instance.node.add_dependency(deadline)

        invoke_role = iam.Role(
            self,
            "HardCapRole",
            assumed_by=iam.ServicePrincipal(
                "scheduler.amazonaws.com",
                conditions={"StringEquals": {"aws:SourceAccount": Stack.of(self).account}},
            ),
            description=f"EventBridge Scheduler runs the run controller's tick at the hard cap of "
            f"{run_name}",
        )
        invoke_role.add_to_policy(
            iam.PolicyStatement(actions=["lambda:InvokeFunction"], resources=[tick.function_arn])
        )
        guards.dead_letters.grant_send_messages(invoke_role)
        self.hard_cap = scheduler.CfnSchedule(
            self,
            "HardCap",
            name=f"{CAP_SCHEDULE_PREFIX}{run_name}",
            description=f"Hard cap: delete TrainStack {max_hours:g} h after deploy",
            schedule_expression=deadline.get_att_string("ScheduleExpression"),
            schedule_expression_timezone="UTC",
            flexible_time_window=scheduler.CfnSchedule.FlexibleTimeWindowProperty(mode="OFF"),
            target=scheduler.CfnSchedule.TargetProperty(
                arn=tick.function_arn,
                role_arn=invoke_role.role_arn,
                input=json.dumps({"trigger": "hard-cap", "run": run_name}),
                retry_policy=scheduler.CfnSchedule.RetryPolicyProperty(
                    maximum_retry_attempts=SCHEDULE_RETRIES,
                    maximum_event_age_in_seconds=SCHEDULE_MAX_AGE_S,
                ),
                dead_letter_config=scheduler.CfnSchedule.DeadLetterConfigProperty(
                    arn=guards.dead_letters.queue_arn
                ),
            ),
        )

        self.idle_alarm = cloudwatch.Alarm(
            self,
            "IdleAlarm",
            alarm_name=f"{IDLE_ALARM_PREFIX}{run_name}",
            alarm_description=f"Fleet {run_name}: average GPU utilisation below "
            f"{IDLE_THRESHOLD_PERCENT}% for {IDLE_MINUTES} minutes; the run controller deletes "
            "TrainStack",
            metric=cloudwatch.Metric(
                namespace=METRIC_NAMESPACE,
                metric_name=GPU_METRIC,
                dimensions_map={"Run": run_name},
                statistic="Average",
                period=IDLE_PERIOD,
            ),
            threshold=IDLE_THRESHOLD_PERCENT,
            comparison_operator=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
            evaluation_periods=IDLE_EVALUATION_PERIODS,
            datapoints_to_alarm=IDLE_EVALUATION_PERIODS,
            # A fleet whose agents stopped publishing is dead or hung, not busy: count it idle.
            # So the alarm can be in ALARM while TrainStack is still being created, or while a
            # relaunch waits for capacity: the tick reads its state every minute and judges it
            # once the stack is deployed, the relaunch is over and the launch grace has passed.
            treat_missing_data=cloudwatch.TreatMissingData.BREACHING,
        )
        # The permission sits in this stack (the alarm's) so TeardownStack never references it.
        tick.add_permission(
            "IdleAlarmInvoke",
            scope=self,
            principal=iam.ServicePrincipal("lambda.alarms.cloudwatch.amazonaws.com"),
            action="lambda:InvokeFunction",
            source_arn=self.idle_alarm.alarm_arn,
            source_account=Stack.of(self).account,
        )
        self.idle_alarm.add_alarm_action(_InvokeFunction(tick))

        # What `horovod-fleet status` reads; the tick reads the run from the stack's tags.
        CfnOutput(self, "Run", value=run_name).override_logical_id(RUN_OUTPUT_KEY)
        # The run controller relaunches at most this often, and never past the cap.
        CfnOutput(self, "MaxRestarts", value=str(max_restarts)).override_logical_id(
            MAX_RESTARTS_OUTPUT_KEY
        )
        CfnOutput(
            self, "DeadlineOutput", value=deadline.get_att_string("Deadline")
        ).override_logical_id(DEADLINE_OUTPUT_KEY)


@jsii.implements(cloudwatch.IAlarmAction)
class _InvokeFunction:
    """Alarm action that invokes a function whose permission was granted in the alarm's stack."""

    def __init__(self, function: aws_lambda.IFunction) -> None:
        self._function = function

    def bind(self, _scope: Construct, _alarm: cloudwatch.IAlarm) -> cloudwatch.AlarmActionConfig:
        return cloudwatch.AlarmActionConfig(alarm_action_arn=self._function.function_arn)
