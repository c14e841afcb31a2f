"""The run's checkpoints in S3, verified: a sha256 recorded at upload, checked at restore.

Every checkpoint file (`checkpoints/<name>.index`, `checkpoints/<name>.data-NNNNN-of-NNNNN`)
gets a sidecar object `<file>.sha256` in S3 holding its hex digest, written before the file
itself: a file whose upload never finished is found absent, never unverified. A restore checks
the checkpoints newest first (by the step in `ckpt-<step>`) and points the trainer at the newest
intact one through `checkpoints/checkpoint`, saying in one line which ones it skipped and why.
The corrupt ones stay in S3 untouched (the trainer writes the same step again later, which
replaces them); nothing here deletes or overwrites an intact checkpoint. When none is intact the
restore stops: training now would start the run over.

Checkpoints uploaded before sidecars existed have none at all: they are taken as they are.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable
from pathlib import Path

SIDECAR = ".sha256"
STATE = "checkpoints/checkpoint"
# TensorFlow's file names for a checkpoint prefix (tensorflow/core/util/tensor_bundle: the
# .index file and the .data-<shard>-of-<shards> files).
CHECKPOINT_FILE = re.compile(r"^checkpoints/(?P<name>[^/]+?)\.(?:index|data-(\d{5})-of-(\d{5}))$")


class NoIntactCheckpoint(RuntimeError):
    """S3 holds checkpoints of the run and none of them is intact."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as source:
        while chunk := source.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def is_checkpoint_file(name: str) -> bool:
    return CHECKPOINT_FILE.match(name) is not None


def is_sidecar(name: str) -> bool:
    return name.endswith(SIDECAR)


def step_of(name: str) -> int:
    """The number TensorFlow's CheckpointManager puts after the prefix (ckpt-<step>)."""
    found = re.search(r"(\d+)$", name)
    return int(found.group(1)) if found else -1


def group(names: Iterable[str]) -> dict[str, list[str]]:
    """{checkpoint name: its files} for every checkpoint file among names."""
    groups: dict[str, list[str]] = {}
    for name in names:
        if found := CHECKPOINT_FILE.match(name):
            groups.setdefault(found.group("name"), []).append(name)
    return groups


def record_digests(
    put: Callable[[str, bytes], None], base: Path, names: Iterable[str]
) -> dict[str, str]:
    """Put `<name>.sha256` for every checkpoint file among names (relative to base); returns
    {name: digest}. Called before the files themselves go up."""
    digests = {}
    for name in names:
        if not is_checkpoint_file(name):
            continue
        try:
            digest = sha256_file(base / name)
        except OSError:  # the trainer deleted an old checkpoint meanwhile: nothing to upload
            continue
        put(name + SIDECAR, f"{digest}  {Path(name).name}\n".encode())
        digests[name] = digest
    return digests


def problem(
    model_dir: Path, files: list[str], recorded: Callable[[str], str | None], legacy: bool
) -> str | None:
    """Why this checkpoint is not intact, or None. `recorded(file)` is the digest S3 holds for
    a file (None: no sidecar)."""
    if not any(f.endswith(".index") for f in files):
        return "its .index is missing"
    shards = {CHECKPOINT_FILE.match(f).group(3) for f in files if ".data-" in f}
    present = {CHECKPOINT_FILE.match(f).group(2) for f in files if ".data-" in f}
    if len(shards) != 1 or len(present) != int(next(iter(shards))):
        return "some of its .data files are missing"
    for name in sorted(files):
        expected = recorded(name)
        if expected is None:
            if legacy:
                continue
            return f"no sha256 was recorded for {Path(name).name}"
        try:
            actual = sha256_file(model_dir / name)
        except OSError as exc:
            return f"{Path(name).name} cannot be read: {exc.strerror}"
        if actual != expected:
            return (
                f"sha256 of {Path(name).name} is {actual[:12]}..., recorded at upload "
                f"{expected[:12]}..."
            )
    return None


def newest_named(model_dir: Path) -> str | None:
    """The checkpoint checkpoints/checkpoint names as the newest (what the trainer resumes)."""
    state = model_dir / STATE
    if not state.is_file():
        return None
    found = re.search(r'^model_checkpoint_path:\s*"([^"]+)"', state.read_text(), re.MULTILINE)
    return Path(found.group(1)).name if found else None


def choose_intact(
    model_dir: Path,
    names: Iterable[str],
    recorded: Callable[[str], str | None],
    where: str,
    run: str,
    log: Callable[[str], None],
) -> str | None:
    """Verify the restored checkpoints newest first; point checkpoints/checkpoint at the newest
    intact one and return its name (None: S3 held no checkpoint). Raises NoIntactCheckpoint."""
    groups = group(names)
    if not groups:
        return None
    order = sorted(groups, key=step_of, reverse=True)
    digests = {f: recorded(f) for files in groups.values() for f in files}
    # A run whose checkpoints carry no sidecar at all was uploaded before they existed.
    legacy = all(d is None for d in digests.values())
    skipped: list[str] = []
    chosen = None
    for name in order:
        why = problem(model_dir, groups[name], digests.get, legacy)
        if why is None:
            chosen = name
            break
        skipped.append(f"{name} ({why})")
    if chosen is None:
        raise NoIntactCheckpoint(
            f"no intact checkpoint in {where}: {'; '.join(skipped)}; refusing to start run "
            f"{run} over (the files stay in S3; to start a new run, deploy with another -c run=NAME)"
        )
    if skipped:
        log(
            f"checkpoint(s) in {where} corrupt or incomplete, left in S3 untouched: "
            f"{'; '.join(skipped)}; resuming from {chosen}, the newest intact checkpoint"
        )
    if skipped or newest_named(model_dir) != chosen:
        kept = sorted((n for n in groups if step_of(n) <= step_of(chosen)), key=step_of)
        state = f'model_checkpoint_path: "{chosen}"\n' + "".join(
            f'all_model_checkpoint_paths: "{n}"\n' for n in kept
        )
        (model_dir / STATE).write_text(state)
    return chosen
