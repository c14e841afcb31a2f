"""tf.data input pipelines over standard-schema ImageNet TFRecords (train-*, validation-*).

Images leave the pipeline as uint8 (4x less host-to-device traffic than float32); the model's
first layer casts and normalises them on the accelerator. Labels leave 0-based as int32.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

import tensorflow as tf

DEFAULT_NUM_CLASSES = 1000
DEFAULT_LABEL_BASE = 1
# Eval resizes the centre crop covering this fraction of the short side (224 of 256).
EVAL_CENTRAL_FRACTION = 0.875
_FEATURES = {
    "image/encoded": tf.io.FixedLenFeature([], tf.string),
    "image/class/label": tf.io.FixedLenFeature([], tf.int64),
}
_LABEL_ERROR = re.compile(r"(label -?\d+ outside \d+\.\.\d+ in [^\]\n]+)")
SPLITS = ("train", "validation")
# A rank waiting for its shard files says which every this many seconds, and looks every second.
WAIT_REPORT_EVERY_S = 30
WAIT_POLL_S = 1.0
# Batches made ahead of the step on the host (the device copy keeps 2 more, to_device): enough to
# ride out a slow batch; each is a batch_size x S x S x 3 uint8 tensor (38 MB at 256 x 224).
PREFETCH_BATCHES = 4


class DataError(ValueError):
    """Bad input data (missing shards, corrupt record, bad label); one `error: ...` line."""


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    num_classes: int
    label_base: int
    train_files: list[str]
    validation_files: list[str]
    train_records: int | None  # from manifest.json; None means count the shards
    validation_records: int | None


@dataclasses.dataclass(frozen=True)
class Manifest:
    """The manifest.json fields the trainer uses (docs/contracts.md); None: not in the file."""

    num_classes: int | None = None
    label_base: int | None = None
    train_records: int | None = None
    validation_records: int | None = None
    # The shard file names of each split, from its `shards` list: what the directory will hold
    # once the node's pull ends, whatever is on disk yet. None: the manifest lists none.
    shard_files: dict[str, list[str]] | None = None


def read_manifest(data_dir: Path) -> Manifest:
    """Read and check data_dir/manifest.json once, so that no bad value reaches the model."""
    path = data_dir / "manifest.json"
    if not path.exists():
        return Manifest()
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DataError(f"unreadable manifest {path}: {exc}") from None
    manifest = Manifest(
        num_classes=_manifest_int(path, document, "num_classes", 2),
        label_base=_manifest_int(path, document, "label_base", 0, 1),
        train_records=_manifest_int(path, document, "splits.train.records", 1),
        validation_records=_manifest_int(path, document, "splits.validation.records", 1),
    )
    if "label_map" in document:
        _check_label_map(path, document["label_map"], manifest)
    if "shards" in document:
        manifest = dataclasses.replace(manifest, shard_files=_shard_files(path, document["shards"]))
    return manifest


def _shard_files(path: Path, shards) -> dict[str, list[str]]:
    """Each split's file names, sorted; a malformed entry is named."""
    names: dict[str, list[str]] = {split: [] for split in SPLITS}
    for index, entry in enumerate(shards if isinstance(shards, list) else [None]):
        file = entry.get("file") if isinstance(entry, dict) else None
        split = entry.get("split") if isinstance(entry, dict) else None
        if not isinstance(file, str) or not file or "/" in file or split not in SPLITS:
            raise DataError(
                f"manifest {path}: shards[{index}] must be an object with a plain file name and "
                f"a split of {' or '.join(SPLITS)}, got {_shown(entry)}"
            )
        names[split].append(file)
    return {split: sorted(files) for split, files in names.items()}


def _check_label_map(path: Path, label_map, manifest: Manifest) -> None:
    """num_classes and the labels must agree with the synset map the preprocessor wrote: 1000
    classes over a map of 10 synsets would train a 1000-way model on 10 classes, exit 0."""
    if not isinstance(label_map, dict) or not label_map:
        raise DataError(
            f"manifest {path}: label_map must be a non-empty JSON object, got {_shown(label_map)}"
        )
    base = _first_given(manifest.label_base, DEFAULT_LABEL_BASE)
    classes = manifest.num_classes or len(label_map)
    if classes != len(label_map):
        raise DataError(
            f"manifest {path}: num_classes {classes} disagrees with label_map, which maps "
            f"{len(label_map)} synsets; they must be equal"
        )
    for synset, label in label_map.items():
        if type(label) is not int or not base <= label < base + classes:
            raise DataError(
                f"manifest {path}: label_map gives {synset} label {_shown(label)}, outside "
                f"{base}..{base + classes - 1} (label_base {base}, num_classes {classes})"
            )


def _manifest_int(
    path: Path, document, field: str, lowest: int, highest: int | None = None
) -> int | None:
    """The integer at dotted `field`, None when absent; DataError naming it when malformed."""
    keys = field.split(".")
    value = document
    for depth, key in enumerate(keys):
        if not isinstance(value, dict):
            where = ".".join(keys[:depth]) or "the top level"
            raise DataError(f"manifest {path}: {where} must be a JSON object, got {_shown(value)}")
        if key not in value:
            return None
        value = value[key]
    allowed = f"an integer >= {lowest}" if highest is None else f"{lowest} or {highest}"
    # bool is an int subclass in Python, but `true` is not a count in JSON.
    if type(value) is not int or value < lowest or (highest is not None and value > highest):
        raise DataError(f"manifest {path}: {field} must be {allowed}, got {_shown(value)}")
    return value


def _shown(value) -> str:
    """A JSON value as the user wrote it, cut short so the error stays one readable line."""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def list_shards(data_dir: Path, split: str) -> list[str]:
    if not data_dir.exists():
        raise DataError(f"data directory {data_dir} does not exist")
    if not data_dir.is_dir():
        raise DataError(f"data directory {data_dir} is not a directory")
    files = sorted(str(p) for p in data_dir.glob(f"{split}-*") if p.is_file())
    if not files:
        raise DataError(f"no {split}-* TFRecord shards in {data_dir}")
    return files


def listed_shards(data_dir: Path, shard_files: dict[str, list[str]], split: str) -> list[str]:
    if not shard_files[split]:
        raise DataError(f"manifest {data_dir / 'manifest.json'} lists no {split} shards")
    return [str(data_dir / file) for file in shard_files[split]]


def wait_for_files(
    files: list[str],
    wait_s: float,
    say: Callable[[str], None],
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Return once every file is on disk; say which are missing at once and every
    WAIT_REPORT_EVERY_S; DataError naming them after wait_s. A file under its own name is whole:
    the node renames each shard into place once verified (docs/contracts.md)."""
    began = clock()
    report_at = began
    while missing := [file for file in files if not Path(file).exists()]:
        waited = clock() - began
        if waited >= wait_s:
            raise DataError(
                f"{_count(missing, 'shard file')} of this rank not on disk after --data-wait-s "
                f"{wait_s:g}: {_some(missing)}"
            )
        if clock() >= report_at:
            what = _count(missing, "shard file")
            say(f"waiting for {what} ({waited:.0f} of {wait_s:g} s): {_some(missing)}")
            report_at += WAIT_REPORT_EVERY_S
        sleep(min(WAIT_POLL_S, max(wait_s - waited, 0.0)))


def _count(items: list, noun: str) -> str:
    return f"{len(items)} {noun}{'s' if len(items) != 1 else ''}"


def _some(files: list[str], shown: int = 3) -> str:
    """The first file names, and how many more: one line however many are missing."""
    names = ", ".join(files[:shown])
    return names + (f" and {len(files) - shown} more" if len(files) > shown else "")


def require_records(files: list[str], what: str) -> None:
    """Fail when every file is empty: an endlessly repeated empty dataset never yields a batch.

    Checked by size, which is instant: every TFRecord record takes at least 16 bytes, and a
    non-empty file without a whole record fails with a read error instead of hanging.
    """
    if all(Path(file).stat().st_size == 0 for file in files):
        raise DataError(f"{what} hold no records (every file is empty)")


def resolve_dataset(data_dir: Path, num_classes: int | None, label_base: int | None) -> DatasetInfo:
    """Shards plus class count and label base: flags override manifest.json, then defaults.

    The shards are the ones manifest.json lists when it lists them (a node may still be pulling
    some: each rank waits for its own, wait_for_files), else the ones on disk."""
    manifest = read_manifest(data_dir)
    if manifest.shard_files is not None:
        train_files = listed_shards(data_dir, manifest.shard_files, "train")
        validation_files = listed_shards(data_dir, manifest.shard_files, "validation")
    else:
        train_files = list_shards(data_dir, "train")
        validation_files = list_shards(data_dir, "validation")
        require_records(train_files, f"the train-* shards in {data_dir}")
        # An empty validation split would not hang, but would report top-1 0.0 on 0 images.
        require_records(validation_files, f"the validation-* shards in {data_dir}")
    return DatasetInfo(
        num_classes=_first_given(num_classes, manifest.num_classes, DEFAULT_NUM_CLASSES),
        label_base=_first_given(label_base, manifest.label_base, DEFAULT_LABEL_BASE),
        train_files=train_files,
        validation_files=validation_files,
        train_records=manifest.train_records,
        validation_records=manifest.validation_records,
    )


def _first_given(*values: int | None) -> int:
    """The first value that is not None (0 is a valid label base, so `or` will not do)."""
    return next(value for value in values if value is not None)


@dataclasses.dataclass(frozen=True)
class RankShard:
    """What one rank reads of a split: `files`, keeping every `ways`-th record from `index`."""

    files: list[str]
    ways: int = 1
    index: int = 0


def shard_for_rank(files: list[str], rank: int, size: int) -> RankShard:
    """Every record goes to exactly one rank, for any number of ranks and of files.

    With at least one file per rank, ranks read disjoint sets of whole files. With fewer files
    than ranks (2 validation shards for 3 ranks, 128 for 512), the ranks rank, rank + F,
    rank + 2F, ... share file rank % F record by record, so no rank is left without data and
    evaluation still counts each image once.
    """
    if len(files) >= size:
        return RankShard(files[rank::size])
    count = len(files)
    file_index = rank % count
    return RankShard([files[file_index]], len(range(file_index, size, count)), rank // count)


def count_shard_records(shard: RankShard) -> int:
    """The records this rank gets of its files (its share when ranks split a file)."""
    total = count_records(shard.files)
    return total // shard.ways + (shard.index < total % shard.ways)


def count_records(files: list[str]) -> int:
    total = 0
    for file in files:
        try:
            total += int(tf.data.TFRecordDataset(file).reduce(0, lambda n, _: n + 1))
        except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as exc:
            raise DataError(f"corrupt or truncated record in {file}: {exc.message}") from None
    return total


def _parse(serialized, filename, num_classes: int, label_base: int):
    features = tf.io.parse_single_example(serialized, _FEATURES)
    raw_label = features["image/class/label"]
    label = raw_label - label_base
    in_range = tf.logical_and(label >= 0, label < num_classes)
    message = tf.strings.format(
        "label {} outside {}..{} in {}",
        (raw_label, label_base, label_base + num_classes - 1, filename),
    )
    with tf.control_dependencies([tf.debugging.Assert(in_range, [message])]):
        label = tf.cast(label, tf.int32)
    return features["image/encoded"], label


def _train_image(image_bytes, image_size: int, min_crop_area: float):
    """Fused decode + random crop: only the sampled window of the JPEG is decoded."""
    shape = tf.image.extract_jpeg_shape(image_bytes)
    begin, size, _ = tf.image.sample_distorted_bounding_box(
        shape,
        bounding_boxes=tf.zeros([1, 0, 4]),
        min_object_covered=0.1,
        aspect_ratio_range=(3 / 4, 4 / 3),
        area_range=(min_crop_area, 1.0),
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    window = tf.stack([begin[0], begin[1], size[0], size[1]])
    image = tf.image.decode_and_crop_jpeg(
        image_bytes, window, channels=3, dct_method="INTEGER_FAST"
    )
    image = tf.image.random_flip_left_right(image)
    image = tf.image.resize(image, [image_size, image_size], method="bilinear")
    return tf.cast(image, tf.uint8)


def _eval_image(image_bytes, image_size: int):
    """Fused decode + centre crop of EVAL_CENTRAL_FRACTION of the short side, then resize."""
    shape = tf.image.extract_jpeg_shape(image_bytes)
    height, width = shape[0], shape[1]
    side = tf.cast(EVAL_CENTRAL_FRACTION * tf.cast(tf.minimum(height, width), tf.float32), tf.int32)
    window = tf.stack([(height - side + 1) // 2, (width - side + 1) // 2, side, side])
    image = tf.image.decode_and_crop_jpeg(image_bytes, window, channels=3)
    image = tf.image.resize(image, [image_size, image_size], method="bilinear")
    return tf.cast(image, tf.uint8)


def _records_with_filename(filename, ways: int = 1, index: int = 0):
    records = tf.data.TFRecordDataset(filename, buffer_size=8 << 20)
    if ways > 1:
        records = records.shard(ways, index)
    return records.map(lambda record: (record, filename))


def train_dataset(
    files: list[str],
    *,
    batch_size: int,
    image_size: int,
    num_classes: int,
    label_base: int,
    shuffle_buffer: int,
    min_crop_area: float = 0.08,
    seed: int | None = None,
    threads: int | None = None,
    ways: int = 1,
    index: int = 0,
    device: str | None = None,
) -> tf.data.Dataset:
    """Endless shuffled batches (uint8 images [B, S, S, 3], int32 0-based labels [B]).

    threads: this rank's share of the node's cores (a private pool), so that the ranks on one
    node do not each size their parallelism for the whole machine; None: TensorFlow's pool.
    ways, index: keep every `ways`-th record of each file from `index` (a RankShard's split).
    device: copy batches ahead to this device (the rank's GPU), off the training step.
    """

    def preprocess(record, filename):
        image_bytes, label = _parse(record, filename, num_classes, label_base)
        return _train_image(image_bytes, image_size, min_crop_area), label

    dataset = tf.data.Dataset.from_tensor_slices(files)
    dataset = dataset.shuffle(len(files), seed=seed, reshuffle_each_iteration=True).repeat()
    cycle = min(len(files), 16)
    dataset = dataset.interleave(
        lambda filename: _records_with_filename(filename, ways, index),
        cycle_length=cycle,
        num_parallel_calls=cycle,
        deterministic=False,
    )
    dataset = dataset.shuffle(shuffle_buffer, seed=seed)
    dataset = dataset.map(preprocess, num_parallel_calls=_calls(threads), deterministic=False)
    dataset = dataset.batch(batch_size, drop_remainder=True).prefetch(PREFETCH_BATCHES)
    return to_device(dataset.with_options(pipeline_options(threads)), device)


def eval_dataset(
    files: list[str],
    *,
    batch_size: int,
    image_size: int,
    num_classes: int,
    label_base: int,
    threads: int | None = None,
    ways: int = 1,
    index: int = 0,
    device: str | None = None,
) -> tf.data.Dataset:
    """One pass over every record of `files` (this rank's share of them), last batch partial."""

    def preprocess(record, filename):
        image_bytes, label = _parse(record, filename, num_classes, label_base)
        return _eval_image(image_bytes, image_size), label

    cycle = min(len(files), 8)
    dataset = tf.data.Dataset.from_tensor_slices(files).interleave(
        lambda filename: _records_with_filename(filename, ways, index),
        cycle_length=cycle,
        num_parallel_calls=cycle,
        deterministic=False,
    )
    dataset = dataset.map(preprocess, num_parallel_calls=_calls(threads), deterministic=False)
    dataset = dataset.batch(batch_size).prefetch(PREFETCH_BATCHES)
    return to_device(dataset.with_options(pipeline_options(threads)), device)


def to_device(dataset: tf.data.Dataset, device: str | None) -> tf.data.Dataset:
    """Copy batches to the device ahead of the step that needs them (it must come last)."""
    if device is None:
        return dataset
    copied = dataset.apply(tf.data.experimental.prefetch_to_device(device, buffer_size=2))
    # The copy is a pipeline of its own (a generator on the device over the input's iterator):
    # without the input's options its iterator would autotune again (pipeline_options: why not).
    return copied.with_options(dataset.options())


def _calls(threads: int | None) -> int:
    """A map's parallel calls: one per thread of this rank's pool (None: of the machine)."""
    return threads or len(os.sched_getaffinity(0))


def pipeline_options(threads: int | None) -> tf.data.Options:
    """No autotuning: its thread (TF 2.15) sleeps out an optimization period that doubles up to
    60 s, and deleting the iterator may wait for that sleep to end: 25 to 45 s on one rank at a
    run's end while the others waited in a collective (docs/trainer.md, "The input pipeline").
    The parallelism is set instead, a call per thread of the pool."""
    options = tf.data.Options()
    if threads:
        options.threading.private_threadpool_size = threads
    options.autotune.enabled = False
    options.deterministic = False
    options.experimental_optimization.map_parallelization = True
    return options


def synthetic_batch(batch_size: int, image_size: int, num_classes: int):
    """One random batch created on the default device (the GPU when there is one)."""
    images = tf.random.uniform([batch_size, image_size, image_size, 3], maxval=256, dtype=tf.int32)
    labels = tf.random.uniform([batch_size], maxval=num_classes, dtype=tf.int32)
    return tf.cast(images, tf.uint8), labels


def describe_input_error(exc: tf.errors.OpError, files: list[str], image_size: int) -> str:
    """Turn a pipeline failure into one line naming the value and the file.

    A label error carries its own text; anything else (CRC, truncation, undecodable JPEG) is
    found by re-reading this rank's files one at a time: slow, but only on the way out.
    """
    label_error = _LABEL_ERROR.search(exc.message)
    if label_error:
        return label_error.group(1).replace('\\"', "").replace('"', "")
    for file in files:
        dataset = tf.data.TFRecordDataset(file).map(
            lambda record: _eval_image(
                tf.io.parse_single_example(record, _FEATURES)["image/encoded"], image_size
            ),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
        try:
            dataset.reduce(0, lambda n, _: n + 1)
        except tf.errors.OpError as file_exc:
            first_line = file_exc.message.strip().splitlines()[0]
            return f"corrupt or truncated record in {file}: {first_line}"
    first_line = exc.message.strip().splitlines()[0]
    return f"input pipeline failed on {', '.join(files)}: {first_line}"
