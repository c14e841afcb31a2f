"""Who hears of a failure: the topic every alarm on the run controller's failures publishes to,
and the addresses subscribed to it (notifyEmail, and budgetEmail as before it), in TeardownStack;
and the line synthesis prints when nobody is.

What reports a failure: the run controller's tick failing minute after minute (TickErrorsAlarm),
an execution of its state machine failed or timed out, a trigger left in the dead-letter queue
after every retry, the preprocessing stop failing. An alarm notifies "one or more subscribers by
using an Amazon Simple Notification Service topic" as its action, on its change into ALARM
(https://docs.amazonaws.cn/en_us/AmazonCloudWatch/latest/monitoring/alarm-actions.html;
aws_cloudwatch_actions.SnsAction,
https://docs.aws.amazon.com/cdk/api/v2/python/aws_cdk.aws_cloudwatch_actions/SnsAction.html).
"Email subscriptions require confirmation" (aws_sns_subscriptions.EmailSubscription,
https://docs.amazonaws.cn/cdk/api/v1/dotnet/api/Amazon.CDK.AWS.SNS.Subscriptions.EmailSubscription.html):
the address first gets a link to confirm. The run's own mails (training started, the run ended)
go to TrainStack's topic, which notifyEmail subscribes to (stacks/train/stack.py).
"""

from aws_cdk import Acknowledgment, Stack, Validations
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cloudwatch_actions
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions

from stacks.nag import checkov_reason

TOPIC_ID = "ControllerFailures"


def addresses(notify_email: str | None, budget_email: str | None) -> list[str]:
    """Each address that hears of failures, once: notifyEmail (the one the README offers for
    "mails you"), and budgetEmail, which had them before notifyEmail did."""
    return list(dict.fromkeys(a for a in (notify_email, budget_email) if a))


def mail_note(notify_email: str | None, budget_email: str | None) -> str:
    """What synthesis prints about who hears of failures."""
    if notify_email:
        return (
            f"notifyEmail {notify_email}: mailed when training starts and the run ends, and on "
            "every failure alarm (the run controller's errors, a failed execution, the "
            "dead-letter queue" + (", the budget" if budget_email else "") + "); AWS mails a "
            "confirmation link first"
        )
    if budget_email:
        return (
            f"no notifyEmail: failures mail only budgetEmail {budget_email}, and nobody hears "
            "when training starts or the run ends; -c notifyEmail=you@example.com"
        )
    return (
        "no notifyEmail: failures (the run controller's errors, a failed execution, a lost "
        "trigger) mail nobody; -c notifyEmail=you@example.com"
    )


def mail_failures(scope: Stack, alarms: list[cloudwatch.Alarm], emails: list[str]) -> sns.Topic:
    """An SNS topic that `alarms` publish to on ALARM, each of `emails` subscribed."""
    # The topic's id is the one TeardownStack gave it before this module: no new topic.
    topic = sns.Topic(scope, TOPIC_ID, enforce_ssl=True)
    # enforce_ssl replaces SNS's default topic policy, so CloudWatch is allowed explicitly.
    topic.add_to_resource_policy(
        iam.PolicyStatement(
            actions=["sns:Publish"],
            principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
            resources=[topic.topic_arn],
            conditions={"StringEquals": {"aws:SourceAccount": scope.account}},
        )
    )
    unencrypted = (
        "CloudWatch alarms cannot publish to a topic encrypted with the AWS managed key "
        "aws/sns (https://repost.aws/knowledge-center/cloudwatch-configure-alarm-sns); the "
        "messages carry only alarm names and states."
    )
    Validations.of(topic).acknowledge(Acknowledgment(id="AwsSolutions-SNS2", reason=unencrypted))
    checkov_reason(topic.node.default_child, "CKV_AWS_26", unencrypted)
    for email in emails:
        topic.add_subscription(subscriptions.EmailSubscription(email))
    for alarm in alarms:
        alarm.add_alarm_action(cloudwatch_actions.SnsAction(topic))
    return topic
