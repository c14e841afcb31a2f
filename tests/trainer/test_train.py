"""trainer.train end to end: --help, bad input as one `error:` line, synthetic, eval-only, the fast
recipe's resolutions, SIGTERM; in this process (train_main) but for the command's process
contract. Its parts alone: test_loop.py, test_actions.py, test_step.py, test_recorder.py,
test_inputs.py."""

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from trainer import recipes
from trainer.config import ConfigError, build_parser, parse_config
from trainer.recorder import INTERRUPTED_FILE
from trainer.run import EXIT_INTERRUPTED
from trainer.step import settle_recipe


def error_lines(result) -> list[str]:
    assert "Traceback" not in result.stderr, result.stderr
    return [line for line in result.stderr.splitlines() if "error:" in line]


def test_help_documents_every_flag():
    parser = build_parser()
    text = parser.format_help()
    for action in parser._actions:
        assert action.help, action.option_strings
        for option in action.option_strings:
            assert option in text


def test_config_is_validated_once_at_the_edge(tmp_path, capsys):
    config = parse_config(["--data-dir", str(tmp_path), "--model-dir", str(tmp_path / "m")])
    assert (config.arch, config.batch_size, config.image_size, config.recipe) == (
        "resnet50",
        256,
        224,
        "goyal",
    )
    assert config.epochs is None  # the recipe's: 90 for goyal
    assert settle_recipe(config, 256)[0].epochs == 90
    with pytest.raises(ConfigError, match="--base-lr applies to --recipe goyal"):
        parse_config(["--data-dir", "d", "--model-dir", "m", "--recipe", "fast", "--base-lr", "1"])
    with pytest.raises(SystemExit) as exited:
        parse_config(["--data-dir", "d", "--model-dir", "m", "--recipe", "mlperf"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.startswith(
        "error: argument --recipe: invalid choice: 'mlperf' (choose from 'goyal', 'fast')"
    )
    with pytest.raises(ConfigError, match="--batch-size must be > 0, got 0"):
        parse_config(["--data-dir", "d", "--model-dir", "m", "--batch-size", "0"])
    with pytest.raises(ConfigError, match="--data-dir is required"):
        parse_config(["--model-dir", "m"])
    assert config.seed is None  # unseeded unless asked
    assert parse_config(["--data-dir", "d", "--model-dir", "m", "--seed", "3"]).seed == 3
    with pytest.raises(ConfigError, match="--seed must be >= 0, got -1"):
        parse_config(["--data-dir", "d", "--model-dir", "m", "--seed", "-1"])


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (["--min-ranks", "2"], "--min-ranks applies to --elastic only"),
        (["--planned-ranks", "8"], "--planned-ranks applies to --elastic only"),
        (["--elastic"], "--elastic needs --planned-ranks (nodes x GPUs, horovodrun's --max-np)"),
        (["--elastic", "--planned-ranks", "0"], "--planned-ranks must be >= 1, got 0"),
        (
            ["--elastic", "--planned-ranks", "8", "--min-ranks", "9"],
            "--min-ranks must be in 1..--planned-ranks (8), got 9",
        ),
        (
            ["--elastic", "--planned-ranks", "8", "--commit-every-s", "0"],
            "--commit-every-s must be a finite number > 0, got 0.0",
        ),
        (["--elastic", "--planned-ranks", "8", "--eval-only"], "--eval-only evaluates once"),
        (["--data-wait-s", "-1"], "--data-wait-s must be a finite number >= 0, got -1.0"),
    ],
)
def test_elastic_flags_are_refused_in_one_line(flags, error):
    with pytest.raises(ConfigError) as refused:
        parse_config(["--data-dir", "d", "--model-dir", "m", *flags])
    assert str(refused.value).startswith(error)


def test_elastic_flags_settle_into_the_config():
    args = ["--data-dir", "d", "--model-dir", "m", "--elastic", "--planned-ranks", "64"]
    config = parse_config([*args, "--min-ranks", "56", "--data-wait-s", "900"])
    assert (config.elastic, config.planned_ranks, config.min_ranks) == (True, 64, 56)
    assert (config.commit_every_s, config.data_wait_s) == (30, 900)
    plain = parse_config(["--data-dir", "d", "--model-dir", "m"])
    assert (plain.elastic, plain.planned_ranks, plain.min_ranks, plain.data_wait_s) == (
        False, None, 1, 600,
    )  # fmt: skip


def test_bad_flag_value_is_one_error_line_from_the_process(tmp_path, run_trainer):
    """The process contract: exit 2, one line on stderr, no traceback, no TensorFlow import."""
    result = run_trainer(["--data-dir", str(tmp_path), "--model-dir", "m", "--epochs", "-1"])
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["error: --epochs must be > 0, got -1"]


def test_missing_data_dir_is_one_error_line(tmp_path, train_main):
    missing = tmp_path / "nowhere"
    result = train_main(["--data-dir", str(missing), "--model-dir", str(tmp_path / "m")])
    assert result.returncode == 2
    assert error_lines(result) == [f"error: data directory {missing} does not exist"]


def test_no_shards_is_one_error_line(tmp_path, train_main):
    result = train_main(["--data-dir", str(tmp_path), "--model-dir", str(tmp_path / "m")])
    assert result.returncode == 2
    assert error_lines(result) == [f"error: no train-* TFRecord shards in {tmp_path}"]


def test_truncated_shard_is_named(tiny_data, tmp_path, train_main):
    shard = tiny_data / "train-00001-of-00002"
    shard.write_bytes(shard.read_bytes()[:-50])
    result = train_main(["--data-dir", str(tiny_data), "--model-dir", str(tmp_path / "m")])
    assert result.returncode == 2
    [line] = error_lines(result)
    assert line.startswith(f"error: corrupt or truncated record in {shard}")


def test_eval_only_without_checkpoint_is_an_error(tiny_data, tmp_path, train_main):
    model_dir = tmp_path / "m"
    args = ["--data-dir", str(tiny_data), "--model-dir", str(model_dir), "--eval-only"]
    result = train_main([*args, "--arch", "resnet18", "--image-size", "32"])
    assert result.returncode == 2
    assert error_lines(result) == [
        f"error: --eval-only: no checkpoint in {model_dir / 'checkpoints'}"
    ]


@pytest.mark.slow  # two traces of ResNet-18 (training, evaluation) in this process: 14 s
def test_synthetic_run_writes_outputs_then_eval_only_restores(tmp_path, train_main):
    model_dir = tmp_path / "m"
    args = ["--synthetic", "--model-dir", str(model_dir), "--arch", "resnet18"]
    args += ["--image-size", "32", "--batch-size", "4", "--num-classes", "10"]
    result = train_main([*args, "--epochs", "1", "--steps-per-epoch", "3", "--log-every", "1"])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = [line.split() for line in lines].index(
        ["Step", "Epoch", "Speed", "Loss", "FinLoss", "LR"]
    )
    assert [int(line.split()[0]) for line in lines[header + 2 : header + 5]] == [1, 2, 3]
    assert lines[-1].startswith("Finished in ")
    train = json.loads((model_dir / "train.json").read_text())
    assert set(train) == {
        "epochs", "epochs_planned", "global_batch", "images_per_s", "end_to_end_images_per_s", "duration_s",
        "startup_s", "evaluation_s", "checkpoint_s", "start_step", "end_step", "step_s",
        "framework_start_s", "first_step_s", "first_step_at", "steps_redone", "resets",
    }  # fmt: skip
    assert (train["start_step"], train["end_step"], train["steps_redone"], train["resets"]) == (
        0, 3, 0, [],
    )  # fmt: skip
    assert train["step_s"] > 0 and 0 < train["first_step_s"] < train["duration_s"]
    startup = json.loads((model_dir / "startup.json").read_text())
    assert set(startup) == {"started_at", "framework_start_s", "first_step_s", "first_step_at"}
    assert startup["first_step_at"] == train["first_step_at"] and startup["started_at"][-1] == "Z"
    # From the process's start to the first step: imports, the model, the restore.
    assert 0 < startup["framework_start_s"] == train["framework_start_s"]
    assert (train["epochs"], train["global_batch"]) == (1, 4)
    # End to end includes start-up, compilation, evaluation and the checkpoint: it is lower.
    assert 0 < train["end_to_end_images_per_s"] < train["images_per_s"]
    assert train["startup_s"] + train["evaluation_s"] + train["checkpoint_s"] < train["duration_s"]
    assert (model_dir / "checkpoints" / "ckpt-3.index").exists()  # numbered by global step
    assert list((model_dir / "tensorboard").glob("events.out.tfevents.*"))
    progress = json.loads((model_dir / "progress.json").read_text())
    assert set(progress) == {
        "phase", "epoch", "epochs", "step", "steps_per_epoch", "ranks", "global_step",
        "images_per_s", "loss", "top1", "eta_s", "updated_at",
    }  # fmt: skip
    assert progress["ranks"] == 1
    # Written last by the evaluation after the last log step (step 3 of 3, nothing left).
    assert (progress["phase"], progress["epoch"], progress["step"]) == ("evaluating", 1, 3)
    assert (progress["global_step"], progress["eta_s"]) == (3, 0.0)
    assert 0 <= progress["top1"] <= 1 and progress["images_per_s"] > 0

    result = train_main([*args, "--eval-only"])
    assert result.returncode == 0, result.stderr
    assert "Resuming from" in result.stdout
    evaluation = json.loads((model_dir / "eval.json").read_text())
    assert set(evaluation) == {"top1", "top5", "epoch", "images"}
    assert (evaluation["epoch"], evaluation["images"]) == (1, 4)


@pytest.mark.slow  # three traces of ResNet-18 (two training sizes, one for evaluation): 20 s
def test_the_fast_recipe_trains_at_its_resolution_steps_in_process(tmp_path, train_main):
    """The short run of the fast recipe (its schedule: tests/trainer/test_recipes.py): LARS, the
    low resolution first, then the ramp's step in the last epoch, evaluation at full size."""
    args = ["--synthetic", "--model-dir", str(tmp_path), "--arch", "resnet18", "--recipe", "fast"]
    args += ["--image-size", "32", "--batch-size", "4", "--num-classes", "10", "--epochs", "6"]
    result = train_main([*args, "--steps-per-epoch", "1", "--log-every", "1"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "(LARS), 2 warmup epochs, poly decay" in result.stdout
    assert "training at 23x23 from epoch 1 (evaluation at 32)" in result.stdout
    assert "training at 27x27 from epoch 6 (evaluation at 32)" in result.stdout
    assert json.loads((tmp_path / "eval.json").read_text())["epoch"] == 6


def signal_at_step(progress: Path, step: int, sent: list[int]) -> threading.Thread:
    """SIGTERM to this process once progress.json says `step` is done (the step goes in `sent`)."""

    def watch() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                done = json.loads(progress.read_text())["global_step"]
            except (OSError, ValueError, KeyError):
                done = 0
            if done >= step:
                sent.append(done)
                os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow  # two one-rank trainings in this process, each a trace of ResNet-18: 23 s
def test_sigterm_mid_epoch_saves_that_step_and_a_rerun_resumes_there(
    tiny_data, tmp_path, train_main
):
    model_dir = tmp_path / "m"
    args = ["--data-dir", str(tiny_data), "--model-dir", str(model_dir), "--arch", "resnet18"]
    args += ["--image-size", "32", "--batch-size", "4", "--epochs", "1", "--num-classes", "4"]
    args += ["--steps-per-epoch", "12", "--log-every", "1"]
    sent: list[int] = []
    watcher = signal_at_step(model_dir / "progress.json", 3, sent)
    result = train_main(args)
    watcher.join()
    assert result.returncode == EXIT_INTERRUPTED, result.stdout + result.stderr
    marker = json.loads((model_dir / INTERRUPTED_FILE).read_text())
    # Stopped at the next check step (every step here, with --log-every 1), mid-epoch.
    assert sent[0] <= marker["step"] <= sent[0] + 2 < 12, (sent, marker)
    assert marker["checkpoint"].endswith(f"ckpt-{marker['step']}")
    assert "interrupted: SIGTERM: stopped at step" in result.stdout

    result = train_main([*args, "--log-every", "1000"])
    assert result.returncode == 0, result.stdout + result.stderr
    step = marker["step"]
    assert f"0 epochs done, {step} steps into epoch 1" in result.stdout
    rows = [line.split() for line in result.stdout.splitlines()]
    assert [row[0] for row in rows if len(row) == 6 and row[0].isdigit()] == ["12"]
    assert not (model_dir / INTERRUPTED_FILE).exists()  # the finished run removed it
    assert (model_dir / "checkpoints" / "ckpt-12.index").exists()


def test_default_recipe_switches_at_a_global_batch_of_16k():
    # 8 nodes x 8 GPUs x 256 = 16,384 gets AWS's tested 16k recipe: 10 warmup epochs, no LARS.
    assert recipes.goyal(16383).warmup_epochs == 5 and recipes.goyal(16384).warmup_epochs == 10
    assert not recipes.goyal(16384).lars and recipes.goyal(32768).lars
    assert recipes.goyal(16384, warmup_epochs=2.5).warmup_epochs == 2.5  # the flag wins
