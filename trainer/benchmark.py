"""Training throughput, measured: warm-up steps, then timed steps of the trainer's own training step.

    python -m trainer.benchmark --model-dir /tmp/b [--input host|device|data] [--data-dir D] \
        [--warmup-steps 10] [--timed-steps 100] [--arch resnet50] [--batch-size 256] ...
    horovodrun -np 16 -H ... python -m trainer.benchmark --model-dir /tmp/b ...

Every trainer flag works (--arch, --batch-size per rank, --image-size, --precision, --xla, ...):
the model, optimizer, loss scaling and gradient allreduce are trainer.train's. Inputs:
- host (default): generated images made on the host and copied to the device before each step
  (prefetch_to_device), as the real pipeline's batches are. This is what the fleet benchmark uses.
- device: one batch generated on the device and reused (trainer.train --synthetic): no copy, so
  it overstates what a real run can reach; kept to show by how much.
- data: the real input pipeline over --data-dir's TFRecords (decode, crop, flip, copy).

Each timed step is synchronised (its losses are read back), so each gives one figure: global
images per second. Rank 0 prints Horovod's synthetic-benchmark lines (mean +- 1.96 standard
deviations, per GPU and in total) and then one `benchmark result: {json}` line that
bootstrap.benchmark reads (docs/contracts.md). Bad input: one `error: ...` line, exit 2.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from trainer import affinity, data
from trainer.cli import OneLineErrorParser, fail
from trainer.config import ConfigError, parse_config
from trainer.inputs import input_threads, rank_train_batches, resolve_input
from trainer.ranks import RunError, setup_devices
from trainer.step import Trainer, settle_recipe

INPUTS = ("host", "device", "data")
RESULT_PREFIX = "benchmark result: "
# Distinct generated batches the host input cycles through; each is copied anew every step.
HOST_POOL = 2


def build_parser() -> OneLineErrorParser:
    parser = OneLineErrorParser(
        prog="python -m trainer.benchmark",
        description="Time the trainer's training step: W warm-up steps, then T timed steps. "
        "Any trainer.train flag is accepted after these.",
        add_help=True,
    )
    parser.add_argument(
        "--input",
        choices=INPUTS,
        default="host",
        help="host: generated batches copied host to device each step; device: one batch made "
        "on the device (overstates); data: the TFRecords in --data-dir",
    )
    parser.add_argument("--warmup-steps", type=int, default=10, help="untimed steps first")
    parser.add_argument("--timed-steps", type=int, default=100, help="steps timed one by one")
    return parser


def host_batches(batch_size: int, image_size: int, num_classes: int, device: str | None, seed: int):
    """Generated uint8 images and labels that live in host memory, copied to `device` ahead of
    each step the way data.train_dataset's batches are: the copy is part of what is measured."""
    rng = np.random.default_rng(seed)
    shape = (HOST_POOL, batch_size, image_size, image_size, 3)
    images = rng.integers(0, 256, size=shape, dtype=np.uint8)
    labels = rng.integers(0, num_classes, size=(HOST_POOL, batch_size), dtype=np.int32)
    with tf.device("/cpu:0"):
        dataset = tf.data.Dataset.from_tensor_slices((images, labels)).repeat()
    dataset = dataset.with_options(data.pipeline_options(None))  # as the trainer's: no autotuning
    return iter(data.to_device(dataset, device) if device else dataset.prefetch(2))


def summarise(step_seconds: list[float], global_batch: int, ranks: int) -> dict:
    """Images/s of each timed step, their mean and Horovod's spread (1.96 standard deviations,
    https://github.com/horovod/horovod/blob/master/examples/tensorflow2/tensorflow2_synthetic_benchmark.py)."""
    rates = [global_batch / s for s in step_seconds]
    mean = statistics.fmean(rates)
    spread = 1.96 * statistics.pstdev(rates)  # np.std, as Horovod computes it
    return {
        "images_per_s": round(mean, 2),
        "images_per_s_spread": round(spread, 2),
        "images_per_s_per_gpu": round(mean / ranks, 2),
        "step_images_per_s": [round(r, 2) for r in rates],
    }


def run(argv: list[str], node_cpus: int) -> dict | None:
    options, trainer_argv = build_parser().parse_known_args(argv)
    if options.warmup_steps < 1 or options.timed_steps < 2:
        raise ConfigError(
            f"--warmup-steps must be >= 1 and --timed-steps >= 2, got {options.warmup_steps} "
            f"and {options.timed_steps}"
        )
    total = options.warmup_steps + options.timed_steps
    if options.input != "data":
        trainer_argv = [*trainer_argv, "--synthetic"]
    config = parse_config([*trainer_argv, "--epochs", "1", "--steps-per-epoch", str(total)])
    gpu = setup_devices()
    global_batch = config.batch_size * hvd.size()
    device = "/gpu:0" if gpu else None
    if options.input == "data":
        info, shard, _, _ = resolve_input(config, global_batch)
        num_classes = info.num_classes
    else:
        num_classes = config.num_classes or data.DEFAULT_NUM_CLASSES
    config, recipe = settle_recipe(config, global_batch)
    trainer = Trainer(config, recipe, num_classes, total, gpu)
    trainer.broadcast_state()
    if options.input == "host":
        batches = host_batches(
            config.batch_size, config.image_size, num_classes, device, hvd.rank()
        )
    elif options.input == "device":
        with tf.device(device or "/cpu:0"):
            batch = data.synthetic_batch(config.batch_size, config.image_size, num_classes)
        batches = iter(lambda: batch, None)
    else:
        batches = rank_train_batches(
            config,
            info,
            shard,
            image_size=config.image_size,
            seed=hvd.rank() * 7919,
            threads=input_threads(node_cpus),
            device=device,
        )
    flags = tf.constant([0.0, 0.0, 0.0])  # no bad input, stop or hosts update
    seconds = []
    for step in range(total):
        began = time.perf_counter()
        images, labels = next(batches)
        trainer.train_step(images, labels, flags)
        trainer.read_step_sums()  # waits for the step, its allreduce included
        if step >= options.warmup_steps:
            seconds.append(time.perf_counter() - began)
    if hvd.rank() != 0:
        return None
    result = {
        "ranks": hvd.size(),
        "nodes": hvd.cross_size(),
        "arch": config.arch,
        "batch_per_rank": config.batch_size,
        "global_batch": global_batch,
        "image_size": config.image_size,
        "precision": "fp16" if trainer.mixed else "fp32",
        "xla": trainer.xla,
        "input": options.input,
        "device": "gpu" if gpu else "cpu",
        "warmup_steps": options.warmup_steps,
        "timed_steps": options.timed_steps,
        **summarise(seconds, global_batch, hvd.size()),
    }
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        build_parser().print_help()
        return 0
    node_cpus = len(os.sched_getaffinity(0))  # before binding, as trainer.train counts them
    bound = affinity.bind_to_gpu_socket()
    hvd.init()
    try:
        result = run(argv, node_cpus)
    except (ConfigError, RunError) as exc:
        fail(str(exc))
    if bound and hvd.rank() == 0:
        print(bound, flush=True)
    if result is not None:
        per_gpu, spread = result["images_per_s_per_gpu"], result["images_per_s_spread"]
        ranks = result["ranks"]
        print(f"Img/sec per GPU: {per_gpu:.1f} +-{spread / ranks:.1f}", flush=True)
        print(
            f"Total img/sec on {ranks} GPU(s): {result['images_per_s']:.1f} +-{spread:.1f}",
            flush=True,
        )
        print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
