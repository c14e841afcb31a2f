"""DatasetStack: the bucket that must never lose data."""

from aws_cdk.assertions import Match

from stacks.dataset.bucket import ACCESS_LOG_BUCKET_LOGICAL_ID, BUCKET_LOGICAL_ID


def bucket(default) -> dict:
    return default["DatasetStack"].to_json()["Resources"][BUCKET_LOGICAL_ID]


def test_stateful_logical_ids_are_pinned(default):
    assert BUCKET_LOGICAL_ID == "DatasetBucket"
    assert ACCESS_LOG_BUCKET_LOGICAL_ID == "DatasetAccessLogBucket"
    resources = default["DatasetStack"].to_json()["Resources"]
    assert resources["DatasetBucket"]["Type"] == "AWS::S3::Bucket"
    assert resources["DatasetAccessLogBucket"]["Type"] == "AWS::S3::Bucket"


def test_bucket_is_retained_versioned_encrypted_and_private(default):
    resource = bucket(default)
    assert resource["DeletionPolicy"] == "Retain"
    assert resource["UpdateReplacePolicy"] == "Retain"
    props = resource["Properties"]
    assert props["VersioningConfiguration"] == {"Status": "Enabled"}
    [rule] = props["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    assert rule["ServerSideEncryptionByDefault"]["SSEAlgorithm"] == "AES256"
    assert props["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True,
        "BlockPublicPolicy": True,
        "IgnorePublicAcls": True,
        "RestrictPublicBuckets": True,
    }
    assert props["LoggingConfiguration"]["DestinationBucketName"] == {
        "Ref": ACCESS_LOG_BUCKET_LOGICAL_ID
    }


def test_bucket_sends_events_to_eventbridge_without_a_custom_resource(default):
    props = bucket(default)["Properties"]
    assert props["NotificationConfiguration"] == {
        "EventBridgeConfiguration": {"EventBridgeEnabled": True}
    }
    assert not default["DatasetStack"].find_resources("AWS::Lambda::Function")


def test_incomplete_uploads_are_aborted(default):
    rules = bucket(default)["Properties"]["LifecycleConfiguration"]["Rules"]
    assert any(r.get("AbortIncompleteMultipartUpload") == {"DaysAfterInitiation": 7} for r in rules)


def test_bucket_policy_denies_plain_http(default):
    default["DatasetStack"].has_resource_properties(
        "AWS::S3::BucketPolicy",
        {
            "Bucket": {"Ref": BUCKET_LOGICAL_ID},
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [
                        Match.object_like(
                            {
                                "Effect": "Deny",
                                "Action": "s3:*",
                                "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                            }
                        )
                    ]
                )
            },
        },
    )


def test_bucket_name_is_derived_from_account_and_region(default):
    name = bucket(default)["Properties"]["BucketName"]
    assert name == {"Fn::Join": ["", ["horovod-fleet-", {"Ref": "AWS::AccountId"}, "-us-east-1"]]}


def test_an_imported_bucket_creates_no_dataset_stack(synth):
    templates = synth(datasetBucket="my-imagenet")
    assert "DatasetStack" not in templates
    assert not templates["TrainStack"].find_resources("AWS::S3::Bucket")
    text = str(templates["TrainStack"].to_json())
    assert "my-imagenet/runs/resnet50-1/*" in text
