"""The rehearsal's IAM-judged S3 (rehearsal/iam_s3.py): policy evaluation, the S3 action of each
request, and the proxy in front of a moto server answering as S3 would."""

import socket
import time

import boto3
import pytest
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import ClientError, ConnectionClosedError, EndpointConnectionError

from rehearsal import iam_s3

BUCKET = "horovod-fleet-rehearsal"
ARN = f"arn:aws:s3:::{BUCKET}"
# The shape TrainStack synthesizes for its nodes' role (stacks/train/fleet.py), resolved.
NODE = [
    {"Effect": "Allow", "Action": "s3:GetObject", "Resource": [f"{ARN}/tfrecords/*"]},
    {"Effect": "Allow", "Action": ["s3:AbortMultipartUpload", "s3:GetObject", "s3:PutObject"],
     "Resource": f"{ARN}/runs/r1/*"},
    {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": ARN,
     "Condition": {"StringLike": {"s3:prefix": ["tfrecords/*", "runs/r1/*"]}}},
]  # fmt: skip


def test_prefix_conditions_and_wildcards():
    assert iam_s3.allowed(NODE, "s3:GetObject", f"{ARN}/tfrecords/train-0", {})
    assert iam_s3.allowed(NODE, "S3:getobject", f"{ARN}/runs/r1/DONE.json", {})
    assert not iam_s3.allowed(NODE, "s3:GetObject", f"{ARN}/runs/r2/DONE.json", {})
    assert not iam_s3.allowed(NODE, "s3:PutObject", f"{ARN}/tfrecords/train-0", {})
    assert iam_s3.allowed(NODE, "s3:ListBucket", ARN, {"s3:prefix": "runs/r1/nodes/"})
    assert not iam_s3.allowed(NODE, "s3:ListBucket", ARN, {"s3:prefix": "runs/"})
    assert not iam_s3.allowed(NODE, "s3:ListBucket", ARN, {})  # no prefix: the condition fails
    deny = {"Effect": "Deny", "Action": "s3:*", "Resource": f"{ARN}/runs/r1/DONE.json"}
    assert not iam_s3.allowed([*NODE, deny], "s3:GetObject", f"{ARN}/runs/r1/DONE.json", {})


def test_the_action_each_request_needs():
    def actions(method, path, query="", headers=None, body=b""):
        parsed = iam_s3.urllib.parse.parse_qs(query, keep_blank_values=True)
        return iam_s3.s3_actions(method, path, parsed, headers or {}, body)

    assert actions("GET", f"/{BUCKET}", "list-type=2&prefix=runs%2Fr1%2F") == [
        ("s3:ListBucket", ARN, {"s3:prefix": "runs/r1/"})
    ]
    assert actions("HEAD", f"/{BUCKET}/tfrecords/a")[0][:2] == (
        "s3:GetObject",
        f"{ARN}/tfrecords/a",
    )
    assert actions("POST", f"/{BUCKET}/runs/r1/m", "uploads")[0][0] == "s3:PutObject"
    assert actions("DELETE", f"/{BUCKET}/k", "uploadId=x")[0][0] == "s3:AbortMultipartUpload"
    copy = actions("PUT", f"/{BUCKET}/runs/r1/b", headers={"x-amz-copy-source": f"/{BUCKET}/raw/a"})
    assert copy == [("s3:PutObject", f"{ARN}/runs/r1/b", {}), ("s3:GetObject", f"{ARN}/raw/a", {})]
    body = (
        b"<Delete><Object><Key>runs/r1/a</Key></Object><Object><Key>raw/b</Key></Object></Delete>"
    )
    assert [r for _, r, _ in actions("POST", f"/{BUCKET}", "delete", body=body)] == [
        f"{ARN}/runs/r1/a",
        f"{ARN}/raw/b",
    ]


def test_intrinsics_resolve_to_the_rehearsal_account():
    joined = {"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, ":s3:::b/runs/*"]]}
    assert iam_s3.resolve(joined, "us-east-1") == "arn:aws:s3:::b/runs/*"
    template = {"Resources": {
        "FleetPolicy1": {"Type": "AWS::IAM::Policy", "Properties": {
            "Roles": [{"Ref": "FleetRole427BC000"}],
            "PolicyDocument": {"Statement": [{"Effect": "Allow", "Action": "s3:GetObject",
                                              "Resource": joined}]}}},
        "RunControllerStepsRolePolicy": {"Type": "AWS::IAM::Policy", "Properties": {
            "Roles": [{"Ref": "RunControllerStepsRole213F541B"}],
            "PolicyDocument": {"Statement": [{"Effect": "Allow", "Action": "ec2:StopInstances",
                                              "Resource": "*"}]}}},
    }}  # fmt: skip
    statements = iam_s3.role_statements([template], "us-east-1")
    assert statements["node"][0]["Resource"] == "arn:aws:s3:::b/runs/*"
    assert statements["controller"][0]["Action"] == "ec2:StopInstances"
    assert statements["preprocessor"] == []


@pytest.fixture
def proxy(moto_endpoint, tmp_path):
    host, port = moto_endpoint.removeprefix("http://").split(":")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        listen = probe.getsockname()[1]
    broad = [*NODE, {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": ARN}]
    judge = iam_s3.IamS3Proxy(
        ("127.0.0.1", listen),
        (host, int(port)),
        {"node": NODE, "controller": broad},
        tmp_path / "refusals.log",
    )
    judge.start()
    yield f"http://127.0.0.1:{listen}", judge
    judge.stop()


def client(endpoint: str, key: str):
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id=key, aws_secret_access_key="x")  # fmt: skip


def code(call) -> str:
    with pytest.raises(ClientError) as raised:
        call()
    return raised.value.response["Error"]["Code"]


def test_the_proxy_answers_as_s3_does_for_each_role(proxy, tmp_path):
    endpoint, judge = proxy
    admin, node, controller = (client(endpoint, k) for k in ("rehearsal", "node", "controller"))
    admin.create_bucket(Bucket=BUCKET)
    admin.put_object(Bucket=BUCKET, Key="tfrecords/train-0", Body=b"x" * 1000)
    admin.put_object(Bucket=BUCKET, Key="raw/train.tar", Body=b"tar")
    assert node.get_object(Bucket=BUCKET, Key="tfrecords/train-0")["Body"].read() == b"x" * 1000
    assert node.head_object(Bucket=BUCKET, Key="tfrecords/train-0")["ContentLength"] == 1000
    assert code(lambda: node.get_object(Bucket=BUCKET, Key="raw/train.tar")) == "AccessDenied"
    assert code(lambda: node.put_object(Bucket=BUCKET, Key="tfrecords/x", Body=b"")) == (
        "AccessDenied"
    )
    # A missing key the role may read: 403 without an unconditioned ListBucket, else 404.
    assert code(lambda: node.get_object(Bucket=BUCKET, Key="runs/r1/DONE.json")) == "AccessDenied"
    assert (
        code(lambda: controller.get_object(Bucket=BUCKET, Key="runs/r1/DONE.json")) == "NoSuchKey"
    )
    listed = node.list_objects_v2(Bucket=BUCKET, Prefix="tfrecords/")
    assert [o["Key"] for o in listed["Contents"]] == ["tfrecords/train-0"]
    assert code(lambda: node.list_objects_v2(Bucket=BUCKET, Prefix="raw/")) == "AccessDenied"
    # A multipart upload inside the role's prefix goes through, part by part.
    big = tmp_path / "ckpt.data"
    big.write_bytes(b"c" * (6 * 1024 * 1024))
    small_parts = TransferConfig(multipart_threshold=5 * 1024 * 1024)
    node.upload_file(str(big), BUCKET, "runs/r1/model/ckpt.data", Config=small_parts)
    assert admin.head_object(Bucket=BUCKET, Key="runs/r1/model/ckpt.data")["ContentLength"] == (
        6 * 1024 * 1024
    )
    assert judge.refusals == [
        f"IAM: role node may not s3:GetObject on {ARN}/raw/train.tar",
        f"IAM: role node may not s3:PutObject on {ARN}/tfrecords/x",
        f"IAM: role node may not s3:ListBucket on {ARN} with s3:prefix 'raw/'",
    ]
    assert (tmp_path / "refusals.log").read_text().count("\n") == 3


def test_a_cut_drops_the_subnet_s_s3_requests_and_lets_another_service_through(proxy):
    """The drill's S3 cut (FIS disrupt-connectivity, scope s3): S3 requests from the fleet's
    addresses go unanswered until the cut ends, the kept address's are answered; a request of
    another service (the head's FIS calls) is neither cut nor judged as S3."""
    endpoint, judge = proxy
    admin = client(endpoint, "rehearsal")
    admin.create_bucket(Bucket=BUCKET)
    once = Config(retries={"total_max_attempts": 1}, read_timeout=10)
    node = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id="node", aws_secret_access_key="x", config=once)  # fmt: skip
    fis = boto3.client("fis", endpoint_url=endpoint, region_name="us-east-1",
                       aws_access_key_id="node", aws_secret_access_key="x", config=once)  # fmt: skip
    judge.cut(keep={"127.0.0.9"}, seconds=1.5)
    began = time.monotonic()
    assert fis.list_experiments()["experiments"] == []  # answered at once, as FIS
    assert time.monotonic() - began < 1.0
    with pytest.raises((ConnectionClosedError, EndpointConnectionError)):
        node.list_objects_v2(Bucket=BUCKET, Prefix="runs/r1/")
    assert time.monotonic() - began >= 1.4  # held to the cut's end, then dropped
    assert node.list_objects_v2(Bucket=BUCKET, Prefix="runs/r1/")["KeyCount"] == 0
    judge.cut(keep={"127.0.0.1"}, seconds=30)  # an address outside the subnet
    assert node.list_objects_v2(Bucket=BUCKET, Prefix="runs/r1/")["KeyCount"] == 0
    assert judge.refusals == []
