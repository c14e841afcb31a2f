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

import contextlib
import hashlib
import re
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from bootstrap import aws, causes
from bootstrap.node_config import TrainConfig

SIDECAR = ".sha256"
STATE = "checkpoints/checkpoint"
# TensorFlow's file names for a checkpoint prefix (tensorflow/core/util/tensor_bundle: the
# .index file and the .data-<shard>-of-<shards> files).
CHECKPOINT_FILE = re.compile(r"^checkpoints/(?P<name>[^/]+?)\.(?:index|data-(\d{5})-of-(\d{5}))$")


class NoIntactCheckpoint(RuntimeError):
    """S3 holds checkpoints of the run and none of them is intact."""

    cause = causes.NO_INTACT_CHECKPOINT


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


# ---------------------------------------------------------------- the run's model dir and S3


def model_prefix(cfg: TrainConfig) -> str:
    return f"s3://{cfg.bucket}/{cfg.runs_prefix}model/"


class RefusedFreshStart(RuntimeError):
    """S3 holds the run's checkpoints, and this attempt could not put them where the trainer
    resumes from: training now would start the run over."""

    cause = causes.NO_INTACT_CHECKPOINT


CHECKPOINT_STATE = re.compile(r'^model_checkpoint_path:\s*"([^"]+)"', re.MULTILINE)


def check_resumable(cfg: TrainConfig, model_dir: Path, remote: dict[str, int]) -> None:
    """The trainer resumes from checkpoints/checkpoint's newest entry: if S3 holds a checkpoint,
    that entry and its index must be here, or the trainer would start over."""
    indexes = [k for k in remote if k.startswith("checkpoints/") and k.endswith(".index")]
    if not indexes:
        return
    state = model_dir / "checkpoints" / "checkpoint"
    found = CHECKPOINT_STATE.search(state.read_text()) if state.is_file() else None
    newest = Path(found.group(1)).name if found else None
    if newest is None or not (model_dir / "checkpoints" / f"{newest}.index").is_file():
        why = f"{newest}.index is not here" if newest else "checkpoints/checkpoint names none"
        raise RefusedFreshStart(
            f"S3 holds {len(indexes)} checkpoint(s) of run {cfg.run} in {model_prefix(cfg)}"
            f"checkpoints/ but this node cannot resume from them ({why}): refusing to start "
            f"run {cfg.run} over; to start a new run, deploy with another -c run=NAME"
        )


class ModelStore:
    """The run's model dir on this node and in S3 (runs/<run>/model/).

    Uploads are refused until this attempt has restored what S3 held (or seen that it held
    nothing): an attempt that never saw the run's checkpoints never overwrites them. Each upload
    copies only the files that changed since the last verified one."""

    def __init__(self, s3, cfg: TrainConfig, model_dir: Path, log=aws.log):
        self.s3, self.cfg, self.model_dir, self.log = s3, cfg, model_dir, log
        self.prefix = f"{cfg.runs_prefix}model/"
        self.restored = False
        self.uploaded: dict[str, tuple[int, int]] = {}

    def local_files(self) -> dict[str, tuple[int, int]]:
        if not self.model_dir.is_dir():
            return {}
        found = {}
        for path in self.model_dir.rglob("*"):
            # TensorFlow writes a checkpoint under <name>_temp/ and renames it when complete
            # (tensorflow/python/checkpoint/functional_saver.py, TF 2.15.1).
            if any("_temp" in part for part in path.relative_to(self.model_dir).parts):
                continue
            with contextlib.suppress(OSError):  # the trainer may delete an old checkpoint
                if path.is_file():
                    stat = path.stat()
                    found[str(path.relative_to(self.model_dir))] = (stat.st_size, stat.st_mtime_ns)
        return found

    def restore(self) -> bool:
        """Bring the run's model dir back from S3, verified, so the trainer resumes from its last
        checkpoint; returns whether S3 held anything. An S3 that cannot be listed, a copy that
        does not arrive, or checkpoints the trainer could not resume from stop the step."""
        self.model_dir.mkdir(parents=True, exist_ok=True)
        listed = aws.list_sizes(self.s3, self.cfg.bucket, self.prefix)
        # The sha256 sidecars are read from S3, not copied into the trainer's model dir.
        sidecars = {n for n in listed if is_sidecar(n)}
        remote = {n: size for n, size in listed.items() if n not in sidecars}
        for name in remote:  # S3 is the truth: a stale local file of the same size is not
            (self.model_dir / name).unlink(missing_ok=True)
        aws.download(
            self.cfg.bucket, self.prefix, remote, self.model_dir,
            f"restoring {model_prefix(self.cfg)}", note=self.log,
        )  # fmt: skip

        def recorded(name: str) -> str | None:
            if name + SIDECAR not in sidecars:
                return None
            key = f"{self.prefix}{name}{SIDECAR}"
            body = self.s3.get_object(Bucket=self.cfg.bucket, Key=key)["Body"].read()
            return body.decode().split()[0] if body.strip() else ""

        choose_intact(
            self.model_dir, remote, recorded, f"{model_prefix(self.cfg)}checkpoints/",
            self.cfg.run, self.log,
        )  # fmt: skip
        check_resumable(self.cfg, self.model_dir, remote)
        self.uploaded = {k: v for k, v in self.local_files().items() if k in remote}
        self.restored = True
        return bool(remote)

    def upload(self, policy: aws.RetryPolicy | None = None) -> int:
        """Copy what changed to S3, verified; returns how many files went up."""
        if not self.restored:
            self.log(
                f"not uploading {self.model_dir}: this attempt did not restore "
                f"{model_prefix(self.cfg)}, so it must not overwrite it"
            )
            return 0
        current = self.local_files()
        changed = [n for n, stamp in current.items() if self.uploaded.get(n) != stamp]
        s3 = self.s3.with_policy(policy) if policy else self.s3
        record_digests(
            lambda key, body: s3.put_object(
                Bucket=self.cfg.bucket, Key=f"{self.prefix}{key}", Body=body
            ),
            self.model_dir,
            changed,
        )
        aws.upload(
            self.s3, self.cfg.bucket, self.prefix, self.model_dir, changed,
            f"uploading {self.model_dir} to {model_prefix(self.cfg)}", policy, self.log,
        )  # fmt: skip
        self.uploaded.update({n: current[n] for n in changed})
        return len(changed)


class CheckpointSync(threading.Thread):
    """Copies the model dir to S3 while training runs, as soon as the trainer has written a
    checkpoint (TensorFlow's CheckpointManager rewrites checkpoints/checkpoint once the
    checkpoint's files are in place; looked at every WATCH_S) and at least every interval_s:
    the instance store does not survive a stop, and a restarted bootstrap resumes from S3."""

    WATCH_S = 2.0

    def __init__(self, store: ModelStore, interval_s: float, log):
        super().__init__(daemon=True)
        self.store, self.interval_s, self.log = store, interval_s, log
        self.stopped = threading.Event()

    def state_stamp(self) -> tuple[int, int] | None:
        try:
            stat = (self.store.model_dir / STATE).stat()
        except OSError:
            return None
        return stat.st_size, stat.st_mtime_ns

    def run(self) -> None:
        seen, synced_at = self.state_stamp(), time.monotonic()
        while not self.stopped.wait(min(self.WATCH_S, self.interval_s)):
            stamp = self.state_stamp()
            if stamp == seen and time.monotonic() - synced_at < self.interval_s:
                continue
            # Read before the upload: the trainer may name a newer one while it runs.
            newest = newest_named(self.store.model_dir)
            try:
                self.store.upload()
            except Exception as exc:  # the next round or the final upload retries
                self.log(f"checkpoint sync to S3 failed, retrying later: {aws.one_line(exc)}")
                continue
            synced_at = time.monotonic()
            if stamp != seen and newest:
                self.log(
                    f"checkpoint {newest} is in {model_prefix(self.store.cfg)}checkpoints/ "
                    "(a restarted or rerun attempt resumes from it)"
                )
            seen = stamp

    def stop(self) -> None:
        self.stopped.set()
        self.join()
