"""ILSVRC archives (or an extracted tree) to sharded TFRecords, streamed, parallel, resumable.

    python -m trainer.preprocess --train-tar ILSVRC2012_img_train.tar \
        --val-tar ILSVRC2012_img_val.tar --val-labels ILSVRC2012_validation_ground_truth.txt \
        --output /data/tfrecords            # or s3://BUCKET/tfrecords; inputs may be s3:// too

Each split's input is cut into blocks that own fixed ranges of shards (trainer/preprocess_inputs.py),
so a shard mixes its block's classes and every run assigns each image to the same shard. The main
process streams a block's images to a pool of worker processes (trainer/preprocess_image.py) and
writes their records in order; a block's shards are published whole, each with a sidecar holding
its record count and sha256 (trainer/preprocess_output.py). A restart skips the blocks whose
shards all still match their sidecars and redoes the others. The manifest (docs/contracts.md) is
written last.
Tested by: .venv/bin/python -m pytest tests/trainer/test_preprocess_local.py tests/trainer/test_preprocess_s3.py
"""

import os
import signal
import sys
import time
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from datetime import datetime, timezone
from multiprocessing import get_context

from trainer.cli import OneLineErrorParser, fail
from trainer.imagenet_archives import (
    InputError,
    check_input,
    check_output_bucket,
    s3_client,
    split_s3_url,
)
from trainer.preprocess_image import encode_batch, init_worker
from trainer.preprocess_inputs import (
    block_fingerprint,
    plan_blocks,
    train_tar_units,
    tree_units,
    val_tar_units,
)
from trainer.preprocess_output import LocalOutput, S3Output, ShardWriter

MANIFEST_FORMAT = "horovod-fleet/imagenet-tfrecords/1"
LABEL_BASE = 1
BATCH_IMAGES = 16  # images per worker task: amortises the inter-process round trip
BATCHES_IN_FLIGHT_PER_WORKER = 4  # keeps workers fed while bounding memory


@dataclass(frozen=True)
class Config:
    train_tar: str | None
    train_dir: str | None
    val_tar: str | None
    val_labels: str | None
    output: str
    train_shards: int
    val_shards: int
    short_side: int
    quality: int
    workers: int
    min_images_per_class: int
    val_per_class: int
    shards_per_block: int


def _bounded(flag: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise InputError(f"{flag} must be between {low} and {high}, got {value}")


def parse_config(argv: list[str] | None) -> Config:
    parser = OneLineErrorParser(
        prog="python -m trainer.preprocess", description=__doc__.split("\n")[0]
    )
    add = parser.add_argument
    add(
        "--train-tar",
        metavar="PATH_OR_S3",
        help="ILSVRC2012_img_train.tar (a tar of per-synset tars): path or s3://",
    )
    add(
        "--train-dir",
        metavar="TREE",
        help="instead of --train-tar: an extracted tree TREE/<synset>/<image>",
    )
    add(
        "--val-tar",
        metavar="PATH_OR_S3",
        help="ILSVRC2012_img_val.tar (flat images): path or s3://",
    )
    add(
        "--val-labels",
        metavar="PATH_OR_S3",
        help="validation ground truth: one synset per line, in file-name order",
    )
    add(
        "--output",
        metavar="DIR_OR_S3",
        required=True,
        help="directory or s3://BUCKET/PREFIX for shards + manifest.json",
    )
    add("--train-shards", metavar="N", type=int, default=1024, help="train shards (default 1024)")
    add("--val-shards", metavar="N", type=int, default=128, help="validation shards (default 128)")
    add(
        "--short-side",
        metavar="N",
        type=int,
        default=256,
        help="shorter side, 32-4096 px, never upscaled (256)",
    )
    add("--quality", metavar="N", type=int, default=90, help="JPEG quality 1-100 (90)")
    add(
        "--workers",
        metavar="N",
        type=int,
        default=len(os.sched_getaffinity(0)),
        help="processes (all cores)",
    )
    add(
        "--min-images-per-class",
        metavar="K",
        type=int,
        default=0,
        help="with --train-dir: drop smaller classes",
    )
    add(
        "--val-per-class",
        metavar="M",
        type=int,
        default=0,
        help="with --train-dir: carve M images per class as validation",
    )
    add(
        "--shards-per-block",
        metavar="N",
        type=int,
        default=64,
        help="shards written together; a restart redoes at most one block (64)",
    )
    args = parser.parse_args(argv)
    config = Config(**{name: value for name, value in vars(args).items()})
    validate(config)
    return config


def validate(config: Config) -> None:
    """Rejects inconsistent or out-of-range options; paths are checked when opened."""
    if (config.train_tar is None) == (config.train_dir is None):
        raise InputError("give exactly one of --train-tar and --train-dir")
    has_val_archive = config.val_tar is not None or config.val_labels is not None
    if config.val_per_class:
        if config.train_dir is None or has_val_archive:
            raise InputError(
                "--val-per-class needs --train-dir and excludes --val-tar/--val-labels"
            )
    elif config.val_tar is None or config.val_labels is None:
        raise InputError("give --val-tar with --val-labels (or --val-per-class with --train-dir)")
    if config.min_images_per_class and config.train_dir is None:
        raise InputError(
            "--min-images-per-class needs --train-dir (a tar cannot be counted cheaply)"
        )
    _bounded("--train-shards", config.train_shards, 1, 99999)
    _bounded("--val-shards", config.val_shards, 1, 99999)
    _bounded("--short-side", config.short_side, 32, 4096)
    _bounded("--quality", config.quality, 1, 100)
    _bounded("--workers", config.workers, 1, 512)
    _bounded("--min-images-per-class", config.min_images_per_class, 0, 10**7)
    _bounded("--val-per-class", config.val_per_class, 0, 10**6)
    _bounded("--shards-per-block", config.shards_per_block, 1, 99999)
    for flag, value in [
        ("--train-tar", config.train_tar),
        ("--train-dir", config.train_dir),
        ("--val-tar", config.val_tar),
        ("--val-labels", config.val_labels),
        ("--output", config.output),
    ]:
        if value is not None and not value.strip():
            raise InputError(f"{flag} is empty; give a path or an s3:// URL")
        if value and value.startswith("s3://"):
            try:
                split_s3_url(value, object_key=flag != "--output")
            except InputError as exc:
                raise InputError(f"{flag}: {exc}") from None


class Progress:
    """images/s and ETA on stderr: one rewritten line on a terminal, a line every 5 s otherwise."""

    def __init__(self, split: str, total_bytes: int, stream=sys.stderr):
        self._split, self._total, self._stream = split, max(total_bytes, 1), stream
        self._tty = stream.isatty()
        self._interval = 0.5 if self._tty else 5.0
        self._start = self._last = time.monotonic()
        self.images = self.skipped = self._bytes = 0

    def advance(self, images: int, skipped: int, nbytes: int) -> None:
        self.images, self.skipped, self._bytes = (
            self.images + images,
            self.skipped + skipped,
            self._bytes + nbytes,
        )
        if time.monotonic() - self._last >= self._interval:
            self._show(final=False)

    def _show(self, final: bool) -> None:
        self._last = time.monotonic()
        elapsed = max(self._last - self._start, 1e-6)
        done = 1.0 if final else self._bytes / self._total
        eta = "done" if final else f"ETA {_duration(elapsed / max(done, 1e-9) - elapsed)}"
        line = (
            f"{self._split}: {self.images} images ({self.skipped} skipped), "
            f"{self.images / elapsed:.0f} images/s, {100 * done:.1f}% of input, {eta}"
        )
        end = "\n" if final or not self._tty else ""
        print(("\r" if self._tty else "") + line, end=end, file=self._stream, flush=True)

    def finish(self) -> None:
        self._show(final=True)


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m{secs:02d}s"


def convert_block(
    block, fingerprint, label_map, config, pool, output, client, progress
) -> list[dict]:
    """Writes all shards of one block and publishes them; returns their sidecars."""
    writers = [ShardWriter(output.staging_path(name)) for name in block.shard_names]
    skipped: list[list[dict]] = [[] for _ in writers]
    pending: deque = deque()

    def collect_oldest() -> None:
        shards, names, nbytes, future = pending.popleft()
        for shard, name, (record, reason) in zip(shards, names, future.result(), strict=True):
            if record is None:
                skipped[shard].append({"file": name, "reason": reason})
            else:
                writers[shard].write(record)
        failed = sum(1 for record, _ in future.result() if record is None)
        progress.advance(len(names) - failed, failed, nbytes)

    def submit(batch: list) -> None:
        items = [(data, name, synset, label_map[synset]) for _, name, data, synset in batch]
        future = pool.submit(encode_batch, items, config.short_side, config.quality)
        pending.append(
            ([b[0] for b in batch], [b[1] for b in batch], sum(len(b[2]) for b in batch), future)
        )
        if len(pending) > config.workers * BATCHES_IN_FLIGHT_PER_WORKER:
            collect_oldest()

    batch: list = []
    position = 0
    for unit in block.units:
        for name, data, synset in unit.images(client):
            batch.append((position % block.shard_count, name, data, synset))
            position += 1
            if len(batch) == BATCH_IMAGES:
                submit(batch)
                batch = []
    if batch:
        submit(batch)
    while pending:
        collect_oldest()
    sidecars = []
    for name, writer, shard_skipped in zip(block.shard_names, writers, skipped, strict=True):
        sha256 = writer.finish()
        sidecar = {
            "file": name,
            "split": block.split,
            "records": writer.records,
            "bytes": writer.bytes,
            "sha256": sha256,
            "fingerprint": fingerprint,
            "skipped": shard_skipped,
        }
        output.publish(name, writer.path, sidecar)
        sidecars.append(sidecar)
    return sidecars


def convert_split(blocks, label_map, config, pool, output, client) -> list[dict]:
    """Sidecars of every shard of one split, converting only the blocks not already complete."""
    sidecars, todo = {}, []
    for block in blocks:
        fingerprint = block_fingerprint(block, label_map, config.short_side, config.quality)
        found = [output.completed(name, fingerprint) for name in block.shard_names]
        if all(found):
            sidecars[block.index] = found
        else:
            todo.append((block, fingerprint))
    split = blocks[0].split
    print(
        f"{split}: {len(blocks)} blocks of shards, {len(blocks) - len(todo)} already complete",
        file=sys.stderr,
        flush=True,
    )
    progress = Progress(split, sum(unit.weight for block, _ in todo for unit in block.units))
    for block, fingerprint in todo:
        sidecars[block.index] = convert_block(
            block, fingerprint, label_map, config, pool, output, client, progress
        )
    if todo:
        progress.finish()
    return [sidecar for block in blocks for sidecar in sidecars[block.index]]


def build_manifest(
    label_map: dict[str, int], splits: dict[str, list[dict]], config: Config
) -> dict:
    shards = [sidecar for sidecars in splits.values() for sidecar in sidecars]
    return {
        "format": MANIFEST_FORMAT,
        "num_classes": len(label_map),
        "label_base": LABEL_BASE,
        "splits": {
            split: {"shards": len(sidecars), "records": sum(s["records"] for s in sidecars)}
            for split, sidecars in splits.items()
        },
        "shards": [
            {key: s[key] for key in ("file", "split", "records", "bytes", "sha256")} for s in shards
        ],
        "label_map": label_map,
        "image": {"short_side": config.short_side, "quality": config.quality},
        "skipped": [entry for s in shards for entry in s["skipped"]],
        "created_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def local_output(root: str) -> LocalOutput:
    if os.path.exists(root) and not os.path.isdir(root):
        raise InputError(f"--output: {root} is a file; expected a directory or s3:// prefix")
    try:
        return LocalOutput(root)
    except OSError as exc:
        raise InputError(f"--output: cannot create {root}: {exc.strerror or exc}") from None


def check_records(manifest: dict) -> None:
    """A split with no record would only fail later, on a GPU fleet: no manifest for it."""
    for split, totals in manifest["splits"].items():
        if totals["records"] == 0:
            reasons = sorted({entry["reason"] for entry in manifest["skipped"]})
            raise InputError(
                f"{split}: no image could be converted ({len(manifest['skipped'])} skipped, "
                f"e.g. {reasons[0] if reasons else 'none found'}); no manifest written"
            )


def run(config: Config) -> dict:
    """Converts both splits and writes the manifest; returns the manifest."""
    sources = [config.train_tar, config.val_tar, config.val_labels, config.output]
    client = s3_client() if any(s and s.startswith("s3://") for s in sources) else None
    for flag, source in [
        ("--train-tar", config.train_tar),
        ("--val-tar", config.val_tar),
        ("--val-labels", config.val_labels),
    ]:
        if source:
            check_input(flag, source, client)
    if config.output.startswith("s3://"):
        check_output_bucket("--output", config.output, client)
    if config.train_dir is not None:
        train_units, carved = tree_units(
            config.train_dir, config.min_images_per_class, config.val_per_class
        )
        val_units = carved if config.val_per_class else None
    else:
        train_units, val_units = train_tar_units(config.train_tar, client), None
    label_map = {
        synset: LABEL_BASE + i for i, synset in enumerate(sorted({u.synset for u in train_units}))
    }
    if val_units is None:
        val_units = val_tar_units(config.val_tar, config.val_labels, label_map, client)
    if not val_units:
        raise InputError("no validation images: --val-tar is empty or every class has 1 image")
    plans = {
        "train": plan_blocks("train", train_units, config.train_shards, config.shards_per_block),
        "validation": plan_blocks(
            "validation", val_units, config.val_shards, config.shards_per_block
        ),
    }
    output = (
        S3Output(config.output, client)
        if config.output.startswith("s3://")
        else local_output(config.output)
    )
    try:
        pool = ProcessPoolExecutor(
            config.workers, mp_context=get_context("spawn"), initializer=init_worker
        )
        with pool:
            splits = {
                split: convert_split(blocks, label_map, config, pool, output, client)
                for split, blocks in plans.items()
            }
        manifest = build_manifest(label_map, splits, config)
        check_records(manifest)
        output.write_manifest(manifest)
    finally:
        output.close()
    return manifest


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> None:
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        manifest = run(parse_config(argv))
    except InputError as exc:
        fail(str(exc))
    except BrokenProcessPool:
        fail("a worker process died (out of memory?); rerun the same command to resume")
    except KeyboardInterrupt:
        fail("interrupted; rerun the same command to resume", 130)
    except OSError as exc:
        fail(f"{exc.filename or 'I/O'}: {exc.strerror or exc}")
    except Exception as exc:
        if not type(exc).__module__.startswith(("botocore", "boto3", "s3transfer")):
            raise
        fail(f"S3: {' '.join(str(exc).split())}")
    splits = ", ".join(
        f"{name} {s['records']} records in {s['shards']} shards"
        for name, s in manifest["splits"].items()
    )
    print(f"wrote {splits}; {len(manifest['skipped'])} images skipped", file=sys.stderr)


if __name__ == "__main__":
    main()
