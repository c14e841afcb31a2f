"""The node scripts end to end against a local moto server: failures are reported with their step,
a node's where the head reads it (runs/<run>/failures/), the head's in DONE.json (status
failed), and each exits non-zero; no hang.

    .venv/bin/python -m pytest tests/bootstrap/test_node_cli.py
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from bootstrap_helpers import cpu_image_json, train_doc, write_tfrecord

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def node(tmp_path, moto_endpoint):
    """A bucket with a one-shard dataset, and a way to run a node script on a node.json."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ENDPOINT_URL=moto_endpoint, AWS_ACCESS_KEY_ID="t", AWS_SECRET_ACCESS_KEY="t",
               AWS_DEFAULT_REGION="us-east-1",
               PATH=f"{Path(sys.executable).parent}:{env['PATH']}")  # fmt: skip
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1",
                      aws_access_key_id="t", aws_secret_access_key="t")  # fmt: skip
    s3.create_bucket(Bucket="fleet-data")
    shard = tmp_path / "train-00000-of-00001"
    write_tfrecord(shard, [b"a", b"bb"])
    manifest = {"splits": {"train": {"shards": 1, "records": 2}},
                "shards": [{"file": shard.name, "split": "train", "records": 2,
                            "bytes": shard.stat().st_size}]}  # fmt: skip
    s3.upload_file(str(shard), "fleet-data", f"tfrecords/{shard.name}")
    s3.put_object(Bucket="fleet-data", Key="tfrecords/manifest.json", Body=json.dumps(manifest))
    # The preprocessor's resume sidecar: in S3 beside the shards, never pulled onto a node.
    s3.put_object(Bucket="fleet-data", Key="tfrecords/_progress/block-000.json", Body=b"{}")

    def run(script, **overrides):
        home = tmp_path / "node"
        doc = train_doc(gpus_per_node=0, efa=False, install=False, instance_store=False,
                        mount_point=str(home / "data"), log_dir=str(home / "logs"),
                        state_dir=str(home / "state"), ip="127.0.0.1", instance_id="i-test",
                        authorized_keys_file=str(home / "authorized_keys"))  # fmt: skip
        doc["image"]["manifest"] = cpu_image_json(tmp_path / "image.json")
        doc.update(overrides)
        if doc["role"] == "head":
            del doc["node_index"]
        (tmp_path / "node.json").write_text(json.dumps(doc))
        result = subprocess.run(
            [str(REPO / "bootstrap" / script)],
            env={**env, "NODE_JSON": str(tmp_path / "node.json")},
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        return result, s3

    run.s3 = s3
    return run


def done(s3):
    return json.loads(s3.get_object(Bucket="fleet-data", Key="runs/r1/DONE.json")["Body"].read())


def failure(s3, index=0):
    """What node `index` told the head about its failure (bootstrap/fleet/node_failures.py)."""
    key = f"runs/r1/failures/{index}.json"
    return json.loads(s3.get_object(Bucket="fleet-data", Key=key)["Body"].read())


def test_missing_nodes_fail_the_run_naming_them(node):
    result, s3 = node("train_node.sh", role="head", nodes=2, rendezvous_timeout_s=1)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "the head holds no dataset" in result.stdout and "data pull" not in result.stdout
    assert "step 'rendezvous' failed" in result.stdout
    doc = done(s3)
    assert (doc["status"], doc["written_by"]) == ("failed", "head")
    assert "node(s) 0, 1 of 2 did not register" in doc["reason"]
    assert doc["top1"] is None and doc["images_per_s"] is None
    assert s3.list_objects_v2(Bucket="fleet-data", Prefix="runs/r1/logs/head/")["KeyCount"]


def test_a_node_without_its_head_says_so_where_the_head_would_read_it(node, tmp_path):
    result, s3 = node("train_node.sh", nodes=2, rendezvous_timeout_s=1)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "(S3 outages are retried for up to 330 s, each call times out)" in result.stdout
    assert "pulled and verified 1 shards, 2 records" in result.stdout
    assert not (tmp_path / "node" / "data" / "tfrecords" / "_progress").exists()
    told = failure(s3)
    assert (told["node"], told["ip"], told["instance_id"]) == (0, "127.0.0.1", "i-test")
    assert told["reason"].startswith("step 'rendezvous' failed: RendezvousError: the head did not")
    assert told["cause"] == "nodes_missing"
    assert s3.list_objects_v2(Bucket="fleet-data", Prefix="runs/DONE.json")["KeyCount"] == 0
    assert s3.list_objects_v2(Bucket="fleet-data", Prefix="runs/r1/logs/node-0/")["KeyCount"]
    # A rerun finds the data verified and skips the pull.
    result, s3 = node("train_node.sh", nodes=2, rendezvous_timeout_s=1)
    assert "data already pulled and verified" in result.stdout


def test_failed_shell_step_is_reported_with_its_name(node):
    # No NVMe instance store on this machine: the mount step fails, the ERR trap reports it.
    result, s3 = node("train_node.sh", instance_store=True)
    assert result.returncode != 0
    assert "step 'instance store' failed" in result.stdout
    assert failure(s3)["reason"].startswith("step 'instance store' failed")
    assert failure(s3)["cause"] == "node_unhealthy"


def test_corrupt_pull_fails_the_data_step(node):
    s3 = node.s3
    s3.put_object(Bucket="fleet-data", Key="tfrecords/train-00000-of-00001", Body=b"garbage!")
    manifest = json.loads(
        s3.get_object(Bucket="fleet-data", Key="tfrecords/manifest.json")["Body"].read()
    )
    manifest["shards"][0]["bytes"] = 8
    s3.put_object(Bucket="fleet-data", Key="tfrecords/manifest.json", Body=json.dumps(manifest))
    # The preprocessor's resume sidecar: in S3 beside the shards, never pulled onto a node.
    s3.put_object(Bucket="fleet-data", Key="tfrecords/_progress/block-000.json", Body=b"{}")
    result, s3 = node("train_node.sh", nodes=1)
    assert result.returncode == 1
    assert "step 'data pull' failed" in result.stdout
    assert "truncated record" in failure(s3)["reason"]
    assert failure(s3)["cause"] == "corrupt_shard"  # the head ends the attempt with it


def test_unwritable_done_json_does_not_hide_the_failure(node):
    """The bucket is gone: the pull fails, and so do the uploads and DONE.json after it. The log
    still says once what failed, one line per report action that could not be done; exit 1."""
    result, _ = node("train_node.sh", bucket="no-such-bucket", nodes=1)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    lines = result.stdout.splitlines()
    [failed] = [line for line in lines if "FAILED:" in line]
    assert "step 'data pull' failed: S5cmdFailed: s5cmd cp s3://no-such-bucket/" in failed
    assert "NoSuchBucket" in failed
    assert "could not tell the head why this node failed: NoSuchBucket" in result.stdout


def test_bad_node_json_is_one_line_naming_the_key(node):
    result, _ = node("train_node.sh", nodes=0)
    assert result.returncode != 0
    assert "error: node.json: key 'nodes' must be >= 1, got 0" in result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr


def test_preprocessing_rerun_skips_a_verified_dataset(node, tmp_path):
    doc = {
        "role": "preprocess", "region": "us-east-1", "bucket": "fleet-data", "log_group": None,
        "signal": None, "raw_prefix": "raw/", "output_prefix": "tfrecords/", "volume_id": None,
        "mount_point": str(tmp_path / "pre"), "download_secret_arn": None, "train_shards": 1,
        "val_shards": 1, "stop_when_done": False, "install": False,
        "log_dir": str(tmp_path / "pre-logs"), "instance_id": "i-pre",
    }  # fmt: skip
    result, _ = node("preprocess_node.sh", **doc)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "already holds a verified dataset: skipping preprocessing" in result.stdout
    assert "dataset ready in s3://fleet-data/tfrecords/: train 2 records" in result.stdout
    assert "step 'preprocess':" not in result.stdout


def test_a_foreign_ami_stops_the_node_first_in_one_line(node, tmp_path):
    image = {**train_doc()["image"], "manifest": str(tmp_path / "no-image.json")}
    result, s3 = node("train_node.sh", nodes=1, image=image)
    assert result.returncode == 1, result.stdout + result.stderr
    assert (
        "error: AMI ami-0123456789abcdef0 is not a horovod-fleet training image "
        f"(no {tmp_path}/no-image.json); deploy ImageStack or pass -c ami=<a baked image>"
    ) in result.stdout
    assert "step 'training image' failed" in result.stdout
    assert "data pull" not in result.stdout
    assert failure(s3)["cause"] == "image_mismatch"
