"""An offline proxy for the recipes: goyal against fast on a small dataset where resolution matters.

    python -m trainer.proxy --workdir DIR [--images 20000] [--seeds 2] [--epochs N] [--target T]

1. Generates DIR/data: --images training and --images / 10 validation images of 10 classes, fine
   and coarse stripes and checks, dots, thin shape outlines and blotches, each in random colours,
   orientation, phase and position. They are drawn at 2x and antialiased down to 64x64 by the
   preprocessor's own conversion (trainer.preprocess.images.image_record), and written as its
   TFRecord shards and manifest.json (trainer.preprocess.output). The fine classes differ from the
   coarse ones only in frequency, so they blur together at low resolution: progressive resizing
   has something to lose.
2. Trains ResNet-18 with each recipe for every seed through `python -m trainer.train` (one rank,
   --target-top1 T, --eval-every 1, a warmup scaled to the short run), into DIR/runs/<recipe>-<seed>.
3. Prints recipe | seed | epochs to target | time to target | final top-1 | images/s, and a median
   row per recipe, read back from each run's train.json and eval.json.

What it shows: that both recipes' code learns, and the direction of their effects on 2 CPU cores
(fast's low-resolution epochs are cheaper; whether they cost epochs). What it cannot show:
ImageNet's epoch counts, behaviour at large batches or many ranks, or GPU speed (docs/trainer.md).
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from trainer import recipes
from trainer.cli import OneLineErrorParser, fail, require_at_least
from trainer.preprocess.images import image_record
from trainer.preprocess.output import LocalOutput, ShardWriter, build_manifest
from trainer.preprocess.sample import synset_names

CLASSES = (
    "stripes-coarse",
    "stripes-fine",
    "checks-coarse",
    "checks-fine",
    "dots-fine",
    "ring-outline",
    "square-outline",
    "triangle-outline",
    "cross-outline",
    "blotches",
)
IMAGE_SIZE = 64  # stored size
RENDER = 2 * IMAGE_SIZE  # drawn at 2x, antialiased down by the preprocessor's conversion
QUALITY = 92
# Periods in stored pixels: fine textures survive 64 px but not the 40 -> 29 px of fast's first
# epochs; coarse ones (4x) stay coarser than a fine one zoomed in by a MIN_CROP_AREA crop (2x).
COARSE_PERIOD = 12.0
FINE_PERIOD = 3.0
MIN_CROP_AREA = 0.25

DEFAULT_IMAGES = 20000
DEFAULT_SEEDS = 2
DEFAULT_EPOCHS = 6
DEFAULT_TARGET = 0.80
DEFAULT_IMAGE_SIZE = 32
DEFAULT_BATCH = 128
SHARDS = {"train": 8, "validation": 2}


# --- the dataset ---------------------------------------------------------------------------------


def _colours(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Two random RGB colours at least 90 apart in luma: colour says nothing about the class."""
    while True:
        a, b = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
        luma = np.array([0.299, 0.587, 0.114])
        if abs(float((a - b) @ luma)) >= 90:
            return a, b


def _grid(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Pixel coordinates in stored pixels, rotated by a random angle."""
    coords = (np.arange(RENDER) + 0.5) * IMAGE_SIZE / RENDER
    y, x = np.meshgrid(coords, coords, indexing="ij")
    angle = rng.uniform(0, math.pi)
    return x * math.cos(angle) + y * math.sin(angle), -x * math.sin(angle) + y * math.cos(angle)


def _texture(rng: np.random.Generator, kind: str, period: float) -> np.ndarray:
    """A 0/1 mask of stripes, checks or dots of about this period (+-15%), random phase."""
    u, v = _grid(rng)
    period *= rng.uniform(0.85, 1.15)
    phase_u, phase_v = rng.uniform(0, period, 2)
    fu, fv = ((u + phase_u) / period) % 1.0, ((v + phase_v) / period) % 1.0
    if kind == "stripes":
        return (fu < 0.5).astype(np.float32)
    if kind == "checks":
        return ((fu < 0.5) ^ (fv < 0.5)).astype(np.float32)
    return (((fu - 0.5) ** 2 + (fv - 0.5) ** 2) < 0.09).astype(np.float32)  # dots


def _outline(rng: np.random.Generator, kind: str) -> np.ndarray:
    """A 0/1 mask of a thin (1-2 stored px) ring, square, triangle or cross outline."""
    mask = Image.new("L", (RENDER, RENDER), 0)
    draw = ImageDraw.Draw(mask)
    scale = RENDER / IMAGE_SIZE
    radius = rng.uniform(14, 26) * scale
    cx, cy = rng.uniform(radius + 2 * scale, RENDER - radius - 2 * scale, 2)
    width = max(1, round(rng.uniform(1.0, 2.0) * scale))
    angle = rng.uniform(0, 2 * math.pi)

    def polygon(corners: int, start: float) -> list[tuple[float, float]]:
        return [
            (cx + radius * math.cos(start + 2 * math.pi * k / corners),
             cy + radius * math.sin(start + 2 * math.pi * k / corners))
            for k in range(corners + 1)
        ]  # fmt: skip

    if kind == "ring":
        draw.ellipse((cx - radius, cy - radius, cx + radius, cy + radius), outline=255, width=width)
    elif kind == "square":
        draw.line(polygon(4, angle), fill=255, width=width, joint="curve")
    elif kind == "triangle":
        draw.line(polygon(3, angle), fill=255, width=width, joint="curve")
    else:  # cross: two strokes through the centre
        ends = polygon(4, angle)
        draw.line([ends[0], ends[2]], fill=255, width=width)
        draw.line([ends[1], ends[3]], fill=255, width=width)
    return np.asarray(mask, dtype=np.float32) / 255


def _blotches(rng: np.random.Generator) -> np.ndarray:
    """Smooth random blobs: low frequency only."""
    coarse = Image.fromarray((rng.random((5, 5)) * 255).astype(np.uint8))
    smooth = coarse.resize((RENDER, RENDER), Image.Resampling.BICUBIC)
    return (np.asarray(smooth, dtype=np.float32) / 255 > 0.5).astype(np.float32)


def render(rng: np.random.Generator, class_index: int) -> Image.Image:
    """One RENDER x RENDER RGB image of the class: its mask between two random colours over a
    faint smooth background, plus sensor-like noise."""
    name = CLASSES[class_index]
    kind, _, grain = name.partition("-")
    if grain == "outline":
        mask = _outline(rng, kind)
    elif kind == "blotches":
        mask = _blotches(rng)
    else:
        mask = _texture(rng, kind, FINE_PERIOD if grain == "fine" else COARSE_PERIOD)
    background, foreground = _colours(rng)
    shade = Image.fromarray((rng.random((3, 3)) * 255).astype(np.uint8)).resize(
        (RENDER, RENDER), Image.Resampling.BICUBIC
    )
    shade = (np.asarray(shade, dtype=np.float32)[..., None] / 255 - 0.5) * 50
    pixels = background + mask[..., None] * (foreground - background) + shade
    pixels += rng.normal(0, 8, size=(RENDER, RENDER, 1))
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    return image.filter(ImageFilter.GaussianBlur(0.5))


def _png(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, "PNG", compress_level=1)
    return out.getvalue()


def split_labels(seed: int, split: str, count: int) -> np.ndarray:
    """0-based labels of a split's images: balanced (counts differ by at most one), in a random
    order, so that every shard of the round-robin holds every class."""
    order = np.random.default_rng([seed, 2 if split == "train" else 3]).permutation(count)
    return order % len(CLASSES)


def _records(job: tuple[int, str, int, int, int]) -> list[bytes]:
    """The framed records of images [start, stop) of a split, deterministic for the seed."""
    seed, split, count, start, stop = job
    synsets = synset_names(len(CLASSES))
    split_id = 0 if split == "train" else 1
    labels = split_labels(seed, split, count)
    out = []
    for index in range(start, stop):
        rng = np.random.default_rng([seed, split_id, index])
        label = int(labels[index])
        drawn = _png(render(rng, label))
        name = f"{split}_{index:06d}.png"
        out.append(image_record(drawn, name, synsets[label], label + 1, IMAGE_SIZE, QUALITY))
    return out


def generate(
    data_dir: Path, train_images: int, val_images: int, seed: int = 0, workers: int | None = None
) -> dict:
    """Writes the shards and manifest.json (the preprocessor's format, labels 1..10) into
    data_dir and returns the manifest. Image i of a split goes to shard i % shards."""
    data_dir.mkdir(parents=True, exist_ok=True)
    output = LocalOutput(str(data_dir))
    synsets = synset_names(len(CLASSES))
    label_map = {synset: label + 1 for label, synset in enumerate(synsets)}
    chunk = 250
    splits = {}
    with multiprocessing.get_context("spawn").Pool(workers or os.cpu_count() or 1) as pool:
        for split, count in (("train", train_images), ("validation", val_images)):
            shards = min(SHARDS[split], count)
            names = [f"{split}-{i:05d}-of-{shards:05d}" for i in range(shards)]
            writers = [ShardWriter(output.staging_path(name)) for name in names]
            jobs = [(seed, split, count, s, min(s + chunk, count)) for s in range(0, count, chunk)]
            position = 0
            for records in pool.imap(_records, jobs):
                for record in records:
                    writers[position % shards].write(record)
                    position += 1
            sidecars = []
            for name, writer in zip(names, writers, strict=True):
                sidecar = {
                    "file": name,
                    "split": split,
                    "records": writer.records,
                    "bytes": writer.bytes,
                    "sha256": writer.finish(),
                    "fingerprint": f"proxy seed {seed}",
                    "skipped": [],
                }
                output.publish(name, writer.path, sidecar)
                sidecars.append(sidecar)
            splits[split] = sidecars
    manifest = build_manifest(label_map, splits, IMAGE_SIZE, QUALITY)
    output.write_manifest(manifest)
    output.close()
    return manifest


# --- the runs ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RunResult:
    recipe: str
    seed: int
    epochs: int  # trained
    epochs_planned: int
    reached_at_epoch: int | None
    time_to_target_s: float | None
    top1: float  # the last evaluation's
    images_per_s: float | None


def read_result(recipe: str, seed: int, model_dir: Path) -> RunResult:
    trained = json.loads((model_dir / "train.json").read_text())
    evaluated = json.loads((model_dir / "eval.json").read_text())
    return RunResult(
        recipe=recipe,
        seed=seed,
        epochs=trained["epochs"],
        epochs_planned=trained["epochs_planned"],
        reached_at_epoch=trained.get("reached_target_at_epoch"),
        time_to_target_s=trained.get("time_to_target_s"),
        top1=evaluated["top1"],
        images_per_s=trained.get("images_per_s"),
    )


def warmup_epochs(recipe: str, epochs: int, global_batch: int) -> float:
    """The recipe's warmup as the same fraction of this short run as of its own epochs (goyal:
    5 of 90, fast: MLPerf's at this batch), so neither spends the run warming up."""
    settled = recipes.resolve(
        recipe,
        global_batch,
        base_lr=None,
        epochs=None,
        warmup_epochs=None,
        momentum=None,
        weight_decay=None,
        label_smoothing=recipes.MLPERF_LABEL_SMOOTHING,
    )
    return round(settled.warmup_epochs / settled.epochs * epochs, 3)


def train_command(
    recipe: str,
    seed: int,
    data_dir: Path,
    model_dir: Path,
    *,
    epochs: int,
    target: float,
    image_size: int,
    batch_size: int,
) -> list[str]:
    return [
        sys.executable, "-m", "trainer.train",
        "--data-dir", str(data_dir), "--model-dir", str(model_dir),
        "--recipe", recipe, "--arch", "resnet18", "--seed", str(seed),
        "--epochs", str(epochs), "--image-size", str(image_size),
        "--batch-size", str(batch_size),
        "--warmup-epochs", str(warmup_epochs(recipe, epochs, batch_size)),
        "--min-crop-area", str(MIN_CROP_AREA),
        "--target-top1", str(target), "--eval-every", "1",
        "--checkpoint-every-s", "100000", "--log-every", "50",
    ]  # fmt: skip


def train(command: list[str], log_path: Path) -> None:
    """Runs one trainer with its output in log_path; a failure ends the proxy with its tail."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.setdefault("PYTHONPATH", str(Path(__file__).resolve().parents[1]))
    with open(log_path, "w") as log:
        finished = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    if finished.returncode != 0:
        tail = log_path.read_text().splitlines()[-5:]
        fail(f"trainer exited {finished.returncode} ({log_path}): " + " | ".join(tail))


# --- the table -----------------------------------------------------------------------------------

HEADER = ("recipe", "seed", "epochs to target", "time to target (s)", "final top-1", "images/s")


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def table_rows(results: list[RunResult]) -> list[tuple[str, ...]]:
    """One row per run, then per recipe (in first-seen order) a median row. The medians of epochs
    and time to target are over the runs that reached it, with "k/n reached" when not all did."""
    rows = []
    for r in results:
        if r.reached_at_epoch is None:
            epochs, seconds = f"not reached in {r.epochs}", "-"
        else:
            epochs, seconds = str(r.reached_at_epoch), f"{r.time_to_target_s:.1f}"
        rate = "-" if r.images_per_s is None else f"{r.images_per_s:.0f}"
        rows.append((r.recipe, str(r.seed), epochs, seconds, f"{r.top1:.3f}", rate))
    for recipe in dict.fromkeys(r.recipe for r in results):
        runs = [r for r in results if r.recipe == recipe]
        reached = [r for r in runs if r.reached_at_epoch is not None]
        note = "" if len(reached) == len(runs) else f" ({len(reached)}/{len(runs)} reached)"
        epochs = _median([r.reached_at_epoch for r in reached])
        seconds = _median([r.time_to_target_s for r in reached])
        rate = _median([r.images_per_s for r in runs if r.images_per_s is not None])
        rows.append(
            (
                recipe,
                "median",
                ("-" if epochs is None else f"{epochs:g}") + note,
                "-" if seconds is None else f"{seconds:.1f}",
                f"{_median([r.top1 for r in runs]):.3f}",
                "-" if rate is None else f"{rate:.0f}",
            )
        )
    return rows


def format_table(results: list[RunResult]) -> str:
    """A Markdown table (it pastes into docs/trainer.md as printed)."""
    rows = [HEADER, *table_rows(results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]

    def line(cells) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(HEADER), rule, *(line(row) for row in rows[1:])])


# --- the command ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(
        prog="python -m trainer.proxy",
        description=__doc__.split("\n\n")[0],
        epilog="Wall time with the defaults: about 10 minutes on 2 CPU cores (docs/trainer.md).",
    )
    parser.add_argument("--workdir", required=True, help="data/ and runs/ go here")
    parser.add_argument(
        "--images", type=int, default=DEFAULT_IMAGES, help="training images (validation: 1/10)"
    )
    parser.add_argument("--seeds", type=int, default=DEFAULT_SEEDS, help="seeds per recipe")
    parser.add_argument(
        "--epochs", type=int, default=DEFAULT_EPOCHS, help="most epochs per run (both recipes)"
    )
    parser.add_argument(
        "--target", type=float, default=DEFAULT_TARGET, help="validation top-1 to stop at"
    )
    parser.add_argument(
        "--image-size", type=int, default=DEFAULT_IMAGE_SIZE, help="trainer's --image-size"
    )
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH, help="images per step")
    parser.add_argument(
        "--recipes", default="goyal,fast", help="comma-separated recipes to compare"
    )
    args = parser.parse_args(argv)
    require_at_least(
        ("--images", args.images, 2 * len(CLASSES)),
        ("--seeds", args.seeds, 1),
        ("--epochs", args.epochs, 1),
        ("--image-size", args.image_size, 32),
        ("--batch-size", args.batch_size, 1),
    )
    if not 0 < args.target <= 1:
        fail(f"--target must be a top-1 in (0, 1], got {args.target}")
    names = [name.strip() for name in args.recipes.split(",") if name.strip()]
    if not names or any(name not in recipes.RECIPES for name in names):
        fail(f"--recipes must name some of {', '.join(recipes.RECIPES)}, got {args.recipes!r}")
    if args.batch_size > args.images:
        fail(f"--batch-size {args.batch_size} is more than the {args.images} training images")

    workdir = Path(args.workdir)
    data_dir = workdir / "data"
    began = time.perf_counter()
    val_images = max(len(CLASSES), args.images // 10)
    generate(data_dir, args.images, val_images)
    print(f"generated {args.images} + {val_images} images in {data_dir} "
          f"({time.perf_counter() - began:.0f} s)", flush=True)  # fmt: skip
    sizes = sorted(
        {recipes.train_resolution(e, args.epochs, args.image_size) for e in range(args.epochs)}
    )
    print(f"fast trains at {'/'.join(map(str, sizes))} px, goyal at {args.image_size}; both "
          f"evaluate at {args.image_size}", flush=True)  # fmt: skip
    results = []
    for seed in range(args.seeds):
        for recipe in names:
            model_dir = workdir / "runs" / f"{recipe}-{seed}"
            if model_dir.exists():
                # A rerun starts over: the trainer would resume from the old checkpoints.
                shutil.rmtree(model_dir)
            model_dir.mkdir(parents=True)
            command = train_command(
                recipe,
                seed,
                data_dir,
                model_dir,
                epochs=args.epochs,
                target=args.target,
                image_size=args.image_size,
                batch_size=args.batch_size,
            )
            started = time.perf_counter()
            train(command, model_dir / "train.log")
            results.append(read_result(recipe, seed, model_dir))
            print(f"{recipe} seed {seed}: top-1 {results[-1].top1:.3f} after "
                  f"{results[-1].epochs} epochs ({time.perf_counter() - started:.0f} s)",
                  flush=True)  # fmt: skip
    print(f"\ntarget top-1 {args.target:g}, ResNet-18, batch {args.batch_size}, image size "
          f"{args.image_size}, at most {args.epochs} epochs of {args.images} images\n")  # fmt: skip
    print(format_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
