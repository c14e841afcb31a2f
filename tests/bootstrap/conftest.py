"""Fixtures for the bootstrap tests: moto S3 in process, moto as a server with the real s5cmd
(for what a node copies with s5cmd), a stub s5cmd, and node.json documents."""

import os
import stat
import sys
from pathlib import Path

import boto3
import pytest
from bootstrap_helpers import BUCKET, QUICK, deny_missing_keys, train_doc
from moto import mock_aws

from bootstrap import aws
from bootstrap.node_config import parse


@pytest.fixture
def train_config(tmp_path):
    def make(**overrides):
        """A node's node.json (node 0 unless node_index says), or the head's with role="head"."""
        head = overrides.get("role") == "head"
        name = "head" if head else overrides.get("node_index", 0)
        overrides.setdefault("state_dir", str(tmp_path / f"state{name}"))
        overrides.setdefault("authorized_keys_file", str(tmp_path / "authorized_keys"))
        overrides.setdefault("log_dir", str(tmp_path / "logs"))
        doc = train_doc(**overrides)
        if head:
            del doc["node_index"]
        return parse(doc)

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
def endpoint(monkeypatch, moto_endpoint):
    url = moto_endpoint
    for name, value in {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "t",
                        "AWS_SECRET_ACCESS_KEY": "t", "AWS_DEFAULT_REGION": "us-east-1",
                        "AWS_REGION": "us-east-1"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    monkeypatch.setattr(aws, "STEP_POLICY", QUICK)
    s3 = boto3.client("s3", endpoint_url=url, region_name="us-east-1")
    s3.create_bucket(Bucket=BUCKET)
    return s3


@pytest.fixture
def fake_s5cmd(tmp_path, monkeypatch):
    """Put an s5cmd running `body` (bash) first on PATH."""

    def install(body: str) -> None:
        exe = tmp_path / "bin" / "s5cmd"
        exe.parent.mkdir(exist_ok=True)
        exe.write_text(f"#!/usr/bin/env bash\n{body}\n")
        exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
        monkeypatch.setenv("PATH", f"{exe.parent}:{os.environ['PATH']}")

    return install


@pytest.fixture(autouse=True)
def s3_reachability(monkeypatch):
    """Each test starts with a node that never missed S3 (the record is the process's)."""
    fresh = aws.S3Reachability()
    monkeypatch.setattr(aws, "S3_REACHABILITY", fresh)
    return fresh
