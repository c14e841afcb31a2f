"""The run's mail (-c notifyEmail) when the run controller ends, relaunches or moves its fleet.
Only boto3, the standard library and contract/: part of the run controller's Lambda asset.
"""

from botocore.exceptions import ClientError

from controller.clients import client, log


def notify(stack: dict, run: str, what: str) -> None:
    """Mail the run's notification topic, when it has one; a mail that cannot be sent never
    stops the controller."""
    if not stack.get("notify_topic"):
        return
    try:
        client("sns").publish(
            TopicArn=stack["notify_topic"],
            Subject=f"horovod-fleet: run {run} stopped by its guard"[:100],
            Message=f"Run {run} {what}. Its checkpoints and logs are in S3 under runs/{run}/.",
        )
        log("notified", run=run, topic=stack["notify_topic"])
    except ClientError as error:
        log("notify-failed", run=run, error=str(error))
