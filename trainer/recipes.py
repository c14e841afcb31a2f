"""Training recipes: the learning rate, its schedule, the optimizer and the epochs for a global
batch. Pure Python (no TensorFlow), so the table and its arithmetic are tested on their own.

    goyal  Goyal et al. 2017 (https://arxiv.org/abs/1706.02677): --base-lr per 256 images scaled
           linearly with the global batch, 5 warmup epochs (10 from a global batch of 16k on),
           cosine decay, Nesterov SGD; LARS above 16k. 90 epochs.
    fast   MLPerf Training's closed-division ResNet-50 recipe: LARS at every batch size, linear
           warmup from 0, then polynomial decay of power 2 to 1e-4, label smoothing 0.1, BatchNorm
           and biases kept out of LARS and weight decay, and the peak LR, warmup, momentum, weight
           decay and epochs of the logged MLPerf run nearest the global batch (MLPERF_RUNS).
           MLPerf's runs reach 75.9% top-1 in 35 (batch <= 4k) to 88 (64k) epochs, not 90.
           Trains at low resolution first, as FFCV does (train_resolution), and evaluates at
           --image-size.

`python -m trainer.recipes --recipe fast --global-batch 16384 [--epochs N] [--image-size S]`
prints the settled recipe as one JSON line, with `pixel_fraction` at S (synthesis reads the
epochs and that fraction for its time and cost estimate).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys

from trainer.cli import OneLineErrorParser

RECIPES = ("goyal", "fast")
DEFAULT_RECIPE = "goyal"
# Images per step per rank without --batch-size: goyal, NVIDIA's 256 per GPU; fast, 128, which
# puts 8 p4d nodes at the global batch of 8,192 where MLPerf's logged runs reached 75.9% soonest.
# stacks/config.py DEFAULT_BATCH_PER_GPU gives the fleet the same (a test keeps them equal).
DEFAULT_BATCH_SIZE = {"goyal": 256, "fast": 128}

# --- goyal -------------------------------------------------------------------------------------
GOYAL_EPOCHS = 90
GOYAL_BASE_LR = 0.1  # per 256 images
GOYAL_MOMENTUM = 0.9
GOYAL_WEIGHT_DECAY = 1e-4
# AWS's 64-GPU Horovod script keeps momentum SGD at a global batch of 16k with 10 warmup epochs
# (https://github.com/aws-samples/deep-learning-models/blob/master/models/resnet/tensorflow/dlami_scripts/train_64gpus.sh);
# LARS (You et al. 2017, https://arxiv.org/abs/1708.03888) takes over above it.
LARGE_BATCH = 16384
WARMUP_EPOCHS = 5.0
LARGE_BATCH_WARMUP_EPOCHS = 10.0

# --- fast: MLPerf Training ResNet-50 v1.5, closed division ---------------------------------------
# Every logged LARS run uses these (`:::MLLOG` keys lars_opt_learning_rate_decay_poly_power,
# lars_opt_end_learning_rate; LARSETA="0.001" and LABELSMOOTHING="0.1" in NVIDIA's configs; the
# reference's image_classification/tensorflow2/lars_util.py and README commands).
POLY_POWER = 2.0
END_LR = 1e-4
LARS_ETA = 0.001
MLPERF_LABEL_SMOOTHING = 0.1
TARGET_TOP1 = 0.759  # MLPerf's ResNet-50 quality target

# --- fast: FFCV's progressive resizing -----------------------------------------------------------
# libffcv/ffcv-imagenet@4dd291a: every ResNet-50 config trains at 160 px, ramps to 192 and
# evaluates higher; its ramps start at 69-74% of the epochs and end at 81-86% (16 epochs: 11/13,
# 24: 17/20, 32: 23/27, 40: 29/34, 56: 41/48, 88: 65/76), and sizes are rounded to 32 px. Here the
# sizes are those fractions of --image-size (160 and 192 at 224) and the evaluation is at
# --image-size, MLPerf's 224 center crop.
LOW_RES = 160 / 224
HIGH_RES = 192 / 224
RES_STEP = 32 / 224
RAMP_START = 0.73
RAMP_END = 0.85


@dataclasses.dataclass(frozen=True)
class MlperfRun:
    """One logged closed-division run: what it used, and the epoch of its first evaluation at or
    above 75.9% (median of its 5 result files)."""

    global_batch: int
    peak_lr: float  # absolute: MLPerf's LARS LR is not scaled by batch / 256
    warmup_epochs: float
    epochs: int  # planned
    weight_decay: float
    momentum: float
    reached_target_at_epoch: int
    source: str  # mlcommons/training_results_<version>: <org>/results/<system>/resnet/result_*.txt


MLPERF_RUNS = (
    MlperfRun(1600, 7.4, 2, 37, 5e-5, 0.9, 35, "v4.0 NVIDIA l40s_n2_ngc24.04_mxnet"),
    MlperfRun(3264, 10.5, 2, 37, 5e-5, 0.9, 35, "v1.0 NVIDIA dgxa100_ngc21.05_mxnet"),
    MlperfRun(8192, 17.0, 5, 44, 2e-4, 0.9, 42, "v1.0 Google tpu-v4-128-TF"),
    MlperfRun(16384, 22.0, 9, 48, 2e-4, 0.9, 47, "v2.0 Dell 32xXE8545x4A100-SXM-40GB"),
    MlperfRun(32768, 29.0, 18, 60, 1e-4, 0.929, 60, "v1.0 Google tpu-v4-4096-TF"),
    MlperfRun(65536, 24.699, 31, 89, 1e-4, 0.951807, 88, "v0.7 Google tpu-v3-8192-TF"),
)


@dataclasses.dataclass(frozen=True)
class Recipe:
    """What the trainer uses for one run, every value settled."""

    name: str
    peak_lr: float
    warmup_epochs: float
    epochs: int
    momentum: float
    weight_decay: float
    label_smoothing: float
    lars: bool
    decay: str  # "cosine" (to 0) or "poly" (power POLY_POWER to END_LR)
    source: str
    progressive: bool = False  # train_resolution's sizes, else --image-size throughout
    # How the peak LR follows the global batch: "linear" (goyal: Goyal et al.'s rule) or "sqrt"
    # (fast: the logged MLPerf runs' own trend, fast() below).
    lr_scaling: str = "linear"

    def peak_lr_at(self, planned_batch: int, global_batch: int) -> float:
        """The peak LR when an elastic run trains at `global_batch` instead of the `planned_batch`
        its recipe was settled for (the per-rank batch stays, the ranks changed): scaled by the
        recipe's own rule. Every other value (epochs, warmup epochs, momentum, weight decay) stays
        the planned one; docs/trainer.md, "Elastic training", has the policy and its sources."""
        ratio = global_batch / planned_batch
        return self.peak_lr * (math.sqrt(ratio) if self.lr_scaling == "sqrt" else ratio)

    def pixel_fraction(self, image_size: int) -> float:
        """The training pixels of all epochs over those of image_size throughout."""
        sizes = [self.train_size(epoch, image_size) for epoch in range(self.epochs)]
        return sum(size * size for size in sizes) / (self.epochs * image_size * image_size)

    def train_size(self, epoch: int, image_size: int) -> int:
        """The training resolution of 0-based `epoch` (evaluation is always at image_size)."""
        if not self.progressive:
            return image_size
        return train_resolution(epoch, self.epochs, image_size)

    def describe(self) -> str:
        return (
            f"recipe {self.name}: peak LR {self.peak_lr:.4g}{' (LARS)' if self.lars else ''}, "
            f"{self.warmup_epochs:g} warmup epochs, {self.decay} decay, momentum "
            f"{self.momentum:g}, weight decay {self.weight_decay:g}, {self.epochs} epochs "
            f"({self.source})"
        )


def nearest_mlperf_run(global_batch: int) -> MlperfRun:
    """The logged run whose global batch is nearest on a log scale."""
    assert global_batch > 0, global_batch
    return min(MLPERF_RUNS, key=lambda run: abs(math.log(global_batch / run.global_batch)))


def fast(
    global_batch: int,
    epochs: int | None = None,
    warmup_epochs: float | None = None,
    momentum: float | None = None,
    weight_decay: float | None = None,
    label_smoothing: float = MLPERF_LABEL_SMOOTHING,
) -> Recipe:
    """MLPerf's recipe at this batch. Between the logged batches the peak LR follows their own
    trend, about the square root of the batch (7.4 at 1.6k, 10.5 at 3.3k, 17 at 8k, 22 at 16k),
    from the nearest run; every other value is that run's unless a flag sets it."""
    run = nearest_mlperf_run(global_batch)
    return Recipe(
        name="fast",
        peak_lr=run.peak_lr * math.sqrt(global_batch / run.global_batch),
        warmup_epochs=run.warmup_epochs if warmup_epochs is None else warmup_epochs,
        epochs=epochs or run.epochs,
        momentum=run.momentum if momentum is None else momentum,
        weight_decay=run.weight_decay if weight_decay is None else weight_decay,
        label_smoothing=label_smoothing,
        lars=True,
        decay="poly",
        source=f"MLPerf {run.source}, global batch {run.global_batch}, 75.9% at epoch "
        f"{run.reached_target_at_epoch}",
        progressive=True,
        lr_scaling="sqrt",
    )


def goyal(
    global_batch: int,
    base_lr: float | None = None,
    epochs: int | None = None,
    warmup_epochs: float | None = None,
    momentum: float | None = None,
    weight_decay: float | None = None,
    label_smoothing: float = MLPERF_LABEL_SMOOTHING,
) -> Recipe:
    """The linear scaling rule's recipe; LARS above LARGE_BATCH."""
    large = global_batch >= LARGE_BATCH
    default_warmup = LARGE_BATCH_WARMUP_EPOCHS if large else WARMUP_EPOCHS
    return Recipe(
        name="goyal",
        peak_lr=(base_lr or GOYAL_BASE_LR) * global_batch / 256,
        warmup_epochs=default_warmup if warmup_epochs is None else warmup_epochs,
        epochs=epochs or GOYAL_EPOCHS,
        momentum=GOYAL_MOMENTUM if momentum is None else momentum,
        weight_decay=GOYAL_WEIGHT_DECAY if weight_decay is None else weight_decay,
        label_smoothing=label_smoothing,
        lars=global_batch > LARGE_BATCH,
        decay="cosine",
        source="Goyal et al. 2017, linear scaling",
    )


def resolve(
    name: str,
    global_batch: int,
    *,
    base_lr: float | None,
    epochs: int | None,
    warmup_epochs: float | None,
    momentum: float | None,
    weight_decay: float | None,
    label_smoothing: float,
) -> Recipe:
    """The recipe `name` settled for this global batch; a flag that was given wins."""
    assert name in RECIPES, name
    if name == "fast":
        assert base_lr is None, "--base-lr is refused with --recipe fast at the command line"
        return fast(global_batch, epochs, warmup_epochs, momentum, weight_decay, label_smoothing)
    return goyal(
        global_batch, base_lr, epochs, warmup_epochs, momentum, weight_decay, label_smoothing
    )


def train_resolution(epoch: int, epochs: int, image_size: int) -> int:
    """FFCV's get_resolution (train_imagenet.py@4dd291a) at 0-based `epoch`: the low size up to
    the ramp's start, the high one from its end, between them the linear interpolation rounded
    to RES_STEP (one step: 160 to 192 at the ramp's middle at 224 px)."""
    low, high = image_size * LOW_RES, image_size * HIGH_RES
    start, end = round(RAMP_START * epochs), round(RAMP_END * epochs)
    if epoch <= start:
        size = low
    elif epoch >= end:
        size = high
    else:
        step = image_size * RES_STEP
        size = round((low + (high - low) * (epoch - start) / (end - start)) / step) * step
    return round(size)


def poly_learning_rate(step: float, peak: float, warmup_steps: int, total_steps: int) -> float:
    """MLPerf's schedule at `step` (NVIDIA's PolySchedule, the reference's lars_util): linear
    from 0 to peak over warmup_steps, then END_LR + (peak - END_LR) (1 - progress)^2."""
    if step < warmup_steps:
        return peak * step / warmup_steps
    progress = min((step - warmup_steps) / max(total_steps - warmup_steps, 1), 1.0)
    return END_LR + (peak - END_LR) * (1 - progress) ** POLY_POWER


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(prog="python -m trainer.recipes", description=__doc__)
    parser.add_argument("--recipe", choices=RECIPES, default=DEFAULT_RECIPE, help="the recipe")
    parser.add_argument(
        "--global-batch", type=int, required=True, help="images per step across every rank"
    )
    parser.add_argument("--epochs", type=int, help="epochs (default: the recipe's at this batch)")
    parser.add_argument("--image-size", type=int, default=224, help="the final crop size")
    args = parser.parse_args(argv)
    if args.global_batch < 1:
        parser.error(f"--global-batch must be >= 1, got {args.global_batch}")
    recipe = resolve(
        args.recipe,
        args.global_batch,
        base_lr=None,
        epochs=args.epochs,
        warmup_epochs=None,
        momentum=None,
        weight_decay=None,
        label_smoothing=MLPERF_LABEL_SMOOTHING,
    )
    settled = {
        **dataclasses.asdict(recipe),
        "pixel_fraction": recipe.pixel_fraction(args.image_size),
    }
    print(json.dumps(settled, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
