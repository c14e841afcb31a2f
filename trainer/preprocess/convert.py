"""The conversion itself: both splits' blocks through a worker pool into shards, then the manifest.

Each split's input is cut into blocks that own fixed ranges of shards (blocks.py), so a shard
mixes its block's classes and every run assigns each image to the same shard. The main process
streams a block's images to a pool of worker processes (images.py) and writes their records in
order; a block's shards are published whole, each with a sidecar holding its record count and
sha256 (output.py). A restart skips the blocks whose shards all still match their sidecars and
redoes the others. The manifest (docs/contracts.md) is written last.

The workers are spawned, fresh interpreters that import what they run by name: it lives in
images.py, never in __main__.py. A spawned process does not re-import a package's __main__, so
a worker imports images.py and what that needs, nothing else.
Tested by: .venv/bin/python -m pytest tests/trainer/test_preprocess_local.py tests/trainer/test_preprocess_s3.py
"""

import os
import sys
import time
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context

from trainer.preprocess.archives import (
    InputError,
    check_input,
    check_output_bucket,
    s3_client,
)
from trainer.preprocess.blocks import (
    block_fingerprint,
    plan_blocks,
    train_tar_units,
    tree_units,
    val_tar_units,
)
from trainer.preprocess.images import encode_batch, init_worker
from trainer.preprocess.output import (
    LABEL_BASE,
    LocalOutput,
    S3Output,
    ShardWriter,
    build_manifest,
)

BATCH_IMAGES = 16  # images per worker task: amortises the inter-process round trip
BATCHES_IN_FLIGHT_PER_WORKER = 4  # keeps workers fed while bounding memory


@dataclass(frozen=True)
class Config:
    """One conversion's settings: a field per flag of `python -m trainer.preprocess`."""

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
        manifest = build_manifest(label_map, splits, config.short_side, config.quality)
        check_records(manifest)
        output.write_manifest(manifest)
    finally:
        output.close()
    return manifest
