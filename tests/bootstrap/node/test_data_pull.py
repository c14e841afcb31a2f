"""Manifest verification of pulled TFRecords, and of the preprocessor's output in S3.

.venv/bin/python -m pytest tests/bootstrap/node/test_data_pull.py
"""

import hashlib
import json

import pytest
from bootstrap_helpers import write_tfrecord

from bootstrap import transfer
from bootstrap.node import data_pull


@pytest.fixture
def dataset(tmp_path):
    shards = []
    for name, split, count in (("train-00000-of-00002", "train", 3), ("train-00001-of-00002",
                               "train", 2), ("validation-00000-of-00001", "validation", 4)):  # fmt: skip
        path = tmp_path / name
        write_tfrecord(path, [bytes([i]) * (10 + i) for i in range(count)])
        shards.append({"file": name, "split": split, "records": count,
                       "bytes": path.stat().st_size,
                       "sha256": hashlib.sha256(path.read_bytes()).hexdigest()})  # fmt: skip
    manifest = {
        "format": "horovod-fleet/imagenet-tfrecords/1",
        "splits": {"train": {"shards": 2, "records": 5}, "validation": {"shards": 1, "records": 4}},
        "shards": shards,
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    return tmp_path


def problems(data_dir):
    """What a pull finds wrong with a data dir: the manifest's totals, then each shard."""
    manifest = json.loads((data_dir / "manifest.json").read_text())
    found = data_pull.manifest_problems(manifest)
    found += data_pull.check_shards(data_dir, manifest["shards"], workers=1)
    return "; ".join(found)


def test_complete_dataset_verifies(dataset):
    assert problems(dataset) == ""


def test_counts_records_by_framing(dataset):
    assert data_pull.count_records(dataset / "validation-00000-of-00001") == 4


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: (d / "train-00001-of-00002").unlink(), "train-00001-of-00002: missing"),
        (lambda d: (d / "train-00000-of-00002").write_bytes(b"x" * 50), "bytes, manifest says"),
        (
            lambda d: (d / "validation-00000-of-00001").write_bytes(
                (d / "validation-00000-of-00001").read_bytes()[:-1] + b"!"
            ),
            "sha256 differs",
        ),
    ],
)
def test_damaged_dataset_fails_naming_the_shard(dataset, damage, message):
    damage(dataset)
    assert message in problems(dataset)


def test_record_count_mismatch_is_caught_without_sha(dataset):
    manifest = json.loads((dataset / "manifest.json").read_text())
    manifest["shards"][0].pop("sha256")
    manifest["shards"][0]["records"] = 4
    manifest["splits"]["train"]["records"] = 6
    (dataset / "manifest.json").write_text(json.dumps(manifest))
    assert "3 records, manifest says 4" in problems(dataset)


def test_inconsistent_split_totals_fail(dataset):
    manifest = json.loads((dataset / "manifest.json").read_text())
    manifest["splits"]["validation"]["records"] = 50000
    (dataset / "manifest.json").write_text(json.dumps(manifest))
    assert "split validation" in problems(dataset)


def test_s3_dataset_check_finds_missing_shards(s3, dataset):
    upload_like_the_preprocessor(s3, dataset)
    assert data_pull.verify_s3_dataset(s3, "fleet-data", "tfrecords/")["splits"]
    s3.delete_object(Bucket="fleet-data", Key="tfrecords/train-00001-of-00002")
    with pytest.raises(data_pull.VerificationError, match="train-00001-of-00002: missing"):
        data_pull.verify_s3_dataset(s3, "fleet-data", "tfrecords/")


def upload_like_the_preprocessor(s3, dataset):
    """trainer.preprocess records each shard's sha256 as the object's metadata."""
    for path in dataset.iterdir():
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        s3.upload_file(
            str(path),
            "fleet-data",
            f"tfrecords/{path.name}",
            ExtraArgs={"Metadata": {"sha256": digest}},
        )


def test_s3_dataset_check_catches_a_same_size_replacement(s3, dataset):
    """Sizes alone would call this dataset done: the replaced shard lost its recorded sha256."""
    upload_like_the_preprocessor(s3, dataset)
    shard = dataset / "train-00000-of-00002"
    s3.put_object(
        Bucket="fleet-data", Key=f"tfrecords/{shard.name}", Body=b"\0" * shard.stat().st_size
    )
    with pytest.raises(data_pull.VerificationError, match="train-00000-of-00002: sha256 in S3"):
        data_pull.verify_s3_dataset(s3, "fleet-data", "tfrecords/")


RAW = [
    "ILSVRC2012_img_train.tar",
    "ILSVRC2012_img_val.tar",
    "ILSVRC2012_validation_ground_truth.txt",
]


class FakeClock:
    """Time that moves only when the code under test sleeps; `on_sleep` acts at each nap."""

    def __init__(self, on_sleep=lambda naps: None):
        self.now, self.naps, self.on_sleep = 0.0, 0, on_sleep

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.naps += 1
        self.on_sleep(self.naps)


def test_waits_for_raw_archives_uploaded_after_boot(s3):
    """`cdk deploy PreprocessStack` makes the bucket and the node together: the node waits."""
    bucket = s3.list_buckets()["Buckets"][0]["Name"]

    def upload_on_third_nap(naps):
        if naps == 3:
            for name in RAW:
                s3.put_object(Bucket=bucket, Key=f"raw/{name}", Body=b"x")

    clock, lines = FakeClock(upload_on_third_nap), []
    s3.put_object(Bucket=bucket, Key="raw/unrelated.txt", Body=b"x")
    data_pull.wait_for_objects(
        s3, bucket, "raw/", RAW, 86400, 60, lines.append, clock=clock, sleep=clock.sleep
    )
    assert clock.naps == 3
    assert lines and all(name in lines[0] for name in RAW)
    assert f"s5cmd cp {' '.join(RAW)} s3://{bucket}/raw/" in lines[0]


def test_either_form_of_the_labels_will_do_and_the_wait_says_so(s3):
    """The devkit as image-net.org ships it, or a synset-per-line file in its place."""
    bucket = s3.list_buckets()["Buckets"][0]["Name"]
    labels = ("ILSVRC2012_devkit_t12.tar.gz", "ILSVRC2012_validation_ground_truth.txt")
    wanted = [RAW[0], RAW[1], labels]
    for name in RAW[:2]:
        s3.put_object(Bucket=bucket, Key=f"raw/{name}", Body=b"x")

    def upload_devkit(naps):
        if naps == 2:
            s3.put_object(Bucket=bucket, Key=f"raw/{labels[0]}", Body=b"kit")

    clock, lines = FakeClock(upload_devkit), []
    present = data_pull.wait_for_objects(
        s3, bucket, "raw/", wanted, 86400, 60, lines.append, clock=clock, sleep=clock.sleep
    )
    assert clock.naps == 2 and present[labels[0]] == 3
    assert lines[0].startswith(f"waiting for {labels[0]} (or {labels[1]}) in s3://{bucket}/raw/")
    assert f"s5cmd cp {labels[0]} s3://{bucket}/raw/" in lines[0]
    s3.delete_object(Bucket=bucket, Key=f"raw/{labels[0]}")
    s3.put_object(Bucket=bucket, Key=f"raw/{labels[1]}", Body=b"n01440764\n")
    clock = FakeClock()
    assert labels[1] in data_pull.wait_for_objects(
        s3, bucket, "raw/", wanted, 86400, 60, lines.append, clock=clock, sleep=clock.sleep
    )
    assert clock.naps == 0


def test_gives_up_on_raw_archives_naming_what_is_missing(s3):
    bucket = s3.list_buckets()["Buckets"][0]["Name"]
    s3.put_object(Bucket=bucket, Key=f"raw/{RAW[0]}", Body=b"x")
    clock, lines = FakeClock(), []
    with pytest.raises(data_pull.VerificationError, match="after 2 h"):
        data_pull.wait_for_objects(
            s3, bucket, "raw/", RAW, 7200, 60, lines.append, clock=clock, sleep=clock.sleep
        )
    assert clock.now >= 7200
    # Reminders every 10 minutes, not every poll, and only the missing archives in them.
    assert len(lines) == 13
    assert RAW[0] not in lines[-1] and RAW[1] in lines[-1]


def test_s5cmd_gives_up_on_a_dead_endpoint_sooner_than_its_default(monkeypatch):
    """s5cmd's own default, 10 retries, reports an unreachable endpoint only after ~90 s."""
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    command = transfer.s5cmd("cp", "s3://b/k", "k")
    retries = int(command[command.index("--retry-count") + 1])
    assert 0 < retries < 10
    assert command[-3:] == ["cp", "s3://b/k", "k"]
