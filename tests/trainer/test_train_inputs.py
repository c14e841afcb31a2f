"""trainer.train on user mistakes: exactly one `error:` line, exit 2, no output directory, no hang
(in this process: tests/trainer/test_train.py holds the command's process contract)."""

import json
from pathlib import Path

import pytest

from trainer.config import ConfigError, parse_config

SMALL_RUN = ["--arch", "resnet18", "--image-size", "32", "--batch-size", "2", "--epochs", "1"]


def the_error_line(result) -> str:
    """The only line on stderr, which must be an error, with exit status 2."""
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


BAD_MANIFESTS = {
    "split not an object": (
        {"splits": {"train": "lots"}},
        'splits.train must be a JSON object, got "lots"',
    ),
    "records a string": (
        {"splits": {"train": {"records": "9"}}},
        'splits.train.records must be an integer >= 1, got "9"',
    ),
    "records negative": (
        {"splits": {"train": {"records": -100}}},
        "splits.train.records must be an integer >= 1, got -100",
    ),
    # 0 records with --steps-per-epoch would repeat an empty dataset forever.
    "records zero": (
        {"splits": {"train": {"records": 0}}},
        "splits.train.records must be an integer >= 1, got 0",
    ),
    "no classes": ({"num_classes": 0}, "num_classes must be an integer >= 2, got 0"),
    # 1000 classes over a map of 10 synsets used to train a 1000-way model and exit 0.
    "classes disagree with label map": (
        {"num_classes": 1000, "label_base": 1, "label_map": {f"n{i:08d}": i for i in range(1, 11)}},
        "num_classes 1000 disagrees with label_map, which maps 10 synsets; they must be equal",
    ),
    "label outside the map": (
        {"num_classes": 4, "label_base": 1, "label_map": {"n1": 1, "n2": 2, "n3": 3, "n4": 5}},
        "label_map gives n4 label 5, outside 1..4 (label_base 1, num_classes 4)",
    ),
}


@pytest.mark.parametrize(("document", "problem"), BAD_MANIFESTS.values(), ids=BAD_MANIFESTS)
def test_bad_manifest_value_is_named_before_any_output(
    tiny_data, tmp_path, train_main, document, problem
):
    manifest = tiny_data / "manifest.json"
    manifest.write_text(json.dumps(document))
    model_dir = tmp_path / "m"
    args = ["--data-dir", str(tiny_data), "--model-dir", str(model_dir), "--steps-per-epoch", "1"]
    result = train_main([*args, *SMALL_RUN])
    assert the_error_line(result) == f"error: manifest {manifest}: {problem}"
    assert not model_dir.exists()


@pytest.mark.parametrize("flag", ["--data-dir", "--model-dir"])
def test_empty_path_is_rejected_at_the_edge(flag):
    # Path("") is ".": an empty --model-dir used to train into the working directory.
    paths = {"--data-dir": "d", "--model-dir": "m", flag: ""}
    with pytest.raises(ConfigError, match=f"^{flag} is empty; give a directory path$"):
        parse_config([arg for pair in paths.items() for arg in pair])


def test_an_empty_stop_file_is_rejected_and_a_given_one_is_a_path():
    args = ["--data-dir", "d", "--model-dir", "m"]
    with pytest.raises(ConfigError, match=r"^--stop-file is empty; give a file path$"):
        parse_config([*args, "--stop-file", " "])
    assert parse_config([*args, "--stop-file", "/data/stop.json"]).stop_file == Path(
        "/data/stop.json"
    )
    assert parse_config(args).stop_file is None


def test_empty_model_dir_is_one_error_line(tmp_path, train_main):
    # The data directory is missing too: even without the check nothing would be written.
    result = train_main(["--data-dir", str(tmp_path / "nowhere"), "--model-dir", ""])
    assert the_error_line(result) == "error: --model-dir is empty; give a directory path"


@pytest.mark.parametrize(
    ("flag", "value", "allowed"),
    [
        ("--base-lr", "nan", "a finite number > 0"),
        ("--base-lr", "inf", "a finite number > 0"),
        ("--warmup-epochs", "inf", "a finite number >= 0"),
        ("--weight-decay", "inf", "a finite number >= 0"),
        ("--target-top1", "75.9", r"a top-1 accuracy in \(0, 1\], like 0.759"),
        ("--target-top1", "0.0", r"a top-1 accuracy in \(0, 1\], like 0.759"),
        ("--target-top1", "nan", r"a top-1 accuracy in \(0, 1\], like 0.759"),
    ],
)
def test_non_finite_float_flag_is_rejected(flag, value, allowed):
    with pytest.raises(ConfigError, match=f"^{flag} must be {allowed}, got {value}$"):
        parse_config(["--synthetic", "--model-dir", "m", flag, value])


def test_data_dir_that_is_a_file_says_so(tmp_path, train_main):
    regular = tmp_path / "data.tar"
    regular.write_bytes(b"not a directory")
    result = train_main(["--data-dir", str(regular), "--model-dir", str(tmp_path / "m")])
    assert the_error_line(result) == f"error: data directory {regular} is not a directory"


def test_shards_without_records_fail_fast_instead_of_hanging(tmp_path, train_main):
    data_dir, model_dir = tmp_path / "data", tmp_path / "m"
    data_dir.mkdir()
    for name in ("train-00000-of-00001", "validation-00000-of-00001"):
        (data_dir / name).write_bytes(b"")
    # --steps-per-epoch skips counting the records: the run used to wait for a first batch.
    args = ["--data-dir", str(data_dir), "--model-dir", str(model_dir), "--steps-per-epoch", "1"]
    result = train_main([*args, *SMALL_RUN])
    assert the_error_line(result) == (
        f"error: the train-* shards in {data_dir} hold no records (every file is empty)"
    )
    assert not model_dir.exists()
