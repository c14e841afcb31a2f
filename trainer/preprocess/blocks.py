"""The inputs of trainer.preprocess cut into units, and units into blocks that own shards.

A unit is a contiguous piece of one split's input read in one go: a per-synset tar inside the
train archive, a run of validation-tar members, or (some of) a class folder's files. Blocks are
contiguous runs of units, each owning a contiguous range of shards; image j of a block goes to
shard first + j % count. Everything here depends only on the inputs and the shard counts, so
every run, and every restart, assigns each image to the same shard.
Tested by: .venv/bin/python -m pytest tests/trainer/test_preprocess_local.py
"""

import hashlib
import itertools
import json
import math
import os
import random
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass

from trainer.preprocess.archives import (
    InputError,
    TarMember,
    list_tar,
    members_in_range,
    open_range,
    read_small,
    tar_images,
)
from trainer.preprocess.devkit import DEVKIT_NAME, GROUND_TRUTH, devkit_synsets, is_archive

VAL_RUN_MEMBERS = 256  # validation-tar members read with one ranged read
CARVE_SEED = "horovod-fleet/val-per-class"


@dataclass(frozen=True)
class SynsetTar:
    """One per-synset tar inside the train archive."""

    archive: str
    member: TarMember
    synset: str

    @property
    def key(self) -> str:
        return f"{self.member.name}@{self.member.offset_data}+{self.member.size}"

    @property
    def weight(self) -> int:
        return self.member.size

    def images(self, client) -> Iterator[tuple[str, bytes, str]]:
        start = self.member.offset_data
        with open_range(self.archive, start, start + self.member.size, client) as stream:
            try:
                for name, data in tar_images(stream):
                    yield name, data, self.synset
            except tarfile.TarError as exc:
                raise InputError(f"--train-tar: {self.member.name} is damaged: {exc}") from None


@dataclass(frozen=True)
class TarRun:
    """Consecutive members of the flat validation archive, with their ground-truth synsets."""

    archive: str
    members: tuple[TarMember, ...]
    synsets: tuple[str, ...]

    @property
    def key(self) -> str:
        first, last = self.members[0], self.members[-1]
        return f"{first.name}..{last.name}@{first.offset_data}+{len(self.members)}"

    @property
    def weight(self) -> int:
        return sum(member.size for member in self.members)

    def images(self, client) -> Iterator[tuple[str, bytes, str]]:
        start, last = self.members[0].offset_data, self.members[-1]
        with open_range(self.archive, start, last.offset_data + last.size, client) as stream:
            for (name, data), synset in zip(
                members_in_range(stream, start, self.members), self.synsets, strict=True
            ):
                yield name, data, synset


@dataclass(frozen=True)
class FolderFiles:
    """Some files of one class folder in an extracted tree."""

    synset: str
    paths: tuple[str, ...]
    sizes: tuple[int, ...]

    @property
    def key(self) -> str:
        return f"{self.synset}:{len(self.paths)}:{self.weight}"

    @property
    def weight(self) -> int:
        return sum(self.sizes)

    def images(self, client) -> Iterator[tuple[str, bytes, str]]:
        for path in self.paths:
            with open(path, "rb") as f:
                yield os.path.basename(path), f.read(), self.synset


@dataclass(frozen=True)
class Block:
    split: str
    index: int
    units: tuple
    first_shard: int
    shard_count: int
    total_shards: int

    @property
    def shard_names(self) -> list[str]:
        return [
            f"{self.split}-{shard:05d}-of-{self.total_shards:05d}"
            for shard in range(self.first_shard, self.first_shard + self.shard_count)
        ]


def plan_blocks(split: str, units: list, total_shards: int, shards_per_block: int) -> list[Block]:
    """Contiguous runs of units, each owning a contiguous range of shards; never an empty block."""
    assert units, f"no {split} input"
    count = min(math.ceil(total_shards / shards_per_block), len(units), total_shards)
    bounds = [(k * len(units) // count, k * total_shards // count) for k in range(count + 1)]
    blocks = [
        Block(split, k, tuple(units[u0:u1]), s0, s1 - s0, total_shards)
        for k, ((u0, s0), (u1, s1)) in enumerate(itertools.pairwise(bounds))
    ]
    assert sum(b.shard_count for b in blocks) == total_shards and all(b.units for b in blocks)
    return blocks


def block_fingerprint(
    block: Block, label_map: dict[str, int], short_side: int, quality: int
) -> str:
    """What a shard's content depends on; a sidecar with another fingerprint is stale."""
    identity = [
        block.split,
        block.index,
        block.first_shard,
        block.shard_count,
        block.total_shards,
        [unit.key for unit in block.units],
        sorted(label_map.items()),
        short_side,
        quality,
    ]
    return hashlib.sha256(json.dumps(identity).encode()).hexdigest()


def _listed(flag: str, source: str, client) -> list[TarMember]:
    try:
        return list_tar(source, client)
    except tarfile.TarError as exc:  # "unexpected end of data" when the archive is cut short
        raise InputError(f"{flag}: {source} is not a readable tar archive: {exc}") from None


def train_tar_units(archive: str, client) -> list[SynsetTar]:
    units = []
    for member in _listed("--train-tar", archive, client):
        base = os.path.basename(member.name)
        if not base.endswith(".tar"):
            raise InputError(f"--train-tar: member {member.name} is not a per-synset .tar")
        units.append(SynsetTar(archive, member, base.removesuffix(".tar")))
    if not units:
        raise InputError(f"--train-tar: {archive} holds no per-synset tars")
    return units


def tree_classes(tree: str) -> dict[str, list[os.DirEntry]]:
    """Each class folder's image files (sorted by name) in an extracted tree."""
    if not os.path.isdir(tree):
        raise InputError(f"--train-dir: not a directory: {tree}")
    classes = {}
    for folder in sorted(os.scandir(tree), key=lambda entry: entry.name):
        if folder.is_dir() and not folder.name.startswith("."):
            files = [
                e for e in os.scandir(folder.path) if e.is_file() and not e.name.startswith(".")
            ]
            classes[folder.name] = sorted(files, key=lambda entry: entry.name)
    if not classes:
        raise InputError(f"--train-dir: {tree} has no class folders")
    return classes


def carve_validation(synset: str, files: list, per_class: int) -> tuple[list, list]:
    """(train, validation): a seeded random per_class files go to validation; one stays in train."""
    chosen = set(
        random.Random(f"{CARVE_SEED}:{synset}").sample(
            range(len(files)), min(per_class, len(files) - 1)
        )
    )
    return (
        [f for i, f in enumerate(files) if i not in chosen],
        [f for i, f in enumerate(files) if i in chosen],
    )


def _folder(synset: str, entries: list[os.DirEntry]) -> FolderFiles:
    return FolderFiles(
        synset, tuple(e.path for e in entries), tuple(e.stat().st_size for e in entries)
    )


def tree_units(
    tree: str, min_images_per_class: int, val_per_class: int
) -> tuple[list[FolderFiles], list[FolderFiles]]:
    """(train, validation) units of a class-per-folder tree, small classes dropped."""
    train, validation = [], []
    for synset, files in tree_classes(tree).items():
        if len(files) < max(min_images_per_class, 1):
            continue
        kept, carved = carve_validation(synset, files, val_per_class)
        train.append(_folder(synset, kept))
        if carved:
            validation.append(_folder(synset, carved))
    if not train:
        wanted = f"at least {min_images_per_class} images" if min_images_per_class else "any image"
        raise InputError(f"--train-dir: no class folder in {tree} holds {wanted}")
    return train, validation


def val_tar_units(val_tar: str, val_labels: str, label_map: dict[str, int], client) -> list[TarRun]:
    """Runs of validation-tar members labelled from the ground truth (file-name order): one
    synset per line, or the devkit's archive (devkit.py)."""
    members = _listed("--val-tar", val_tar, client)
    raw = read_small(val_labels, client)
    if is_archive(raw):
        synsets = devkit_synsets(raw, os.path.basename(val_labels))
        what = f"the devkit's {GROUND_TRUTH}"
    else:
        try:
            synsets = raw.decode().split()
        except UnicodeDecodeError:
            raise InputError(f"--val-labels: {val_labels} is not a text file") from None
        what = "--val-labels"
    if len(synsets) != len(members):
        raise InputError(f"{what} has {len(synsets)} lines but --val-tar has {len(members)} images")
    unknown = sorted(set(synsets) - set(label_map))
    if unknown and all(label.isdigit() for label in synsets):
        # The devkit's ILSVRC2012_validation_ground_truth.txt numbers the classes 1 to 1000
        # (its meta.mat names each number's synset): the same file name, not the same labels.
        raise InputError(
            f"--val-labels holds class numbers ({synsets[0]}, ...), as the devkit's ground truth "
            f"does; give the devkit itself ({DEVKIT_NAME}), whose meta.mat names each number's "
            "synset, or one synset per line (n01440764, ...), in file-name order"
        )
    if unknown:
        raise InputError(f"{what} names synsets not in the train input, e.g. {unknown[0]}")
    synset_of = dict(zip(sorted(member.name for member in members), synsets, strict=True))
    runs = [members[i : i + VAL_RUN_MEMBERS] for i in range(0, len(members), VAL_RUN_MEMBERS)]
    return [TarRun(val_tar, tuple(run), tuple(synset_of[m.name] for m in run)) for run in runs]
