"""trainer/preprocess/ runs on the preprocessing node, which installs no TensorFlow: every module
imports, and every command runs, with TensorFlow, Keras and Horovod unimportable.

.venv/bin/python -m pytest tests/trainer/test_preprocess_package.py
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "trainer" / "preprocess"
BLOCKED = ("tensorflow", "keras", "horovod")

# A sitecustomize, not a prelude to `python -c`: Python runs it at start-up in every process that
# inherits the environment, so it also blocks the imports of `-m` commands and of spawned workers.
BLOCKER = f"""
import sys


class BlockTensorFlow:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {BLOCKED!r}:
            raise ImportError(f"{{name}} is blocked: the preprocessing node has no TensorFlow")
        return None


sys.meta_path.insert(0, BlockTensorFlow())
"""

IMPORT_EVERY_MODULE = """
import importlib, pkgutil, sys
import trainer.preprocess

names = [m.name for m in pkgutil.walk_packages(trainer.preprocess.__path__, "trainer.preprocess.")]
for name in names:
    importlib.import_module(name)
loaded = sorted(m for m in sys.modules if m.partition(".")[0] in {blocked!r})
assert not loaded, loaded
print(" ".join(names))
"""


@pytest.fixture
def without_tensorflow(tmp_path):
    """Runs a command in a fresh interpreter where importing TensorFlow raises ImportError."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(REPO)]))

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
            timeout=300,
        )  # fmt: skip

    return run


def test_the_block_stops_tensorflow(without_tensorflow):
    """The trainer itself imports TensorFlow: under the block it cannot start."""
    result = without_tensorflow("-c", "import trainer.data")
    assert result.returncode != 0
    assert "tensorflow is blocked" in result.stderr


def test_every_module_imports_without_tensorflow(without_tensorflow):
    result = without_tensorflow("-c", IMPORT_EVERY_MODULE.format(blocked=BLOCKED))
    assert result.returncode == 0, result.stderr
    imported = set(result.stdout.split())
    files = {f"trainer.preprocess.{path.stem}" for path in PACKAGE.glob("*.py")}
    assert imported == files - {"trainer.preprocess.__init__"}


def test_the_commands_run_without_tensorflow(without_tensorflow, tmp_path):
    for module in ("trainer.preprocess", "trainer.preprocess.sample", "trainer.preprocess.bench"):
        result = without_tensorflow("-m", module, "--help")
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("usage: python -m " + module)
    raw = tmp_path / "raw"
    sample = without_tensorflow(
        "-m", "trainer.preprocess.sample", "--output", str(raw), "--classes", "2",
        "--train-per-class", "3", "--val-images", "2",
    )  # fmt: skip
    assert sample.returncode == 0, sample.stderr
    converted = without_tensorflow(
        "-m", "trainer.preprocess", "--train-tar", str(raw / "ILSVRC2012_img_train.tar"),
        "--val-tar", str(raw / "ILSVRC2012_img_val.tar"),
        "--val-labels", str(raw / "ILSVRC2012_validation_ground_truth.txt"),
        "--output", str(tmp_path / "tfrecords"), "--train-shards", "2", "--val-shards", "1",
        "--workers", "2",
    )  # fmt: skip
    assert converted.returncode == 0, converted.stderr
    assert "wrote train 6 records in 2 shards, validation 2 records in 1 shards" in converted.stderr


OLD_MODULES = [
    "preprocess.py", "preprocess_inputs.py", "preprocess_image.py", "preprocess_jpeg.py",
    "preprocess_output.py", "imagenet_archives.py", "tfrecord_writer.py", "make_sample.py",
    "bench_preprocess.py",
]  # fmt: skip


def test_the_converter_lives_only_in_its_package():
    assert [name for name in OLD_MODULES if (REPO / "trainer" / name).exists()] == []
