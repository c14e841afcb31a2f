"""`horovod-fleet enable-events --bucket NAME`: turn on S3's EventBridge notifications for a
bucket of your own (-c datasetBucket=), keeping every notification it already sends.

PutBucketNotificationConfiguration replaces the bucket's whole configuration: "This action
replaces the existing notification configuration with the configuration you include in the
request body" (https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutBucketNotificationConfiguration.html),
so putting `{"EventBridgeConfiguration": {}}` alone would drop its SNS, SQS and Lambda
notifications. This reads the configuration, adds EventBridge to it and writes it all back. The
destinations already there are not validated again (SkipDestinationValidation): they are the
bucket owner's, unchanged, and a broken one must not keep EventBridge off. S3 offers no
conditional write of the configuration: a change someone else makes between the read and the
write is lost, so run it when nothing else edits the bucket's notifications.
"""

from __future__ import annotations

# The configuration's kinds of notification (GetBucketNotificationConfiguration's answer).
KINDS = (
    "TopicConfigurations",
    "QueueConfigurations",
    "LambdaFunctionConfigurations",
    "EventBridgeConfiguration",
)


def enable_eventbridge(s3, bucket: str) -> str:
    """EventBridge notifications on for `bucket`, every other notification kept; what was done,
    in one line."""
    current = s3.get_bucket_notification_configuration(Bucket=bucket)
    kept = {kind: current[kind] for kind in KINDS if current.get(kind)}
    others = sum(len(kept.get(kind, [])) for kind in KINDS[:3])
    if "EventBridgeConfiguration" in current:
        return f"s3://{bucket} already sends its events to EventBridge; nothing changed"
    s3.put_bucket_notification_configuration(
        Bucket=bucket,
        NotificationConfiguration={**kept, "EventBridgeConfiguration": {}},
        SkipDestinationValidation=True,
    )
    return (
        f"s3://{bucket} now sends its events to EventBridge (the run controller sees DONE.json "
        f"at once); its {others} other notification(s) kept"
    )
