"""The devkit as image-net.org ships it: `--val-labels ILSVRC2012_devkit_t12.tar.gz`, its meta.mat
read without SciPy (trainer/preprocess/matfile.py) but written here by scipy.io.savemat, the
validation images labelled by ILSVRC2012_ID, never by position.

.venv/bin/python -m pytest tests/trainer/test_devkit.py
"""

import io
import random
import re
import tarfile

import numpy as np
import pytest
from ilsvrc_samples import read_records, run_preprocess, sample_args
from scipy.io import savemat

from trainer.preprocess.archives import InputError
from trainer.preprocess.blocks import val_tar_units
from trainer.preprocess.devkit import DEVKIT_NAME, devkit_synsets
from trainer.preprocess.matfile import MatError, read_mat
from trainer.preprocess.sample import make_sample

# meta.mat's synsets fields, in its order (torchvision's parse_devkit_archive takes the fifth,
# num_children, to find the leaves; Fuel's read_metadata_mat_file names them all).
FIELDS = ("ILSVRC2012_ID", "WNID", "words", "gloss", "num_children", "children",
          "wordnet_height", "num_train_images")  # fmt: skip
ANCESTORS = ("n00001740", "n00021939")  # entity, artifact: not classes
ROOT = "ILSVRC2012_devkit_t12"


def class_ids(synsets: list[str]) -> dict[str, int]:
    """ILSVRC2012_IDs 1..N in an order that is not the synsets' sorted one."""
    shuffled = sorted(synsets, reverse=True)
    shuffled = shuffled[1:] + shuffled[:1]
    assert shuffled != sorted(synsets)
    return {synset: i + 1 for i, synset in enumerate(shuffled)}


def meta_mat(ids: dict[str, int], compressed: bool = True, seed: int = 3) -> bytes:
    """meta.mat as the devkit has it: the leaves, then ancestors with children, the rows
    shuffled too, so that nothing but the ID field says which synset a class number is."""
    leaves = [(i, wnid, f"words of {wnid}", "a gloss", 0, np.zeros((1, 0)), 0, 1300)
              for wnid, i in ids.items()]  # fmt: skip
    top = len(ids)
    ancestors = [(top + 1 + k, wnid, wnid, "", 2, np.array([[1, 2]]), 3 + k, 0)
                 for k, wnid in enumerate(ANCESTORS)]  # fmt: skip
    rows = leaves + ancestors
    random.Random(seed).shuffle(rows)
    synsets = np.zeros((len(rows), 1), dtype=[(field, "O") for field in FIELDS])
    for index, row in enumerate(rows):
        for field, value in zip(FIELDS, row, strict=True):
            synsets[index, 0][field] = value
    out = io.BytesIO()
    savemat(out, {"synsets": synsets}, do_compression=compressed)
    return out.getvalue()


def devkit(path, files: dict[str, bytes]) -> str:
    """A .tar.gz laid out as ILSVRC2012_devkit_t12.tar.gz is: the files under its root folder."""
    with tarfile.open(path, "w:gz") as archive:
        for name, data in {"readme.txt": b"ILSVRC2012 devkit", **files}.items():
            info = tarfile.TarInfo(f"{ROOT}/{name}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return str(path)


def ground_truth(ids: dict[str, int], synsets: list[str]) -> bytes:
    return "".join(f"{ids[synset]}\n" for synset in synsets).encode()


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    return make_sample(str(tmp_path_factory.mktemp("raw")), 4, 3, 12)


@pytest.fixture(scope="module")
def shipped(sample, tmp_path_factory) -> str:
    ids = class_ids(sample.synsets)
    files = {
        "data/meta.mat": meta_mat(ids),
        "data/ILSVRC2012_validation_ground_truth.txt": ground_truth(ids, sample.val_synsets),
        "evaluation/demo_eval.m": b"% MATLAB",
    }
    return devkit(tmp_path_factory.mktemp("devkit") / DEVKIT_NAME, files)


def test_every_validation_image_is_labelled_by_its_class_number(sample, shipped, tmp_path):
    output = tmp_path / "tfrecords"
    args = sample_args(sample, str(output), "--train-shards", "2", "--val-shards", "2",
                       "--short-side", "48", "--workers", "2")  # fmt: skip
    args[args.index("--val-labels") + 1] = shipped
    result = run_preprocess(args)
    assert result.returncode == 0, result.stderr
    label_of = {synset: i + 1 for i, synset in enumerate(sorted(sample.synsets))}
    truth = {f"ILSVRC2012_val_{i + 1:08d}.JPEG": s for i, s in enumerate(sample.val_synsets)}
    seen = {}
    for shard in sorted(output.glob("validation-*")):
        for record in read_records(str(shard)):
            seen[record["image/filename"].decode()] = (
                record["image/class/synset"].decode(),
                int(record["image/class/label"]),
            )
    assert seen == {name: (synset, label_of[synset]) for name, synset in truth.items()}
    ids, by_position = class_ids(sample.synsets), sorted(sample.synsets)
    wrong = [s for s in sample.val_synsets if by_position[ids[s] - 1] != s]
    assert wrong, "class numbers read as sorted positions would mislabel some of these images"


@pytest.mark.parametrize("compressed", [True, False])
def test_meta_mat_reads_as_scipy_wrote_it(compressed):
    ids = {"n01440764": 2, "n02119789": 1}
    synsets = read_mat(meta_mat(ids, compressed=compressed))["synsets"]
    leaves = {s["WNID"]: s["ILSVRC2012_ID"] for s in synsets if s["num_children"] == [0]}
    assert leaves == {"n01440764": [2], "n02119789": [1]}
    assert {s["WNID"] for s in synsets if s["num_children"] == [2]} == set(ANCESTORS)
    assert {tuple(s["children"]) for s in synsets} == {(), (1, 2)}
    assert set(synsets[0]) == set(FIELDS)


def test_matrices_strings_and_cells_read_as_matlab_lays_them_out():
    out = io.BytesIO()
    cells = np.empty((1, 2), dtype=object)
    cells[0, 0], cells[0, 1] = "déjà vu", np.array([[7.5]])
    savemat(out, {"grid": np.arange(6).reshape(2, 3), "rows": np.array(["ab", "cd"]), "c": cells})
    found = read_mat(out.getvalue())
    assert found["grid"] == [0, 3, 1, 4, 2, 5]  # column-major
    assert found["rows"] == ["ab", "cd"] and found["c"] == ["déjà vu", [7.5]]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"MATLAB 7.3 MAT-file, Platform: GLNXA64" + b" " * 100, "7.3 MAT-file (HDF5)"),
        (b"\x00" * 200, "not a Level 5 MAT-file"),
        (b"MATLAB 5.0 MAT-file", "shorter than a MAT-file header"),
    ],
)
def test_what_is_not_a_level_5_mat_file_is_refused(data, message):
    with pytest.raises(MatError, match=re.escape(message)):
        read_mat(data)


def bad_devkit(tmp_path, sample, change: str) -> str:
    ids = class_ids(sample.synsets)
    truth = ground_truth(ids, sample.val_synsets)
    files = {"data/meta.mat": meta_mat(ids), "data/ILSVRC2012_validation_ground_truth.txt": truth}
    if change == "no meta.mat":
        del files["data/meta.mat"]
    elif change == "an unknown class":
        files["data/ILSVRC2012_validation_ground_truth.txt"] = truth.replace(b"1\n", b"1860\n", 1)
    elif change == "an ancestor":
        files["data/ILSVRC2012_validation_ground_truth.txt"] = f"{len(ids) + 1}\n".encode() + truth
    elif change == "a short ground truth":
        files["data/ILSVRC2012_validation_ground_truth.txt"] = truth[
            : truth.rindex(b"\n", 0, -1) + 1
        ]
    elif change == "a word":
        files["data/ILSVRC2012_validation_ground_truth.txt"] = b"tench\n" + truth
    elif change == "no synsets":
        out = io.BytesIO()
        savemat(out, {"classes": np.arange(3)})
        files["data/meta.mat"] = out.getvalue()
    return devkit(tmp_path / DEVKIT_NAME, files)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("no meta.mat", f"--val-labels: {DEVKIT_NAME} holds no data/meta.mat; expected the"),
        (
            "an unknown class",
            "names class 1860, which data/meta.mat does not list among its 4 classes (IDs 1..4)",
        ),
        ("an ancestor", "line 1 of data/ILSVRC2012_validation_ground_truth.txt names class 5,"),
        (
            "a short ground truth",
            "the devkit's data/ILSVRC2012_validation_ground_truth.txt has "
            "11 lines but --val-tar has 12 images",
        ),
        ("a word", "line 1 of data/ILSVRC2012_validation_ground_truth.txt is 'tench', not a"),
        ("no synsets", "data/meta.mat holds no `synsets` struct array"),
    ],
)
def test_a_bad_devkit_is_one_line_saying_what_is_wrong(sample, tmp_path, change, message):
    path = bad_devkit(tmp_path, sample, change)
    with pytest.raises(InputError) as raised:
        val_tar_units(sample.val_tar, path, {s: 1 for s in sample.synsets}, None)
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_a_damaged_devkit_and_the_command_line_refuse_in_one_line(sample, tmp_path):
    path = tmp_path / DEVKIT_NAME
    path.write_bytes(b"\x1f\x8b\x08\x00" + b"\x00" * 40)  # a gzip header, then nothing
    with pytest.raises(InputError, match=f"--val-labels: {DEVKIT_NAME} is not a readable tar.gz"):
        devkit_synsets(path.read_bytes(), DEVKIT_NAME)
    args = sample_args(sample, str(tmp_path / "out"))
    args[args.index("--val-labels") + 1] = bad_devkit(tmp_path, sample, "an unknown class")
    result = run_preprocess(args)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"error: --val-labels: {DEVKIT_NAME}: line ")
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_the_devkits_own_ground_truth_alone_points_at_the_devkit(sample, tmp_path):
    ids = class_ids(sample.synsets)
    numbers = tmp_path / "ILSVRC2012_validation_ground_truth.txt"
    numbers.write_bytes(ground_truth(ids, sample.val_synsets))
    with pytest.raises(InputError, match=f"give the devkit itself \\({DEVKIT_NAME}\\)"):
        val_tar_units(sample.val_tar, str(numbers), {s: 1 for s in sample.synsets}, None)
