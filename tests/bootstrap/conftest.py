"""Fixtures for the bootstrap tests: moto S3 (in process or as a server) and node.json documents."""

import urllib.request

import boto3
import pytest
from bootstrap_helpers import BUCKET, deny_missing_keys, train_doc
from moto import mock_aws
from moto.server import ThreadedMotoServer

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


@pytest.fixture
def moto_endpoint():
    """A moto server for processes the test starts (s5cmd, node scripts), on an empty account:
    moto keeps its state per process, across servers and mock_aws."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    urllib.request.urlopen(urllib.request.Request(f"{url}/moto-api/reset", method="POST"))
    yield url
    server.stop()
