"""DatasetBucket: the versioned, encrypted bucket for raw archives, TFRecords and runs."""

from aws_cdk import Acknowledgment, Aws, Duration, RemovalPolicy, Validations
from aws_cdk import aws_s3 as s3
from constructs import Construct

from stacks.nag import checkov_reason

# Pinned: CloudFormation replaces (and so empties) a bucket whose logical ID changes.
BUCKET_LOGICAL_ID = "DatasetBucket"
ACCESS_LOG_BUCKET_LOGICAL_ID = "DatasetAccessLogBucket"


def default_bucket_name(region: str) -> str:
    """The bucket's name when DatasetStack creates it. Derived from account and region, so every
    stack finds the bucket by name: no cross-stack export ties them together."""
    return f"horovod-fleet-{Aws.ACCOUNT_ID}-{region}"


class DatasetBucket(Construct):
    """Versioned, encrypted, private, SSL-only bucket with server access logs, kept on delete."""

    def __init__(self, scope: Construct, construct_id: str, *, bucket_name: str) -> None:
        super().__init__(scope, construct_id)
        common = {
            "encryption": s3.BucketEncryption.S3_MANAGED,
            "block_public_access": s3.BlockPublicAccess.BLOCK_ALL,
            "enforce_ssl": True,
            "removal_policy": RemovalPolicy.RETAIN,
        }
        access_logs = s3.Bucket(
            self,
            "AccessLogs",
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            lifecycle_rules=[s3.LifecycleRule(expiration=Duration.days(365))],
            **common,
        )
        access_logs.node.default_child.override_logical_id(ACCESS_LOG_BUCKET_LOGICAL_ID)
        for check_id, reason in (
            ("CKV_AWS_18", "This is the access-log bucket itself; logging it into itself loops."),
            (
                "CKV_AWS_21",
                "S3 log delivery writes each access log once and the lifecycle expires it after "
                "a year; versions would only keep expired logs.",
            ),
        ):
            checkov_reason(access_logs.node.default_child, check_id, reason)
        Validations.of(access_logs).acknowledge(
            Acknowledgment(
                id="AwsSolutions-S1",
                reason="This is the access-log bucket itself; logging it into itself would loop.",
            )
        )
        self.bucket = s3.Bucket(
            self,
            "Bucket",
            bucket_name=bucket_name,
            versioned=True,
            server_access_logs_bucket=access_logs,
            server_access_logs_prefix="dataset/",
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="AbortIncompleteUploads",
                    abort_incomplete_multipart_upload_after=Duration.days(7),
                ),
                # Versions protect against an overwrite or delete by mistake for a month; keeping
                # them forever would double the bill for every re-preprocessed dataset.
                s3.LifecycleRule(
                    id="ExpireOldVersions", noncurrent_version_expiration=Duration.days(30)
                ),
            ],
            **common,
        )
        cfn_bucket: s3.CfnBucket = self.bucket.node.default_child
        cfn_bucket.override_logical_id(BUCKET_LOGICAL_ID)
        # TeardownStack's rules react to DONE.json and manifest.json through EventBridge. Set on
        # the bucket itself: event_bridge_enabled=True would add a custom-resource Lambda.
        cfn_bucket.notification_configuration = s3.CfnBucket.NotificationConfigurationProperty(
            event_bridge_configuration=s3.CfnBucket.EventBridgeConfigurationProperty(
                event_bridge_enabled=True
            )
        )
