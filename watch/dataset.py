"""`horovod-fleet dataset index s3://BUCKET/PREFIX/`: the manifest.json of TFRecords you made
yourself (TensorFlow's build_imagenet_data.py, your own pipeline), so that TrainStack's dataset
check and the nodes take them as they take the converter's (docs/contracts.md, manifest.json).

Every shard directly under the prefix whose name matches a split's pattern (`train-*`,
`validation-*`, or --train/--validation) is read whole, in parallel: each record's framing and
both CRCs, its tf.train.Example (watch/tfrecords.py), the standard schema's keys
(`image/encoded`, `image/class/label`) and its label. The manifest records each shard's records,
bytes, sha256 and ETag, the splits' totals, the label base and class count, and the label map when
every record names its synset (`image/class/synset`). Anything wrong ends in one line naming the
file, and no manifest is written.

Why a sha256 and an ETag, and no object metadata. The nodes check each shard they download
against the manifest's sha256 on their own disk (bootstrap/node/data_pull.py), so the index must
read every byte once: it reads them anyway, to count records and check labels. The check in S3
before a run (verify_s3_dataset) compares each shard's size and ETag in one listing with the
manifest's. ETag: "The entity tag is a hash of the object. The ETag reflects changes only to the
contents of an object, not its metadata" (https://docs.aws.amazon.com/AmazonS3/latest/API/API_Object.html),
so a shard replaced after the index fails that check. The converter's shards carry their sha256
as object metadata instead, which only an upload (or a copy of every object: a new version of
150 GB in a versioned bucket, and write access to the user's data) can set. S3's own checksums
cannot stand in for the sha256: an object uploaded without one gets CRC64NVME, and a multipart
upload's SHA-256 is "a calculation based on the checksum values of each individual part", not
the file's (https://docs.aws.amazon.com/AmazonS3/latest/API/API_Checksum.html,
https://docs.aws.amazon.com/AmazonS3/latest/userguide/checking-object-integrity.html).
Tested by: .venv/bin/python -m pytest tests/watch/test_dataset_index.py
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime, timezone

from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from contract.runs import stamp
from watch.aws import WatchError
from watch.progress import Progress
from watch.tfrecords import CRC_IS_FAST, ExampleError, RecordError, parse_example, records

# manifest.json (docs/contracts.md): the converter's format; an index says so in `source`.
MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "horovod-fleet/imagenet-tfrecords/1"
SOURCE = "horovod-fleet dataset index"
SPLITS = ("train", "validation")  # what the trainer reads (trainer/data.py SPLITS)
DEFAULT_PATTERNS = {"train": "train-*", "validation": "validation-*"}
IMAGE_KEY, LABEL_KEY, SYNSET_KEY = "image/encoded", "image/class/label", "image/class/synset"
# A JPEG's start of image, then a marker: trainer/data.py decodes with decode_and_crop_jpeg.
JPEG_START = b"\xff\xd8\xff"
CHUNK = 1 << 20
READ_ATTEMPTS = 3  # a connection cut mid-shard reads the shard again from its start
# Long reads of large shards: retried requests, and time for a slow link.
INDEX_CLIENT = Config(
    connect_timeout=10, read_timeout=60, retries={"max_attempts": 5, "mode": "standard"}
)


@dataclass(frozen=True)
class Request:
    """One index: where, which names are which split, and the labels the user vouches for."""

    bucket: str
    prefix: str  # "" or ending in "/"
    patterns: dict[str, str]
    num_classes: int | None = None
    label_base: int | None = None
    workers: int = 16
    replace: bool = False

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


def parse_url(url: str) -> tuple[str, str]:
    """(bucket, prefix) of s3://BUCKET[/PREFIX[/]]; the prefix ends in "/" unless empty."""
    if not url.startswith("s3://") or not url[5:].split("/", 1)[0]:
        raise WatchError(f"expected s3://BUCKET/PREFIX/, got {url!r}")
    bucket, _, prefix = url[5:].partition("/")
    return bucket, (prefix.rstrip("/") + "/") if prefix.strip("/") else ""


@dataclass(frozen=True)
class Shard:
    name: str
    split: str
    size: int


@dataclass
class ShardIndex:
    """What one shard holds: the manifest's entry, and its labels as far as the checks need."""

    name: str
    split: str
    records: int = 0
    bytes: int = 0
    sha256: str = ""
    etag: str = ""
    lowest: tuple[int, int] | None = None  # (label, record index)
    highest: tuple[int, int] | None = None
    labels: set[int] = field(default_factory=set)
    synsets: set[tuple[int, str]] = field(default_factory=set)
    unnamed: int = 0  # records without a synset

    def entry(self) -> dict:
        keys = ("records", "bytes", "sha256", "etag")
        return {"file": self.name, "split": self.split, **{k: getattr(self, k) for k in keys}}


class Cancelled(Exception):
    """Another shard failed: this one stops reading."""


def shards_to_index(s3, request: Request, say: Callable[[str], None]) -> list[Shard]:
    """The shards under the prefix by split, or one line saying why there are none to index.
    Objects in folders below the prefix are not the fleet's: it reads the prefix's own files."""
    listed, nested = {}, 0
    for page in s3.get_paginator("list_objects_v2").paginate(
        Bucket=request.bucket, Prefix=request.prefix
    ):
        for item in page.get("Contents", []):
            name = item["Key"][len(request.prefix) :]
            if "/" in name:
                nested += 1
            elif name and name != MANIFEST_NAME:
                listed[name] = item["Size"]
    shards, ignored = [], []
    for name, size in sorted(listed.items()):
        splits = [
            s for s, pattern in request.patterns.items() if fnmatch.fnmatchcase(name, pattern)
        ]
        if len(splits) > 1:
            raise WatchError(f"{name} matches both {' and '.join(splits)}: narrow the patterns")
        if splits:
            shards.append(Shard(name, splits[0], size))
        else:
            ignored.append(name)
    patterns = " or ".join(f"{p!r}" for p in request.patterns.values())
    below = f"; {nested} objects are in folders below it" if nested else ""
    if not shards:
        raise WatchError(
            f"no TFRecords under {request.url}: no object there is named {patterns}{below} "
            "(name the splits with --train GLOB and --validation GLOB)"
        )
    for split in SPLITS:
        if not any(s.split == split for s in shards):
            raise WatchError(
                f"no {split} shards under {request.url} (none named "
                f"{request.patterns[split]!r}): the trainer needs both splits; name them with "
                f"--{split} GLOB"
            )
    if ignored:
        more = f" and {len(ignored) - 3} more" if len(ignored) > 3 else ""
        say(f"ignoring {len(ignored)} objects of no split: {', '.join(ignored[:3])}{more}")
    return shards


def check_existing_manifest(s3, request: Request) -> None:
    """A manifest the converter wrote (it also lists the images it skipped) is replaced only on
    --replace; one an index wrote is simply written again."""
    try:
        body = s3.get_object(Bucket=request.bucket, Key=request.prefix + MANIFEST_NAME)["Body"]
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
            return
        raise
    try:
        source = json.loads(body.read()).get("source")
    except (ValueError, AttributeError):
        source = None
    if source != SOURCE and not request.replace:
        raise WatchError(
            f"{request.url}{MANIFEST_NAME} exists and was not written by an index (the "
            "converter's lists the images it skipped): pass --replace to write a new one"
        )


class _Reader:
    """A shard's bytes in exact reads, hashed and counted as they arrive; it stops when told."""

    def __init__(self, body, on_chunk: Callable[[int], None], stop: threading.Event):
        self._body, self._on_chunk, self._stop = body, on_chunk, stop
        self._buffer, self._position = b"", 0
        self.digest, self.bytes = hashlib.sha256(), 0

    def read(self, count: int) -> bytes:
        while len(self._buffer) - self._position < count:
            if self._stop.is_set():
                raise Cancelled
            chunk = self._body.read(max(CHUNK, count))
            if not chunk:
                break
            self.digest.update(chunk)
            self.bytes += len(chunk)
            self._on_chunk(len(chunk))
            self._buffer = self._buffer[self._position :] + chunk
            self._position = 0
        data = self._buffer[self._position : self._position + count]
        self._position += len(data)
        return data


def _schema_problem(shard: str, index: int, features: dict) -> str | None:
    image, label = features.get(IMAGE_KEY), features.get(LABEL_KEY)
    has_image = image and image.kind == "bytes_list" and image.count == 1
    if has_image and label and label.kind == "int64_list" and label.count == 1:
        if image.head.startswith(JPEG_START):
            return None
        return (
            f"{shard}: record {index}'s {IMAGE_KEY} is not a JPEG (it starts "
            f"{image.head[:4].hex(' ') or 'empty'}{_format_of(image.head)}): the trainer decodes "
            "JPEG only, as build_imagenet_data.py writes every image"
        )
    names = ", ".join(sorted(features)[:8]) or "none"
    tfds = " (TFDS's schema)" if {"image", "label"} <= set(features) else ""
    return (
        f"{shard}: record {index} is not in the standard schema: it needs one {IMAGE_KEY} "
        f"(bytes) and one {LABEL_KEY} (int64); its features are {names}{tfds}"
    )


def _format_of(head: bytes) -> str:
    known = {b"\x89PNG": "PNG", b"GIF8": "GIF", b"RIFF": "WebP?", b"BM": "BMP"}
    return next((f", {name}" for start, name in known.items() if head.startswith(start)), "")


def read_shard(s3, request: Request, shard: Shard, progress: Progress, stop) -> ShardIndex:
    """Read one shard whole; WatchError naming it when it is not an intact standard-schema
    TFRecord file. A read cut by the network starts again, its progress taken back."""
    for attempt in range(1, READ_ATTEMPTS + 1):
        try:
            response = s3.get_object(Bucket=request.bucket, Key=request.prefix + shard.name)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            raise WatchError(f"{shard.name}: S3 refused to read it: {code}") from None
        reader = _Reader(response["Body"], progress.advance, stop)
        try:
            found = _index_records(shard, reader)
        except (BotoCoreError, OSError):
            progress.advance(-reader.bytes)
            if attempt == READ_ATTEMPTS:
                raise
            continue
        finally:
            response["Body"].close()
        found.bytes, found.sha256 = reader.bytes, reader.digest.hexdigest()
        found.etag = response.get("ETag", "").strip('"')
        progress.shard_done()
        return found
    raise AssertionError("unreachable")


def _index_records(shard: Shard, reader: _Reader) -> ShardIndex:
    found = ShardIndex(shard.name, shard.split)
    try:
        for index, data in enumerate(records(reader.read)):
            features = parse_example(data, frozenset({SYNSET_KEY}))
            if problem := _schema_problem(shard.name, index, features):
                raise WatchError(problem)
            _note_label(found, index, features)
    except RecordError as exc:
        raise WatchError(f"{shard.name}: does not parse as TFRecords: {exc}") from None
    except ExampleError as exc:
        raise WatchError(
            f"{shard.name}: record {found.records} is not a tf.train.Example: {exc}"
        ) from None
    return found


def _note_label(found: ShardIndex, index: int, features: dict) -> None:
    label = features[LABEL_KEY].values[0]
    found.records += 1
    found.labels.add(label)
    if found.lowest is None or label < found.lowest[0]:
        found.lowest = (label, index)
    if found.highest is None or label > found.highest[0]:
        found.highest = (label, index)
    synset = features.get(SYNSET_KEY)
    if synset and synset.kind == "bytes_list" and synset.count == 1:
        found.synsets.add((label, synset.values[0].decode(errors="replace")))
    else:
        found.unnamed += 1


def read_all(s3, request: Request, shards: list[Shard], progress: Progress) -> list[ShardIndex]:
    """Every shard, `request.workers` at a time; the first failure stops the others."""
    stop = threading.Event()
    with ThreadPoolExecutor(min(request.workers, len(shards))) as pool:
        futures = [pool.submit(read_shard, s3, request, s, progress, stop) for s in shards]
        try:
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            failed = [f.exception() for f in futures if f in done and f.exception()]
            if failed:
                raise next((e for e in failed if not isinstance(e, Cancelled)), failed[0])
        except BaseException:  # a refusal, or Ctrl-C: the other reads stop at their next chunk
            stop.set()
            for future in futures:
                future.cancel()
            raise
    return [future.result() for future in futures]


@dataclass(frozen=True)
class Labels:
    base: int
    num_classes: int
    lowest: int
    highest: int
    label_map: dict[str, int] | None
    note: str  # why there is no label map, or ""


def resolve_labels(request: Request, found: list[ShardIndex]) -> Labels:
    """The label base and class count (the flags, else what the labels show: base 0 when a
    label 0 is there, else 1, the standard schema's, where 0 is the unused background class),
    every label checked against them; the label map when every record names its synset and each
    synset is one label."""
    lowest = min((s.lowest for s in found if s.lowest), default=None)
    highest = max((s.highest for s in found if s.highest), default=None)
    if lowest is None or highest is None:
        raise WatchError(f"the shards under {request.url} hold no records")
    base = request.label_base if request.label_base is not None else int(lowest[0] != 0)
    classes = request.num_classes or highest[0] - base + 1
    top = base + classes - 1
    for shard in found:
        if shard.lowest and shard.lowest[0] < base:
            label, index = shard.lowest
            raise WatchError(
                f"{shard.name}: record {index} has label {label}, below the label base {base} "
                "(the trainer's labels start at 0 or 1: --label-base)"
            )
        if shard.highest and shard.highest[0] > top:
            label, index = shard.highest
            raise WatchError(
                f"{shard.name}: record {index} has label {label}, above {top}, the last of "
                f"{classes} classes from base {base} (--num-classes)"
            )
    if classes < 2:
        raise WatchError(
            f"every label under {request.url} is {highest[0]}: a classifier needs 2 classes or more"
        )
    label_map, note = _label_map(found, base, classes)
    return Labels(base, classes, lowest[0], highest[0], label_map, note)


def _label_map(found: list[ShardIndex], base: int, classes: int) -> tuple[dict | None, str]:
    if any(s.unnamed for s in found):
        return None, f"no label_map: some records have no {SYNSET_KEY}"
    pairs = set().union(*(s.synsets for s in found))
    by_synset: dict[str, set[int]] = {}
    for label, synset in pairs:
        by_synset.setdefault(synset, set()).add(label)
    for synset, labels in sorted(by_synset.items()):
        if len(labels) > 1:
            shown = " and ".join(str(x) for x in sorted(labels)[:2])
            return None, f"no label_map: {SYNSET_KEY} {synset} has labels {shown}"
    if len(by_synset) != classes or len({label for label, _ in pairs}) != classes:
        return None, f"no label_map: {len(by_synset)} synsets name {classes} classes"
    return {s: labels.pop() for s, labels in sorted(by_synset.items())}, ""


def build_manifest(request: Request, found: list[ShardIndex], labels: Labels) -> dict:
    """manifest.json (docs/contracts.md), shards in split then name order."""
    ordered = sorted(found, key=lambda s: (SPLITS.index(s.split), s.name))
    manifest = {
        "format": MANIFEST_FORMAT,
        "source": SOURCE,
        "num_classes": labels.num_classes,
        "label_base": labels.base,
        "labels": {"lowest": labels.lowest, "highest": labels.highest},
        "splits": {
            split: {
                "shards": sum(1 for s in ordered if s.split == split),
                "records": sum(s.records for s in ordered if s.split == split),
            }
            for split in SPLITS
        },
        "shards": [s.entry() for s in ordered],
        "created_at": stamp(datetime.now(timezone.utc)),
    }
    if labels.label_map:
        manifest["label_map"] = labels.label_map
    return manifest


def index(s3, request: Request, progress_stream, say: Callable[[str], None]) -> dict:
    """Read the prefix's shards and write its manifest.json; the manifest. Every check is done
    before the one write, so a refusal leaves the prefix as it was."""
    shards = shards_to_index(s3, request, say)
    check_existing_manifest(s3, request)
    if not CRC_IS_FAST:
        say(
            "google-crc32c's C code is not installed: the CRCs are checked in plain Python, "
            "about 2 MB/s (make setup installs it; or pip install google-crc32c)"
        )
    progress = Progress(sum(s.size for s in shards), len(shards), progress_stream)
    try:
        found = read_all(s3, request, shards, progress)
    except BaseException:
        progress.abandon()
        raise
    progress.finish()
    for split in SPLITS:
        if not sum(s.records for s in found if s.split == split):
            raise WatchError(f"the {split} shards under {request.url} hold no records")
    labels = resolve_labels(request, found)
    trained = set().union(*(s.labels for s in found if s.split == "train"))
    if missing := labels.num_classes - len(trained):
        say(f"{missing} of the {labels.num_classes} classes have no train record")
    if labels.note:
        say(labels.note)
    manifest = build_manifest(request, found, labels)
    s3.put_object(
        Bucket=request.bucket,
        Key=request.prefix + MANIFEST_NAME,
        Body=json.dumps(manifest, indent=1).encode(),
        ContentType="application/json",
    )
    return manifest


def summary(request: Request, manifest: dict) -> str:
    """What was written, in one line."""
    splits = ", ".join(
        f"{split} {t['records']} records in {t['shards']} shards"
        for split, t in manifest["splits"].items()
    )
    labels = manifest["labels"]
    named = f", {len(manifest['label_map'])} synsets" if "label_map" in manifest else ""
    return (
        f"wrote {request.url}{MANIFEST_NAME}: {splits}; labels {labels['lowest']}.."
        f"{labels['highest']}, label base {manifest['label_base']}, "
        f"{manifest['num_classes']} classes{named}"
    )
