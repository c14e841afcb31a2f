"""Helpers shared by the bootstrap tests (a unique module name: tests/trainer has a conftest too)."""

import json
import struct
from pathlib import Path

from bootstrap import aws

BUCKET = "fleet-data"
# S3 calls that give up within 2 s: a test's outage or missing file fails fast.
QUICK = aws.RetryPolicy(budget_s=2, first_delay_s=0.01, max_delay_s=0.05, note_every_s=0.5)


def train_doc(**overrides) -> dict:
    doc = {
        "role": "train",
        "region": "us-east-1",
        "bucket": BUCKET,
        "log_group": None,
        "project": "horovod-fleet",
        "signal": None,
        "run": "r1",
        "node_index": 0,
        "nodes": 2,
        "gpus_per_node": 8,
        "instance_type": "p4d.24xlarge",
        "efa": True,
        "dataset_prefix": "tfrecords/",
        "runs_prefix": "runs/r1/",
        "rendezvous_timeout_s": 30,
        "trainer": {"epochs": 2, "batch_per_gpu": 256, "arch": "resnet50", "image_size": 224},
        "metrics": {"namespace": "HorovodFleet", "dimension": {"Run": "r1"}},
        "image": {
            "manifest": "/opt/horovod-fleet/image.json",
            "ami": "ami-0123456789abcdef0",
            "tensorflow": "2.15.1",
            "horovod": "0.28.1",
        },
        "poll_interval_s": 1,
    }
    doc.update(overrides)
    return doc


def write_tfrecord(path, records):
    """TFRecord framing with dummy CRCs: verification counts records, it does not parse them."""
    with path.open("wb") as f:
        for data in records:
            f.write(struct.pack("<Q", len(data)) + b"\0" * 4 + data + b"\0" * 4)


def cpu_image_json(path: Path) -> str:
    """An image.json of a CPU node, as the rehearsal writes it; returns its path for node.json."""
    path.write_text(
        json.dumps(
            {
                "format": "horovod-fleet/image/1",
                "recipe_sha256": "c" * 64,
                "versions": {"python": "3.11.7", "tensorflow": "2.15.1", "horovod": "0.28.1"},
                "horovod_build": {"TensorFlow": True, "Gloo": True, "MPI": False, "NCCL": False},
            }
        )
    )
    return str(path)


def deny_missing_keys(s3) -> None:
    """Make a moto client answer as S3 answers a node: a GET or HEAD of a missing key is 403
    AccessDenied, not 404, because the node role's s3:ListBucket is conditioned on s3:prefix
    (https://docs.aws.amazon.com/AmazonS3/latest/API/API_GetObject.html, "Permissions": without
    s3:ListBucket, a missing key is 403)."""

    def deny(parsed, **_):
        error = parsed.get("Error", {})
        if error.get("Code") in ("NoSuchKey", "404"):
            error["Code"], error["Message"] = ("AccessDenied", "Access Denied")
            parsed.setdefault("ResponseMetadata", {})["HTTPStatusCode"] = 403

    for operation in ("GetObject", "HeadObject"):
        s3.meta.events.register(f"after-call.s3.{operation}", deny)


def head_doc(**overrides) -> dict:
    """The head's node.json: the nodes' keys, role head, no node index (docs/contracts.md)."""
    doc = train_doc(role="head", **overrides)
    doc.pop("node_index", None)
    return doc
