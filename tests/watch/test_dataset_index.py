"""`horovod-fleet dataset index` on TFRecords in a moto S3: the manifest it writes, what accepts it
(TrainStack's dataset check, the S3 check, the nodes' own check), and what it refuses.

.venv/bin/python -m pytest tests/watch/test_dataset_index.py
"""

import hashlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from moto import mock_aws
from tfrecord_samples import encode, imagenet_record, imagenet_shards, shard_bytes, synset

from bootstrap.node import data_pull
from contract.names import DATASET_TYPE
from controller import answers
from trainer.preprocess.records import frame_record
from watch import cli, dataset
from watch.progress import Progress

ROOT = Path(__file__).resolve().parents[2]

REGION = "us-east-1"
BUCKET = "my-imagenet"
PREFIX = "tfrecords/ilsvrc/"
URL = f"s3://{BUCKET}/{PREFIX}"
CLASSES = 5
JPEG = b"\xff\xd8\xff\xdb the rest of a JPEG"


@pytest.fixture
def s3(monkeypatch):
    for name in ("AWS_ENDPOINT_URL", "AWS_PROFILE", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    answers.client.cache_clear()
    with mock_aws():
        client = boto3.client("s3", region_name=REGION)
        client.create_bucket(Bucket=BUCKET)
        yield client
    answers.client.cache_clear()


@pytest.fixture
def shards(s3) -> dict[str, bytes]:
    """build_imagenet_data.py's layout: 3 train and 2 validation shards, labels 1..5, and a file
    of no split beside them."""
    made = imagenet_shards(train=3, validation=2, classes=CLASSES, per_shard=7)
    for name, data in made.items():
        s3.put_object(Bucket=BUCKET, Key=PREFIX + name, Body=data)
    s3.put_object(Bucket=BUCKET, Key=PREFIX + "README.txt", Body=b"made with build_imagenet_data")
    return made


def index(*flags: str, url: str = URL) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    sys.stdout, sys.stderr = out, err
    try:
        code = cli.main(["dataset", "index", url, *flags])
    finally:
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    return code, out.getvalue(), err.getvalue()


def manifest_in(s3, prefix: str = PREFIX) -> dict | None:
    try:
        body = s3.get_object(Bucket=BUCKET, Key=prefix + "manifest.json")["Body"].read()
    except s3.exceptions.NoSuchKey:
        return None
    return json.loads(body)


def refused(s3, *flags: str, url: str = URL) -> str:
    """The one error line of an index that must write nothing."""
    code, out, err = index(*flags, url=url)
    lines = err.strip().splitlines()
    assert code == 1 and out == "", (out, err)
    assert lines[-1].startswith("error: ") and err.count("error:") == 1, err
    assert "Traceback" not in err
    assert manifest_in(s3) is None
    return lines[-1]


def test_the_manifest_counts_hashes_and_labels_every_shard(s3, shards):
    code, out, err = index()
    assert code == 0, err
    manifest = manifest_in(s3)
    names = sorted(shards, key=lambda n: (not n.startswith("train"), n))
    assert [s["file"] for s in manifest["shards"]] == names
    for shard in manifest["shards"]:
        data = shards[shard["file"]]
        assert shard["split"] == shard["file"].split("-")[0]
        assert shard["records"] == 7 and shard["bytes"] == len(data)
        assert shard["sha256"] == hashlib.sha256(data).hexdigest()
        head = s3.head_object(Bucket=BUCKET, Key=PREFIX + shard["file"])
        assert shard["etag"] == head["ETag"].strip('"')
    assert manifest["splits"] == {
        "train": {"shards": 3, "records": 21},
        "validation": {"shards": 2, "records": 14},
    }
    assert (manifest["label_base"], manifest["num_classes"]) == (1, CLASSES)
    assert manifest["labels"] == {"lowest": 1, "highest": CLASSES}
    assert manifest["label_map"] == {synset(label): label for label in range(1, CLASSES + 1)}
    assert manifest["format"] == "horovod-fleet/imagenet-tfrecords/1"
    assert manifest["source"] == "horovod-fleet dataset index"
    assert "ignoring 1 objects of no split: README.txt" in err
    assert err.strip().splitlines()[-1].startswith("read 100%: ")  # not a terminal: plain lines
    assert out == (
        f"wrote {URL}manifest.json: train 21 records in 3 shards, validation 14 records in 2 "
        f"shards; labels 1..5, label base 1, 5 classes, 5 synsets\n"
    )


def test_trainstack_the_s3_check_and_the_nodes_accept_the_indexed_prefix(s3, shards, tmp_path):
    assert index()[0] == 0
    event = {
        "RequestType": "Create",
        "ResourceType": DATASET_TYPE,
        "StackId": f"arn:aws:cloudformation:{REGION}:123456789012:stack/TrainStack/guid",
        "ResourceProperties": {"Bucket": BUCKET, "Key": PREFIX + "manifest.json"},
    }
    assert answers.on_event(event) == {"PhysicalResourceId": f"{URL}manifest.json"}
    manifest = data_pull.verify_s3_dataset(s3, BUCKET, PREFIX)
    assert data_pull.manifest_problems(manifest) == []
    for shard in manifest["shards"]:  # what a node's pull downloads, then checks on its disk
        s3.download_file(BUCKET, PREFIX + shard["file"], str(tmp_path / shard["file"]))
    assert data_pull.check_shards(tmp_path, manifest["shards"], workers=2) == []
    flipped = bytearray(shards["train-00001-of-00003"])
    flipped[len(flipped) // 2] ^= 0x01  # the same size and records, another image
    (tmp_path / "train-00001-of-00003").write_bytes(bytes(flipped))
    assert data_pull.check_shards(tmp_path, manifest["shards"], workers=2) == [
        "train-00001-of-00003: sha256 differs from the manifest"
    ]


def test_a_shard_replaced_after_the_index_fails_the_s3_check(s3, shards):
    assert index()[0] == 0
    replaced = imagenet_shards(train=3, validation=2, classes=CLASSES, per_shard=7)
    body = replaced["validation-00000-of-00002"][::-1]  # the same size, other bytes
    s3.put_object(Bucket=BUCKET, Key=PREFIX + "validation-00000-of-00002", Body=body)
    with pytest.raises(data_pull.VerificationError, match="validation-00000-of-00002: changed"):
        data_pull.verify_s3_dataset(s3, BUCKET, PREFIX)


def test_a_truncated_shard_is_refused_by_name_and_nothing_is_written(s3, shards):
    cut = shards["train-00001-of-00003"]
    s3.put_object(Bucket=BUCKET, Key=PREFIX + "train-00001-of-00003", Body=cut[: len(cut) - 100])
    line = refused(s3)
    assert line.startswith("error: train-00001-of-00003: does not parse as TFRecords: truncated")


def test_a_shard_with_a_flipped_byte_is_refused_by_its_crc(s3, shards):
    data = bytearray(shards["validation-00001-of-00002"])
    data[len(data) // 2] ^= 0x10
    s3.put_object(Bucket=BUCKET, Key=PREFIX + "validation-00001-of-00002", Body=bytes(data))
    assert "validation-00001-of-00002: does not parse as TFRecords: corrupt: bad data CRC" in (
        refused(s3)
    )


def test_tfds_records_are_refused_for_the_keys_they_lack(s3):
    tfds = shard_bytes([{"image": b"\xff\xd8jpeg", "label": 3, "file_name": "n1_1.JPEG"}])
    for name in (
        "imagenet2012-train.tfrecord-00000-of-00001",
        "imagenet2012-validation.tfrecord-0",
    ):
        s3.put_object(Bucket=BUCKET, Key=PREFIX + name, Body=tfds)
    line = refused(s3, "--train", "*-train.tfrecord-*", "--validation", "*-validation.*")
    # Both shards are read at once, and the first refusal stops the other: either may be named.
    named, _, said = line.removeprefix("error: ").partition(": ")
    assert named in (
        "imagenet2012-train.tfrecord-00000-of-00001",
        "imagenet2012-validation.tfrecord-0",
    )
    assert said == (
        "record 0 is not in the standard schema: it needs one image/encoded (bytes) and one "
        "image/class/label (int64); its features are file_name, image, label (TFDS's schema)"
    )


def test_an_image_that_is_not_a_jpeg_is_refused(s3, shards):
    png = [{"image/encoded": b"\x89PNG\r\n\x1a\n...", "image/class/label": 2}]
    s3.put_object(Bucket=BUCKET, Key=PREFIX + "train-00002-of-00003", Body=shard_bytes(png))
    assert refused(s3) == (
        "error: train-00002-of-00003: record 0's image/encoded is not a JPEG (it starts 89 50 4e "
        "47, PNG): the trainer decodes JPEG only, as build_imagenet_data.py writes every image"
    )


@pytest.mark.parametrize(
    ("flags", "bad_label", "message"),
    [
        ((), -1, "has label -1, below the label base 1 (the trainer's labels start at 0 or 1"),
        (("--num-classes", "5"), 6, "has label 6, above 5, the last of 5 classes from base 1"),
        (("--label-base", "1"), 0, "has label 0, below the label base 1"),
    ],
)
def test_labels_out_of_range_are_refused_by_file_and_record(s3, shards, flags, bad_label, message):
    features = [imagenet_record(1 + i % CLASSES, synset(1 + i % CLASSES), i) for i in range(6)]
    features[3]["image/class/label"] = bad_label
    s3.put_object(
        Bucket=BUCKET, Key=PREFIX + "validation-00001-of-00002", Body=shard_bytes(features)
    )
    assert refused(s3, *flags).startswith(f"error: validation-00001-of-00002: record 3 {message}")


def test_zero_based_labels_and_no_synsets_make_a_manifest_without_a_label_map(s3):
    for split, labels in (("train", [0, 1, 2, 3]), ("validation", [3, 0])):
        records = [{"image/encoded": JPEG, "image/class/label": label} for label in labels]
        s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}{split}-0", Body=shard_bytes(records))
    code, out, err = index()
    manifest = manifest_in(s3)
    assert code == 0, err
    assert (manifest["label_base"], manifest["num_classes"]) == (0, 4)
    assert "label_map" not in manifest and "no label_map: some records have no" in err
    assert out.endswith("labels 0..3, label base 0, 4 classes\n")


def test_classes_without_a_train_record_are_said(s3):
    records = [imagenet_record(label, synset(label), label) for label in (1, 2, 4)]
    for split in ("train", "validation"):
        s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}{split}-0", Body=shard_bytes(records))
    code, _, err = index("--num-classes", "6")
    assert code == 0 and manifest_in(s3)["num_classes"] == 6
    assert "3 of the 6 classes have no train record" in err
    assert "no label_map: 3 synsets name 6 classes" in err


@pytest.mark.parametrize(
    ("objects", "flags", "message"),
    [
        ({}, (), f"error: no TFRecords under {URL}: no object there is named 'train-*' or "),
        ({"train/train-0": b"x"}, (), "; 1 objects are in folders below it (name the splits"),
        ({"train-0": b""}, (), f"error: no validation shards under {URL} (none named"),
        ({"train-0": b"", "validation-0": b""}, (), "the train shards under"),
        ({"a-0": b""}, ("--train", "*-0", "--validation", "a-*"), "a-0 matches both train and"),
    ],
)
def test_a_prefix_without_both_splits_is_refused(s3, objects, flags, message):
    for name, data in objects.items():
        s3.put_object(Bucket=BUCKET, Key=PREFIX + name, Body=data)
    assert message in refused(s3, *flags)


def test_a_single_class_and_bad_flags_are_refused(s3):
    records = [imagenet_record(1, synset(1), i) for i in range(2)]
    for split in ("train", "validation"):
        s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}{split}-0", Body=shard_bytes(records))
    assert "every label under" in refused(s3) and "2 classes or more" in refused(s3)
    assert "--num-classes must be 2 or more, got 1" in refused(s3, "--num-classes", "1")
    assert "expected s3://BUCKET/PREFIX/" in refused(s3, url="my-imagenet/tfrecords/")
    assert "NoSuchBucket" in refused(s3, url="s3://no-such-bucket/x/")


def test_a_converters_manifest_is_replaced_only_when_asked(s3, shards):
    s3.put_object(Bucket=BUCKET, Key=PREFIX + "manifest.json", Body=b'{"skipped": []}')
    code, _, err = index()
    assert code == 1 and "was not written by an index" in err and "--replace" in err
    assert manifest_in(s3) == {"skipped": []}
    assert index("--replace")[0] == 0 and manifest_in(s3)["source"] == dataset.SOURCE
    s3.delete_object(Bucket=BUCKET, Key=PREFIX + "train-00002-of-00003")
    assert index()[0] == 0, "an index's own manifest is written again"
    assert manifest_in(s3)["splits"]["train"] == {"shards": 2, "records": 14}


class CutOnce:
    """A body whose first read of the shard is cut by the network once."""

    def __init__(self, body, fail: list):
        self._body, self._fail = body, fail

    def read(self, count: int) -> bytes:
        if self._fail:
            self._fail.pop()
            from botocore.exceptions import ResponseStreamingError

            raise ResponseStreamingError(error="connection reset by peer")
        return self._body.read(count)

    def close(self) -> None:
        self._body.close()


def test_a_read_cut_by_the_network_reads_the_shard_again(s3, shards, monkeypatch):
    real = s3.get_object
    fail = [True]

    def flaky(**kwargs):
        response = real(**kwargs)
        if kwargs["Key"].endswith("train-00001-of-00003"):
            response["Body"] = CutOnce(response["Body"], fail)
        return response

    monkeypatch.setattr(s3, "get_object", flaky)
    request = dataset.Request(BUCKET, PREFIX, dict(dataset.DEFAULT_PATTERNS), workers=2)
    stream = io.StringIO()
    manifest = dataset.index(s3, request, stream, lambda line: None)
    assert fail == [] and manifest["splits"]["train"]["records"] == 21
    shard = next(s for s in manifest["shards"] if s["file"] == "train-00001-of-00003")
    assert shard["sha256"] == hashlib.sha256(shards["train-00001-of-00003"]).hexdigest()
    total = sum(len(data) for data in shards.values())
    assert f"{total / 1e9:.2f} GB of {total / 1e9:.2f} GB, 5 of 5 shards" in stream.getvalue()


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_is_a_bar_on_a_terminal_and_lines_elsewhere():
    now = [0.0]
    tty = Terminal()
    progress = Progress(4_000_000_000, 4, tty, clock=lambda: now[0])
    now[0] = 10.0
    progress.shard_done()
    progress.advance(1_000_000_000)
    assert tty.getvalue() == (
        "\r\033[K[#######.......................]  25% 1.00 GB of 4.00 GB, 1 of 4 shards, "
        "100 MB/s, ETA 0m30s"
    )
    progress.abandon()  # a refusal: its error line starts on a line of its own
    assert tty.getvalue().endswith("ETA 0m30s\n")
    plain = io.StringIO()
    progress = Progress(4_000_000_000, 4, plain, clock=lambda: now[0])
    now[0] = 11.0
    progress.advance(2_000)  # less than PLAIN_EVERY_S later: nothing yet
    now[0] = 21.0
    progress.advance(2_000_000_000)
    progress.finish()
    assert plain.getvalue().splitlines() == [
        "read 50%: 2.00 GB of 4.00 GB, 0 of 4 shards, 182 MB/s, ETA 0m10s",
        "read 50%: 2.00 GB of 4.00 GB, 0 of 4 shards, 182 MB/s, done",
    ]


def test_the_command_honours_aws_endpoint_url(moto_endpoint, tmp_path):
    """The installed command's code path, in its own process, against a moto server it reaches
    only through AWS_ENDPOINT_URL."""
    env = dict(
        os.environ, AWS_ENDPOINT_URL=moto_endpoint, AWS_ACCESS_KEY_ID="t",
        AWS_SECRET_ACCESS_KEY="t", AWS_DEFAULT_REGION=REGION, PYTHONPATH=str(ROOT),
    )  # fmt: skip
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name=REGION,
                      aws_access_key_id="t", aws_secret_access_key="t")  # fmt: skip
    s3.create_bucket(Bucket=BUCKET)
    for name, data in imagenet_shards(train=2, validation=1, classes=3, per_shard=4).items():
        s3.put_object(Bucket=BUCKET, Key=PREFIX + name, Body=data)
    command = [sys.executable, "-m", "watch.cli", "dataset", "index", URL, "--workers", "2"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"wrote {URL}manifest.json: train 8 records in 2 shards")
    manifest = json.loads(s3.get_object(Bucket=BUCKET, Key=PREFIX + "manifest.json")["Body"].read())
    assert manifest["splits"]["validation"] == {"shards": 1, "records": 4}
    s3.put_object(Bucket=BUCKET, Key=PREFIX + "validation-00000-of-00001", Body=b"\x05" * 30)
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("error: validation-00000-of-00001: does not parse as TFRecords")


def test_a_record_that_is_not_an_example_is_refused_by_file_and_record(s3):
    good = shard_bytes([imagenet_record(1, synset(1), 0), imagenet_record(2, synset(2), 1)])
    s3.put_object(Bucket=BUCKET, Key=PREFIX + "train-0", Body=good)
    bad = frame_record(encode(imagenet_record(1, synset(1), 2))) + frame_record(b"\x0a\x09garbage")
    s3.put_object(Bucket=BUCKET, Key=PREFIX + "validation-0", Body=bad)
    assert refused(s3) == (
        "error: validation-0: record 1 is not a tf.train.Example: field 1 runs past the end of "
        "its message"
    )


class Endless:
    """A shard body that never ends, as a huge shard on a slow link would seem."""

    record = frame_record(encode(imagenet_record(1, synset(1), 0)))

    def __init__(self):
        self.reads = 0

    def read(self, count: int) -> bytes:
        self.reads += 1
        return self.record

    def close(self) -> None:
        pass


class Bodies:
    """An S3 client whose objects are the given bodies."""

    def __init__(self, bodies: dict):
        self.bodies = bodies

    def get_object(self, Bucket: str, Key: str) -> dict:
        body = self.bodies[Key.rsplit("/", 1)[-1]]
        return {"Body": body() if callable(body) else io.BytesIO(body), "ETag": '"e"'}


def test_a_refused_shard_stops_the_reads_still_going():
    """Never a hang: the endless shard stops at its next chunk once another is refused."""
    endless = Endless()
    s3 = Bodies({"train-0": lambda: endless, "validation-0": b"\x01\x02\x03"})
    request = dataset.Request(BUCKET, PREFIX, dict(dataset.DEFAULT_PATTERNS), workers=2)
    shards = [
        dataset.Shard("train-0", "train", 10**12),
        dataset.Shard("validation-0", "validation", 3),
    ]
    progress = Progress(10**12, 2, io.StringIO())
    # read_all returns once every read has ended: one that never stopped would hang here, and
    # the default tier's timeout would fail the test.
    with pytest.raises(
        cli.WatchError, match="validation-0: does not parse as TFRecords: truncated"
    ):
        dataset.read_all(s3, request, shards, progress)
    assert endless.reads > 0


@pytest.mark.slow
def test_shards_tensorflow_wrote_index_into_a_manifest_the_trainer_takes(s3, tmp_path):
    """TensorFlow's own writer, as build_imagenet_data.py uses it, then the index, then the
    trainer's reading of the manifest and the shards (trainer/data.py)."""
    import tensorflow as tf

    from trainer import data

    def feature(value):
        if isinstance(value, list):
            return tf.train.Feature(float_list=tf.train.FloatList(value=value))
        if isinstance(value, int):
            return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
        value = value.encode() if isinstance(value, str) else value
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

    counts = {"train-00000-of-00002": 3, "train-00001-of-00002": 4, "validation-00000-of-00001": 5}
    index_of = 0
    for name, count in counts.items():
        with tf.io.TFRecordWriter(str(tmp_path / name)) as writer:
            for _ in range(count):
                label = 1 + index_of % 3
                record = imagenet_record(label, synset(label), index_of)
                record = {k: v for k, v in record.items() if k != "image/object/bbox/label"}
                example = tf.train.Example(
                    features=tf.train.Features(feature={k: feature(v) for k, v in record.items()})
                )
                writer.write(example.SerializeToString())
                index_of += 1
        s3.upload_file(str(tmp_path / name), BUCKET, PREFIX + name)
    code, _, err = index()
    assert code == 0, err
    pulled = tmp_path / "node"
    pulled.mkdir()
    manifest = data_pull.verify_s3_dataset(s3, BUCKET, PREFIX)
    for shard in manifest["shards"]:
        s3.download_file(BUCKET, PREFIX + shard["file"], str(pulled / shard["file"]))
    s3.download_file(BUCKET, PREFIX + "manifest.json", str(pulled / "manifest.json"))
    assert data_pull.check_shards(pulled, manifest["shards"], workers=2) == []
    info = data.resolve_dataset(pulled, None, None)
    assert (info.num_classes, info.label_base) == (3, 1)
    assert (info.train_records, info.validation_records) == (7, 5)
    assert data.count_records(info.train_files) == 7
    assert data.read_manifest(pulled).shard_files == {
        "train": sorted(n for n in counts if n.startswith("train")),
        "validation": ["validation-00000-of-00001"],
    }


def test_without_google_crc32c_the_index_still_works_and_says_it_is_slow(s3, shards, monkeypatch):
    from watch import tfrecords

    monkeypatch.setattr(tfrecords, "crc32c", tfrecords.crc32c_python)
    monkeypatch.setattr(dataset, "CRC_IS_FAST", False)
    code, _, err = index()
    assert code == 0 and "the CRCs are checked in plain Python, about 2 MB/s" in err
    assert manifest_in(s3)["splits"]["train"]["records"] == 21
