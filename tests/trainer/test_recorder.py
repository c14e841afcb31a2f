"""trainer/recorder.py: the run's log lines and files from rank 0, nothing from the others but
the digest hook; with a stand-in for the step (its loss scale and weights digest)."""

import json
import re
import time
import types

import tensorflow as tf

from trainer.config import parse_config
from trainer.recorder import (
    HEADER,
    INTERRUPTED_FILE,
    RESETS_FILE,
    STARTUP_FILE,
    Recorder,
    Timings,
    make_model_dir,
)


def make_recorder(model_dir, rank=0):
    args = ["--synthetic", "--model-dir", str(model_dir), "--epochs", "3"]
    config = parse_config([*args, "--image-size", "32", "--batch-size", "4"])
    step = types.SimpleNamespace(
        loss_scale_state=lambda: (32768.0, 2), weights_digest=lambda: f"digest of rank {rank}"
    )
    timings = Timings(time.perf_counter())
    return Recorder(config, rank=rank, ranks=2, steps_per_epoch=10, timings=timings, step=step)


def save_checkpoint(model_dir, number):
    checkpoint = tf.train.Checkpoint(v=tf.Variable(1.0))
    manager = tf.train.CheckpointManager(checkpoint, str(model_dir / "checkpoints"), 5)
    return manager.save(checkpoint_number=number)


def test_rank_0_logs_the_table_and_writes_every_file(tmp_path, capsys, monkeypatch):
    digests = tmp_path / "digests"
    digests.mkdir()
    monkeypatch.setenv("TRAINER_WEIGHTS_DIGEST_DIR", str(digests))
    model_dir = tmp_path / "m"
    assert make_model_dir(model_dir) is None
    recorder = make_recorder(model_dir)
    recorder.resized(24, 1)
    recorder.begin_training()
    recorder.begin_epoch(1)
    recorder.start_clocks()
    recorder.log_step(
        epoch=1, step=5, global_step=5, steps=5, loss=1.23456, total_loss=2.5,
        learning_rate=lambda: 0.1,
    )  # fmt: skip
    recorder.evaluating()
    recorder.evaluated({"top1": 0.61, "top5": 0.75, "epoch": 1, "images": 8})
    recorder.end_epoch(1)
    recorder.reached_target(0.6, 1, 0.61, 65.0)
    recorder.interrupted("SIGTERM: stopped at step 7 (epoch 1, step 7 of 10)")
    assert json.loads((model_dir / INTERRUPTED_FILE).read_text())["checkpoint"] is None
    path = save_checkpoint(model_dir, 7)
    recorder.interrupted("SIGTERM: stopped at step 7 (epoch 1, step 7 of 10)")
    recorder.finish(1, {"target_top1": 0.6}, end_step=7, resets=[])

    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == ["training at 24x24 from epoch 1 (evaluation at 32)", HEADER, "Epoch 1/3"]
    row = lines[3].split()
    assert (row[0], row[1], row[3], row[4], row[5]) == ("5", "0.50", "1.235", "2.500", "0.10000")
    assert float(row[2]) > 0  # global images per second: 8 x 5 images over the interval
    assert lines[4] == "Eval epoch 1: top1 0.6100 top5 0.7500 on 8 images"
    assert re.fullmatch(
        r"Epoch 1/3 done in \d+\.\d s: [\d.]+ img/s \([\d.]+ per GPU\), 8 images/step, "
        r"ETA \d:\d\d:\d\d, loss scale 32768, 2 skipped steps",
        lines[5],
    ), lines[5]
    assert lines[6] == "Reached the target top-1 0.6000 at epoch 1 (0.6100) in 0:01:05: stopping"
    assert lines[7].startswith("Finished in ") and len(lines) == 8

    progress = json.loads((model_dir / "progress.json").read_text())
    assert (progress["phase"], progress["step"], progress["top1"]) == ("evaluating", 5, 0.61)
    assert json.loads((model_dir / "eval.json").read_text())["top1"] == 0.61
    assert json.loads((model_dir / INTERRUPTED_FILE).read_text()) == {
        "reason": "SIGTERM: stopped at step 7 (epoch 1, step 7 of 10)",
        "checkpoint": path,
        "step": 7,
    }
    train = json.loads((model_dir / "train.json").read_text())
    assert (train["epochs"], train["epochs_planned"], train["global_batch"]) == (1, 3, 8)
    assert train["target_top1"] == 0.6 and train["evaluation_s"] >= 0
    assert list((model_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert (digests / "rank-0.sha256").read_text() == "digest of rank 0\n"


def test_other_ranks_print_and_write_nothing_but_their_digest(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TRAINER_WEIGHTS_DIGEST_DIR", str(tmp_path))
    model_dir = tmp_path / "m"  # rank 0 makes it; this rank never looks
    recorder = make_recorder(model_dir, rank=1)
    recorder.begin_training()
    recorder.begin_epoch(1)
    recorder.start_clocks()
    recorder.log_step(
        epoch=1, step=1, global_step=1, steps=1, loss=1.0, total_loss=1.0,
        learning_rate=lambda: 0.1,
    )  # fmt: skip
    recorder.evaluating()
    recorder.evaluated({"top1": 0.5, "top5": 0.5, "epoch": 1, "images": 8})
    recorder.end_epoch(1)
    recorder.interrupted("SIGTERM")
    recorder.finish(1, {}, end_step=1, resets=[])
    assert capsys.readouterr().out == ""
    assert not model_dir.exists()
    assert (tmp_path / "rank-1.sha256").read_text() == "digest of rank 1\n"


def test_the_model_dir_is_made_and_a_stale_marker_removed(tmp_path):
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    (model_dir / INTERRUPTED_FILE).write_text("{}")
    assert make_model_dir(model_dir) is None
    assert (model_dir / "checkpoints").is_dir() and not (model_dir / INTERRUPTED_FILE).exists()
    regular = tmp_path / "file"
    regular.write_text("")
    assert make_model_dir(regular) == f"cannot create --model-dir {regular}: Not a directory"


def test_every_node_s_local_rank_0_writes_startup_json_once(tmp_path):
    for rank, local_rank in ((0, 0), (3, 0), (1, 1)):
        model_dir = tmp_path / f"node-of-rank-{rank}"
        recorder = make_recorder(model_dir, rank=rank)
        recorder.timings.started_at -= 10  # the process started 10 s ago
        recorder.set_world(rank, 4, 10, local_rank)
        recorder.first_step(2.5, time.time())
        recorder.first_step(0.1, time.time())  # a later world's first step: not the process's
        written = (model_dir / STARTUP_FILE).exists()
        assert written == (local_rank == 0), (rank, local_rank)
    startup = json.loads((tmp_path / "node-of-rank-3" / STARTUP_FILE).read_text())
    assert set(startup) == {"started_at", "framework_start_s", "first_step_s", "first_step_at"}
    assert (startup["first_step_s"], startup["framework_start_s"]) == (2.5, 7.5)


def test_rank_0_of_each_world_writes_the_resets_and_progress_says_the_ranks(tmp_path):
    """After a reset another process may be rank 0: it writes from then on, with the world's
    rank count in progress.json (the watcher's "nodes 7 of 8")."""
    model_dir = tmp_path / "m"
    resets = [{"at": "2026-01-01T00:00:00Z", "ranks_before": 2, "ranks_after": 1}]
    recorder = make_recorder(model_dir, rank=1)
    recorder.write_resets(resets)
    assert not model_dir.exists()
    recorder.set_world(0, 1, 20, 0)  # the old rank 0's host was lost: this one is rank 0 now
    recorder.write_resets(resets)
    assert json.loads((model_dir / RESETS_FILE).read_text()) == resets
    recorder.begin_training()
    recorder.start_clocks()
    recorder.log_step(
        epoch=1, step=4, global_step=4, steps=4, loss=1.0, total_loss=1.0,
        learning_rate=lambda: 0.1,
    )  # fmt: skip
    progress = json.loads((model_dir / "progress.json").read_text())
    assert (progress["ranks"], progress["steps_per_epoch"]) == (1, 20)
    assert recorder.writer is not None  # TensorBoard, from this world on


def test_the_training_clock_starts_with_the_first_world_not_a_later_one(tmp_path):
    recorder = make_recorder(tmp_path / "m", rank=1)
    recorder.begin_training()
    started = recorder.timings.train_start
    recorder.set_world(1, 2, 10, 0)  # an elastic reset: the loop begins again
    recorder.begin_training()
    assert recorder.timings.train_start == started  # startup_s and the time to target hold


def test_every_nodes_local_rank_0_says_its_ranks_step_at_most_once_a_second(tmp_path, monkeypatch):
    """node-steps.json: the node's bootstrap waits for a silent head while its ranks step."""
    import trainer.recorder as recorder_module

    clock = [1000.0]
    monkeypatch.setattr(recorder_module.time, "monotonic", lambda: clock[0])
    first, other = make_recorder(tmp_path / "a"), make_recorder(tmp_path / "b")
    other.set_world(1, 2, 10, local_rank=1)
    for step in (1, 2):  # two steps in the same second: one write
        first.steps_seen(step)
        other.steps_seen(step)
    path = tmp_path / "a" / "node-steps.json"
    assert json.loads(path.read_text())["global_step"] == 1
    clock[0] += 1.0
    first.steps_seen(3)
    assert json.loads(path.read_text())["global_step"] == 3
    assert not (tmp_path / "b" / "node-steps.json").exists()  # one writer per node
