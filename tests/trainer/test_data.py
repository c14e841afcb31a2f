"""The tf.data pipelines on tiny standard-schema TFRecords written in tmp_path."""

import json

import numpy as np
import pytest
import tensorflow as tf

from trainer import bench_input, data


def info_for(data_dir, num_classes=4, label_base=None):
    return data.resolve_dataset(data_dir, num_classes, label_base)


def test_train_batches_are_uint8_crops_with_zero_based_labels(tiny_data):
    info = info_for(tiny_data)
    assert info.label_base == 1 and info.train_records is None
    dataset = data.train_dataset(
        info.train_files,
        batch_size=8,
        image_size=32,
        num_classes=4,
        label_base=info.label_base,
        shuffle_buffer=64,
    )
    labels = []
    for images, batch_labels in dataset.take(8):  # repeats: 64 images from 32 records
        assert images.shape == (8, 32, 32, 3) and images.dtype == tf.uint8
        assert batch_labels.shape == (8,) and batch_labels.dtype == tf.int32
        labels += batch_labels.numpy().tolist()
    assert set(labels) == {0, 1, 2, 3}


def test_eval_reads_every_record_once_centre_cropped(tiny_data):
    info = info_for(tiny_data)
    dataset = data.eval_dataset(
        info.validation_files, batch_size=3, image_size=24, num_classes=4, label_base=1
    )
    batches = list(dataset)
    assert [int(labels.shape[0]) for _, labels in batches] == [3, 3, 2]
    labels = np.concatenate([labels.numpy() for _, labels in batches])
    assert sorted(labels.tolist()) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert all(images.shape[1:] == (24, 24, 3) for images, _ in batches)


def pipeline_stages(dataset: tf.data.Dataset) -> list[tuple[str, dict[str, int]]]:
    """Each stage of `dataset`, outermost first, with its parallelism and buffer settings."""
    stages = []
    while dataset is not None:
        names = ("_num_parallel_calls", "_buffer_size", "_cycle_length")
        knobs = {name: int(getattr(dataset, name)) for name in names if hasattr(dataset, name)}
        stages.append((type(dataset).__name__, knobs))
        dataset = getattr(dataset, "_input_dataset", None)
    return stages


@pytest.mark.parametrize(
    ("split", "device"), [("train", None), ("eval", None), ("train", "/cpu:0")]
)
def test_pipelines_set_their_parallelism_and_run_no_autotune_thread(tiny_data, split, device):
    """TF 2.15's autotune thread can hold an iterator's deletion for up to 60 s, a rank's last
    seconds or a reset's (docs/trainer.md, "The input pipeline"): off, also in the copy to the
    device, every knob set instead, the map's calls one per thread of the rank's pool."""
    info = info_for(tiny_data)
    common = {"batch_size": 4, "image_size": 16, "num_classes": 4, "label_base": 1, "threads": 3}
    common["device"] = device
    if split == "train":
        dataset = data.train_dataset(info.train_files, shuffle_buffer=8, **common)
    else:
        dataset = data.eval_dataset(info.validation_files, **common)
    options = dataset.options()
    assert options.autotune.enabled is False and options.threading.private_threadpool_size == 3
    stages = pipeline_stages(dataset)
    assert all(value > 0 for _, knobs in stages for value in knobs.values()), stages  # -1: AUTOTUNE
    assert ("_ParallelMapDataset", {"_num_parallel_calls": 3}) in stages
    assert ("_PrefetchDataset", {"_buffer_size": data.PREFETCH_BATCHES}) in stages
    assert len(next(iter(dataset))[1]) == 4


def test_manifest_gives_classes_and_base_and_flags_override(tiny_data):
    manifest = {
        "num_classes": 7,
        "label_base": 0,
        "splits": {"train": {"shards": 2, "records": 32}, "validation": {"records": 8}},
    }
    (tiny_data / "manifest.json").write_text(json.dumps(manifest))
    info = data.resolve_dataset(tiny_data, None, None)
    assert (info.num_classes, info.label_base, info.train_records) == (7, 0, 32)
    info = data.resolve_dataset(tiny_data, 4, 1)
    assert (info.num_classes, info.label_base) == (4, 1)
    (tiny_data / "manifest.json").write_text("{not json")
    with pytest.raises(data.DataError, match="manifest"):
        data.resolve_dataset(tiny_data, None, None)


BAD_MANIFESTS = {
    "top level": ([1, 2], "the top level must be a JSON object, got [1, 2]"),
    "splits": ({"splits": "all"}, 'splits must be a JSON object, got "all"'),
    "one class": ({"num_classes": 1}, "num_classes must be an integer >= 2, got 1"),
    "bool classes": ({"num_classes": True}, "num_classes must be an integer >= 2, got true"),
    "label base": ({"label_base": 5}, "label_base must be 0 or 1, got 5"),
    "null base": ({"label_base": None}, "label_base must be 0 or 1, got null"),
    "validation": (
        {"splits": {"validation": {"records": 2.5}}},
        "splits.validation.records must be an integer >= 1, got 2.5",
    ),
    "map not an object": (
        {"label_map": ["n1"]},
        'label_map must be a non-empty JSON object, got ["n1"]',
    ),
    "zero-based map": (
        {"num_classes": 2, "label_base": 1, "label_map": {"n1": 0, "n2": 1}},
        "label_map gives n1 label 0, outside 1..2 (label_base 1, num_classes 2)",
    ),
    "map label not a number": (
        {"label_map": {"n1": 1, "n2": "2"}},
        'label_map gives n2 label "2", outside 1..2 (label_base 1, num_classes 2)',
    ),
    "long value": (
        {"num_classes": "x" * 60},
        'num_classes must be an integer >= 2, got "' + "x" * 36 + "...",
    ),
}


@pytest.mark.parametrize(("document", "problem"), BAD_MANIFESTS.values(), ids=BAD_MANIFESTS)
def test_manifest_values_are_checked_where_read(tiny_data, document, problem):
    manifest = tiny_data / "manifest.json"
    manifest.write_text(json.dumps(document))
    with pytest.raises(data.DataError) as caught:
        data.resolve_dataset(tiny_data, 4, 1)  # flags given: the manifest is checked all the same
    assert str(caught.value) == f"manifest {manifest}: {problem}"


def test_manifest_label_map_that_agrees_is_accepted(tiny_data):
    document = {"num_classes": 4, "label_base": 0, "label_map": {"a": 0, "b": 1, "c": 2, "d": 3}}
    (tiny_data / "manifest.json").write_text(json.dumps(document))
    assert data.read_manifest(tiny_data).num_classes == 4


def test_manifest_may_leave_fields_out(tiny_data):
    (tiny_data / "manifest.json").write_text(json.dumps({"splits": {"train": {"shards": 2}}}))
    info = data.resolve_dataset(tiny_data, None, None)
    assert (info.num_classes, info.label_base, info.train_records) == (1000, 1, None)


@pytest.mark.parametrize("split", ["train", "validation"])
def test_a_split_of_empty_shards_is_an_error(tiny_data, split):
    for shard in tiny_data.glob(f"{split}-*"):
        shard.write_bytes(b"")
    with pytest.raises(data.DataError) as caught:
        data.resolve_dataset(tiny_data, None, None)
    assert str(caught.value) == (
        f"the {split}-* shards in {tiny_data} hold no records (every file is empty)"
    )


def test_one_empty_shard_among_others_is_fine(tiny_data):
    (tiny_data / "train-00001-of-00002").write_bytes(b"")
    data.require_records(sorted(str(p) for p in tiny_data.glob("train-*")), "train shards")
    with pytest.raises(data.DataError, match=r"^rank 1's shards hold no records"):
        data.require_records([str(tiny_data / "train-00001-of-00002")], "rank 1's shards")


def test_defaults_without_manifest_are_imagenet(tiny_data):
    info = data.resolve_dataset(tiny_data, None, None)
    assert (info.num_classes, info.label_base) == (1000, 1)
    assert [p.rsplit("/", 1)[1] for p in info.train_files] == [
        "train-00000-of-00002",
        "train-00001-of-00002",
    ]


def test_shards_are_split_by_file_between_ranks():
    files = [f"train-{i}" for i in range(5)]
    parts = [data.shard_for_rank(files, rank, 2) for rank in range(2)]
    assert parts == [
        data.RankShard(["train-0", "train-2", "train-4"]),
        data.RankShard(["train-1", "train-3"]),
    ]


@pytest.mark.parametrize(("files", "ranks"), [(2, 3), (1, 2), (3, 8), (128, 512)])
def test_fewer_files_than_ranks_split_files_by_record(files, ranks):
    names = [f"validation-{i}" for i in range(files)]
    shards = [data.shard_for_rank(names, rank, ranks) for rank in range(ranks)]
    # Every (file, record position) belongs to exactly one rank: each image counted once.
    owners = {}
    for rank, shard in enumerate(shards):
        assert len(shard.files) == 1 and 0 <= shard.index < shard.ways
        for record in range(shard.index, 64, shard.ways):
            assert (shard.files[0], record) not in owners
            owners[(shard.files[0], record)] = rank
    assert len(owners) == files * 64


def test_ranks_sharing_a_file_read_each_record_once(tmp_path, write_split, colour_images):
    # 3 ranks over 2 validation shards of 5 records each: the eval sums see all 10, once.
    paths = write_split(tmp_path, "validation", colour_images(10, 20, 20), list(range(1, 11)), 2)
    files = [str(p) for p in paths]
    labels = []
    for rank in range(3):
        shard = data.shard_for_rank(files, rank, 3)
        dataset = data.eval_dataset(
            shard.files, batch_size=4, image_size=16, num_classes=10, label_base=1,
            ways=shard.ways, index=shard.index,
        )  # fmt: skip
        labels += [int(label) for _, batch in dataset for label in batch.numpy()]
        assert data.count_shard_records(shard) == {0: 3, 1: 5, 2: 2}[rank]
    assert sorted(labels) == list(range(10))


def test_batches_can_be_prefetched_to_a_device(tiny_data):
    info = info_for(tiny_data)
    dataset = data.train_dataset(
        info.train_files, batch_size=4, image_size=32, num_classes=4, label_base=1,
        shuffle_buffer=8, device="/cpu:0",
    )  # fmt: skip
    images, labels = next(iter(dataset))
    assert images.shape == (4, 32, 32, 3) and images.device.endswith("CPU:0")
    assert labels.device.endswith("CPU:0")


def test_missing_directory_and_missing_shards(tmp_path):
    with pytest.raises(data.DataError, match="does not exist"):
        data.list_shards(tmp_path / "nowhere", "train")
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(data.DataError, match=r"^data directory .*file is not a directory$"):
        data.list_shards(tmp_path / "file", "train")
    with pytest.raises(data.DataError, match="no train-\\* TFRecord shards"):
        data.list_shards(tmp_path, "train")


def test_label_outside_range_names_value_and_file(tmp_path, write_split, colour_images):
    files = write_split(tmp_path, "train", colour_images(6, 20, 20), [1, 2, 3, 4, 5, 4], 1)
    dataset = data.eval_dataset(
        [str(f) for f in files], batch_size=6, image_size=16, num_classes=4, label_base=1
    )
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        list(dataset)
    message = data.describe_input_error(caught.value, [str(f) for f in files], 16)
    assert message == f"label 5 outside 1..4 in {files[0]}"


def test_zero_based_labels(tmp_path, write_split, colour_images):
    files = write_split(tmp_path, "validation", colour_images(4, 20, 20), [0, 1, 2, 3], 1)
    dataset = data.eval_dataset(
        [str(files[0])], batch_size=4, image_size=16, num_classes=4, label_base=0
    )
    assert sorted(next(iter(dataset))[1].numpy().tolist()) == [0, 1, 2, 3]


def test_truncated_and_corrupt_records_name_the_file(tmp_path, write_split, colour_images):
    files = write_split(tmp_path, "train", colour_images(8, 20, 20), [1] * 8, 2)
    good, bad = str(files[0]), str(files[1])
    raw = files[1].read_bytes()
    files[1].write_bytes(raw[: len(raw) - 100])
    with pytest.raises(data.DataError, match=f"corrupt or truncated record in {bad}"):
        data.count_records([good, bad])
    dataset = data.eval_dataset(
        [good, bad], batch_size=2, image_size=16, num_classes=4, label_base=1
    )
    with pytest.raises(tf.errors.OpError) as caught:
        list(dataset)
    assert data.describe_input_error(caught.value, [good, bad], 16).startswith(
        f"corrupt or truncated record in {bad}"
    )
    # A flipped byte inside a JPEG payload: the record's CRC catches it.
    corrupt = bytearray(raw)
    corrupt[len(raw) // 2] ^= 0xFF
    files[1].write_bytes(bytes(corrupt))
    with pytest.raises(data.DataError, match=f"corrupt or truncated record in {bad}"):
        data.count_records([good, bad])


def test_undecodable_jpeg_names_the_file(tmp_path, write_split, colour_images):
    files = write_split(tmp_path, "train", colour_images(2, 20, 20), [1, 2], 1)
    writer_path = tmp_path / "train-00001-of-00002"
    with tf.io.TFRecordWriter(str(writer_path)) as writer:
        features = {
            "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"not a jpeg"])),
            "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[1])),
        }
        writer.write(
            tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()
        )
    names = [str(files[0]), str(writer_path)]
    dataset = data.eval_dataset(names, batch_size=4, image_size=16, num_classes=4, label_base=1)
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        list(dataset)
    assert data.describe_input_error(caught.value, names, 16).startswith(
        f"corrupt or truncated record in {writer_path}"
    )


def test_bench_input_prints_json_last(tiny_data, capsys):
    args = ["--data-dir", str(tiny_data), "--image-size", "32", "--batch-size", "8"]
    assert bench_input.main([*args, "--seconds", "1", "--warmup", "0.5"]) == 0
    report = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert set(report) == {"images_per_s", "images_per_s_per_core", "cores"}
    assert report["images_per_s"] > 0 and report["cores"] >= 1
    assert report["images_per_s_per_core"] == pytest.approx(
        report["images_per_s"] / report["cores"], rel=0.01
    )


def test_bench_input_without_shards_is_one_error_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        bench_input.main(["--data-dir", str(tmp_path)])
    assert exited.value.code == 2
    assert capsys.readouterr().err == f"error: no train-* TFRecord shards in {tmp_path}\n"


def test_a_manifest_s_shard_list_names_the_files_before_they_are_on_disk(tiny_data):
    """The node pulls its own ranks' shards first: the ranks shard the manifest's list, the
    whole dataset's, not the files on disk yet (docs/contracts.md, "Start-up, resets and
    goodput")."""
    listed = ["train-00000-of-00003", "train-00001-of-00003", "train-00002-of-00003"]
    shards = [{"file": name, "split": "train"} for name in reversed(listed)]
    shards.append({"file": "validation-00000-of-00002", "split": "validation"})
    (tiny_data / "manifest.json").write_text(json.dumps({"shards": shards}))
    info = info_for(tiny_data)
    assert info.train_files == [str(tiny_data / name) for name in listed]  # sorted
    assert info.validation_files == [str(tiny_data / "validation-00000-of-00002")]

    (tiny_data / "manifest.json").write_text(json.dumps({"shards": [{"file": "a/b"}]}))
    with pytest.raises(data.DataError, match=r"shards\[0\] must be an object with a plain file"):
        info_for(tiny_data)
    (tiny_data / "manifest.json").write_text(json.dumps({"shards": shards[:1]}))
    with pytest.raises(data.DataError, match=r"lists no validation shards$"):
        info_for(tiny_data)


class FakeClock:
    """time.monotonic and time.sleep: sleeping moves the clock; files appear at given times."""

    def __init__(self, appear=()):
        self.now, self.appear = 0.0, dict(appear)

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds
        for path, at in list(self.appear.items()):
            if self.now >= at:
                path.write_bytes(b"x")
                del self.appear[path]


def test_a_rank_waits_for_its_shards_saying_which_then_names_the_missing(tmp_path):
    present = tmp_path / "train-0"
    present.write_bytes(b"x")
    late = [tmp_path / f"train-{i}" for i in range(1, 6)]
    clock, said = FakeClock({path: 45.0 for path in late}), []
    files = [str(present), *map(str, late)]
    data.wait_for_files(files, 600, said.append, clock=clock, sleep=clock.sleep)
    assert clock.now == 45.0  # polled every second until the last one came
    shown = ", ".join(map(str, late[:3])) + " and 2 more"
    assert said == [
        f"waiting for 5 shard files (0 of 600 s): {shown}",
        f"waiting for 5 shard files (30 of 600 s): {shown}",
    ]

    clock, said = FakeClock(), []
    with pytest.raises(data.DataError) as failed:
        data.wait_for_files(
            [str(tmp_path / "never")], 65, said.append, clock=clock, sleep=clock.sleep
        )
    assert str(failed.value) == (
        f"1 shard file of this rank not on disk after --data-wait-s 65: {tmp_path / 'never'}"
    )
    assert len(said) == 3 and clock.now == 65.0  # at 0, 30 and 60 s
