"""Helpers for the preprocessing tests: run trainer.preprocess, read back its TFRecords."""

import os
import subprocess
import sys
from pathlib import Path

import tensorflow as tf

REPO = Path(__file__).resolve().parents[2]

FEATURES = {
    "image/encoded": tf.io.FixedLenFeature([], tf.string),
    "image/format": tf.io.FixedLenFeature([], tf.string),
    "image/class/label": tf.io.FixedLenFeature([], tf.int64),
    "image/class/synset": tf.io.FixedLenFeature([], tf.string),
    "image/height": tf.io.FixedLenFeature([], tf.int64),
    "image/width": tf.io.FixedLenFeature([], tf.int64),
    "image/filename": tf.io.FixedLenFeature([], tf.string),
    "image/colorspace": tf.io.FixedLenFeature([], tf.string),
    "image/channels": tf.io.FixedLenFeature([], tf.int64),
}


def run_preprocess(
    args: list[str], timeout: float = 120, cwd: Path = REPO, **env: str
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainer.preprocess", *args],
        cwd=cwd,
        env=dict(os.environ, PYTHONPATH=str(REPO), **env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def sample_args(sample, output: str, *extra: str) -> list[str]:
    return [
        "--train-tar", sample.train_tar, "--val-tar", sample.val_tar,
        "--val-labels", sample.val_labels, "--output", output, *extra,
    ]  # fmt: skip


def read_records(path: str) -> list[dict]:
    """Every record of a TFRecord file, parsed (which checks the CRCs) and its image decoded."""
    records = []
    for serialized in tf.data.TFRecordDataset(path):
        parsed = tf.io.parse_single_example(serialized, FEATURES)
        record = {key: value.numpy() for key, value in parsed.items()}
        record["pixels"] = tf.io.decode_jpeg(parsed["image/encoded"]).numpy()
        records.append(record)
    return records
