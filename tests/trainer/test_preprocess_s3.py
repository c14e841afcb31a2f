"""trainer.preprocess reading the archives from S3 and writing shards to S3, via a moto server.

.venv/bin/python -m pytest tests/trainer/test_preprocess_s3.py
"""

import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest
from ilsvrc_samples import read_records, run_preprocess

from trainer.preprocess.sample import make_sample

BUCKET = "dataset"
FLAGS = [
    "--train-shards",
    "4",
    "--val-shards",
    "2",
    "--short-side",
    "64",
    "--shards-per-block",
    "2",
]
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3_env(tmp_path_factory):
    """A moto S3 server on a free port; yields the environment that points boto3 at it."""
    port = free_port()
    moto = Path(sys.executable).parent / "moto_server"
    log = open(tmp_path_factory.mktemp("moto") / "moto.log", "wb")  # noqa: SIM115
    server = subprocess.Popen(
        [str(moto), "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log
    )
    env = dict(S3_ENV, AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert time.monotonic() < deadline and server.poll() is None, (
                "moto_server did not start"
            )
            time.sleep(0.2)
    yield env
    server.terminate()
    server.wait(timeout=10)
    log.close()


@pytest.fixture(scope="module")
def s3(s3_env, tmp_path_factory):
    """The sample archives uploaded to s3://dataset/raw/; yields (client, sample)."""
    sample = make_sample(str(tmp_path_factory.mktemp("raw")), 3, 5, 6, quirks=True)
    client = boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")  # fmt: skip
    client.create_bucket(Bucket=BUCKET)
    for path in (sample.train_tar, sample.val_tar, sample.val_labels):
        client.upload_file(path, BUCKET, f"raw/{os.path.basename(path)}")
    return client, sample


def s3_args(output: str, train: str = "ILSVRC2012_img_train.tar") -> list[str]:
    raw = f"s3://{BUCKET}/raw/"
    return ["--train-tar", raw + train, "--val-tar", raw + "ILSVRC2012_img_val.tar",
            "--val-labels", raw + "ILSVRC2012_validation_ground_truth.txt", "--output", output, *FLAGS]  # fmt: skip


def test_s3_in_s3_out_and_restart(s3, s3_env, tmp_path):
    client, sample = s3
    result = run_preprocess(s3_args(f"s3://{BUCKET}/tfrecords"), **s3_env)
    assert result.returncode == 0, result.stderr
    manifest = json.loads(
        client.get_object(Bucket=BUCKET, Key="tfrecords/manifest.json")["Body"].read()
    )
    assert manifest["splits"] == {
        "train": {"shards": 4, "records": 14},
        "validation": {"shards": 2, "records": 6},
    }
    assert manifest["label_map"] == {
        synset: i + 1 for i, synset in enumerate(sorted(sample.synsets))
    }
    labels = []
    for shard in manifest["shards"]:
        path = tmp_path / shard["file"]
        client.download_file(BUCKET, f"tfrecords/{shard['file']}", str(path))
        assert hashlib.sha256(path.read_bytes()).hexdigest() == shard["sha256"]
        records = read_records(str(path))
        assert len(records) == shard["records"]
        labels += [(r["image/class/synset"].decode(), r["image/class/label"]) for r in records]
    assert all(manifest["label_map"][synset] == label for synset, label in labels)
    staged = [
        key["Key"] for key in client.list_objects_v2(Bucket=BUCKET, Prefix="tfrecords/")["Contents"]
    ]
    assert sorted(k for k in staged if "/_progress/" not in k) == sorted(
        [f"tfrecords/{s['file']}" for s in manifest["shards"]] + ["tfrecords/manifest.json"]
    )

    client.delete_object(Bucket=BUCKET, Key="tfrecords/_progress/train-00001-of-00004.json")
    result = run_preprocess(s3_args(f"s3://{BUCKET}/tfrecords"), **s3_env)
    assert result.returncode == 0, result.stderr
    assert "train: 2 blocks of shards, 1 already complete" in result.stderr
    assert "validation: 1 blocks of shards, 1 already complete" in result.stderr


def test_s3_input_to_local_output_matches_local_run(s3, s3_env, tmp_path):
    _, sample = s3
    from_s3 = run_preprocess(s3_args(str(tmp_path / "from-s3")), **s3_env)
    local_args = [
        "--train-tar",
        sample.train_tar,
        "--val-tar",
        sample.val_tar,
        "--val-labels",
        sample.val_labels,
    ]
    local = run_preprocess([*local_args, "--output", str(tmp_path / "local"), *FLAGS])
    assert from_s3.returncode == 0 and local.returncode == 0, from_s3.stderr + local.stderr

    def hashes(name):
        return [
            s["sha256"]
            for s in json.loads((tmp_path / name / "manifest.json").read_text())["shards"]
        ]

    assert hashes("from-s3") == hashes("local")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            s3_args("s3://dataset/out", train="missing.tar"),
            "--train-tar: cannot read s3://dataset/raw/missing.tar: not found (404)",
        ),
        (
            s3_args("s3://no-such-bucket/out"),
            "--output: cannot use s3://no-such-bucket/out: NoSuchBucket",
        ),
    ],
)
def test_s3_bad_input_is_one_error_line(s3, s3_env, args, message):
    result = run_preprocess(args, **s3_env)
    assert result.returncode != 0
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert message in result.stderr
