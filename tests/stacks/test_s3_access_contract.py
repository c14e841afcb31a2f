"""The preprocessing node's S3 calls against its role's policy, which moto does not enforce.

trainer.preprocess runs in-process against moto as the node runs it (archives in raw/, output
to the dataset prefix); every S3 call it makes is checked against the statements PreprocessStack
grants, the way S3 authorises it: HeadBucket and listings as s3:ListBucket (with the listing's
prefix as s3:prefix, none for HeadBucket), object calls against the object ARNs.
"""

import fnmatch
import os

import boto3
import pytest
from conftest import as_text, statements
from moto import mock_aws

from trainer.preprocess import convert
from trainer.preprocess.__main__ import parse_config
from trainer.preprocess.sample import make_sample

BUCKET = "horovod-fleet-123456789012-us-east-1"
ACTIONS = {
    "ListObjectsV2": "s3:ListBucket",
    "ListObjects": "s3:ListBucket",
    "HeadBucket": "s3:ListBucket",
    "GetObject": "s3:GetObject",
    "HeadObject": "s3:GetObject",
    "PutObject": "s3:PutObject",
    "CreateMultipartUpload": "s3:PutObject",
    "UploadPart": "s3:PutObject",
    "CompleteMultipartUpload": "s3:PutObject",
    "AbortMultipartUpload": "s3:AbortMultipartUpload",
    "DeleteObject": "s3:DeleteObject",
}


def allowed(grants: list[dict], operation: str, params: dict) -> bool:
    """Whether some Allow statement covers the call (no Deny statements are used here)."""
    action = ACTIONS[operation]
    for statement in grants:
        actions = (
            statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        )
        if action not in actions:
            continue
        for resource in (as_text(r) for r in _as_list(statement["Resource"])):
            bucket_and_key = resource.split(":::", 1)[-1]
            if action == "s3:ListBucket":
                if "/" in bucket_and_key:
                    continue
                patterns = statement.get("Condition", {}).get("StringLike", {}).get("s3:prefix")
                if patterns is None:
                    return True
                prefix = None if operation == "HeadBucket" else params.get("Prefix", "")
                if prefix is not None and any(fnmatch.fnmatchcase(prefix, p) for p in patterns):
                    return True
            elif "/" in bucket_and_key:
                key_pattern = bucket_and_key.split("/", 1)[1]
                if fnmatch.fnmatchcase(params["Key"], key_pattern):
                    return True
    return False


def _as_list(value) -> list:
    return value if isinstance(value, list) else [value]


@pytest.fixture
def s3_calls(tmp_path, monkeypatch):
    """Runs the node's preprocessing command against moto; returns (operation, params) of each
    S3 call."""
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    sample = make_sample(str(tmp_path / "raw"), 3, 4, 6)
    calls = []
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        for path in (sample.train_tar, sample.val_tar, sample.val_labels):
            client.upload_file(path, BUCKET, f"raw/{os.path.basename(path)}")
        client.meta.events.register(
            "provide-client-params.s3.*",
            lambda params, model, **_: calls.append((model.name, dict(params))),
        )
        monkeypatch.setattr(convert, "s3_client", lambda: client)
        raw = f"s3://{BUCKET}/raw/"
        args = [
            *("--train-tar", raw + os.path.basename(sample.train_tar)),
            *("--val-tar", raw + os.path.basename(sample.val_tar)),
            *("--val-labels", raw + os.path.basename(sample.val_labels)),
            *("--output", f"s3://{BUCKET}/tfrecords"),
            *("--train-shards", "2", "--val-shards", "1", "--short-side", "64", "--workers", "1"),
        ]
        convert.run(parse_config(args))
    return calls


def test_every_s3_call_of_preprocessing_is_granted(default, s3_calls):
    grants = statements(default["PreprocessStack"], "Preprocessor")
    assert {operation for operation, _ in s3_calls} >= {"ListObjectsV2", "GetObject", "PutObject"}
    denied = [(op, params) for op, params in s3_calls if not allowed(grants, op, params)]
    assert denied == []


def test_the_checker_denies_what_the_policy_does_not_grant(default):
    grants = statements(default["PreprocessStack"], "Preprocessor")
    assert not allowed(grants, "HeadBucket", {"Bucket": BUCKET})
    assert not allowed(grants, "ListObjectsV2", {"Bucket": BUCKET, "Prefix": "runs/"})
    assert not allowed(grants, "PutObject", {"Bucket": BUCKET, "Key": "raw/x.tar"})
    assert allowed(grants, "ListObjectsV2", {"Bucket": BUCKET, "Prefix": "tfrecords/"})
    assert allowed(grants, "GetObject", {"Bucket": BUCKET, "Key": "raw/x.tar"})
