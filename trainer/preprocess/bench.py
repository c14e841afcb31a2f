"""Preprocessing speed against the hand-run TensorFlow recipe, in images/s per core.

    python -m trainer.preprocess.bench [--images 2000] [--workers N]

Generates an ImageNet-like sample (sample.py), converts it with trainer.preprocess in a
subprocess, then runs the reference on the same images in this process with TensorFlow limited to
one thread (its import and start-up not counted): what build_imagenet_data.py does (a TensorFlow
decode of every image to learn its shape, the original bytes into TFRecords), then what the Deep
Learning AMI's separate tensorflow_image_resizer.py does (per record: parse, TensorFlow decode,
bilinear resize to the short side, encode with optimize_size and 4:2:0 chroma, a new Example).
Both convert to the same short side and quality. Per core is given two ways: images per
CPU-second (user + system time of every process involved: robust when the machine is shared) and
wall-clock images/s divided by the cores used. The tool is timed twice: as run, start-up
included, and in steady state, what each further image costs (the difference to a run on a
100-image sample): that is the rate over ImageNet's 1.33 M images, and like the reference it
leaves start-up out. Also printed: CPU ms per image by stage for both, the ratio the fast path's
codec work alone would allow, and its PSNR against an exact Pillow decode + antialiased resize.
TensorFlow is imported only by the reference's function, so the package imports without it.
Tested by: .venv/bin/python -m pytest tests/trainer/test_preprocess_bench.py
"""

import io
import math
import os
import resource
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass

import numpy as np
from PIL import Image

from trainer.cli import OneLineErrorParser, fail
from trainer.preprocess import jpeg
from trainer.preprocess.images import target_size
from trainer.preprocess.sample import make_sample

GOAL_RATIO = 4.0
GOAL_PER_CORE = 150.0
SMALL_SAMPLE = (10, 8, 20)  # classes, train images per class, validation images
SMALL_IMAGES = SMALL_SAMPLE[0] * SMALL_SAMPLE[1] + SMALL_SAMPLE[2]
# The steady state is the difference of two runs that each pay a start-up of about half a
# CPU-second; at 200 images the difference (about 0.15 CPU-s) drowned in its noise and came out
# negative on a busy machine. 900 images beyond the small run cost well over a CPU-second.
MIN_IMAGES = 10 * SMALL_IMAGES
MAX_WORKERS = 512  # trainer.preprocess's own bound
SHORT_SIDE, QUALITY = 256, 90  # trainer.preprocess's defaults


class MeasurementError(Exception):
    """The machine was too noisy for a figure to mean anything."""


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

    def minus(self, smaller: "Timing") -> "Timing":
        """What the images beyond the smaller run's cost: its fixed costs (start-up) cancel out."""
        assert self.images > smaller.images and self.cores == smaller.cores
        return Timing(
            self.images - smaller.images,
            self.wall_s - smaller.wall_s,
            self.cpu_s - smaller.cpu_s,
            self.cores,
        )

    def steady_state(self, smaller: "Timing") -> "Timing":
        """minus(), refusing a difference that noise made meaningless (no cost, or negative)."""
        steady = self.minus(smaller)
        if steady.cpu_s <= 0 or steady.wall_s <= 0:
            raise MeasurementError(
                f"the {self.images}-image run cost no more than the {smaller.images}-image run "
                f"({self.cpu_s:.2f} vs {smaller.cpu_s:.2f} CPU-s, {self.wall_s:.2f} vs "
                f"{smaller.wall_s:.2f} s): the machine is too busy to measure a steady state; "
                "run again with more --images or when it is quieter"
            )
        return steady

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


def reference_timing(images, short_side: int, quality: int, workdir: str) -> tuple[Timing, dict]:
    """The reference's timing, and its CPU seconds by stage measured again on a quarter sample.

    Like the scripts: TensorFlow 1 graphs in one session, one session.run per image and pass.
    """
    import tensorflow as tf

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

    graph = tf.Graph()
    with graph.as_default():
        # build_imagenet_data.py's ImageCoder.decode_jpeg: the shape of every image.
        image_data = tf.compat.v1.placeholder(tf.string)
        decoded = tf.io.decode_jpeg(image_data, channels=3)
        # tensorflow_image_resizer.py's resize_example: a record in, its image resized out.
        record = tf.compat.v1.placeholder(tf.string)
        spec = {"image/encoded": tf.io.FixedLenFeature([], tf.string)}
        encoded = tf.io.parse_single_example(record, spec)["image/encoded"]
        pixels = tf.io.decode_jpeg(encoded, channels=3)
        shape = tf.cast(tf.shape(pixels)[:2], tf.float32)
        size = tf.cast(tf.minimum(short_side / tf.reduce_min(shape), 1.0) * shape, tf.int32)
        resized = tf.cast(tf.compat.v1.image.resize(pixels, size, align_corners=False), tf.uint8)
        reencoded = tf.io.encode_jpeg(
            resized, format="rgb", quality=quality, progressive=False, optimize_size=True,
            chroma_downsampling=True,
        )  # fmt: skip
    config = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=1, inter_op_parallelism_threads=1
    )
    full, small = os.path.join(workdir, "reference-full"), os.path.join(workdir, "reference-small")
    # Not entered as a context: that would make its graph the default, and reading the records
    # back with tf.data needs eager mode.
    session = tf.compat.v1.Session(graph=graph, config=config)
    start, cpu_start = time.perf_counter(), time.process_time()
    with tf.io.TFRecordWriter(full) as writer:
        for name, data, label in images:
            height, width, _ = session.run(decoded, {image_data: data}).shape
            writer.write(example(data, label, height, width, name))
    with tf.io.TFRecordWriter(small) as writer:
        records = tf.data.TFRecordDataset(full).as_numpy_iterator()
        for (name, _, label), serialized in zip(images, records, strict=True):
            out, (height, width) = session.run([reencoded, size], {record: serialized})
            writer.write(example(out, label, height, width, name))
    timing = Timing(len(images), time.perf_counter() - start, time.process_time() - cpu_start, 1)
    quarter = [data for _, data, _ in images[::4]]
    cumulative = []
    for fetch in (pixels, resized, reencoded):  # each stage's cost is the difference to the last
        before = time.process_time()
        for data in quarter:
            session.run(fetch, {encoded: data})
        cumulative.append((time.process_time() - before) * len(images) / len(quarter))
    session.close()
    decode, resize, encode = (
        cumulative[0],
        cumulative[1] - cumulative[0],
        cumulative[2] - cumulative[1],
    )
    return timing, {"2 decodes": 2 * decode, "resize": resize, "encode": encode}


def tool_stages(images, short_side: int, quality: int) -> tuple[dict, list[float], int]:
    """CPU seconds of the fast path's two stages, the PSNR of each image it takes against an exact
    Pillow decode + antialiased bilinear resize, and how many images it took."""
    stages, psnrs, taken = {"decode + resize": 0.0, "encode": 0.0}, [], 0
    for _, data, _ in images:
        before = time.process_time()
        original = jpeg.fast_path_size(data)
        pixels = None
        if original is not None:
            size = target_size(*original, short_side)
            pixels = jpeg.decode_resized(data, original, size)
        middle = time.process_time()
        stages["decode + resize"] += middle - before
        if pixels is None:
            continue
        jpeg.encode(pixels, quality)
        stages["encode"] += time.process_time() - middle
        taken += 1
        with Image.open(io.BytesIO(data)) as image:
            exact = image.convert("RGB")
        if exact.size != size:
            psnrs.append(psnr(pixels, np.asarray(exact.resize(size, Image.Resampling.BILINEAR))))
    return stages, psnrs, taken


def psnr(image: np.ndarray, reference: np.ndarray) -> float:
    """Peak signal-to-noise ratio in dB of two uint8 images (inf if identical)."""
    mse = np.mean((image.astype(np.float64) - reference) ** 2)
    return math.inf if mse == 0 else 10 * math.log10(255**2 / mse)


def breakdown(stages: dict, timing: Timing, rest: str) -> str:
    parts = [f"{name} {1000 * seconds / timing.images:.2f}" for name, seconds in stages.items()]
    other = 1000 * (timing.cpu_s - sum(stages.values())) / timing.images
    return " + ".join([*parts, f"{rest} {other:.2f}"]) + f" = {1000 / timing.per_cpu_second():.2f}"


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
    parser = OneLineErrorParser(
        prog="python -m trainer.preprocess.bench", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--images", type=int, default=2000, help="images in the sample")
    cores = len(os.sched_getaffinity(0))
    parser.add_argument(
        "--workers",
        type=int,
        default=cores,
        help="tool processes (default: one per core, %(default)s here)",
    )
    args = parser.parse_args(argv)
    if args.images < MIN_IMAGES:
        fail(
            f"--images must be at least {MIN_IMAGES} (steady state is measured against a "
            f"{SMALL_IMAGES}-image run), got {args.images}"
        )
    if not 1 <= args.workers <= MAX_WORKERS:
        fail(f"--workers must be between 1 and {MAX_WORKERS}, got {args.workers}")
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
        as_run = tool_timing(sample, len(images), args.workers, os.path.join(workdir, "tfrecords"))
        print(f"trainer.preprocess, start-up included: {as_run.describe()}", flush=True)
        small = make_sample(os.path.join(workdir, "small"), *SMALL_SAMPLE)
        small_run = tool_timing(
            small, SMALL_IMAGES, args.workers, os.path.join(workdir, "small-tfrecords")
        )
        try:
            tool = as_run.steady_state(small_run)
        except MeasurementError as error:
            fail(str(error), code=1)
        startup_cpu_s = small_run.cpu_s - SMALL_IMAGES * tool.cpu_s / tool.images
        print(
            f"trainer.preprocess, steady state: {tool.describe()}; start-up "
            f"{startup_cpu_s:.2f} CPU-s (from a {SMALL_IMAGES}-image run)",
            flush=True,
        )
        reference, reference_stages = reference_timing(images, SHORT_SIDE, QUALITY, workdir)
        print(f"reference, TensorFlow one image at a time: {reference.describe()}")
    stages, psnrs, taken = tool_stages(images, SHORT_SIDE, QUALITY)
    print("CPU ms per image by stage:")
    print(
        f"  tool, steady state: {breakdown(stages, tool, 'the rest (archives, records, processes)')}"
    )
    print(f"  reference: {breakdown(reference_stages, reference, 'the rest (records, sessions)')}")
    codec_ms = 1000 * sum(stages.values()) / len(images)
    print(
        f"ceiling: decoding, resizing and encoding alone cost the fast path {codec_ms:.2f} ms per "
        f"image, so even with nothing else to do it could be at most "
        f"{1000 / reference.per_cpu_second() / codec_ms:.1f}x the reference per CPU-second"
    )
    print(
        f"quality: the fast path took {taken} of {len(images)} images; against an exact Pillow decode "
        f"+ antialiased bilinear resize, the {len(psnrs)} it resized have PSNR mean "
        f"{np.mean(psnrs):.1f} dB, min {min(psnrs):.1f} dB"
    )
    print(f"load average {os.getloadavg()[0]:.1f} on {cores} cores (the machine may be shared)")
    for basis, timing in [("steady state", tool), ("start-up included", as_run)]:
        for label, rate in [
            ("per CPU-second", Timing.per_cpu_second),
            ("per core by wall clock", Timing.per_core_wall),
        ]:
            ratio = rate(timing) / rate(reference)
            met = rate(timing) >= GOAL_PER_CORE and ratio >= GOAL_RATIO
            print(
                f"{basis}, {label}: tool {rate(timing):.0f}, reference {rate(reference):.0f}, "
                f"{ratio:.1f}x -> {'meets' if met else 'misses'} the goals "
                f"(>= {GOAL_RATIO:.0f}x, >= {GOAL_PER_CORE:.0f}/s per core)"
            )


if __name__ == "__main__":
    main()
