"""The validation labels from ILSVRC2012_devkit_t12.tar.gz as image-net.org ships it.

Its data/ILSVRC2012_validation_ground_truth.txt gives each validation image (in file-name order)
a class number, an ILSVRC2012_ID; its data/meta.mat names each number's synset: a struct array
`synsets` with fields ILSVRC2012_ID, WNID, words, gloss, num_children, children,
wordnet_height, num_train_images, where the 1,000 classes are the leaves (num_children 0, IDs
1 to 1000) and the others their ancestors in WordNet. torchvision reads it the same way
(torchvision/datasets/imagenet.py, parse_devkit_archive: leaves by num_children == 0, then
ILSVRC2012_ID to WNID,
https://github.com/pytorch/vision/blob/main/torchvision/datasets/imagenet.py), and Fuel lists
the fields (https://github.com/mila-iqia/fuel/blob/master/fuel/converters/ilsvrc2012.py,
read_metadata_mat_file). The IDs need not follow the synsets' sorted order, nor the table's
rows: the map goes by ID, never by position.
Tested by: .venv/bin/python -m pytest tests/trainer/test_devkit.py
"""

from __future__ import annotations

import io
import tarfile
import zlib

from trainer.preprocess.archives import InputError
from trainer.preprocess.matfile import MatError, read_mat

DEVKIT_NAME = "ILSVRC2012_devkit_t12.tar.gz"
META = "data/meta.mat"
GROUND_TRUTH = "data/ILSVRC2012_validation_ground_truth.txt"


def is_archive(data: bytes) -> bool:
    """A gzip stream or a tar (the devkit), not a text file of synsets."""
    return data[:2] == b"\x1f\x8b" or data[257:262] == b"ustar"


def _member(archive: tarfile.TarFile, path: str, source: str) -> bytes:
    found = [m for m in archive.getmembers() if m.isfile() and m.name.endswith("/" + path)]
    found += [m for m in archive.getmembers() if m.isfile() and m.name == path]
    if not found:
        raise InputError(
            f"--val-labels: {source} holds no {path}; expected the ILSVRC2012 devkit "
            f"({DEVKIT_NAME}) or one synset per line"
        )
    return archive.extractfile(found[0]).read()


def leaf_synsets(meta: bytes, source: str) -> dict[int, str]:
    """ILSVRC2012_ID -> WNID of the classes (the leaves) that meta.mat lists."""
    try:
        synsets = read_mat(meta).get("synsets")
    except MatError as exc:
        raise InputError(f"--val-labels: {source}: {META} is unreadable: {exc}") from None
    if not isinstance(synsets, list) or not synsets or not isinstance(synsets[0], dict):
        raise InputError(f"--val-labels: {source}: {META} holds no `synsets` struct array")
    missing = {"ILSVRC2012_ID", "WNID"} - set(synsets[0])
    if missing:
        raise InputError(f"--val-labels: {source}: {META}'s synsets have no {sorted(missing)[0]}")
    classes = {}
    for synset in synsets:
        ids, children = synset["ILSVRC2012_ID"], synset.get("num_children", [0])
        if not ids or not isinstance(synset["WNID"], str):
            raise InputError(f"--val-labels: {source}: a synset of {META} has no ID or WNID")
        if not children or children[0] == 0:
            classes[int(ids[0])] = synset["WNID"]
    return classes


def devkit_synsets(data: bytes, source: str) -> list[str]:
    """The synset of each validation image, in file-name order, from the devkit's archive."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as archive:
            meta = _member(archive, META, source)
            truth = _member(archive, GROUND_TRUTH, source)
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        raise InputError(f"--val-labels: {source} is not a readable tar.gz: {exc}") from None
    classes = leaf_synsets(meta, source)
    synsets = []
    for line_number, line in enumerate(truth.decode(errors="replace").split(), 1):
        if not line.isdigit():
            raise InputError(
                f"--val-labels: {source}: line {line_number} of {GROUND_TRUTH} is {line!r}, "
                "not a class number"
            )
        if int(line) not in classes:
            raise InputError(
                f"--val-labels: {source}: line {line_number} of {GROUND_TRUTH} names class "
                f"{line}, which {META} does not list among its {len(classes)} classes "
                f"(IDs {min(classes, default=0)}..{max(classes, default=0)})"
            )
        synsets.append(classes[int(line)])
    return synsets
