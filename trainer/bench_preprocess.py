"""Preprocessing speed against the hand-run TensorFlow recipe, in images/s per core.

    python -m trainer.bench_preprocess [--images 2000] [--workers N]

Generates an ImageNet-like sample (trainer.make_sample), converts it with trainer.preprocess in a
subprocess (start-up included), then runs the reference on the same images in this process with
TensorFlow limited to one thread: what build_imagenet_data.py does (a TensorFlow decode of every
image to check it, one Example per image into TFRecords) followed by the separate resize pass
(TensorFlow decode, resize, encode, one image at a time). Per core is given two ways: images per
CPU-second (user + system time of every process involved: robust when the machine is shared)
and wall-clock images/s divided by the cores used.
"""

import argparse
import io
import os
import resource
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass

from PIL import Image

from trainer.make_sample import make_sample

GOAL_RATIO = 4.0
GOAL_PER_CORE = 150.0


@dataclass(frozen=True)
class Timing:
    images: int
    wall_s: float
    cpu_s: float
    cores: int

    def per_cpu_second(self) -> float:
        return self.images / self.cpu_s

    def per_core_wall(self) -> float:
        return self.images / self.wall_s / self.cores

    def describe(self) -> str:
        return (
            f"{self.per_cpu_second():.0f} images per CPU-second, {self.per_core_wall():.0f} images/s "
            f"per core by wall clock ({self.images} images, {self.cores} cores, {self.wall_s:.1f} s)"
        )


def sample_images(sample) -> list[tuple[str, bytes, int]]:
    """(name, bytes, 1-based label) of every train and validation image, in memory."""
    labels = {synset: i + 1 for i, synset in enumerate(sample.synsets)}
    images = []
    with tarfile.open(sample.train_tar) as outer:
        for member in outer:
            synset = member.name.removesuffix(".tar")
            with tarfile.open(fileobj=outer.extractfile(member)) as inner:
                images += [(m.name, inner.extractfile(m).read(), labels[synset]) for m in inner]
    with tarfile.open(sample.val_tar) as val:
        members = sorted(val.getmembers(), key=lambda m: m.name)
        images += [
            (m.name, val.extractfile(m).read(), labels[synset])
            for m, synset in zip(members, sample.val_synsets, strict=True)
        ]
    return images


def reference_timing(images, short_side: int, quality: int, workdir: str) -> Timing:
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)

    def example(encoded: bytes, label: int, height: int, width: int, name: str) -> bytes:
        def as_bytes(value):
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

        def as_int(value):
            return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))

        feature = {
            "image/encoded": as_bytes(encoded), "image/format": as_bytes(b"JPEG"),
            "image/class/label": as_int(label), "image/height": as_int(height),
            "image/width": as_int(width), "image/filename": as_bytes(name.encode()),
            "image/colorspace": as_bytes(b"RGB"), "image/channels": as_int(3),
        }  # fmt: skip
        return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()

    full, resized = (
        os.path.join(workdir, "reference-full"),
        os.path.join(workdir, "reference-small"),
    )
    spec = {"image/encoded": tf.io.FixedLenFeature([], tf.string)}
    start, cpu_start = time.perf_counter(), time.process_time()
    with tf.io.TFRecordWriter(
        full
    ) as writer:  # build_imagenet_data.py: decode to check, keep bytes
        for name, data, label in images:
            pixels = tf.io.decode_jpeg(data, channels=3)
            writer.write(example(data, label, pixels.shape[0], pixels.shape[1], name))
    with tf.io.TFRecordWriter(resized) as writer:  # the resizer: decode, resize, encode, one by one
        for (name, _, label), record in zip(images, tf.data.TFRecordDataset(full), strict=True):
            pixels = tf.io.decode_jpeg(tf.io.parse_single_example(record, spec)["image/encoded"], 3)
            height, width = pixels.shape[0], pixels.shape[1]
            scale = min(1.0, short_side / min(height, width))
            size = (round(height * scale), round(width * scale))
            small = tf.cast(tf.image.resize(pixels, size), tf.uint8)
            jpeg = tf.io.encode_jpeg(small, quality=quality).numpy()
            writer.write(example(jpeg, label, size[0], size[1], name))
    return Timing(len(images), time.perf_counter() - start, time.process_time() - cpu_start, 1)


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def tool_timing(sample, count: int, workers: int, output: str) -> Timing:
    command = [
        sys.executable, "-m", "trainer.preprocess", "--train-tar", sample.train_tar,
        "--val-tar", sample.val_tar, "--val-labels", sample.val_labels, "--output", output,
        "--train-shards", "16", "--val-shards", "2", "--workers", str(workers),
    ]  # fmt: skip
    start, cpu_start = time.perf_counter(), _children_cpu_s()
    subprocess.run(command, check=True, stderr=subprocess.DEVNULL)
    return Timing(count, time.perf_counter() - start, _children_cpu_s() - cpu_start, workers)


def image_size(data: bytes) -> tuple[int, int]:
    with Image.open(io.BytesIO(data)) as image:
        return image.size


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.bench_preprocess", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--images", type=int, default=2000, help="images in the sample (2000)")
    cores = len(os.sched_getaffinity(0))
    parser.add_argument("--workers", type=int, default=cores, help="tool processes (all cores)")
    args = parser.parse_args(argv)
    if args.images < 20 or args.workers < 1:
        print("error: --images must be at least 20 and --workers at least 1", file=sys.stderr)
        sys.exit(2)
    classes, val_images = 10, args.images // 10
    with tempfile.TemporaryDirectory(prefix="bench-preprocess-") as workdir:
        print(f"generating {args.images} ImageNet-like images ...", flush=True)
        per_class = (args.images - val_images) // classes
        sample = make_sample(os.path.join(workdir, "raw"), classes, per_class, val_images)
        images = sample_images(sample)
        sizes = [image_size(data) for _, data, _ in images]
        print(
            f"sample: {len(images)} images, mean {sum(w for w, _ in sizes) / len(sizes):.0f}x"
            f"{sum(h for _, h in sizes) / len(sizes):.0f}, "
            f"{sum(len(d) for _, d, _ in images) / len(images) / 1024:.0f} KiB"
        )
        tool = tool_timing(sample, len(images), args.workers, os.path.join(workdir, "tfrecords"))
        print(f"trainer.preprocess: {tool.describe()}", flush=True)
        reference = reference_timing(images, 256, 90, workdir)
        print(f"reference, TensorFlow one image at a time: {reference.describe()}")
    print(f"load average {os.getloadavg()[0]:.1f} on {cores} cores (the machine may be shared)")
    for label, rate in [
        ("per CPU-second", Timing.per_cpu_second),
        ("per core by wall clock", Timing.per_core_wall),
    ]:
        ratio = rate(tool) / rate(reference)
        met = rate(tool) >= GOAL_PER_CORE and ratio >= GOAL_RATIO
        print(
            f"{label}: tool {rate(tool):.0f}, reference {rate(reference):.0f}, {ratio:.1f}x -> "
            f"{'meets' if met else 'misses'} the goals (>= {GOAL_RATIO:.0f}x, >= {GOAL_PER_CORE:.0f}/s per core)"
        )


if __name__ == "__main__":
    main()
