"""TeardownStack: the run controller (run_controller.py), the deploy-time answers
(deploy_answers.py), the preprocessing node's stop, the dead-letter queue and the alarms on
their failures, and the optional budget; nothing here depends on a deployed fleet."""

from aws_cdk import (
    Acknowledgment,
    CrossStackReferences,
    Duration,
    ReferenceStrength,
    Stack,
    Tags,
    Validations,
    aws_lambda,
)
from aws_cdk import aws_budgets as budgets
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from contract.names import PREPROCESS_PARAMETER, PROJECT, PROJECT_TAG
from stacks.nag import acknowledge_wildcard_resources, checkov_reason
from stacks.teardown.deploy_answers import DeployAnswers
from stacks.teardown.failure_mail import addresses, mail_failures
from stacks.teardown.functions import CONTROLLER_CODE, function_role, python_function
from stacks.teardown.guards import FleetGuards
from stacks.teardown.run_controller import RunController

# EventBridge's limits for a rule target: 185 retries, a day of event age. The manifest's event
# is the preprocessing stop's only trigger.
EVENT_RETRIES = 185


class TeardownStack(Stack):
    """The run controller, the deploy-time answers, the preprocessing node's stop, the budget."""

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
        notify_email: str | None = None,
        **kwargs,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        Tags.of(self).add(PROJECT_TAG, PROJECT)
        # What fails after all retries (an asynchronous invocation of the preprocessing stop, the
        # hard cap's schedule that could not invoke the tick) lands here, and its alarm e-mails
        # notifyEmail and budgetEmail (failure_mail.py): a lost trigger is never silent.
        dead_letters = sqs.Queue(
            self,
            "DeadLetters",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=Duration.days(14),
        )
        Validations.of(dead_letters).acknowledge(
            Acknowledgment(
                id="AwsSolutions-SQS3",
                reason="This queue is the triggers' dead-letter queue; its alarm is the next step.",
            )
        )
        checkov_reason(
            dead_letters.node.default_child,
            "CKV_AWS_27",
            "Encrypted at rest with SQS-managed keys (SqsManagedSseEnabled), which checkov does "
            "not count; a KMS key would need grants for EventBridge, Scheduler and Lambda to "
            "deliver dead letters, and a missing grant loses exactly the events this queue keeps.",
        )
        CrossStackReferences.of(dead_letters).produce(ReferenceStrength.STRONG)
        manifest_key = f"{dataset_prefix}manifest.json"
        answers = DeployAnswers(self, "Answers", bucket=bucket, manifest_key=manifest_key)
        controller = RunController(self, "RunController", bucket=bucket)
        stopper = self._preprocess_stop(bucket, manifest_key, dead_letters)
        self.guards = FleetGuards(
            answers_token=answers.service_token,
            answers_role=answers.role,
            tick=controller.tick,
            dead_letters=dead_letters,
            cleanup_token=controller.cleanup_token,
            preprocess_role=stopper.role,
            controller_role=controller.steps_role,
            tick_errors_alarm=controller.tick_errors_alarm,
        )
        if budget_email:
            if not budget_limit_usd > 0:
                raise ValueError(f"budget_limit_usd must be positive, got {budget_limit_usd!r}")
            # The budget mails budgetEmail, and notifyEmail, which hears of everything.
            self._budget(addresses(budget_email, notify_email), budget_limit_usd)
        alarms = [
            *controller.alarms,
            controller.alarm(
                "DeadLettersAlarm",
                "A horovod-fleet trigger was not handled after all retries: a fleet may still "
                "be billing. Check TrainStack, or delete it by hand",
                dead_letters.metric_approximate_number_of_messages_visible(
                    period=Duration.minutes(5), statistic="Maximum"
                ),
            ),
            controller.alarm(
                "PreprocessStopErrorsAlarm",
                "The horovod-fleet preprocessing stop failed; Lambda retries it, then moves "
                "the event to the dead-letter queue",
                stopper.metric_errors(period=Duration.minutes(5), statistic="Sum"),
            ),
        ]
        self._mail(alarms, addresses(notify_email, budget_email))

    def _preprocess_stop(
        self, bucket: s3.IBucket, manifest_key: str, dead_letters: sqs.IQueue
    ) -> aws_lambda.Function:
        """The function that stops the registered preprocessing node when the manifest is
        written; PreprocessGuard grants it that node and volume."""
        role = function_role(
            self,
            "PreprocessStopRole",
            "horovod-fleet: stops the preprocessing node once its manifest is written",
        )
        CrossStackReferences.of(role).produce(ReferenceStrength.STRONG)
        policy = iam.Policy(
            self,
            "PreprocessStopPolicy",
            roles=[role],
            statements=[
                iam.PolicyStatement(
                    actions=["ssm:GetParameter"],
                    resources=[
                        self.format_arn(
                            service="ssm",
                            resource="parameter",
                            resource_name=PREPROCESS_PARAMETER[1:],
                        )
                    ],
                ),
                # Describe calls support no resource-level permissions; they are read-only.
                iam.PolicyStatement(
                    actions=["ec2:DescribeInstances", "ec2:DescribeSnapshots"], resources=["*"]
                ),
            ],
        )
        acknowledge_wildcard_resources(
            policy,
            ["*"],
            "The read-only EC2 Describe calls, which support no resource-level permissions.",
        )
        function = python_function(
            self,
            "PreprocessStop",
            code=CONTROLLER_CODE,
            handler="preprocess.handler",
            role=role,
            description="Stops the horovod-fleet preprocessing node when the manifest is written",
            environment={
                "MANIFEST_KEY": manifest_key,
                "PREPROCESS_PARAMETER": PREPROCESS_PARAMETER,
            },
            # Waiting for the node to stop before its snapshot takes minutes.
            timeout_minutes=15,
            dead_letters=dead_letters,
        )
        events.Rule(
            self,
            "ManifestRule",
            description="Stop the preprocessing node when it wrote the manifest",
            event_pattern=events.EventPattern(
                source=["aws.s3"],
                detail_type=["Object Created"],
                detail={
                    "bucket": {"name": [bucket.bucket_name]},
                    "object": {"key": [manifest_key]},
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
        return function

    def _mail(self, alarms: list[cloudwatch.Alarm], emails: list[str]) -> None:
        """Every alarm on the controller's failures e-mails each address (failure_mail.py; the
        first message asks to confirm the subscription)."""
        if emails:
            mail_failures(self, alarms, emails)

    def _budget(self, emails: list[str], limit_usd: float) -> None:
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
                    # Up to 10 e-mail subscribers a notification (AWS::Budgets::Budget
                    # NotificationWithSubscribers, https://docs.aws.amazon.com/AWSCloudFormation/
                    # latest/UserGuide/aws-properties-budgets-budget-notificationwithsubscribers.html).
                    subscribers=[
                        budgets.CfnBudget.SubscriberProperty(
                            subscription_type="EMAIL", address=email
                        )
                        for email in emails
                    ],
                )
                for kind, threshold in (("ACTUAL", 80), ("FORECASTED", 100))
            ],
        )
