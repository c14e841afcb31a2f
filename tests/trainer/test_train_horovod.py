"""Horovod over Gloo on CPU, the proofs that need several ranks: they learn in sync and stop
together at the target, a checkpoint resumes on two ranks, a bad or empty rank stops every rank,
a signal to one rank stops all at one step, float16 averaging does not overflow.

The learning proofs read one shared two-rank run (tests/trainer/conftest.py,
two_rank_digits_run); docs/test-tiers.md lists what these tests replaced.

    .venv/bin/python -m pytest -m slow tests/trainer/test_train_horovod.py
"""

import json
import re
import shutil
import signal
import time

import psutil
import pytest
from trainer_helpers import DIGITS_RUN, DIGITS_TARGET_TOP1

pytestmark = pytest.mark.slow


def rank_digests(directory) -> list[str]:
    return [p.read_text().strip() for p in sorted(directory.glob("rank-*.sha256"))]


def test_two_ranks_learn_digits_with_identical_weights(two_rank_digits_run):
    model_dir, digests, result = two_rank_digits_run
    assert "10 classes, 2 ranks x 32 = global batch 64, 23 steps/epoch" in result.stdout
    assert "Finished in " in result.stdout.splitlines()[-1]
    evaluation = json.loads((model_dir / "eval.json").read_text())
    assert evaluation["images"] == 297 and evaluation["top1"] >= DIGITS_TARGET_TOP1, evaluation
    train = json.loads((model_dir / "train.json").read_text())
    assert train["global_batch"] == 64 and train["images_per_s"] > 0
    [first, second] = rank_digests(digests)
    assert first == second, "ranks ended with different weights"


def test_two_ranks_stop_together_once_the_target_top1_is_reached(two_rank_digits_run):
    """MLPerf's time to accuracy: evaluate every epoch, stop at the first that reaches the
    target, and say when; the digits reach it within a few epochs of 8."""
    model_dir, _, result = two_rank_digits_run
    train = json.loads((model_dir / "train.json").read_text())
    evaluation = json.loads((model_dir / "eval.json").read_text())
    reached = train["reached_target_at_epoch"]
    assert reached is not None and reached < 8, train
    assert (train["epochs"], train["epochs_planned"], evaluation["epoch"]) == (reached, 8, reached)
    assert train["time_to_target_s"] > 0
    assert f"Reached the target top-1 {DIGITS_TARGET_TOP1:.4f} at epoch {reached}" in result.stdout
    assert f"Epoch {reached + 1}/8" not in result.stdout


def test_its_checkpoint_resumes_on_two_ranks_in_step(
    two_rank_digits_run, digits_data, tmp_path, run_trainer
):
    """The shared run's last checkpoint, one more epoch on two ranks: it resumes after the
    epochs done, trains only the new one, and the ranks end with identical weights."""
    model_dir, digests = tmp_path / "model", tmp_path / "digests"
    shutil.copytree(two_rank_digits_run.model_dir, model_dir)
    digests.mkdir()
    done = json.loads((model_dir / "train.json").read_text())["epochs"]
    flags = [*DIGITS_RUN[: DIGITS_RUN.index("--epochs")], "--log-every", "10"]
    args = ["--data-dir", str(digits_data), "--model-dir", str(model_dir), *flags]
    args += ["--epochs", str(done + 1), "--warmup-epochs", "1", "--base-lr", "0.8"]
    result = run_trainer(args, ranks=2, timeout=600, TRAINER_WEIGHTS_DIGEST_DIR=str(digests))
    assert result.returncode == 0, result.stdout + result.stderr
    log = result.stdout
    assert re.search(rf"Resuming from \S+ckpt-{done * 23}: {done} epochs done\n", log), log
    assert f"Epoch {done}/" not in log and f"Epoch {done + 1}/{done + 1}" in log
    assert json.loads((model_dir / "eval.json").read_text())["epoch"] == done + 1
    [first, second] = rank_digests(digests)
    assert first == second, "ranks ended with different weights after resuming"


def test_bad_label_on_one_rank_stops_every_rank(
    tiny_data, tmp_path, run_trainer, write_split, colour_images
):
    # Only rank 1 reads train-00001; its label 9 is outside 1..4. Rank 0 must not wait forever.
    write_split(tiny_data / "bad", "train", colour_images(8, 40, 40), [1, 2, 9, 4] * 2, 1)
    (tiny_data / "bad" / "train-00000-of-00001").rename(tiny_data / "train-00001-of-00002")
    args = ["--data-dir", str(tiny_data), "--model-dir", str(tmp_path / "m"), "--arch", "resnet18"]
    args += ["--image-size", "32", "--batch-size", "4", "--epochs", "1", "--num-classes", "4"]
    started = time.monotonic()
    result = run_trainer(args, ranks=2, timeout=300)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if "error: label" in line]
    bad_file = tiny_data / "train-00001-of-00002"
    assert sorted(line.split(":", 1)[0] for line in errors) == ["[0]<stderr>", "[1]<stderr>"]
    assert all(line.endswith(f"error: label 9 outside 1..4 in {bad_file}") for line in errors)
    assert "Traceback" not in "".join(line for line in result.stderr.splitlines() if "]<" in line)
    assert time.monotonic() - started < 200


def test_empty_shards_on_one_rank_stop_every_rank(tiny_data, tmp_path, run_trainer):
    # The split has records, but rank 1's only shard is empty: with --steps-per-epoch (no count)
    # rank 1 used to wait forever for a batch while rank 0 waited for it in the allreduce.
    empty = tiny_data / "train-00001-of-00002"
    empty.write_bytes(b"")
    model_dir = tmp_path / "m"
    args = ["--data-dir", str(tiny_data), "--model-dir", str(model_dir), "--arch", "resnet18"]
    args += ["--image-size", "32", "--batch-size", "4", "--epochs", "1", "--num-classes", "4"]
    result = run_trainer([*args, "--steps-per-epoch", "2"], ranks=2, timeout=120)
    assert result.returncode != 0  # horovodrun's own status for a failed rank
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert sorted(line.split(":", 1)[0] for line in errors) == ["[0]<stderr>", "[1]<stderr>"]
    expected = f"error: rank 1's train shards, from {empty}, hold no records (every file is empty)"
    assert all(line.endswith(expected) for line in errors), errors
    assert not model_dir.exists()


def test_three_ranks_over_two_validation_shards_count_each_image_once(
    tiny_data, tmp_path, run_trainer
):
    # tiny_data has 2 train and 2 validation shards: 3 ranks used to refuse to start.
    model_dir, digests = tmp_path / "model", tmp_path / "digests"
    digests.mkdir()
    args = ["--data-dir", str(tiny_data), "--model-dir", str(model_dir), "--arch", "resnet18"]
    args += ["--image-size", "32", "--batch-size", "2", "--epochs", "1", "--num-classes", "4"]
    args += ["--steps-per-epoch", "3", "--log-every", "1"]
    result = run_trainer(args, ranks=3, timeout=600, TRAINER_WEIGHTS_DIGEST_DIR=str(digests))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 ranks x 2 = global batch 6" in result.stdout
    assert json.loads((model_dir / "eval.json").read_text())["images"] == 8
    assert len(set(rank_digests(digests))) == 1, "ranks ended with different weights"


def rank_process(rank: int, command_part: str):
    """The trainer process horovodrun started as `rank` (HOROVOD_RANK in its environment)."""
    for process in psutil.process_iter(["cmdline"]):
        try:
            if command_part in " ".join(process.info["cmdline"] or []) and (
                process.environ().get("HOROVOD_RANK") == str(rank)
            ):
                return process
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


def test_fp16_sigterm_to_one_rank_saves_its_step_and_two_ranks_resume_in_step(
    tiny_data, tmp_path, run_trainer, start_trainer
):
    model_dir, digests = tmp_path / "model", tmp_path / "digests"
    digests.mkdir()
    args = ["--data-dir", str(tiny_data), "--model-dir", str(model_dir), "--arch", "resnet18"]
    args += ["--image-size", "32", "--batch-size", "2", "--epochs", "1", "--num-classes", "4"]
    # float16 is slow on CPU: few steps, a stop at the first check after step 4.
    args += ["--steps-per-epoch", "24", "--log-every", "2", "--precision", "fp16"]
    process = start_trainer(args, ranks=2)
    try:
        for line in process.stdout:
            fields = line.split(":", 1)[-1].split()
            if len(fields) == 6 and fields[0].isdigit() and int(fields[0]) >= 4:
                break
        rank_1 = rank_process(1, str(model_dir))
        assert rank_1 is not None, "rank 1 not found"
        rank_1.send_signal(signal.SIGTERM)  # a Spot interruption of a node other than node 0
        output = process.communicate(timeout=300)[0]
    finally:
        process.kill()
    marker = json.loads((model_dir / "interrupted.json").read_text())
    assert marker["reason"].startswith("a signal on another rank: stopped at step"), marker
    assert 4 <= marker["step"] < 24, output

    result = run_trainer(args, ranks=2, timeout=900, TRAINER_WEIGHTS_DIGEST_DIR=str(digests))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"0 epochs done, {marker['step']} steps into epoch 1" in result.stdout
    # Weights, slots, loss scale and good-step count: rank 1 restarted from rank 0's.
    [first, second] = rank_digests(digests)
    assert first == second, "fp16 ranks drifted apart after resuming"


AVERAGE_LARGE_GRADIENTS = """
import horovod.tensorflow as hvd
import tensorflow as tf
from trainer.step import distributed_tape
hvd.init()
x = tf.Variable(1.0)
with tf.GradientTape() as tape:
    loss = 40000.0 * x
(grad,) = distributed_tape(tape, hvd.size()).gradient(loss, [x])
print(f"averaged gradient {float(grad)}")
with tf.GradientTape() as tape:  # an elastic world of 2 ranks, planned for 4
    loss = 40000.0 * x
(grad,) = distributed_tape(tape, 4).gradient(loss, [x])
print(f"averaged gradient {float(grad)}")
"""


def test_float16_averaging_does_not_overflow_where_the_sum_would(tmp_path, horovod_script):
    # 2 x 40000 overflows float16 (max 65504); their average does not. Summing first, then
    # dividing (Horovod's Average without a pre-divide) gave inf on every rank. Pre-divided by
    # the 4 ranks an elastic run planned, 2 ranks still get their average (Horovod divides by
    # its size at run time).
    result = horovod_script(AVERAGE_LARGE_GRADIENTS, ranks=2)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if "averaged gradient" in line]
    assert len(lines) == 4 and all(line.endswith("averaged gradient 40000.0") for line in lines)
