"""Helpers shared by the bootstrap tests (a unique module name: tests/trainer has a conftest too)."""

import struct

BUCKET = "fleet-data"


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
        "instance_type": "p3dn.24xlarge",
        "efa": True,
        "dataset_prefix": "tfrecords/",
        "runs_prefix": "runs/r1/",
        "rendezvous_timeout_s": 30,
        "trainer": {"epochs": 2, "batch_per_gpu": 256, "arch": "resnet50", "image_size": 224},
        "metrics": {"namespace": "HorovodFleet", "dimension": {"Run": "r1"}},
        "poll_interval_s": 1,
    }
    doc.update(overrides)
    return doc


def write_tfrecord(path, records):
    """TFRecord framing with dummy CRCs: verification counts records, it does not parse them."""
    with path.open("wb") as f:
        for data in records:
            f.write(struct.pack("<Q", len(data)) + b"\0" * 4 + data + b"\0" * 4)
