"""Cost control: the reaper Lambda and the triggers that make a fleet stop billing unattended.

TeardownStack holds the reaper and everything that does not depend on a deployed fleet (the S3
rules, the re-check role, the optional budget). RunGuard (inside TrainStack) adds the per-run
hard cap and idle alarm; PreprocessGuard (inside PreprocessStack) registers the preprocessing
instance and grants the reaper exactly that instance and volume. Both guards live in the
dependent stacks, so TeardownStack never references them and there is no dependency cycle.

The guards reference the reaper (and its dead-letter queue) strongly, through CloudFormation
exports: CloudFormation refuses to delete TeardownStack while TrainStack or PreprocessStack
imports them, so the cap schedule and the alarm never point at a reaper that is gone.
"""

import json
from collections.abc import Sequence
from pathlib import Path

import jsii
from aws_cdk import (
    Acknowledgment,
    ArnFormat,
    CfnOutput,
    CrossStackReferences,
    CustomResource,
    Duration,
    ReferenceStrength,
    RemovalPolicy,
    Stack,
    Tags,
    Validations,
    aws_lambda,
)
from aws_cdk import aws_budgets as budgets
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cloudwatch_actions
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_scheduler as scheduler
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from stacks.nag import acknowledge_wildcard_resources, checkov_reason

PROJECT = "horovod-fleet"
TRAIN_STACK_NAME = "TrainStack"
# PreprocessGuard writes the instance and volume here; the reaper reads it on a new manifest.
PREPROCESS_PARAMETER = "/horovod-fleet/preprocess"
# The reaper reads the deployed fleet's run from this TrainStack output before deleting it.
RUN_OUTPUT_KEY = "HorovodFleetRun"
IDLE_ALARM_PREFIX = "horovod-fleet-idle-"
RECHECK_SCHEDULE_PREFIX = "horovod-fleet-recheck-"
# The reaper also answers this custom resource: an AMI id and code URLs as they were on the
# first deploy, kept by every update (stacks/reaper/handler.py).
PINNED_TYPE = "Custom::HorovodFleetPinned"
RECHECK_MINUTES = 10
METRIC_NAMESPACE = "HorovodFleet"
GPU_METRIC = "nvidia_smi_utilization_gpu"
IDLE_THRESHOLD_PERCENT = 5
IDLE_PERIOD = Duration.minutes(5)
IDLE_EVALUATION_PERIODS = 6  # 6 x 5 min = 30 minutes below the threshold
IDLE_MINUTES = 30  # IDLE_PERIOD x IDLE_EVALUATION_PERIODS: quiet this long is idle
# An idle fleet is deleted no sooner than this after TrainStack finished deploying: the nodes get
# the rendezvous timeout (stacks/train.py, 30 minutes) to meet, then 10 minutes for the allreduce
# check and the trainer's start. A fleet that is still not training is deleted then, within 45
# minutes of launch plus the rendezvous timeout.
LAUNCH_GRACE_MINUTES = 40
# Scheduler retries a failed invocation for up to a day (its limits: 185 attempts, 86400 s).
SCHEDULE_RETRIES = 185
SCHEDULE_MAX_AGE_S = 86400
# EventBridge's limits for a rule target: 185 retries, a day of event age.
EVENT_RETRIES = 185
REAPER_CODE = Path(__file__).parent / "reaper"


class TeardownStack(Stack):
    """The reaper, the S3 completion rules, the re-check role and the optional budget."""

    reaper: aws_lambda.Function

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        bucket: s3.IBucket,
        budget_email: str | None,
        budget_limit_usd: float,
        dataset_prefix: str = "tfrecords/",
        **kwargs,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        Tags.of(self).add("Project", PROJECT)

        log_group = logs.LogGroup(
            self,
            "ReaperLogs",
            retention=logs.RetentionDays.THREE_MONTHS,
            removal_policy=RemovalPolicy.DESTROY,
        )
        role = iam.Role(
            self,
            "ReaperRole",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description="The horovod-fleet reaper: deletes TrainStack, stops the preprocessing node",
        )
        # Scheduler assumes this role to invoke the reaper for a re-check it scheduled itself.
        recheck_role = iam.Role(
            self,
            "RecheckRole",
            assumed_by=iam.ServicePrincipal(
                "scheduler.amazonaws.com",
                conditions={"StringEquals": {"aws:SourceAccount": self.account}},
            ),
            description="EventBridge Scheduler invokes the horovod-fleet reaper for a re-check",
        )
        # Every trigger invokes the reaper asynchronously. What fails after all retries (an error
        # of the reaper, a target EventBridge or Scheduler could not invoke) lands here, and the
        # alarms below e-mail budgetEmail: a failed teardown is never silent.
        dead_letters = sqs.Queue(
            self,
            "ReaperDeadLetters",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=Duration.days(14),
        )
        Validations.of(dead_letters).acknowledge(
            Acknowledgment(
                id="AwsSolutions-SQS3",
                reason="This queue is the reaper's dead-letter queue; its alarm is the next step.",
            )
        )
        function = aws_lambda.Function(
            self,
            "Reaper",
            runtime=aws_lambda.Runtime.PYTHON_3_14,
            handler="handler.handler",
            code=aws_lambda.Code.from_asset(str(REAPER_CODE), exclude=["__pycache__", "*.pyc"]),
            role=role,
            log_group=log_group,
            # Waiting for the preprocessing instance to stop before its snapshot takes minutes.
            timeout=Duration.minutes(15),
            memory_size=256,
            # Lambda's own limits: 2 retries after an error, 6 hours in its queue (throttles
            # are retried for as long). https://docs.aws.amazon.com/lambda/latest/dg/invocation-async-error-handling.html
            retry_attempts=2,
            max_event_age=Duration.hours(6),
            dead_letter_queue=dead_letters,
            description="Stops horovod-fleet billing: deletes TrainStack, stops preprocessing",
            environment={
                "BUCKET": bucket.bucket_name,
                "RUN_OUTPUT_KEY": RUN_OUTPUT_KEY,
                "PREPROCESS_PARAMETER": PREPROCESS_PARAMETER,
                "IDLE_ALARM_PREFIX": IDLE_ALARM_PREFIX,
                "RECHECK_PREFIX": RECHECK_SCHEDULE_PREFIX,
                "RECHECK_MINUTES": str(RECHECK_MINUTES),
                "RECHECK_ROLE_ARN": recheck_role.role_arn,
                "DEAD_LETTER_ARN": dead_letters.queue_arn,
                "MANIFEST_KEY": f"{dataset_prefix}manifest.json",
                "IDLE_MINUTES": str(IDLE_MINUTES),
                "LAUNCH_GRACE_MINUTES": str(LAUNCH_GRACE_MINUTES),
            },
        )
        # Strong whatever the app's default: the guards in the other stacks import the reaper,
        # so CloudFormation refuses to delete TeardownStack under a live fleet.
        for referenced in (function, role, dead_letters):
            CrossStackReferences.of(referenced).produce(ReferenceStrength.STRONG)
        # Function adds a DependsOn on its role that the role's GetAtt already implies (cfn-lint
        # W3005 on every synth); dropping it keeps the templates warning-free.
        function.node.default_child.add_deletion_override("DependsOn")
        self._checkov_reasons(function.node.default_child, dead_letters.node.default_child)
        self.reaper = function
        self.dead_letters = dead_letters
        recheck_role.add_to_policy(
            iam.PolicyStatement(
                actions=["lambda:InvokeFunction"], resources=[function.function_arn]
            )
        )
        dead_letters.grant_send_messages(recheck_role)
        self._grant_reaper(role, log_group, bucket, recheck_role)

        manifest_key = f"{dataset_prefix}manifest.json"
        for rule_id, key_filter, description in (
            ("RunDoneRule", events.Match.wildcard("runs/*/DONE.json"), "a run wrote DONE.json"),
            ("ManifestRule", [manifest_key], "preprocessing wrote the manifest"),
        ):
            events.Rule(
                self,
                rule_id,
                description=f"Invoke the reaper when {description}",
                event_pattern=events.EventPattern(
                    source=["aws.s3"],
                    detail_type=["Object Created"],
                    detail={
                        "bucket": {"name": [bucket.bucket_name]},
                        "object": {"key": key_filter},
                    },
                ),
                targets=[
                    targets.LambdaFunction(
                        function,
                        retry_attempts=EVENT_RETRIES,
                        max_event_age=Duration.hours(24),
                        dead_letter_queue=dead_letters,
                    )
                ],
            )

        if budget_email:
            if not budget_limit_usd > 0:
                raise ValueError(f"budget_limit_usd must be positive, got {budget_limit_usd!r}")
            self._budget(budget_email, budget_limit_usd)
        self._failure_alarms(function, dead_letters, budget_email)

    @staticmethod
    def _checkov_reasons(function: aws_lambda.CfnFunction, dead_letters: sqs.CfnQueue) -> None:
        for check_id, reason in (
            (
                "CKV_AWS_115",
                "No reserved concurrency on purpose: an account whose Lambda concurrency limit is "
                "still the new-account 10 cannot reserve any (Lambda keeps 100 unreserved, "
                "https://docs.aws.amazon.com/lambda/latest/dg/configuration-concurrency.html) "
                "and TeardownStack would fail to deploy. A throttled asynchronous invocation is "
                "retried for up to 6 hours, then dead-lettered and alarmed.",
            ),
            (
                "CKV_AWS_117",
                "The reaper calls only AWS APIs and reaches no private resource; in a VPC it "
                "would need a NAT gateway or six interface endpoints, more ways to fail.",
            ),
            (
                "CKV_AWS_173",
                "The environment holds resource names, ARNs and minutes, no secrets; Lambda "
                "encrypts it at rest with an AWS managed key.",
            ),
        ):
            checkov_reason(function, check_id, reason)
        checkov_reason(
            dead_letters,
            "CKV_AWS_27",
            "Encrypted at rest with SQS-managed keys (SqsManagedSseEnabled), which checkov does "
            "not count; a KMS key would need grants for EventBridge, Scheduler and Lambda to "
            "deliver dead letters, and a missing grant loses exactly the events this queue keeps.",
        )

    def _failure_alarms(
        self, function: aws_lambda.Function, dead_letters: sqs.Queue, email: str | None
    ) -> None:
        """Alarms on a reaper error and on anything in its dead-letter queue; with budgetEmail
        they e-mail it (the first message asks to confirm the subscription)."""
        alarms = [
            cloudwatch.Alarm(
                self,
                "ReaperErrorsAlarm",
                alarm_description="The horovod-fleet reaper failed; Lambda retries it, then moves "
                "the event to the dead-letter queue. Check its log group and the fleet",
                metric=function.metric_errors(period=Duration.minutes(5), statistic="Sum"),
                threshold=1,
                evaluation_periods=1,
                comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            ),
            cloudwatch.Alarm(
                self,
                "ReaperDeadLettersAlarm",
                alarm_description="A horovod-fleet teardown event was not handled after all "
                "retries: a fleet may still be billing. Delete TrainStack by hand",
                metric=dead_letters.metric_approximate_number_of_messages_visible(
                    period=Duration.minutes(5), statistic="Maximum"
                ),
                threshold=1,
                evaluation_periods=1,
                comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            ),
        ]
        if not email:
            return
        topic = sns.Topic(self, "ReaperFailures", enforce_ssl=True)
        # enforce_ssl replaces SNS's default topic policy, so CloudWatch is allowed explicitly.
        topic.add_to_resource_policy(
            iam.PolicyStatement(
                actions=["sns:Publish"],
                principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
                resources=[topic.topic_arn],
                conditions={"StringEquals": {"aws:SourceAccount": self.account}},
            )
        )
        unencrypted = (
            "CloudWatch alarms cannot publish to a topic encrypted with the AWS managed key "
            "aws/sns (https://repost.aws/knowledge-center/cloudwatch-configure-alarm-sns); the "
            "messages carry only alarm names and states."
        )
        Validations.of(topic).acknowledge(
            Acknowledgment(id="AwsSolutions-SNS2", reason=unencrypted)
        )
        checkov_reason(topic.node.default_child, "CKV_AWS_26", unencrypted)
        topic.add_subscription(subscriptions.EmailSubscription(email))
        for alarm in alarms:
            alarm.add_alarm_action(cloudwatch_actions.SnsAction(topic))

    def _grant_reaper(
        self, role: iam.Role, log_group: logs.LogGroup, bucket: s3.IBucket, recheck_role: iam.Role
    ) -> None:
        """Everything the reaper may do from this stack; per-instance rights come from guards."""
        train_stack_arn = self.format_arn(
            service="cloudformation", resource="stack", resource_name=f"{TRAIN_STACK_NAME}/*"
        )
        # Every alarm of the account and region, read-only: CloudWatch has been seen to authorise
        # DescribeAlarms against alarm:*, and a denial would leave an idle fleet billing.
        alarms_arn = self.format_arn(
            service="cloudwatch",
            resource="alarm",
            resource_name="*",
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
        recheck_schedules_arn = self.format_arn(
            service="scheduler",
            resource="schedule",
            resource_name=f"default/{RECHECK_SCHEDULE_PREFIX}*",
        )
        done_objects_arn = bucket.arn_for_objects("runs/*/DONE.json")
        train_instances_arn = self.format_arn(service="ec2", resource="instance", resource_name="*")
        statements = [
            iam.PolicyStatement(
                actions=["logs:CreateLogStream", "logs:PutLogEvents"],
                resources=[log_group.log_group_arn],
            ),
            iam.PolicyStatement(
                actions=[
                    "cloudformation:DescribeStacks",
                    "cloudformation:DescribeStackEvents",
                    "cloudformation:DeleteStack",
                ],
                resources=[train_stack_arn],
            ),
            iam.PolicyStatement(
                actions=["s3:ListBucket"],
                resources=[bucket.bucket_arn],
                conditions={"StringLike": {"s3:prefix": ["runs/*"]}},
            ),
            iam.PolicyStatement(actions=["s3:GetObject"], resources=[done_objects_arn]),
            iam.PolicyStatement(
                actions=["cloudwatch:DescribeAlarms"],
                resources=[alarms_arn],
            ),
            iam.PolicyStatement(
                actions=["scheduler:CreateSchedule"],
                resources=[recheck_schedules_arn],
            ),
            iam.PolicyStatement(actions=["iam:PassRole"], resources=[recheck_role.role_arn]),
            iam.PolicyStatement(
                actions=["ssm:GetParameter"],
                resources=[
                    self.format_arn(
                        service="ssm", resource="parameter", resource_name=PREPROCESS_PARAMETER[1:]
                    )
                ],
            ),
            # Describe calls support no resource-level permissions; they are read-only.
            iam.PolicyStatement(
                actions=["ec2:DescribeInstances", "ec2:DescribeSnapshots"], resources=["*"]
            ),
            # After a failed delete of TrainStack, its leftover instances; CloudFormation's own
            # tag names the stack, and no one else can set an aws: tag.
            iam.PolicyStatement(
                actions=["ec2:TerminateInstances"],
                resources=[train_instances_arn],
                conditions={
                    "StringEquals": {
                        "aws:ResourceTag/aws:cloudformation:stack-name": TRAIN_STACK_NAME,
                        "aws:ResourceTag/Project": PROJECT,
                    }
                },
            ),
        ]
        policy = iam.Policy(self, "ReaperPolicy", statements=statements, roles=[role])
        acknowledge_wildcard_resources(
            policy,
            [
                train_stack_arn,
                alarms_arn,
                recheck_schedules_arn,
                done_objects_arn,
                train_instances_arn,
                "*",
            ],
            "The wildcards are the stack-id suffix of TrainStack, the reaper's own re-check "
            "schedules by name prefix, the run name in runs/<run>/DONE.json (read to learn "
            "whether a run failed), TrainStack's instances (terminated only with "
            "CloudFormation's stack-name tag TrainStack and Project=horovod-fleet, after a "
            "failed delete), read-only DescribeAlarms on the region's alarms (CloudWatch may "
            "authorise it against alarm:*), and the read-only EC2 Describe calls, which "
            "support no resource-level permissions.",
        )

    def _budget(self, email: str, limit_usd: float) -> None:
        """A monthly cost budget that e-mails at 80% of actual and 100% of forecast spend."""
        # Account-wide on purpose: a tag filter needs the Project tag activated as a cost
        # allocation tag first, and a budget that silently sees $0 is worse than a broad one.
        budgets.CfnBudget(
            self,
            "Budget",
            budget=budgets.CfnBudget.BudgetDataProperty(
                budget_type="COST",
                time_unit="MONTHLY",
                budget_limit=budgets.CfnBudget.SpendProperty(amount=limit_usd, unit="USD"),
            ),
            notifications_with_subscribers=[
                budgets.CfnBudget.NotificationWithSubscribersProperty(
                    notification=budgets.CfnBudget.NotificationProperty(
                        notification_type=kind,
                        comparison_operator="GREATER_THAN",
                        threshold=threshold,
                        threshold_type="PERCENTAGE",
                    ),
                    subscribers=[
                        budgets.CfnBudget.SubscriberProperty(
                            subscription_type="EMAIL", address=email
                        )
                    ],
                )
                for kind, threshold in (("ACTUAL", 80), ("FORECASTED", 100))
            ],
        )


class RunGuard(Construct):
    """Per-run hard cap (one-time schedule) and idle alarm, both invoking the reaper.

    Also outputs the run as TrainStack's `HorovodFleetRun`, which the reaper compares with the
    event's run before it deletes anything.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        reaper: aws_lambda.Function,
        run_name: str,
        max_hours: float,
        instances: Sequence[ec2.CfnInstance],
    ) -> None:
        super().__init__(scope, construct_id)
        if max_hours <= 0:
            raise ValueError(f"max_hours must be positive, got {max_hours!r}")
        if reaper.dead_letter_queue is None:
            raise ValueError("the reaper must have a dead-letter queue")
        self.max_hours = max_hours  # the cap the synthesis cost line multiplies by
        Tags.of(self).add("Project", PROJECT)
        Tags.of(self).add(f"{PROJECT}:run", run_name)

        # CloudFormation has no "now": the reaper answers this custom resource with the deadline,
        # so the cap counts from this deployment and synthesis stays deterministic.
        deadline = CustomResource(
            self,
            "Deadline",
            service_token=reaper.function_arn,
            resource_type="Custom::HorovodFleetDeadline",
            properties={"Run": run_name, "MaxHours": str(max_hours)},
            # A reaper that cannot answer fails the deploy in minutes, not CloudFormation's hour.
            service_timeout=Duration.minutes(5),
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
            description=f"EventBridge Scheduler invokes the reaper at the hard cap of {run_name}",
        )
        invoke_role.add_to_policy(
            iam.PolicyStatement(actions=["lambda:InvokeFunction"], resources=[reaper.function_arn])
        )
        reaper.dead_letter_queue.grant_send_messages(invoke_role)
        self.hard_cap = scheduler.CfnSchedule(
            self,
            "HardCap",
            description=f"Hard cap: delete TrainStack {max_hours:g} h after deploy",
            schedule_expression=deadline.get_att_string("ScheduleExpression"),
            schedule_expression_timezone="UTC",
            flexible_time_window=scheduler.CfnSchedule.FlexibleTimeWindowProperty(mode="OFF"),
            target=scheduler.CfnSchedule.TargetProperty(
                arn=reaper.function_arn,
                role_arn=invoke_role.role_arn,
                input=json.dumps({"trigger": "hard-cap", "run": run_name}),
                retry_policy=scheduler.CfnSchedule.RetryPolicyProperty(
                    maximum_retry_attempts=SCHEDULE_RETRIES,
                    maximum_event_age_in_seconds=SCHEDULE_MAX_AGE_S,
                ),
                dead_letter_config=scheduler.CfnSchedule.DeadLetterConfigProperty(
                    arn=reaper.dead_letter_queue.queue_arn
                ),
            ),
        )

        self.idle_alarm = cloudwatch.Alarm(
            self,
            "IdleAlarm",
            alarm_name=f"{IDLE_ALARM_PREFIX}{run_name}",
            alarm_description=f"Fleet {run_name}: average GPU utilisation below "
            f"{IDLE_THRESHOLD_PERCENT}% for 30 minutes; the reaper deletes TrainStack",
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
            # So the alarm can be in ALARM while TrainStack is still being created; the reaper
            # then re-checks until the stack is deployed and the launch grace has passed.
            treat_missing_data=cloudwatch.TreatMissingData.BREACHING,
        )
        # The permission sits in this stack (the alarm's) so TeardownStack never references it.
        reaper.add_permission(
            "IdleAlarmInvoke",
            scope=self,
            principal=iam.ServicePrincipal("lambda.alarms.cloudwatch.amazonaws.com"),
            action="lambda:InvokeFunction",
            source_arn=self.idle_alarm.alarm_arn,
            source_account=Stack.of(self).account,
        )
        self.idle_alarm.add_alarm_action(_InvokeFunction(reaper))

        # The reaper deletes TrainStack only when the event's run is the one deployed.
        CfnOutput(self, "Run", value=run_name).override_logical_id(RUN_OUTPUT_KEY)


@jsii.implements(cloudwatch.IAlarmAction)
class _InvokeFunction:
    """Alarm action that invokes a function whose permission was granted in the alarm's stack."""

    def __init__(self, function: aws_lambda.IFunction) -> None:
        self._function = function

    def bind(self, _scope: Construct, _alarm: cloudwatch.IAlarm) -> cloudwatch.AlarmActionConfig:
        return cloudwatch.AlarmActionConfig(alarm_action_arn=self._function.function_arn)


class PreprocessGuard(Construct):
    """Registers the preprocessing instance and volume, and lets the reaper stop/snapshot them."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        reaper: aws_lambda.IFunction,
        instance: ec2.CfnInstance,
        volume: ec2.CfnVolume,
        snapshot_volume: bool,
    ) -> None:
        super().__init__(scope, construct_id)
        Tags.of(self).add("Project", PROJECT)
        stack = Stack.of(self)
        ssm.StringParameter(
            self,
            "Registration",
            parameter_name=PREPROCESS_PARAMETER,
            description="The horovod-fleet preprocessing instance the reaper stops on a new manifest",
            string_value=stack.to_json_string(
                {
                    "instance_id": instance.ref,
                    "volume_id": volume.ref,
                    "snapshot_volume": snapshot_volume,
                }
            ),
        )
        if reaper.role is None:
            raise ValueError("the reaper must have an execution role")
        snapshots = stack.format_arn(
            service="ec2", account="", resource="snapshot", resource_name="*"
        )
        statements = [
            iam.PolicyStatement(
                actions=["ec2:StopInstances"],
                resources=[
                    stack.format_arn(service="ec2", resource="instance", resource_name=instance.ref)
                ],
            )
        ]
        if snapshot_volume:
            statements += [
                iam.PolicyStatement(
                    actions=["ec2:CreateSnapshot"],
                    resources=[
                        stack.format_arn(
                            service="ec2", resource="volume", resource_name=volume.ref
                        ),
                        snapshots,
                    ],
                ),
                iam.PolicyStatement(
                    actions=["ec2:CreateTags"],
                    resources=[snapshots],
                    conditions={"StringEquals": {"ec2:CreateAction": "CreateSnapshot"}},
                ),
            ]
        policy = iam.Policy(self, "ReaperPolicy", statements=statements, roles=[reaper.role])
        if snapshot_volume:
            acknowledge_wildcard_resources(
                policy,
                [snapshots],
                "A snapshot's id is unknown until CreateSnapshot makes it; the volume and the "
                "instance are named exactly, and tagging is limited to CreateSnapshot.",
            )
