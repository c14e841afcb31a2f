"""Raw archives from a download URL whose credentials are in Secrets Manager (never in node.json).

.venv/bin/python -m pytest tests/bootstrap/preprocess/test_raw_download.py
"""

import base64
import json
import threading
import urllib.error
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import boto3
import pytest
from moto import mock_aws

from bootstrap import aws
from bootstrap.node_config import parse
from bootstrap.preprocess.preprocessing_node import (
    DEVKIT,
    LABEL_FILES,
    RAW_FILES,
    download_raw,
    raw_inputs,
)

AUTH = "Basic " + base64.b64encode(b"user:s3cret").decode()


class Archives(BaseHTTPRequestHandler):
    absent: tuple[str, ...] = ()  # files the download URL does not have (404)

    def do_GET(self):
        if self.headers.get("Authorization") != AUTH:
            self.send_error(401)
            return
        if self.path.rsplit("/", 1)[-1] in self.absent:
            self.send_error(404)
            return
        body = self.path.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Archives)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/imagenet"
    httpd.shutdown()


@pytest.fixture
def secret_config(server, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "t")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "t")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    aws.client.cache_clear()
    with mock_aws():
        secrets = boto3.client("secretsmanager", region_name="us-east-1")
        arn = secrets.create_secret(
            Name="imagenet-download",
            SecretString=json.dumps({"url": server, "username": "user", "password": "s3cret"}),
        )["ARN"]
        yield parse({
            "role": "preprocess", "region": "us-east-1", "bucket": "fleet-data", "log_group": None,
            "signal": None, "raw_prefix": "raw/", "output_prefix": "tfrecords/",
            "volume_id": None, "mount_point": str(tmp_path), "download_secret_arn": arn,
            "train_shards": 1, "val_shards": 1, "stop_when_done": False,
        })  # fmt: skip
    aws.client.cache_clear()


def test_download_uses_the_secret_and_keeps_finished_files(secret_config, tmp_path):
    paths = download_raw(secret_config)
    assert (tmp_path / "raw" / RAW_FILES["val"]).read_text() == f"/imagenet/{RAW_FILES['val']}"
    assert set(paths) == {"train", "val", "labels"}
    (tmp_path / "raw" / RAW_FILES["train"]).write_text("kept")
    download_raw(secret_config)
    assert (tmp_path / "raw" / RAW_FILES["train"]).read_text() == "kept"
    assert paths["labels"] == str(tmp_path / "raw" / DEVKIT), "the devkit, as image-net ships"


def test_a_url_without_the_devkit_gives_the_synset_file(secret_config, tmp_path, monkeypatch):
    monkeypatch.setattr(Archives, "absent", (DEVKIT,))
    paths = download_raw(secret_config)
    assert paths["labels"] == str(tmp_path / "raw" / RAW_FILES["labels"])
    assert not (tmp_path / "raw" / DEVKIT).exists()
    monkeypatch.setattr(Archives, "absent", (DEVKIT, RAW_FILES["labels"]))
    assert download_raw(secret_config) == paths, "finished downloads are kept, in either form"


def test_a_url_with_neither_label_file_fails_the_download(secret_config, monkeypatch):
    monkeypatch.setattr(Archives, "absent", LABEL_FILES)
    with pytest.raises(urllib.error.HTTPError, match="404"):
        download_raw(secret_config)


def test_the_devkit_is_taken_before_a_synset_file_and_either_will_do():
    archives = {RAW_FILES["train"], RAW_FILES["val"]}
    assert raw_inputs(archives | {DEVKIT, RAW_FILES["labels"]})["labels"] == DEVKIT
    assert raw_inputs(archives | {RAW_FILES["labels"]})["labels"] == RAW_FILES["labels"]
    with pytest.raises(FileNotFoundError, match=f"neither of {DEVKIT}"):
        raw_inputs(archives)


@pytest.mark.parametrize("uploaded", [LABEL_FILES, (RAW_FILES["labels"],)])
def test_the_node_converts_with_the_devkit_when_it_is_in_raw(tmp_path, monkeypatch, uploaded):
    """The node's own path from raw/ to the converter's command line, the converter stubbed."""
    from bootstrap.head import launch
    from bootstrap.node import data_pull
    from bootstrap.preprocess.preprocessing_node import PreprocessingNode

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "t")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "t")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    aws.client.cache_clear()
    commands = []

    def converter(command, env, log_path, **_):
        commands.append(command)
        return 0, []

    verified = iter([data_pull.VerificationError("no manifest yet"), {"splits": {}}])

    def verify(*_):
        outcome = next(verified)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(launch, "stream", converter)
    monkeypatch.setattr(data_pull, "verify_s3_dataset", verify)
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="fleet-data")
        for name in (RAW_FILES["train"], RAW_FILES["val"], *uploaded):
            s3.put_object(Bucket="fleet-data", Key=f"raw/{name}", Body=b"x")
        cfg = parse({
            "role": "preprocess", "region": "us-east-1", "bucket": "fleet-data", "log_group": None,
            "signal": None, "raw_prefix": "raw/", "output_prefix": "tfrecords/",
            "volume_id": None, "mount_point": str(tmp_path), "download_secret_arn": None,
            "train_shards": 1, "val_shards": 1, "stop_when_done": False,
            "log_dir": str(tmp_path / "logs"), "poll_interval_s": 1,
        })  # fmt: skip
        PreprocessingNode(cfg).run()
    aws.client.cache_clear()
    [command] = commands
    labels = command[command.index("--val-labels") + 1]
    assert labels == f"s3://fleet-data/raw/{uploaded[0]}"
