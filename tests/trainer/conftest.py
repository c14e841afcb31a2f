"""Fixtures for the trainer tests: standard-schema ImageNet TFRecords and trainer subprocesses.

Helpers are handed out as fixtures (not imported) because every tests/ folder has a conftest.py.
"""

from __future__ import annotations

import io
import json
import signal
import subprocess
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image
from trainer_helpers import DIGITS_RUN, HOROVODRUN, PYTHON, REPO, trainer_env


def jpeg_bytes(pixels: np.ndarray, quality: int = 90) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


def example(encoded: bytes, label: int, height: int, width: int, name: str) -> bytes:
    """One record in the standard ImageNet schema (build_imagenet_data.py)."""

    def as_bytes(value: bytes):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

    def as_int(value: int):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))

    features = {
        "image/encoded": as_bytes(encoded),
        "image/format": as_bytes(b"JPEG"),
        "image/class/label": as_int(label),
        "image/class/synset": as_bytes(f"n{label:08d}".encode()),
        "image/height": as_int(height),
        "image/width": as_int(width),
        "image/filename": as_bytes(name.encode()),
        "image/colorspace": as_bytes(b"RGB"),
        "image/channels": as_int(3),
    }
    return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()


def _write_split(directory: Path, split: str, images, labels, shards: int) -> list[Path]:
    """Write images (uint8 HxWx3) with their labels round-robin into `shards` TFRecord files."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / f"{split}-{i:05d}-of-{shards:05d}" for i in range(shards)]
    writers = [tf.io.TFRecordWriter(str(p)) for p in paths]
    for index, (pixels, label) in enumerate(zip(images, labels, strict=True)):
        height, width = pixels.shape[:2]
        record = example(jpeg_bytes(pixels), int(label), height, width, f"{split}_{index}.JPEG")
        writers[index % shards].write(record)
    for writer in writers:
        writer.close()
    return paths


def _colour_images(count: int, height: int, width: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(count, height, width, 3), dtype=np.uint8)


@pytest.fixture
def tiny_data(tmp_path) -> Path:
    """2 train + 2 validation shards, 4 classes, 1-based labels, 48x40 images, no manifest."""
    data_dir = tmp_path / "data"
    labels = [1 + i % 4 for i in range(32)]
    _write_split(data_dir, "train", _colour_images(32, 48, 40), labels, 2)
    _write_split(data_dir, "validation", _colour_images(8, 48, 40, 1), labels[:8], 2)
    return data_dir


def trainer_command(args: list[str], ranks: int = 1, module: str = "trainer.train") -> list[str]:
    command = [PYTHON, "-m", module, *args]
    if ranks == 1:
        return command
    return [HOROVODRUN, "-np", str(ranks), "-H", f"localhost:{ranks}", "--gloo", *command]


def _run_trainer(
    args: list[str], ranks: int = 1, timeout: float = 300, module: str = "trainer.train", **env
) -> subprocess.CompletedProcess:
    return subprocess.run(
        trainer_command(args, ranks, module),
        cwd=REPO,
        env=trainer_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class Result(NamedTuple):
    """What a trainer command did: a subprocess's CompletedProcess has the same three fields."""

    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def train_main(capsys):
    """trainer.train's main(argv) in this process, as one rank: a Result. No process start and
    no second TensorFlow import; the SIGTERM handler the run installs and the float16 policy
    it may set are put back afterwards."""
    from trainer import train

    def run(argv: list[str]) -> Result:
        capsys.readouterr()
        previous = signal.getsignal(signal.SIGTERM)
        try:
            code = train.main(argv)
        except SystemExit as exc:
            code = exc.code
        finally:
            signal.signal(signal.SIGTERM, previous)
            tf.keras.mixed_precision.set_global_policy("float32")
        out, err = capsys.readouterr()
        return Result(code, out, err)

    return run


@pytest.fixture
def write_split():
    return _write_split


@pytest.fixture
def colour_images():
    return _colour_images


@pytest.fixture
def run_trainer():
    return _run_trainer


def _digit_images(size: int) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 1,797 8x8 digits (0..16 grey levels) as size x size RGB uint8 images."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = []
    for pixels in digits.images:
        grey = Image.fromarray((pixels * 255 / 16).astype(np.uint8)).resize((size, size))
        images.append(np.repeat(np.asarray(grey)[:, :, None], 3, axis=2))
    return np.stack(images), digits.target


@pytest.fixture(scope="session")
def digits_data(tmp_path_factory) -> Path:
    """Digits as 32x32 JPEGs: 1,500 train (4 shards) / 297 validation (2 shards), labels 1..10,
    with a manifest.json in the preprocessor's format. Written once per session: read-only."""
    images, digits = _digit_images(32)
    labels = digits + 1
    data_dir = tmp_path_factory.mktemp("digits")
    _write_split(data_dir, "train", images[:1500], labels[:1500], 4)
    _write_split(data_dir, "validation", images[1500:], labels[1500:], 2)
    manifest = {
        "format": "horovod-fleet/imagenet-tfrecords/1",
        "num_classes": 10,
        "label_base": 1,
        "splits": {
            "train": {"shards": 4, "records": 1500},
            "validation": {"shards": 2, "records": len(images) - 1500},
        },
    }
    (data_dir / "manifest.json").write_text(json.dumps(manifest))
    return data_dir


class TwoRankRun(NamedTuple):
    model_dir: Path
    digests: Path  # rank-<r>.sha256 of every checkpoint variable, per rank, at the end
    result: subprocess.CompletedProcess


@pytest.fixture(scope="session")
def two_rank_digits_run(digits_data, tmp_path_factory) -> TwoRankRun:
    """One two-rank training on the digits, shared by every test that only reads what it
    left (learning, identical weights, the stop at the target) or copies its model dir (resume,
    eval-only): the costliest proof of the suite, made once."""
    where = tmp_path_factory.mktemp("two-rank-digits")
    model_dir, digests = where / "model", where / "digests"
    digests.mkdir()
    args = ["--data-dir", str(digits_data), "--model-dir", str(model_dir), *DIGITS_RUN]
    result = _run_trainer(args, ranks=2, timeout=900, TRAINER_WEIGHTS_DIGEST_DIR=str(digests))
    assert result.returncode == 0, result.stdout + result.stderr
    return TwoRankRun(model_dir, digests, result)


@pytest.fixture
def horovod_script(tmp_path):
    """Run a Python snippet (with the repository importable) on `ranks` Gloo ranks."""

    def run(source: str, ranks: int, timeout: float = 300) -> subprocess.CompletedProcess:
        script = tmp_path / "snippet.py"
        script.write_text(source)
        command = [HOROVODRUN, "-np", str(ranks), "-H", f"localhost:{ranks}", "--gloo"]
        return subprocess.run(
            [*command, PYTHON, str(script)],
            cwd=REPO,
            env=trainer_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    return run


@pytest.fixture
def start_trainer():
    """Start a trainer in the background, on `ranks` Gloo ranks (stdout and stderr merged)."""

    def start(args: list[str], ranks: int = 1) -> subprocess.Popen:
        return subprocess.Popen(
            trainer_command(args, ranks),
            cwd=REPO,
            env=trainer_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    return start
