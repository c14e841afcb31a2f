"""trainer.benchmark: timed steps of the trainer's own step on host-made, device-made or real batches.

.venv/bin/python -m pytest tests/trainer/test_trainer_benchmark.py
"""

import json
import statistics

import numpy as np
import pytest
import tensorflow as tf

from trainer import benchmark

SMALL = ["--arch", "resnet18", "--image-size", "32", "--batch-size", "4", "--num-classes", "4"]


def result_of(stdout: str) -> dict:
    [line] = [x for x in stdout.splitlines() if x.startswith(benchmark.RESULT_PREFIX)]
    return json.loads(line[len(benchmark.RESULT_PREFIX) :])


def test_summary_is_the_mean_and_horovods_spread_of_the_step_rates():
    summary = benchmark.summarise([0.5, 0.25, 0.25, 1.0], global_batch=8, ranks=2)
    rates = [16.0, 32.0, 32.0, 8.0]
    assert summary["step_images_per_s"] == rates
    assert summary["images_per_s"] == statistics.fmean(rates) == 22.0
    assert summary["images_per_s_spread"] == round(1.96 * float(np.std(rates)), 2)
    assert summary["images_per_s_per_gpu"] == 11.0


@pytest.mark.parametrize("device", [None, "/cpu:0"])
def test_host_batches_live_in_host_memory_and_cycle(device):
    batches = benchmark.host_batches(3, 32, 10, device, seed=1)
    # Not autotuned, as the trainer's (docs/trainer.md, "The input pipeline").
    assert batches._dataset.options().autotune.enabled is False
    first, second, third = (next(batches) for _ in range(3))
    images, labels = first
    assert images.shape == (3, 32, 32, 3) and images.dtype == tf.uint8
    assert labels.shape == (3,) and int(tf.reduce_max(labels)) < 10
    assert "CPU" in images.device
    assert not np.array_equal(first[0].numpy(), second[0].numpy())
    assert np.array_equal(first[0].numpy(), third[0].numpy())  # a pool of HOST_POOL batches


@pytest.mark.slow
@pytest.mark.parametrize("source", ["host", "device"])
def test_one_rank_times_each_step(run_trainer, tmp_path, source):
    args = ["--model-dir", str(tmp_path), "--input", source, "--warmup-steps", "1"]
    result = run_trainer([*args, "--timed-steps", "3", *SMALL], module="trainer.benchmark")
    assert result.returncode == 0, result.stderr[-3000:]
    found = result_of(result.stdout)
    assert (found["ranks"], found["input"], found["timed_steps"]) == (1, source, 3)
    assert len(found["step_images_per_s"]) == 3
    assert found["images_per_s"] == pytest.approx(
        statistics.fmean(found["step_images_per_s"]), 0.01
    )
    assert "Total img/sec on 1 GPU(s):" in result.stdout


@pytest.mark.slow
def test_real_data_through_the_input_pipeline(run_trainer, tmp_path, tiny_data):
    args = ["--model-dir", str(tmp_path), "--input", "data", "--data-dir", str(tiny_data)]
    result = run_trainer(
        [*args, "--warmup-steps", "1", "--timed-steps", "2", *SMALL], module="trainer.benchmark"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result_of(result.stdout)["input"] == "data"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--input", "disk"], "argument --input: invalid choice: 'disk'"),
        (["--timed-steps", "1"], "--timed-steps >= 2, got 10 and 1"),
        (["--input", "data"], "--data-dir is required"),
    ],
)
def test_bad_input_is_one_line(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exited:
        benchmark.main(["--model-dir", str(tmp_path), *args])
    assert exited.value.code == 2
    stderr = capsys.readouterr().err
    assert stderr.strip().splitlines() == [stderr.strip()]
    assert message in stderr
