"""trainer.proxy: the generated dataset, the runs' command lines, and the table with its medians."""

import json

import numpy as np
import pytest
import tensorflow as tf

from trainer import data, proxy, recipes

FEATURES = {
    "image/encoded": tf.io.FixedLenFeature([], tf.string),
    "image/class/label": tf.io.FixedLenFeature([], tf.int64),
    "image/height": tf.io.FixedLenFeature([], tf.int64),
    "image/width": tf.io.FixedLenFeature([], tf.int64),
    "image/class/synset": tf.io.FixedLenFeature([], tf.string),
}


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("proxy") / "data"
    manifest = proxy.generate(data_dir, 200, 40, workers=1)
    return data_dir, manifest


def read_split(files):
    return [
        tf.io.parse_single_example(record, FEATURES)
        for record in tf.data.TFRecordDataset(sorted(files))
    ]


def test_generator_writes_the_preprocessors_shards_and_manifest(generated):
    data_dir, manifest = generated
    assert manifest["format"] == "horovod-fleet/imagenet-tfrecords/1"
    assert (manifest["num_classes"], manifest["label_base"]) == (10, 1)
    assert manifest["splits"] == {
        "train": {"shards": 8, "records": 200},
        "validation": {"shards": 2, "records": 40},
    }
    assert json.loads((data_dir / "manifest.json").read_text()) == manifest
    info = data.resolve_dataset(data_dir, None, None)  # the trainer reads it as it is
    assert (info.num_classes, info.label_base, info.train_records) == (10, 1, 200)
    assert (len(info.train_files), len(info.validation_files)) == (8, 2)
    for split, files, count in (
        ("train", info.train_files, 200),
        ("validation", info.validation_files, 40),
    ):
        examples = read_split(files)
        assert len(examples) == count
        labels = [int(e["image/class/label"]) for e in examples]
        # Balanced: every class count/10 times.
        assert np.bincount(labels, minlength=11).tolist() == [0] + [count // 10] * 10, split
        for e in examples[:20]:
            assert (int(e["image/height"]), int(e["image/width"])) == (64, 64)
            pixels = tf.io.decode_jpeg(e["image/encoded"]).numpy()
            assert pixels.shape == (64, 64, 3)
            assert pixels.std() > 5  # drawn, not blank
        synsets = {int(e["image/class/label"]): e["image/class/synset"].numpy() for e in examples}
        assert {manifest["label_map"][s.decode()] for s in synsets.values()} == set(synsets)
    # Every training shard holds several classes (labels are shuffled before the round-robin).
    first_shard = read_split(info.train_files[:1])
    assert len({int(e["image/class/label"]) for e in first_shard}) >= 5


def test_generator_is_deterministic_and_the_trainer_pipeline_reads_it(generated, tmp_path):
    data_dir, _ = generated
    again = proxy.generate(tmp_path / "again", 200, 40, workers=2)
    first = json.loads((data_dir / "manifest.json").read_text())
    assert [s["sha256"] for s in again["shards"]] == [s["sha256"] for s in first["shards"]]
    info = data.resolve_dataset(data_dir, None, None)
    images, labels = next(
        iter(
            data.train_dataset(
                info.train_files,
                batch_size=16,
                image_size=23,
                num_classes=10,
                label_base=1,
                shuffle_buffer=64,
                min_crop_area=proxy.MIN_CROP_AREA,
            )
        )
    )
    assert images.shape == (16, 23, 23, 3) and labels.numpy().max() < 10


def test_fine_classes_lose_their_detail_at_low_resolution():
    """What makes the dataset resolution-sensitive: a fine texture has high-frequency energy at
    64 px that a 23 px (fast's first epochs at --image-size 32) resize mostly averages away."""

    def detail(image, size):
        small = np.asarray(image.convert("L").resize((size, size)), dtype=np.float32)
        return np.abs(np.diff(small, axis=1)).mean()

    rng = np.random.default_rng(0)
    fine = proxy.CLASSES.index("stripes-fine")
    images = [proxy.render(rng, fine) for _ in range(5)]
    assert all(image.size == (proxy.RENDER, proxy.RENDER) for image in images)
    assert np.mean([detail(i, 64) for i in images]) > 2 * np.mean([detail(i, 23) for i in images])


def result(recipe, seed, reached, seconds, top1, rate, epochs=6):
    return proxy.RunResult(recipe, seed, reached or epochs, epochs, reached, seconds, top1, rate)


def test_table_rows_and_medians():
    results = [
        result("goyal", 0, 4, 200.0, 0.91, 400.0),
        result("fast", 0, 5, 150.0, 0.90, 700.0),
        result("goyal", 1, 3, 160.0, 0.93, 420.0),
        result("fast", 1, None, None, 0.70, 720.0),
    ]
    rows = proxy.table_rows(results)
    assert rows[:4] == [
        ("goyal", "0", "4", "200.0", "0.910", "400"),
        ("fast", "0", "5", "150.0", "0.900", "700"),
        ("goyal", "1", "3", "160.0", "0.930", "420"),
        ("fast", "1", "not reached in 6", "-", "0.700", "720"),
    ]
    assert rows[4:] == [
        ("goyal", "median", "3.5", "180.0", "0.920", "410"),
        ("fast", "median", "5 (1/2 reached)", "150.0", "0.800", "710"),
    ]
    table = proxy.format_table(results).splitlines()
    assert table[0].startswith("| recipe | seed   | epochs to target ")
    assert table[1].startswith("|--------|")
    assert len(table) == 2 + 6 and all(line.endswith("|") for line in table)


def test_no_run_reaching_the_target_has_dashes_for_its_median():
    rows = proxy.table_rows([result("fast", 0, None, None, 0.5, None)])
    assert rows == [
        ("fast", "0", "not reached in 6", "-", "0.500", "-"),
        ("fast", "median", "- (0/1 reached)", "-", "0.500", "-"),
    ]


def test_read_result_takes_train_and_eval_json(tmp_path):
    (tmp_path / "train.json").write_text(
        json.dumps(
            {
                "epochs": 4,
                "epochs_planned": 6,
                "target_top1": 0.8,
                "reached_target_at_epoch": 4,
                "time_to_target_s": 123.4,
                "images_per_s": 456.7,
            }
        )
    )
    (tmp_path / "eval.json").write_text(json.dumps({"top1": 0.81, "top5": 1.0, "epoch": 4}))
    assert proxy.read_result("fast", 1, tmp_path) == proxy.RunResult(
        "fast", 1, 4, 6, 4, 123.4, 0.81, 456.7
    )


def test_train_command_scales_each_recipes_warmup(tmp_path):
    command = proxy.train_command(
        "goyal", 1, tmp_path / "d", tmp_path / "m", epochs=9, target=0.8, image_size=32,
        batch_size=128,
    )  # fmt: skip
    flags = dict(zip(command[3::2], command[4::2], strict=False))
    assert command[1:3] == ["-m", "trainer.train"]
    assert flags["--recipe"] == "goyal" and flags["--seed"] == "1"
    assert flags["--warmup-epochs"] == "0.5"  # 5 of goyal's 90 epochs
    assert (flags["--target-top1"], flags["--eval-every"]) == ("0.8", "1")
    fast = recipes.fast(128)
    assert proxy.warmup_epochs("fast", 37, 128) == fast.warmup_epochs  # MLPerf's 2 of 37


def test_bad_flags_are_one_error_line(capsys):
    with pytest.raises(SystemExit) as exited:
        proxy.main(["--workdir", "w", "--target", "1.5"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip() == "error: --target must be a top-1 in (0, 1], got 1.5"


@pytest.mark.slow
def test_a_tiny_comparison_trains_both_recipes(tmp_path, capsys):
    proxy.main(
        ["--workdir", str(tmp_path), "--images", "256", "--seeds", "1", "--epochs", "2",
         "--target", "0.05", "--batch-size", "32"]
    )  # fmt: skip
    out = capsys.readouterr().out
    table = out[out.index("| recipe") :].splitlines()
    assert [line.split("|")[1].strip() for line in table[2:]] == [
        "goyal",
        "fast",
        "goyal",
        "fast",
    ]
    for recipe in ("goyal", "fast"):
        trained = json.loads((tmp_path / "runs" / f"{recipe}-0" / "train.json").read_text())
        assert trained["target_top1"] == 0.05
