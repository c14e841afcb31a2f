"""trainer.preprocess on tiny generated ILSVRC archives, local files.

.venv/bin/python -m pytest tests/trainer/test_preprocess_local.py
"""

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
from ilsvrc_samples import REPO, read_records, run_preprocess, sample_args
from PIL import Image

from trainer.preprocess.sample import make_image, make_sample

SHORT_SIDE = 64
FLAGS = ["--train-shards", "4", "--val-shards", "2", "--short-side", str(SHORT_SIDE),
         "--shards-per-block", "2", "--workers", "2"]  # fmt: skip


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    return make_sample(str(tmp_path_factory.mktemp("raw")), 3, 5, 6, quirks=True)


@pytest.fixture(scope="module")
def converted(sample, tmp_path_factory):
    output = str(tmp_path_factory.mktemp("tfrecords"))
    result = run_preprocess(sample_args(sample, output, *FLAGS))
    assert result.returncode == 0, result.stderr
    return output


def manifest_of(output: str) -> dict:
    with open(os.path.join(output, "manifest.json")) as f:
        return json.load(f)


def original_size(sample, name: str) -> tuple[int, int]:
    archive_name = sample.train_tar if name.startswith("n") else sample.val_tar
    with tarfile.open(archive_name) as archive:
        for member in archive:
            if member.name == name:
                return Image.open(archive.extractfile(member)).size
            if member.name.endswith(".tar") and name.startswith(member.name[:-4]):
                with tarfile.open(fileobj=archive.extractfile(member)) as inner:
                    return Image.open(inner.extractfile(name)).size
    raise AssertionError(name)


def test_manifest_counts_labels_and_hashes(sample, converted):
    manifest = manifest_of(converted)
    truncated = [name for name, kind in sample.quirks.items() if kind == "truncated"]
    assert manifest["format"] == "horovod-fleet/imagenet-tfrecords/1"
    assert manifest["num_classes"] == 3 and manifest["label_base"] == 1
    assert manifest["label_map"] == {
        synset: i + 1 for i, synset in enumerate(sorted(sample.synsets))
    }
    assert manifest["splits"] == {
        "train": {"shards": 4, "records": 14},
        "validation": {"shards": 2, "records": 6},
    }
    assert manifest["skipped"] == [{"file": truncated[0], "reason": "truncated image"}]
    assert manifest["image"] == {"short_side": SHORT_SIDE, "quality": 90}
    names = [f"train-{i:05d}-of-00004" for i in range(4)] + [
        f"validation-{i:05d}-of-00002" for i in range(2)
    ]
    assert [shard["file"] for shard in manifest["shards"]] == names
    for shard in manifest["shards"]:
        with open(os.path.join(converted, shard["file"]), "rb") as f:
            data = f.read()
        assert shard["bytes"] == len(data) and shard["sha256"] == hashlib.sha256(data).hexdigest()
        assert shard["records"] == len(read_records(os.path.join(converted, shard["file"])))


def test_every_record_decodes_with_its_label(sample, converted):
    manifest = manifest_of(converted)
    synset_of = {name: synset for synset, names in sample.train_names.items() for name in names}
    synset_of.update(
        {f"ILSVRC2012_val_{i + 1:08d}.JPEG": s for i, s in enumerate(sample.val_synsets)}
    )
    seen, synsets_in_shard = {}, {}
    for shard in manifest["shards"]:
        for record in read_records(os.path.join(converted, shard["file"])):
            name = record["image/filename"].decode()
            synset = record["image/class/synset"].decode()
            synsets_in_shard.setdefault(shard["file"], set()).add(synset)
            height, width, channels = record["pixels"].shape
            assert (
                synset == synset_of[name]
                and record["image/class/label"] == manifest["label_map"][synset]
            )
            assert (record["image/height"], record["image/width"], channels) == (height, width, 3)
            assert min(height, width) == min(SHORT_SIDE, *original_size(sample, name))
            assert record["image/format"] == b"JPEG" and record["image/colorspace"] == b"RGB"
            seen[name] = record["pixels"]
    expected = set(synset_of) - {n for n, kind in sample.quirks.items() if kind == "truncated"}
    assert set(seen) == expected and len(seen) == 20
    # 3 classes in 2 blocks: the second block's two classes are dealt to both of its shards.
    assert synsets_in_shard["train-00002-of-00004"] == set(sorted(sample.synsets)[1:])


def test_quirks_become_faithful_rgb(sample, converted):
    """The CMYK, PNG and grayscale images keep their picture, only as 3-channel JPEGs."""
    manifest = manifest_of(converted)
    pixels = {}
    for shard in manifest["shards"]:
        for record in read_records(os.path.join(converted, shard["file"])):
            pixels[record["image/filename"].decode()] = record["pixels"].astype(float)
    for index, (name, kind) in enumerate(sample.quirks.items()):
        if kind == "truncated":
            continue
        class_index = sample.synsets.index(name.split("_")[0])
        plain = Image.open(io.BytesIO(make_image(0, 0, index, class_index)))
        expected = np.asarray(plain.convert("L" if kind == "grayscale" else "RGB").convert("RGB"))
        assert abs(pixels[name].mean() - expected.mean()) < 6, kind
        if kind == "grayscale":
            assert np.abs(pixels[name][..., 0] - pixels[name][..., 2]).max() < 3


def test_same_inputs_same_shards(sample, converted, tmp_path):
    result = run_preprocess(sample_args(sample, str(tmp_path), *FLAGS))
    assert result.returncode == 0, result.stderr
    assert [s["sha256"] for s in manifest_of(str(tmp_path))["shards"]] == [
        s["sha256"] for s in manifest_of(converted)["shards"]
    ]


def test_restart_skips_finished_blocks_and_redoes_broken_shards(sample, converted, tmp_path):
    first = manifest_of(converted)
    output = tmp_path / "out"
    result = run_preprocess(sample_args(sample, str(output), *FLAGS))
    assert result.returncode == 0, result.stderr
    os.remove(output / "manifest.json")
    with open(output / "train-00000-of-00004", "r+b") as f:  # a shard cut short (train block 0)
        f.truncate(100)
    os.remove(output / "_progress" / "validation-00001-of-00002.json")  # never confirmed
    (output / "_progress" / "train-00003-of-00004.partial").write_bytes(b"half")  # killed mid-block
    untouched = {
        name: os.path.getmtime(output / name)
        for name in ("train-00002-of-00004", "train-00003-of-00004")
    }
    result = run_preprocess(sample_args(sample, str(output), *FLAGS))
    assert result.returncode == 0, result.stderr
    assert "train: 2 blocks of shards, 1 already complete" in result.stderr
    assert "validation: 1 blocks of shards, 0 already complete" in result.stderr
    assert {name: os.path.getmtime(output / name) for name in untouched} == untouched
    assert manifest_of(str(output))["shards"] == first["shards"]
    result = run_preprocess(sample_args(sample, str(output), *FLAGS))
    assert "train: 2 blocks of shards, 2 already complete" in result.stderr
    assert "validation: 1 blocks of shards, 1 already complete" in result.stderr


def test_changed_settings_redo_everything(sample, converted, tmp_path):
    output = tmp_path / "out"
    assert run_preprocess(sample_args(sample, str(output), *FLAGS)).returncode == 0
    flags = [*FLAGS[:-4], "--short-side", "48", *FLAGS[-4:]]
    result = run_preprocess(sample_args(sample, str(output), *flags))
    assert result.returncode == 0, result.stderr
    assert "train: 2 blocks of shards, 0 already complete" in result.stderr
    assert manifest_of(str(output))["image"]["short_side"] == 48


def extract_tree(sample, root) -> None:
    with tarfile.open(sample.train_tar) as outer:
        for member in outer:
            folder = root / member.name.removesuffix(".tar")
            folder.mkdir(parents=True)
            with tarfile.open(fileobj=outer.extractfile(member)) as inner:
                for image in inner:
                    (folder / image.name).write_bytes(inner.extractfile(image).read())


def test_tree_with_min_images_and_val_per_class(sample, tmp_path):
    tree = tmp_path / "tree"
    extract_tree(sample, tree)
    small = sorted(sample.synsets)[-1]
    for path in sorted((tree / small).iterdir())[2:]:
        path.unlink()  # leaves 2 images: below --min-images-per-class 3
    output = tmp_path / "out"
    args = ["--train-dir", str(tree), "--output", str(output), "--min-images-per-class", "3",
            "--val-per-class", "2", "--train-shards", "3", "--val-shards", "2", "--short-side", "64"]  # fmt: skip
    result = run_preprocess(args)
    assert result.returncode == 0, result.stderr
    manifest = manifest_of(str(output))
    assert manifest["label_map"] == {
        synset: i + 1 for i, synset in enumerate(sorted(sample.synsets)[:2])
    }
    assert manifest["splits"]["validation"]["records"] in (
        3,
        4,
    )  # 2 per class, maybe the truncated one
    assert len(manifest["skipped"]) == 1
    assert manifest["splits"]["train"]["records"] + manifest["splits"]["validation"]["records"] == 9
    names = [
        r["image/filename"]
        for s in manifest["shards"]
        for r in read_records(str(output / s["file"]))
    ]
    assert len(names) == len(set(names)) == 9 and not any(
        n.startswith(small.encode()) for n in names
    )


def test_tree_with_the_validation_archive(sample, tmp_path):
    tree = tmp_path / "tree"
    extract_tree(sample, tree)
    output = tmp_path / "out"
    args = ["--train-dir", str(tree), "--val-tar", sample.val_tar, "--val-labels", sample.val_labels,
            "--output", str(output), "--train-shards", "2", "--val-shards", "1", "--short-side", "64"]  # fmt: skip
    result = run_preprocess(args)
    assert result.returncode == 0, result.stderr
    manifest = manifest_of(str(output))
    assert manifest["splits"]["validation"]["records"] == len(sample.val_synsets)
    assert manifest["label_map"] == {s: i + 1 for i, s in enumerate(sorted(sample.synsets))}


def test_a_split_with_no_convertible_image_writes_no_manifest(tmp_path):
    tree = tmp_path / "tree"
    for synset in ("n01440764", "n01443537"):
        (tree / synset).mkdir(parents=True)
        for index in range(3):
            (tree / synset / f"{synset}_{index}.JPEG").write_bytes(b"not an image")
    output = tmp_path / "out"
    result = run_preprocess(
        ["--train-dir", str(tree), "--val-per-class", "1", "--output", str(output)]
    )
    assert result.returncode == 2
    last = result.stderr.splitlines()[-1]
    assert last.startswith("error: ") and "no image could be converted" in last, result.stderr
    assert "not an image" in last and "Traceback" not in result.stderr
    assert not (output / "manifest.json").exists()


def corrupt_files(tmp_path, sample) -> dict:
    """Broken inputs by name: not a tar, a short ground truth, a train tar with junk synset tars."""
    (tmp_path / "not-a-tar.tar").write_bytes(b"this is not a tar archive" * 100)
    (tmp_path / "two-lines.txt").write_text("n01440764\nn01440764\n")
    (tmp_path / "class-numbers.txt").write_text("".join(f"{n}\n" for n in range(1, 7)))
    with tarfile.open(tmp_path / "damaged.tar", "w") as archive:
        junk = b"not a tar\xff\x00" * 200
        for synset in sample.synsets:
            info = tarfile.TarInfo(f"{synset}.tar")
            info.size = len(junk)
            archive.addfile(info, io.BytesIO(junk))
    cut = Path(sample.train_tar).read_bytes()
    (tmp_path / "cut.tar").write_bytes(cut[: len(cut) * 2 // 3])
    (tmp_path / "a-directory").mkdir()
    (tmp_path / "a-file").write_text("not a directory")
    names = {"not_a_tar": "not-a-tar.tar", "two_lines": "two-lines.txt", "damaged": "damaged.tar",
             "class_numbers": "class-numbers.txt", "cut": "cut.tar", "a_directory": "a-directory",
             "a_file": "a-file"}  # fmt: skip
    return {name: str(tmp_path / file) for name, file in names.items()}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"--train-tar": "/nonexistent/ILSVRC2012_img_train.tar"}, "--train-tar: no such file"),
        ({"--val-tar": "s3://"}, "--val-tar: expected s3://BUCKET/KEY"),
        ({"--short-side": "0"}, "--short-side must be between 32 and 4096, got 0"),
        ({"--short-side": "abc"}, "--short-side: invalid int value"),
        ({"--quality": "101"}, "--quality must be between 1 and 100"),
        ({"--train-dir": "/tmp"}, "give exactly one of --train-tar and --train-dir"),
        ({"--min-images-per-class": "5"}, "--min-images-per-class needs --train-dir"),
        ({"--train-tar": "not_a_tar"}, "is not a readable tar archive"),
        ({"--val-labels": "two_lines"}, "--val-labels has 2 lines but --val-tar has 6 images"),
        ({"--val-labels": "class_numbers"}, "--val-labels holds class numbers (1, ...), as the"),
        ({"--val-labels": None}, "give --val-tar with --val-labels"),
        ({"--train-tar": "damaged"}, "--train-tar: n01440764.tar is damaged"),
        ({"--train-tar": "cut"}, "cut.tar is not a readable tar archive: unexpected end of data"),
        ({"--train-tar": ""}, "--train-tar is empty; give a path or an s3:// URL"),
        ({"--output": ""}, "--output is empty; give a path or an s3:// URL"),
        ({"--train-tar": "a_directory"}, "is a directory; expected the archive file"),
        ({"--output": "a_file"}, "is a file; expected a directory or s3:// prefix"),
        ({"--output": "/proc/no-such-dir/out"}, "--output: cannot create /proc/no-such-dir/out"),
        ({"--train-tar": "s3://bucket"}, "--train-tar: expected s3://BUCKET/KEY of one object"),
        ({"--val-labels": "s3://bucket/raw/"}, "--val-labels: expected s3://BUCKET/KEY of one"),
        ({"--output": "s3://Bad_Bucket!/x"}, "'Bad_Bucket!' is not an S3 bucket name"),
    ],
)
def test_bad_input_is_one_error_line(sample, tmp_path, change, message):
    files = corrupt_files(tmp_path, sample)
    args = dict(
        zip(
            sample_args(sample, str(tmp_path / "out"))[::2],
            sample_args(sample, "")[1::2],
            strict=True,
        )
    )
    args["--output"] = str(tmp_path / "out")
    for flag, value in change.items():
        args[flag] = files.get(value, value)
    result = run_preprocess(
        [item for flag, value in args.items() if value is not None for item in (flag, value)],
        cwd=tmp_path / "a-directory",
    )
    assert result.returncode != 0
    assert list((tmp_path / "a-directory").iterdir()) == []  # nothing written where it runs
    lines = result.stderr.splitlines()  # progress lines may come first when the error is mid-run
    assert lines[-1].startswith("error: ") and result.stderr.count("error:") == 1, result.stderr
    assert message in lines[-1] and "Traceback" not in result.stderr
    assert not (tmp_path / "out" / "manifest.json").exists()


def process_exits(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_killed_run_resumes_to_the_same_shards(tmp_path):
    """SIGKILL mid-run (as a reboot would), then rerun: finished blocks stay, the rest is redone."""
    sample = make_sample(str(tmp_path / "raw"), 8, 12, 4)
    flags = [
        "--train-shards",
        "8",
        "--val-shards",
        "1",
        "--shards-per-block",
        "1",
        "--workers",
        "1",
    ]
    clean = run_preprocess(sample_args(sample, str(tmp_path / "clean"), *flags))
    assert clean.returncode == 0, clean.stderr
    output = tmp_path / "killed"
    command = [
        sys.executable,
        "-m",
        "trainer.preprocess",
        *sample_args(sample, str(output), *flags),
    ]
    victim = subprocess.Popen(command, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
                              stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 60
    while not list(output.glob("_progress/train-*.json")) and time.monotonic() < deadline:
        time.sleep(0.01)
    children = Path(f"/proc/{victim.pid}/task/{victim.pid}/children").read_text().split()
    victim.kill()
    victim.wait()
    assert children and all(process_exits(int(pid), timeout=10) for pid in children)
    finished = len(list(output.glob("_progress/train-*.json")))
    assert (finished >= 1 and not (output / "manifest.json").exists()) or finished == 8
    result = run_preprocess(sample_args(sample, str(output), *flags))
    assert result.returncode == 0, result.stderr
    assert f"train: 8 blocks of shards, {finished} already complete" in result.stderr
    assert manifest_of(str(output))["shards"] == manifest_of(str(tmp_path / "clean"))["shards"]
