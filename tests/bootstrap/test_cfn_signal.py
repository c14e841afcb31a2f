"""CloudFormation signalling: UniqueId is the instance id, a refused second signal is not fatal.

.venv/bin/python -m pytest tests/bootstrap/test_cfn_signal.py
"""

import boto3
import pytest
from bootstrap_helpers import train_doc
from botocore.stub import Stubber

from bootstrap import aws
from bootstrap.node_config import parse


@pytest.fixture
def cloudformation(monkeypatch):
    client = boto3.client(
        "cloudformation", region_name="us-east-1", aws_access_key_id="t", aws_secret_access_key="t"
    )
    monkeypatch.setattr(aws, "client", lambda service, region: client)
    with Stubber(client) as stub:
        yield stub


def signalled_cfg():
    return parse(train_doc(signal={"stack": "TrainStack", "resource": "Node1"}, instance_id="i-1"))


def test_signal_uses_the_instance_id(cloudformation):
    cloudformation.add_response(
        "signal_resource",
        {},
        {"StackName": "TrainStack", "LogicalResourceId": "Node1", "UniqueId": "i-1",
         "Status": "FAILURE"},
    )  # fmt: skip
    message = aws.signal_cloudformation(signalled_cfg(), False, "no GPUs")
    assert message == "signalled FAILURE to TrainStack/Node1: no GPUs"
    cloudformation.assert_no_pending_responses()


def test_refused_signal_is_reported_not_raised(cloudformation):
    cloudformation.add_client_error("signal_resource", "ValidationError", "already signalled")
    assert "refused the SUCCESS signal" in aws.signal_cloudformation(signalled_cfg(), True, "ok")


def test_no_signal_configured():
    assert aws.signal_cloudformation(parse(train_doc()), True, "ok") == (
        "no CloudFormation signal configured"
    )
