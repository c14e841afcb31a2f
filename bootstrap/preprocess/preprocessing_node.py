"""The preprocessing node, on its own: ImageNet's raw archives (from s3://<bucket>/raw/, or
downloaded from the URL in a Secrets Manager secret) converted once to verified TFRecords in
s3://<bucket>/<output_prefix>, then a signal to CloudFormation and a stop."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request
from base64 import b64encode
from pathlib import Path

from botocore.exceptions import ClientError

from bootstrap import aws
from bootstrap.head import failures, launch
from bootstrap.lines import REASON_LIMIT, one_line
from bootstrap.node import data_pull
from bootstrap.node_config import PreprocessConfig
from bootstrap.steps import StepFailed, announce_failure, step

RAW_FILES = {
    "train": "ILSVRC2012_img_train.tar",
    "val": "ILSVRC2012_img_val.tar",
    "labels": "ILSVRC2012_validation_ground_truth.txt",
}
# The validation labels: the devkit as image-net.org ships it (trainer/preprocess/devkit.py reads
# its meta.mat and ground truth), or in its place a file of one synset per line. The devkit
# first, when both are there: its class numbers cannot be taken for synsets.
DEVKIT = "ILSVRC2012_devkit_t12.tar.gz"
LABEL_FILES = (DEVKIT, RAW_FILES["labels"])


def raw_inputs(present) -> dict[str, str]:
    """The name of each raw input in `present` (names in raw/ or on disk): the archives, and
    the first of LABEL_FILES there."""
    labels = next((name for name in LABEL_FILES if name in present), None)
    if labels is None:
        raise FileNotFoundError(f"neither of {', '.join(LABEL_FILES)} is in raw/")
    return {"train": RAW_FILES["train"], "val": RAW_FILES["val"], "labels": labels}


class PreprocessingNode:
    """The preprocessing node's bootstrap: convert (unless a verified dataset is there), verify, signal,
    stop."""

    def __init__(self, cfg: PreprocessConfig):
        self.cfg = cfg

    def run(self) -> None:
        cfg = self.cfg
        s3 = aws.s3_client(cfg.region)
        output = f"s3://{cfg.bucket}/{cfg.output_prefix}"

        def already_done() -> bool:
            try:
                data_pull.verify_s3_dataset(s3, cfg.bucket, cfg.output_prefix)
            except (data_pull.VerificationError, ClientError) as exc:
                # No manifest yet, or a dataset that fails its check: (re)convert, resumably.
                aws.log(
                    f"{output} holds no verified dataset ({one_line(exc, REASON_LIMIT)}): converting"
                )
                return False
            aws.log(f"{output} already holds a verified dataset: skipping preprocessing")
            return True

        if not step("check for a verified dataset", already_done):
            if cfg.download_secret_arn:
                raw = step("download raw archives", lambda: download_raw(cfg))
            else:
                present = step(
                    "wait for raw archives",
                    lambda: data_pull.wait_for_objects(
                        s3, cfg.bucket, cfg.raw_prefix,
                        [RAW_FILES["train"], RAW_FILES["val"], LABEL_FILES],
                        cfg.raw_wait_s, max(cfg.poll_interval_s, 30), aws.log,
                    ),
                )  # fmt: skip
                names = raw_inputs(present)
                raw = {k: f"s3://{cfg.bucket}/{cfg.raw_prefix}{n}" for k, n in names.items()}
            command = [
                "python3", "-m", "trainer.preprocess",
                "--train-tar", raw["train"], "--val-tar", raw["val"], "--val-labels", raw["labels"],
                "--output", output.rstrip("/"),
                "--train-shards", str(cfg.train_shards), "--val-shards", str(cfg.val_shards),
            ]  # fmt: skip

            def convert():
                # Finished shards are staged before upload (GBs at peak): on the data volume, not
                # the root disk.
                staging = Path(cfg.mount_point) / "staging"
                staging.mkdir(parents=True, exist_ok=True)
                env = {**os.environ, "TMPDIR": str(staging)}
                code, tail = launch.stream(command, env, Path(cfg.log_dir) / "preprocess.log")
                if code:
                    raise RuntimeError(
                        f"trainer.preprocess exited {code}: {failures.failure_reason(tail)} "
                        "(details in preprocess.log)"
                    )

            step("preprocess", convert)
        manifest = step(
            "verify manifest",
            lambda: data_pull.verify_s3_dataset(s3, cfg.bucket, cfg.output_prefix),
        )
        splits = ", ".join(f"{k} {v['records']} records" for k, v in manifest["splits"].items())
        aws.log(f"dataset ready in {output}: {splits}")
        step("signal", lambda: aws.log(aws.signal_cloudformation(cfg, True, "dataset ready")))
        stop_instance_soon(cfg)

    def report(self, failure: StepFailed) -> None:
        """Whatever failed: tell CloudFormation (PreprocessStack's deploy fails with the reason),
        and stop the instance."""
        announce_failure(self.cfg, failure)
        stop_instance_soon(self.cfg)


def stop_instance_soon(cfg: PreprocessConfig) -> None:
    """Cost control: halt (the instance's shutdown behaviour is stop) a minute from now, which
    leaves the CloudWatch agent time to ship the last log lines."""
    if cfg.stop_when_done:
        aws.log("stop_when_done: halting this instance in 1 minute")
        subprocess.run(["shutdown", "-h", "+1"], check=False)


def download_raw(cfg: PreprocessConfig) -> dict[str, str]:
    """Fetch the archives from the URL in the Secrets Manager secret: JSON {"url": base URL,
    optional "username"/"password" for HTTP basic auth}; for the labels the devkit, or where the
    URL has none (404) the synset-per-line file. Finished downloads are kept."""
    secret = aws.client("secretsmanager", cfg.region).get_secret_value(
        SecretId=cfg.download_secret_arn
    )
    doc = json.loads(secret["SecretString"])
    target = Path(cfg.mount_point) / "raw"
    target.mkdir(parents=True, exist_ok=True)
    headers = {}
    if doc.get("username"):
        token = b64encode(f"{doc['username']}:{doc.get('password', '')}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    for name in (RAW_FILES["train"], RAW_FILES["val"], *LABEL_FILES):
        path = target / name
        if path.exists():
            aws.log(f"{name} already downloaded")
        elif name in LABEL_FILES and any((target / n).exists() for n in LABEL_FILES):
            continue  # the labels are here in their other form
        else:
            try:
                fetch(f"{doc['url'].rstrip('/')}/{name}", headers, path)
            except urllib.error.HTTPError as error:
                if error.code != 404 or name != DEVKIT:
                    raise
                aws.log(f"{name}: not at the download URL (404); trying {RAW_FILES['labels']}")
    names = raw_inputs({p.name for p in target.iterdir()})
    return {kind: str(target / name) for kind, name in names.items()}


def fetch(url: str, headers: dict, path: Path) -> None:
    request = urllib.request.Request(url, headers=headers)
    partial = path.with_suffix(".part")
    with urllib.request.urlopen(request, timeout=60) as response, partial.open("wb") as out:
        while chunk := response.read(1 << 22):
            out.write(chunk)
    partial.replace(path)
    aws.log(f"downloaded {path.name}: {path.stat().st_size} bytes")
