"""Benchmark the training input pipeline alone (no model): images/s and images/s per core.

Run:
    python -m trainer.bench_input --data-dir /data/tfrecords [--image-size 224] [--batch-size 256]
    python -m trainer.bench_input --generate    # writes an ImageNet-like temporary set first
The last line printed is JSON: {"images_per_s": .., "images_per_s_per_core": .., "cores": ..}.
A V100 trains ~1,300 img/s (mixed precision + XLA) and p3dn has 12 vCPUs per GPU, so the
pipeline must reach at least 110 img/s per core.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import tensorflow as tf
from PIL import Image

from trainer import data
from trainer.cli import OneLineErrorParser, fail
from trainer.preprocess.sample import make_image

REQUIRED_PER_CORE = 110


def generate(directory: Path, images: int, shards: int, seed: int = 0) -> int:
    """Write `images` ImageNet-like JPEGs (make_sample's) as train-* shards; total bytes."""
    writers = [
        tf.io.TFRecordWriter(str(directory / f"train-{i:05d}-of-{shards:05d}"))
        for i in range(shards)
    ]
    total = 0
    for index in range(images):
        encoded = make_image(seed, 0, index, index % 1000)
        width, height = Image.open(io.BytesIO(encoded)).size
        total += len(encoded)
        features = {
            "image/encoded": _bytes(encoded),
            "image/format": _bytes(b"JPEG"),
            "image/class/label": _int(1 + index % 1000),
            "image/height": _int(height),
            "image/width": _int(width),
            "image/filename": _bytes(f"synthetic_{index}.JPEG".encode()),
            "image/colorspace": _bytes(b"RGB"),
            "image/channels": _int(3),
        }
        example = tf.train.Example(features=tf.train.Features(feature=features))
        writers[index % shards].write(example.SerializeToString())
    for writer in writers:
        writer.close()
    return total


def _bytes(value: bytes) -> tf.train.Feature:
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))


def _int(value: int) -> tf.train.Feature:
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))


def measure(
    files: list[str], batch_size: int, image_size: int, seconds: float, warmup_s: float
) -> tuple[float, float]:
    """Images per wall second and per CPU second (all threads) of the training pipeline, after
    `warmup_s` of filling buffers and autotuning. On a shared machine only the second is fair."""
    dataset = data.train_dataset(
        files,
        batch_size=batch_size,
        image_size=image_size,
        num_classes=1000,
        label_base=1,
        shuffle_buffer=1000,
    )
    batches = iter(dataset)
    deadline = time.perf_counter() + warmup_s
    while time.perf_counter() < deadline:
        next(batches)
    images, start, cpu_start = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        images += int(next(batches)[1].shape[0])
    return images / (time.perf_counter() - start), images / (time.process_time() - cpu_start)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = OneLineErrorParser(prog="python -m trainer.bench_input", description=__doc__)
    parser.add_argument("--data-dir", help="directory with train-* TFRecord shards")
    parser.add_argument(
        "--generate",
        action="store_true",
        help="write a temporary ImageNet-like set (--images JPEGs) and benchmark it",
    )
    parser.add_argument("--images", type=int, default=512, help="images written by --generate")
    parser.add_argument("--image-size", type=int, default=224, help="output crop size")
    parser.add_argument("--batch-size", type=int, default=256, help="images per batch")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured duration")
    parser.add_argument("--warmup", type=float, default=5.0, help="unmeasured seconds first")
    args = parser.parse_args(argv)
    if args.generate == (args.data_dir is not None):
        fail("give exactly one of --data-dir DIR or --generate")
    if args.data_dir is not None and not args.data_dir.strip():
        fail("--data-dir is empty; give a directory path")  # Path("") would be the cwd
    for flag, value in [
        ("--images", args.images),
        ("--image-size", args.image_size),
        ("--batch-size", args.batch_size),
    ]:
        if value <= 0:
            fail(f"{flag} must be > 0, got {value}")
    # nan compares false with everything: it would measure nothing (or warm up forever if inf).
    if not 0 < args.seconds < math.inf:
        fail(f"--seconds must be a finite number > 0, got {args.seconds}")
    if not 0 <= args.warmup < math.inf:
        fail(f"--warmup must be a finite number >= 0, got {args.warmup}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cores = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory(prefix="bench-input-") as scratch:
        data_dir = Path(args.data_dir or scratch)
        if args.generate:
            total = generate(data_dir, args.images, shards=8)
            print(f"generated {args.images} JPEGs, {total / args.images / 1024:.0f} KiB on average")
        try:
            files = data.list_shards(data_dir, "train")
            data.require_records(files, f"the train-* shards in {data_dir}")
            images_per_s, images_per_cpu_s = measure(
                files, args.batch_size, args.image_size, args.seconds, args.warmup
            )
        except data.DataError as exc:
            fail(str(exc))
        except tf.errors.OpError as exc:
            fail(data.describe_input_error(exc, files, args.image_size))
    per_core = images_per_s / cores
    verdict = "meets" if per_core >= REQUIRED_PER_CORE else "BELOW"
    print(
        f"{images_per_s:.0f} img/s on {cores} cores: {per_core:.0f} per core ({verdict} the "
        f"{REQUIRED_PER_CORE} img/s per core needed to feed a V100 from 12 vCPUs); "
        f"{images_per_cpu_s:.0f} images per CPU-second actually used"
    )
    print(
        json.dumps(
            {
                "images_per_s": round(images_per_s, 1),
                "images_per_s_per_core": round(per_core, 1),
                "cores": cores,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
