"""A training run's time and cost before deploy: the synthesis line

    TrainStack training estimate: 90 epochs x 1,281,167 images at ~136,800 img/s ... ~$...

Throughput is a published per-GPU figure times the GPUs times a scaling efficiency; the start-up,
launch to the first step, is stacks/startup_estimate.py's budget. Nothing here has been measured
on AWS by this project: the benchmark mode (-c benchmark=true) measures the fleet itself.
"""

import functools
import json
import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from stacks import root_volume, startup_estimate
from stacks.instance_types import GpuType, fleet_usd_per_hour

IMAGENET_TRAIN_IMAGES = 1_281_167
IMAGENET_VAL_IMAGES = 50_000
# ResNet-50 v1.5 training in TensorFlow, batch 256 per GPU, mixed precision + XLA, per GPU:
# NVIDIA's DeepLearningExamples, TensorFlow/Classification/ConvNets/resnet50v1.5/README.md
# ("Training performance: NVIDIA DGX A100 (8x A100 40GB)": 2,375 img/s on 1 GPU, 17,400 on 8).
# No published TensorFlow figure was found for the other GPUs of the table.
PER_GPU_IMAGES_PER_S = {"A100 40 GB": 2375}
# The same table's 8-GPU weak scaling is 7.32x (91.5%); across EFA nodes docs/cost.md assumes 90%.
SCALING = 0.9


REPO = Path(__file__).resolve().parents[1]

# The trainer's checkpoint interval (node.json `trainer.checkpoint_every_s`): a tenth of the
# run's estimated training, so that a crash loses at most a tenth of it and a short run (the
# fast recipe's few minutes) has checkpoints too, and at most 600 s, Young's optimum for a fleet
# that crashes once in 25-50 hours (docs/faults-and-recovery.md, "A crash"). It pays for
# itself: a save stalls every rank for its pause, so the interval is at least the pause over
# SAVE_SHARE, and saving costs at most 1% of the training. The pause on p4d is an estimate
# (docs/trainer.md, "The checkpoint interval"): ResNet-50's 205 MB (25.6 M weights and SGD's
# momentum slot in float32) copied from the GPU and written into the page cache, measured at
# 0.55-0.84 s of CPU here. Elastic commits cover one node's loss; these cover the rest.
MAX_CHECKPOINT_EVERY_S = 600
MIN_CHECKPOINT_EVERY_S = 10  # the least -c checkpointEveryS may ask
CHECKPOINT_SHARE = 10  # one checkpoint interval per tenth of the estimated training
CHECKPOINT_PAUSE_S = 1.0  # a save's pause on p4d, rounded up
SAVE_SHARE = 0.01  # the most of the training the saves may cost
DEFAULT_MIN_CHECKPOINT_EVERY_S = math.ceil(CHECKPOINT_PAUSE_S / SAVE_SHARE)  # 100 s


@dataclass(frozen=True)
class RunPlan:
    """What the recipe makes of a fleet, resolved once (stacks/config.py): the epochs the
    trainer will run, the share of image_size's pixels they train on, and their (images/s,
    training s, evaluation s) at the published per-GPU rate (None: no published figure)."""

    epochs: int
    pixel_fraction: float = 1.0
    timed: tuple[float, float, float] | None = None

    @property
    def training_s(self) -> float | None:
        """The estimated seconds of training and evaluation, or None."""
        return self.timed[1] + self.timed[2] if self.timed else None


def run_plan(
    gpu: GpuType,
    nodes: int,
    *,
    recipe: str,
    batch_per_gpu: int,
    epochs: int | None,
    image_size: int,
    eval_every: int,
    arch: str,
) -> RunPlan:
    """The recipe's epochs and pixels at this fleet's global batch, and their estimated time."""
    global_batch = nodes * gpu.gpus * batch_per_gpu
    planned, pixel_fraction = recipe_plan(recipe, global_batch, epochs, image_size)
    timed = estimated_seconds(
        gpu, nodes, epochs=planned, pixel_fraction=pixel_fraction, eval_every=eval_every,
        arch=arch, image_size=image_size,
    )  # fmt: skip
    return RunPlan(planned, pixel_fraction, timed)


@functools.cache  # a process per question: each distinct one is asked once per process
def recipe_plan(
    recipe: str, global_batch: int, epochs: int | None, image_size: int
) -> tuple[int, float]:
    """The epochs the trainer will run (`epochs`, else the recipe's at this global batch) and
    the fraction of image_size's pixels they train on (the fast recipe starts at low
    resolution), asked of the trainer's own recipes as a process (`python -m trainer.recipes`,
    docs/contracts.md): stacks/ never imports trainer/."""
    command = [sys.executable, "-m", "trainer.recipes", "--recipe", recipe]
    command += ["--global-batch", str(global_batch), "--image-size", str(image_size)]
    if epochs is not None:
        command += ["--epochs", str(epochs)]
    result = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=60, check=True
    )
    settled = json.loads(result.stdout)
    return settled["epochs"], settled["pixel_fraction"]


def training_estimate(gpu: GpuType, nodes: int, *, recipe: str, arch: str, plan: RunPlan) -> str:
    """The synthesis line: minutes and dollars for the plan's epochs of `recipe` at the published
    per-GPU rate."""
    per_gpu = PER_GPU_IMAGES_PER_S.get(gpu.gpu_model)
    timed, epochs, pixel_fraction = plan.timed, plan.epochs, plan.pixel_fraction
    if per_gpu is None or timed is None:
        what = f"{arch} on {gpu.gpu_model}"
        return (
            f"TrainStack training estimate: none, no published TensorFlow figure for {what}; "
            "measure the fleet with -c benchmark=true"
        )
    gpus = nodes * gpu.gpus
    rate, training_s, evaluation_s = timed
    startup_s = startup_estimate.startup_s(
        startup_estimate.startup_phases(gpu, nodes, init_rate=root_volume.init_rate(nodes))
    )
    total_s = training_s + evaluation_s + startup_s
    hours = total_s / 3600
    volumes_usd = (
        root_volume.initialization_usd(nodes) + root_volume.throughput_usd_per_hour(nodes) * hours
    )
    usd = fleet_usd_per_hour(gpu, nodes) * hours + volumes_usd
    return (
        f"TrainStack training estimate: {epochs} epochs (recipe {recipe}"
        + (f", {pixel_fraction:.0%} of the pixels" if pixel_fraction < 1 else "")
        + f") x {IMAGENET_TRAIN_IMAGES:,} images at "
        f"~{rate:,.0f} img/s ({gpus} x {per_gpu:,} per GPU, NVIDIA's published {gpu.gpu_model} "
        f"figure, x {SCALING:.0%} scaling) = {training_s / 60:.1f} min training + "
        f"{evaluation_s / 60:.1f} min evaluation + {startup_s / 60:.1f} min start-up (launch to "
        f"the first step, below) = ~{total_s / 60:.0f} min, ~${usd:,.2f} with the "
        f"{root_volume.cost_note(nodes, hours)}"
    )


def estimated_seconds(
    gpu: GpuType,
    nodes: int,
    *,
    epochs: int,
    pixel_fraction: float,
    eval_every: int,
    arch: str,
    image_size: int,
) -> tuple[float, float, float] | None:
    """(images/s, training s, evaluation s) at the published per-GPU rate; None without one."""
    per_gpu = PER_GPU_IMAGES_PER_S.get(gpu.gpu_model)
    if per_gpu is None or arch != "resnet50":
        return None
    gpus = nodes * gpu.gpus
    # Fewer pixels, proportionally more images a second (a first-order estimate).
    rate = gpus * per_gpu * (1.0 if gpus == 1 else SCALING) * (224 / image_size) ** 2
    # Fewer pixels per image in a recipe's low-resolution epochs: proportionally less time.
    training_s = epochs * IMAGENET_TRAIN_IMAGES * pixel_fraction / rate
    # Every eval_every epochs and after the last; taken as no faster than training.
    evaluation_s = math.ceil(epochs / eval_every) * IMAGENET_VAL_IMAGES / rate
    return rate, training_s, evaluation_s


def checkpoint_every_s(training_s: float | None) -> int:
    """The checkpoint interval for a run whose training (and evaluation) is estimated at
    training_s: a tenth of it, within [DEFAULT_MIN_CHECKPOINT_EVERY_S, MAX_CHECKPOINT_EVERY_S];
    the maximum without an estimate (a type with no published figure)."""
    if training_s is None:
        return MAX_CHECKPOINT_EVERY_S
    share = int(training_s // CHECKPOINT_SHARE)
    return max(DEFAULT_MIN_CHECKPOINT_EVERY_S, min(MAX_CHECKPOINT_EVERY_S, share))


def checkpoint_note(interval_s: int, training_s: float | None, chosen: bool) -> str:
    """The synthesis line that says how often the run checkpoints to S3, and why."""
    if chosen:
        why = "-c checkpointEveryS"
    elif training_s is None:
        why = "the longest interval: no estimate of the training to take a tenth of"
    else:
        why = (
            f"a tenth of the ~{training_s / 60:.1f} min estimated training, from "
            f"{DEFAULT_MIN_CHECKPOINT_EVERY_S} s, where a save's ~{CHECKPOINT_PAUSE_S:g} s pause "
            f"costs {SAVE_SHARE:.0%}, to {MAX_CHECKPOINT_EVERY_S} s"
        )
    return (
        f"TrainStack checkpoints to S3 every {interval_s} s ({why}): what a whole-fleet loss can "
        "cost at most; an elastic reset loses at most the steps since the last in-memory commit"
    )
