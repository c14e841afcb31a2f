"""The trainer's command line, parsed once into a frozen TrainConfig and validated at the edge."""

from __future__ import annotations

import argparse
import dataclasses
import math
from pathlib import Path

from trainer.cli import OneLineErrorParser
from trainer.recipes import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_RECIPE,
    GOYAL_BASE_LR,
    GOYAL_EPOCHS,
    GOYAL_MOMENTUM,
    GOYAL_WEIGHT_DECAY,
    LARGE_BATCH,
    LARGE_BATCH_WARMUP_EPOCHS,
    RECIPES,
    WARMUP_EPOCHS,
)

ARCHS = ("resnet50", "resnet18")
# Evaluation costs a pipeline start and a pass over 50,000 images: every 10 epochs keeps it near
# 1% of a 64-GPU run's time (an epoch is ~16 s there); the last epoch is always evaluated.
DEFAULT_EVAL_EVERY = 10
# A checkpoint at an epoch end once this long has passed since the last (and at the end, and on
# SIGTERM). Each save (~205 MB, 1-2 s) stalls every rank: every epoch would cost 8 p4d nodes
# 10-18% of their time, 600 s costs 0.2-0.3%, and a crash then loses at most ~10 minutes of
# training, Young's optimum for a fleet crashing once in 25-50 hours (docs/faults-and-recovery.md,
# "A crash", has the table and the reasoning).
DEFAULT_CHECKPOINT_EVERY_S = 600
# Under --elastic a commit (an in-memory copy of every state variable, no disk) ends at most this
# many seconds of steps: what a lost rank costs the others in steps trained again (issue 41).
DEFAULT_COMMIT_EVERY_S = 30
# How long a rank waits for its shard files to be on disk (the node's pull puts its own ranks'
# shards first; docs/contracts.md, "Start-up, resets and goodput").
DEFAULT_DATA_WAIT_S = 600


class ConfigError(ValueError):
    """A user mistake in the command line; reported as one `error: ...` line."""


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    data_dir: Path
    model_dir: Path
    recipe: str
    epochs: int | None  # None: the recipe's (trainer/recipes.py)
    batch_size: int
    image_size: int
    arch: str
    num_classes: int | None
    label_base: int | None
    synthetic: bool
    eval_only: bool
    base_lr: float | None
    warmup_epochs: float | None
    momentum: float | None
    weight_decay: float | None
    label_smoothing: float
    log_every: int
    steps_per_epoch: int
    eval_every: int
    shuffle_buffer: int
    precision: str
    xla: str
    keep_checkpoints: int
    min_crop_area: float
    checkpoint_every_s: float
    target_top1: float | None
    seed: int | None = None  # None: unseeded weights, the built-in shuffle seeds
    data_wait_s: float = DEFAULT_DATA_WAIT_S
    elastic: bool = False
    planned_ranks: int | None = None  # --elastic: the ranks the recipe is settled for
    min_ranks: int = 1
    commit_every_s: float = DEFAULT_COMMIT_EVERY_S
    stop_file: Path | None = None  # the agreed stop asked from outside: at an epoch's end


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="python -m trainer.train",
        description="Train ResNet-50 v1.5 (or ResNet-18) on ImageNet TFRecords with Horovod. "
        "Run under horovodrun for several ranks; every rank gets the same flags.",
        epilog="Environment: TRAINER_WEIGHTS_DIGEST_DIR=DIR makes every rank write "
        "DIR/rank-<r>.sha256 of its final weights (tests compare ranks with it).",
    )
    _add_data_flags(parser)
    _add_recipe_flags(parser)
    _add_device_flags(parser)
    _add_schedule_flags(parser)
    _add_elastic_flags(parser)
    return parser


def _add_data_flags(parser: argparse.ArgumentParser) -> None:
    """Where the records come from, how they are read, and where the outputs go."""
    group = parser.add_argument_group("data and outputs")
    group.add_argument(
        "--data-dir",
        help="directory with train-* and validation-* TFRecord shards (standard ImageNet schema) "
        "and optionally manifest.json; not needed with --synthetic",
    )
    group.add_argument(
        "--model-dir",
        required=True,
        help="output directory: checkpoints/, tensorboard/, eval.json, train.json (rank 0 writes)",
    )
    group.add_argument(
        "--num-classes",
        type=int,
        help="number of classes K (default: manifest.json's num_classes, else 1000)",
    )
    group.add_argument(
        "--label-base",
        type=int,
        choices=(0, 1),
        help="first label value in the records (default: manifest.json's label_base, else 1)",
    )
    group.add_argument(
        "--synthetic",
        action="store_true",
        help="random images generated on the device, no data read (throughput smoke test)",
    )
    group.add_argument(
        "--eval-only",
        action="store_true",
        help="restore the newest checkpoint in --model-dir, evaluate and write eval.json",
    )
    group.add_argument(
        "--shuffle-buffer", type=int, default=10000, help="records per rank in the shuffle buffer"
    )
    group.add_argument(
        "--min-crop-area",
        type=float,
        default=0.08,
        help="smallest random crop as a fraction of the image area (Inception-style crops)",
    )
    group.add_argument(
        "--data-wait-s",
        type=float,
        default=DEFAULT_DATA_WAIT_S,
        help="wait this long for this rank's shard files (those manifest.json lists) to be on "
        "disk before failing, saying every 30 s which it waits for",
    )


def _add_recipe_flags(parser: argparse.ArgumentParser) -> None:
    """The model and the recipe (trainer/recipes.py): a flag given wins over the recipe."""
    group = parser.add_argument_group("model and recipe")
    group.add_argument("--arch", choices=ARCHS, default="resnet50", help="model architecture")
    group.add_argument(
        "--recipe",
        choices=RECIPES,
        default=DEFAULT_RECIPE,
        help="goyal: linear LR scaling, cosine decay, Nesterov SGD (LARS above a global batch "
        f"of {LARGE_BATCH}), {GOYAL_EPOCHS} epochs; fast: MLPerf's LARS recipe at the global "
        "batch, polynomial decay, the epochs MLPerf needs there (docs/trainer.md)",
    )
    group.add_argument(
        "--epochs",
        type=int,
        help=f"total training epochs (default: the recipe's: {GOYAL_EPOCHS} for goyal, 37 to 89 "
        "by global batch for fast)",
    )
    group.add_argument(
        "--batch-size",
        type=int,
        help="images per step per rank (default: the recipe's: "
        + ", ".join(f"{size} for {recipe}" for recipe, size in DEFAULT_BATCH_SIZE.items())
        + ")",
    )
    group.add_argument("--image-size", type=int, default=224, help="training/eval crop size")
    group.add_argument(
        "--base-lr",
        type=float,
        help=f"recipe goyal: learning rate per 256 images (default {GOYAL_BASE_LR:g}); the peak "
        "LR is base-lr x global batch / 256",
    )
    group.add_argument(
        "--warmup-epochs",
        type=float,
        help=f"linear LR warmup (default: the recipe's; goyal: {WARMUP_EPOCHS:g}, or "
        f"{LARGE_BATCH_WARMUP_EPOCHS:g} from a global batch of {LARGE_BATCH} on)",
    )
    group.add_argument(
        "--momentum",
        type=float,
        help=f"momentum (default: the recipe's; goyal: {GOYAL_MOMENTUM:g}, Nesterov)",
    )
    group.add_argument(
        "--weight-decay",
        type=float,
        help="L2 on convolution and dense kernels, never on BatchNorm or biases (default: the "
        f"recipe's; goyal: {GOYAL_WEIGHT_DECAY:g})",
    )
    group.add_argument("--label-smoothing", type=float, default=0.1, help="label smoothing")
    group.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed the initial weights and offset the data shuffle's seeds (>= 0), for repeated "
        "runs that differ only in it; off: random initial weights",
    )


def _add_device_flags(parser: argparse.ArgumentParser) -> None:
    """How the step runs on the device."""
    group = parser.add_argument_group("device")
    group.add_argument(
        "--precision",
        choices=("auto", "fp16", "fp32"),
        default="auto",
        help="auto: mixed float16 with loss scaling on GPU, float32 on CPU",
    )
    group.add_argument(
        "--xla",
        choices=("auto", "on", "off"),
        default="auto",
        help="XLA-compile the forward/backward pass (auto: on GPU only)",
    )


def _add_schedule_flags(parser: argparse.ArgumentParser) -> None:
    """When the run logs, evaluates, saves and stops."""
    group = parser.add_argument_group("logging, evaluation, checkpoints and stops")
    group.add_argument("--log-every", type=int, default=100, help="log a table row every N steps")
    group.add_argument(
        "--steps-per-epoch",
        type=int,
        default=0,
        help="0: train records // global batch (100 with --synthetic); otherwise this many",
    )
    group.add_argument(
        "--eval-every",
        type=int,
        default=DEFAULT_EVAL_EVERY,
        help="evaluate every N epochs and after the last one",
    )
    group.add_argument("--keep-checkpoints", type=int, default=5, help="newest checkpoints kept")
    group.add_argument(
        "--checkpoint-every-s",
        type=float,
        default=DEFAULT_CHECKPOINT_EVERY_S,
        help="save at the end of an epoch once this many seconds passed since the last save "
        "(0: every epoch); always at the end and on SIGTERM",
    )
    group.add_argument(
        "--target-top1",
        type=float,
        default=None,
        help="stop once an evaluation (every --eval-every epochs) reaches this top-1, in (0, 1], "
        "as MLPerf's time-to-accuracy does; off: train every epoch",
    )
    group.add_argument(
        "--stop-file",
        help="stop, as a success, at the end of the first epoch when this file is on any rank's "
        "node (its checkpoint saved): the stop a drill's head asks once its experiments are "
        "judged; off: train every epoch",
    )


def _add_elastic_flags(parser: argparse.ArgumentParser) -> None:
    """Horovod elastic (horovodrun --gloo --host-discovery-script ...; docs/trainer.md)."""
    group = parser.add_argument_group("elastic training (under horovodrun's elastic mode)")
    group.add_argument(
        "--elastic",
        action="store_true",
        help="train under hvd.elastic.run: a lost or added host resets the ranks to the last "
        "commit in memory and training goes on in the new world",
    )
    group.add_argument(
        "--planned-ranks",
        type=int,
        help="--elastic: the ranks the recipe is settled for (nodes x GPUs, horovodrun's "
        "--max-np); in a smaller or larger world the per-rank batch stays and the LR scales",
    )
    group.add_argument(
        "--min-ranks",
        type=int,
        default=1,
        help="--elastic: the fewest ranks to train on (horovodrun's --min-np); a SIGTERM that "
        "would leave fewer stops every rank at a checkpoint (exit 75) instead",
    )
    group.add_argument(
        "--commit-every-s",
        type=float,
        default=DEFAULT_COMMIT_EVERY_S,
        help="--elastic: commit the state in memory once this many seconds of steps (from the "
        "measured step time) passed since the last commit, and at every epoch end",
    )


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def _path(flag: str, value: str | None, kind: str = "directory path") -> Path | None:
    """Path("") is ".": an empty flag would quietly mean the working directory."""
    if value is None:
        return None
    _require(value.strip() != "", f"{flag} is empty; give a {kind}")
    return Path(value)


def _check_elastic(args: argparse.Namespace) -> None:
    defaults = {"planned_ranks": None, "min_ranks": 1, "commit_every_s": DEFAULT_COMMIT_EVERY_S}
    if not args.elastic:
        for name, default in defaults.items():
            _require(
                getattr(args, name) == default,
                f"--{name.replace('_', '-')} applies to --elastic only",
            )
        return
    _require(not args.eval_only, "--eval-only evaluates once: it takes no --elastic")
    _require(
        args.planned_ranks is not None,
        "--elastic needs --planned-ranks (nodes x GPUs, horovodrun's --max-np): every rank, "
        "including one that joins later, settles the recipe for it",
    )
    _require(args.planned_ranks >= 1, f"--planned-ranks must be >= 1, got {args.planned_ranks}")
    _require(
        1 <= args.min_ranks <= args.planned_ranks,
        f"--min-ranks must be in 1..--planned-ranks ({args.planned_ranks}), got {args.min_ranks}",
    )
    _require(
        0 < args.commit_every_s < math.inf,
        f"--commit-every-s must be a finite number > 0, got {args.commit_every_s}",
    )


def parse_config(argv: list[str] | None = None) -> TrainConfig:
    """Parse and validate the command line; raises ConfigError naming the bad value."""
    args = build_parser().parse_args(argv)
    _require(args.synthetic or args.data_dir is not None, "--data-dir is required (or --synthetic)")
    for name in ("epochs", "batch_size", "image_size", "log_every", "eval_every"):
        value = getattr(args, name)
        _require(value is None or value > 0, f"--{name.replace('_', '-')} must be > 0, got {value}")
    _require(args.image_size >= 32, f"--image-size must be >= 32, got {args.image_size}")
    _require(
        args.steps_per_epoch >= 0, f"--steps-per-epoch must be >= 0, got {args.steps_per_epoch}"
    )
    _require(
        args.num_classes is None or args.num_classes >= 2,
        f"--num-classes must be >= 2, got {args.num_classes}",
    )
    # inf passes the range checks but turns the loss or the warmup step count into nan/overflow.
    _require(
        args.base_lr is None or 0 < args.base_lr < math.inf,
        f"--base-lr must be a finite number > 0, got {args.base_lr}",
    )
    _require(
        args.base_lr is None or args.recipe == "goyal",
        "--base-lr applies to --recipe goyal (the LR per 256 images); --recipe fast takes the "
        "peak LR of the MLPerf run nearest the global batch",
    )
    _require(
        args.warmup_epochs is None or 0 <= args.warmup_epochs < math.inf,
        f"--warmup-epochs must be a finite number >= 0, got {args.warmup_epochs}",
    )
    _require(
        0 <= args.checkpoint_every_s < math.inf,
        f"--checkpoint-every-s must be a finite number >= 0, got {args.checkpoint_every_s}",
    )
    _require(
        args.momentum is None or 0 <= args.momentum < 1,
        f"--momentum must be in [0, 1), got {args.momentum}",
    )
    _require(
        args.weight_decay is None or 0 <= args.weight_decay < math.inf,
        f"--weight-decay must be a finite number >= 0, got {args.weight_decay}",
    )
    _require(
        0 <= args.label_smoothing < 1,
        f"--label-smoothing must be in [0, 1), got {args.label_smoothing}",
    )
    _require(args.shuffle_buffer > 0, f"--shuffle-buffer must be > 0, got {args.shuffle_buffer}")
    _require(
        args.keep_checkpoints > 0, f"--keep-checkpoints must be > 0, got {args.keep_checkpoints}"
    )
    _require(
        0 < args.min_crop_area <= 1, f"--min-crop-area must be in (0, 1], got {args.min_crop_area}"
    )
    _require(
        args.target_top1 is None or 0 < args.target_top1 <= 1,
        f"--target-top1 must be a top-1 accuracy in (0, 1], like 0.759, got {args.target_top1}",
    )
    _require(args.seed is None or args.seed >= 0, f"--seed must be >= 0, got {args.seed}")
    _require(
        0 <= args.data_wait_s < math.inf,
        f"--data-wait-s must be a finite number >= 0, got {args.data_wait_s}",
    )
    _check_elastic(args)
    args.data_dir = _path("--data-dir", args.data_dir)
    args.model_dir = _path("--model-dir", args.model_dir)
    args.stop_file = _path("--stop-file", args.stop_file, "file path")
    if args.batch_size is None:
        args.batch_size = DEFAULT_BATCH_SIZE[args.recipe]
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    return TrainConfig(**{k: v for k, v in vars(args).items() if k in fields})
