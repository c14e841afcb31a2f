"""TeardownStack: the reaper Lambda, the S3 rules that invoke it, its re-check role, the alarms
on its failures and the optional budget; nothing here depends on a deployed fleet."""

from pathlib import Path

from aws_cdk import (
    Acknowledgment,
    ArnFormat,
    CrossStackReferences,
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
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from stacks.nag import acknowledge_wildcard_resources, checkov_reason
from stacks.node_code import PROJECT
from stacks.teardown.deploy_answers import DeployAnswers
from stacks.teardown.guards import FleetGuards
from stacks.teardown.names import (
    FLEET_TAG,
    IDLE_ALARM_PREFIX,
    IDLE_MINUTES,
    NOTIFY_TOPIC_PREFIX,
    PREPROCESS_PARAMETER,
    RUN_OUTPUT_KEY,
    TRAIN_STACK_NAME,
)

RECHECK_SCHEDULE_PREFIX = "horovod-fleet-recheck-"
RECHECK_MINUTES = 10
# An idle fleet is deleted no sooner than this after TrainStack finished deploying: the nodes get
# the rendezvous timeout (stacks/train/fleet.py, 30 minutes) to meet, then 10 minutes for the
# allreduce check and the trainer's start. A fleet that is still not training is deleted then,
# within 45 minutes of launch plus the rendezvous timeout.
LAUNCH_GRACE_MINUTES = 40
# EventBridge's limits for a rule target: 185 retries, a day of event age.
EVENT_RETRIES = 185
REAPER_CODE = Path(__file__).parent / "reaper"


class TeardownStack(Stack):
    """The reaper, the S3 completion rules, the re-check role and the optional budget."""

    reaper: aws_lambda.Function
    guards: FleetGuards

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
        manifest_key = f"{dataset_prefix}manifest.json"
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
                "MANIFEST_KEY": manifest_key,
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
        answers = DeployAnswers(self, "Answers", bucket=bucket, manifest_key=manifest_key)
        self.guards = FleetGuards(
            answers_token=answers.service_token, answers_role=answers.role, reaper=function
        )
        recheck_role.add_to_policy(
            iam.PolicyStatement(
                actions=["lambda:InvokeFunction"], resources=[function.function_arn]
            )
        )
        dead_letters.grant_send_messages(recheck_role)
        self._grant_reaper(role, log_group, bucket, recheck_role)

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
        self,
        role: iam.Role,
        log_group: logs.LogGroup,
        bucket: s3.IBucket,
        recheck_role: iam.Role,
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
        # The run controller's record of each attempt, and the status it says "relaunching" in.
        attempts_objects_arn = bucket.arn_for_objects("runs/*/attempts.json")
        status_objects_arn = bucket.arn_for_objects("runs/*/status.json")
        train_instances_arn = self.format_arn(service="ec2", resource="instance", resource_name="*")
        launch_templates_arn = self.format_arn(
            service="ec2", resource="launch-template", resource_name="*"
        )
        # CloudFormation names the nodes' role after the stack: TrainStack-FleetRole...
        train_roles_arn = self.format_arn(
            service="iam", region="", resource="role", resource_name=f"{TRAIN_STACK_NAME}-*"
        )
        train_resources = {
            kind: self.format_arn(service="ec2", resource=kind, resource_name="*")
            for kind in ("vpc", "route-table", "subnet", "placement-group")
        }
        # What CloudFormation made for TrainStack: its own tag names the stack, and no one else
        # can set an aws: tag.
        train_stack_tagged = {
            "StringEquals": {
                "aws:ResourceTag/aws:cloudformation:stack-name": TRAIN_STACK_NAME,
                "aws:ResourceTag/Project": PROJECT,
            }
        }
        fleet_actions = [
            "ec2:TerminateInstances",
            # The run controller's relaunch: a stop and start moves each node to healthy
            # hardware with empty instance stores and keeps its address.
            "ec2:StopInstances",
            "ec2:StartInstances",
        ]
        notify_topics_arn = self.format_arn(
            service="sns", resource=f"{NOTIFY_TOPIC_PREFIX}*", arn_format=ArnFormat.NO_RESOURCE_NAME
        )
        statements = [
            iam.PolicyStatement(
                actions=["logs:CreateLogStream", "logs:PutLogEvents"],
                resources=[log_group.log_group_arn],
            ),
            iam.PolicyStatement(
                actions=[
                    "cloudformation:DescribeStacks",
                    "cloudformation:DescribeStackEvents",
                    # Which instances the fleet has, before a relaunch stops and starts them.
                    "cloudformation:DescribeStackResources",
                    "cloudformation:DeleteStack",
                ],
                resources=[train_stack_arn],
            ),
            iam.PolicyStatement(
                actions=["s3:ListBucket"],
                resources=[bucket.bucket_arn],
                conditions={"StringLike": {"s3:prefix": ["runs/*"]}},
            ),
            iam.PolicyStatement(
                actions=["s3:GetObject"],
                resources=[
                    done_objects_arn,
                    attempts_objects_arn,
                    status_objects_arn,
                ],
            ),
            # A relaunch records the attempt, says so in status.json and removes DONE.json,
            # which would end the next attempt's members as soon as they start.
            iam.PolicyStatement(
                actions=["s3:PutObject"], resources=[attempts_objects_arn, status_objects_arn]
            ),
            iam.PolicyStatement(actions=["s3:DeleteObject"], resources=[done_objects_arn]),
            # A relaunch that found no capacity in any zone ends the run with the DONE.json its
            # attempt never wrote (reaper/handler.py give_up).
            iam.PolicyStatement(actions=["s3:PutObject"], resources=[done_objects_arn]),
            iam.PolicyStatement(
                actions=["cloudwatch:DescribeAlarms"],
                resources=[alarms_arn],
            ),
            iam.PolicyStatement(
                actions=["scheduler:CreateSchedule"],
                resources=[recheck_schedules_arn],
            ),
            iam.PolicyStatement(actions=["iam:PassRole"], resources=[recheck_role.role_arn]),
            # The run's -c notifyEmail topic, told when the guard ends a fleet.
            iam.PolicyStatement(actions=["sns:Publish"], resources=[notify_topics_arn]),
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
                actions=[
                    "ec2:DescribeInstances",
                    "ec2:DescribeSnapshots",
                    # A zone move finds its subnets and the templates' versions.
                    "ec2:DescribeSubnets",
                    "ec2:DescribeRouteTables",
                    "ec2:DescribeLaunchTemplateVersions",
                ],
                resources=["*"],
            ),
            # After a failed delete of TrainStack, its leftover instances; CloudFormation's own
            # tag names the stack, and no one else can set an aws: tag.
            iam.PolicyStatement(
                actions=fleet_actions,
                resources=[train_instances_arn],
                conditions=train_stack_tagged,
            ),
            # The same for the replacements the run controller launched, which carry TrainStack's
            # id in the fleet's tag (their launch templates set it).
            iam.PolicyStatement(
                actions=fleet_actions,
                resources=[train_instances_arn],
                conditions={
                    "StringLike": {f"aws:ResourceTag/{FLEET_TAG}": train_stack_arn},
                    "StringEquals": {"aws:ResourceTag/Project": PROJECT},
                },
            ),
            # A replacement is launched from TrainStack's replacement template alone: nothing of
            # the template may be overridden (ec2:IsLaunchTemplateResource), and only templates
            # tagged as TrainStack's may be used. AWS's example policy "launch instances only
            # from a specific launch template", with the tagging it needs:
            # https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ExamplePolicies_EC2.html
            iam.PolicyStatement(
                actions=["ec2:RunInstances"],
                resources=["*"],
                conditions={
                    "ArnLike": {"ec2:LaunchTemplate": launch_templates_arn},
                    "Bool": {"ec2:IsLaunchTemplateResource": "true"},
                },
            ),
            iam.PolicyStatement(
                effect=iam.Effect.DENY,
                actions=["ec2:RunInstances"],
                resources=[launch_templates_arn],
                conditions={"StringNotLike": {f"aws:ResourceTag/{FLEET_TAG}": train_stack_arn}},
            ),
            iam.PolicyStatement(
                actions=["ec2:CreateTags"],
                resources=[
                    self.format_arn(service="ec2", resource=kind, resource_name="*")
                    for kind in ("instance", "volume", "network-interface")
                ],
                conditions={"StringEquals": {"ec2:CreateAction": "RunInstances"}},
            ),
            # The run controller's zone move (reaper/zone_move.py): in TrainStack's VPC, a subnet
            # routed by TrainStack's fleet route table and a cluster placement group, both made
            # only with the fleet's tag naming TrainStack and deleted only when so tagged, and a
            # version of TrainStack's replacement templates that names them. Condition keys:
            # https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazonec2.html
            iam.PolicyStatement(
                actions=[
                    "ec2:CreateSubnet",
                    "ec2:AssociateRouteTable",
                    "ec2:DisassociateRouteTable",
                ],
                resources=[train_resources["vpc"], train_resources["route-table"]],
                conditions=train_stack_tagged,
            ),
            iam.PolicyStatement(
                actions=["ec2:CreateSubnet", "ec2:CreatePlacementGroup"],
                resources=[train_resources["subnet"], train_resources["placement-group"]],
                conditions={"StringLike": {f"aws:RequestTag/{FLEET_TAG}": train_stack_arn}},
            ),
            iam.PolicyStatement(
                actions=["ec2:CreateTags"],
                resources=[train_resources["subnet"], train_resources["placement-group"]],
                conditions={
                    "StringEquals": {"ec2:CreateAction": ["CreateSubnet", "CreatePlacementGroup"]}
                },
            ),
            iam.PolicyStatement(
                actions=[
                    "ec2:AssociateRouteTable",
                    "ec2:DisassociateRouteTable",
                    "ec2:DeleteSubnet",
                    "ec2:DeletePlacementGroup",
                ],
                resources=[train_resources["subnet"], train_resources["placement-group"]],
                conditions={"StringLike": {f"aws:ResourceTag/{FLEET_TAG}": train_stack_arn}},
            ),
            iam.PolicyStatement(
                actions=["ec2:CreateLaunchTemplateVersion"],
                resources=[launch_templates_arn],
                conditions={"StringLike": {f"aws:ResourceTag/{FLEET_TAG}": train_stack_arn}},
            ),
            # The nodes' role, named in the replacement templates' instance profile.
            iam.PolicyStatement(
                actions=["iam:PassRole"],
                resources=[train_roles_arn],
                conditions={"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}},
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
                attempts_objects_arn,
                status_objects_arn,
                train_instances_arn,
                launch_templates_arn,
                train_roles_arn,
                *train_resources.values(),
                *(
                    self.format_arn(service="ec2", resource=kind, resource_name="*")
                    for kind in ("volume", "network-interface")
                ),
                notify_topics_arn,
                "*",
            ],
            "The wildcards are the stack-id suffix of TrainStack, the reaper's own re-check "
            "schedules by name prefix, the run name in runs/<run>/DONE.json (read to learn "
            "whether a run failed, deleted before a relaunch), attempts.json and status.json "
            "(the run controller's record), TrainStack's instances (stopped, started or "
            "terminated only with CloudFormation's stack-name tag TrainStack, or the fleet's tag "
            "holding TrainStack's id, and Project=horovod-fleet: a relaunch, or after a failed "
            "delete), RunInstances only from a launch template tagged as TrainStack's and "
            "with none of its resources overridden (a node's replacement), tags only at "
            "RunInstances, a zone move's subnet and placement group (created only with the "
            "fleet's tag naming TrainStack, in TrainStack's own VPC and route table, deleted "
            "only when so tagged) and its launch template versions (only of TrainStack's "
            "templates), PassRole only of TrainStack's roles and only to EC2, the runs' notification topics by name prefix, read-only DescribeAlarms on the region's alarms (CloudWatch may "
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
