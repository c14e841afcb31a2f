"""Fixtures for the bootstrap tests: moto S3 in process and node.json documents (a moto server: tests/conftest.py)."""

import boto3
import pytest
from bootstrap_helpers import BUCKET, deny_missing_keys, train_doc
from moto import mock_aws

from bootstrap import aws
from bootstrap.node_config import parse


@pytest.fixture
def train_config(tmp_path):
    def make(**overrides):
        overrides.setdefault("state_dir", str(tmp_path / f"state{overrides.get('node_index', 0)}"))
        overrides.setdefault("authorized_keys_file", str(tmp_path / "authorized_keys"))
        overrides.setdefault("log_dir", str(tmp_path / "logs"))
        return parse(train_doc(**overrides))

    return make


@pytest.fixture
def s3(monkeypatch):
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        deny_missing_keys(client)  # every node-side test sees S3 as the node role does
        yield client


@pytest.fixture(autouse=True)
def s3_reachability(monkeypatch):
    """Each test starts with a node that never missed S3 (the record is the process's)."""
    fresh = aws.S3Reachability()
    monkeypatch.setattr(aws, "S3_REACHABILITY", fresh)
    return fresh
