"""The run's checkpoints in S3, whole or not at all, and verified: a sha256 recorded at upload,
checked at restore.

An upload goes in TensorFlow's own order, each phase verified in S3 before the next: a sidecar
object `<file>.sha256` holding the hex digest of each new checkpoint file, then the `.data` files
(with the model dir's other files), then the `.index` files, then `checkpoints/checkpoint`, the
commit point. TensorFlow writes a checkpoint in that order too (see ModelStore.upload), so a
checkpoint that S3's state file names is whole in S3 unless something damaged it since, and one
it does not name is at worst an upload cut short.

A restore resumes from the newest whole checkpoint wherever its files are: in S3, or still on
this node's disk (a restarted bootstrap), a local file counting when its sha256 is the one its
sidecar in S3 holds. Such a file is kept, not downloaded again, and goes up to S3 again with the
next upload. The restore says in one line which newer checkpoints it skipped and why, and points
the trainer at the chosen one through `checkpoints/checkpoint`. Nothing in S3 is deleted or
overwritten by a restore; the skipped ones stay (the trainer writes the same step again later,
which replaces them). When nothing is whole: a run whose state file in S3 names a checkpoint
stops (training now would start it over); a run that never committed one is a new run.

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

from bootstrap import aws, causes, transfer
from bootstrap.fleet.supervision import NODE_STEPS_FILE
from bootstrap.lines import one_line
from bootstrap.node_config import TrainConfig

SIDECAR = ".sha256"
STATE = "checkpoints/checkpoint"
# TensorFlow's file names for a checkpoint prefix (tensorflow/core/util/tensor_bundle: the
# .index file and the .data-<shard>-of-<shards> files).
CHECKPOINT_FILE = re.compile(r"^checkpoints/(?P<name>[^/]+?)\.(?:index|data-(\d{5})-of-(\d{5}))$")
# The entries of a checkpoints/checkpoint file: model_checkpoint_path (the newest) and
# all_model_checkpoint_paths (CheckpointState, written by update_checkpoint_state_internal in
# tensorflow/python/checkpoint/checkpoint_management.py, TF 2.15.1).
STATE_ENTRY = re.compile(r'^(all_)?model_checkpoint_paths?:\s*"([^"]+)"', re.MULTILINE)


class NoIntactCheckpoint(RuntimeError):
    """S3 has committed checkpoints of the run and none of them is whole, there or here."""

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


def parse_state(text: str) -> tuple[str | None, set[str]]:
    """(the newest checkpoint, every checkpoint) a checkpoints/checkpoint file's text names."""
    entries = STATE_ENTRY.findall(text)
    newest = next((Path(p).name for every, p in entries if not every), None)
    return newest, {Path(p).name for _, p in entries}


def read_state(path: Path) -> tuple[str | None, set[str]]:
    """(the newest checkpoint, every checkpoint) a checkpoints/checkpoint file names."""
    try:
        return parse_state(path.read_text())
    except FileNotFoundError:
        return None, set()


def newest_named(model_dir: Path) -> str | None:
    """The checkpoint checkpoints/checkpoint names as the newest (what the trainer resumes)."""
    return read_state(model_dir / STATE)[0]


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
    files: list[str],
    recorded: Callable[[str], str | None],
    actual: Callable[[str], str],
    legacy: bool,
) -> str | None:
    """Why this checkpoint is not whole, or None. `recorded(file)` is the digest S3 holds for a
    file (None: no sidecar), `actual(file)` the sha256 of the file here."""
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
            found = actual(name)
        except OSError as exc:
            return f"{Path(name).name} cannot be read: {exc.strerror}"
        if found != expected:
            return (
                f"sha256 of {Path(name).name} is {found[:12]}..., recorded at upload "
                f"{expected[:12]}..."
            )
    return None


def choose_intact(
    model_dir: Path,
    names: Iterable[str],
    recorded: Callable[[str], str | None],
    committed: set[str],
    where: str,
    run: str,
    log: Callable[[str], None],
    actual: Callable[[str], str] | None = None,
) -> str | None:
    """Verify the checkpoints among names (files in model_dir) newest first; point
    checkpoints/checkpoint at the newest whole one and return its name. `committed`: the
    checkpoints S3's state file names. With nothing whole, None when nothing was ever committed
    (a new run: checkpoints/checkpoint is removed); else raises NoIntactCheckpoint."""
    groups = group(names)
    digests = {f: recorded(f) for files in groups.values() for f in files}
    # A run whose checkpoints carry no sidecar at all was uploaded before they existed.
    legacy = all(d is None for d in digests.values())
    actual = actual or (lambda name: sha256_file(model_dir / name))
    newest_committed = max(map(step_of, committed), default=-1)
    skipped: list[str] = []
    chosen = None
    for name in sorted(groups.keys() | committed, key=step_of, reverse=True):
        why = problem(groups.get(name, []), digests.get, actual, legacy)
        if why is None:
            chosen = name
            break
        cut = step_of(name) > newest_committed
        skipped.append(f"{name} ({'never committed: ' if cut else ''}{why})")
    if chosen is None:
        if committed:
            raise NoIntactCheckpoint(
                f"no intact checkpoint in {where}: {'; '.join(skipped)}; refusing to start run "
                f"{run} over (the files stay in S3; to start a new run, deploy with another "
                "-c run=NAME)"
            )
        if skipped:
            log(
                f"checkpoint(s) in {where} never committed (an upload cut short), left in S3 "
                f"untouched: {'; '.join(skipped)}; no whole checkpoint yet: run {run} starts "
                "from its first step"
            )
        (model_dir / STATE).unlink(missing_ok=True)
        return None
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
    """S3 has committed checkpoints of the run, and this attempt could not put them where the
    trainer resumes from: training now would start the run over."""

    cause = causes.NO_INTACT_CHECKPOINT


def check_resumable(cfg: TrainConfig, model_dir: Path, committed: set[str]) -> None:
    """The trainer resumes from checkpoints/checkpoint's newest entry: once S3's state file has
    committed a checkpoint, that entry and its index must be here, or the trainer would start
    over."""
    if not committed:
        return
    newest = newest_named(model_dir)
    if newest is None or not (model_dir / "checkpoints" / f"{newest}.index").is_file():
        why = f"{newest}.index is not here" if newest else "checkpoints/checkpoint names none"
        raise RefusedFreshStart(
            f"S3 holds {len(committed)} committed checkpoint(s) of run {cfg.run} in "
            f"{model_prefix(cfg)}checkpoints/ but this node cannot resume from them ({why}): "
            f"refusing to start run {cfg.run} over; to start a new run, deploy with another "
            "-c run=NAME"
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
        # The step of the checkpoint S3's state file names (-1: none): the commit point, which
        # an upload never moves back (a rank 0 that moved to a node holding only older ones).
        self.committed_step = -1

    def local_files(self) -> dict[str, tuple[int, int]]:
        if not self.model_dir.is_dir():
            return {}
        found = {}
        for path in self.model_dir.rglob("*"):
            # TensorFlow writes a checkpoint under <name>_temp/ and renames it when complete
            # (tensorflow/python/checkpoint/functional_saver.py, TF 2.15.1).
            if any("_temp" in part for part in path.relative_to(self.model_dir).parts):
                continue
            if path.name == NODE_STEPS_FILE:  # the node's own word, not an output of the run
                continue
            with contextlib.suppress(OSError):  # the trainer may delete an old checkpoint
                if path.is_file():
                    stat = path.stat()
                    found[str(path.relative_to(self.model_dir))] = (stat.st_size, stat.st_mtime_ns)
        return found

    def sidecar(self, name: str) -> str:
        """The sha256 recorded in S3 for a checkpoint file ("" for an empty sidecar)."""
        key = f"{self.prefix}{name}{SIDECAR}"
        body = self.s3.get_object(Bucket=self.cfg.bucket, Key=key)["Body"].read()
        return body.decode().split()[0] if body.strip() else ""

    def verified_here(self, recorded: dict[str, str]) -> dict[str, str]:
        """{file: sha256} of this node's checkpoint files whose sha256 S3 recorded."""
        found = {}
        for name in self.local_files():
            if name in recorded:
                with contextlib.suppress(OSError):
                    if (digest := sha256_file(self.model_dir / name)) == recorded[name]:
                        found[name] = digest
        return found

    def drop_newer_than(self, chosen: str | None) -> None:
        """Delete this node's checkpoints newer than the one the trainer resumes from: none is
        whole, and the next upload must not send them up as if the trainer had written them."""
        for name, files in group(self.local_files()).items():
            if chosen is None or step_of(name) > step_of(chosen):
                for file in files:
                    (self.model_dir / file).unlink(missing_ok=True)

    def restore(self) -> str | None:
        """Bring the run's model dir back, verified, so the trainer resumes from its newest whole
        checkpoint; returns that checkpoint's name, or None when the run has none yet. An S3 that
        cannot be listed, a copy that does not arrive, or committed checkpoints the trainer could
        not resume from stop the step."""
        self.model_dir.mkdir(parents=True, exist_ok=True)
        listed = aws.list_sizes(self.s3, self.cfg.bucket, self.prefix)
        # The sha256 sidecars are read from S3, not copied into the trainer's model dir.
        remote = {n: size for n, size in listed.items() if not is_sidecar(n)}
        recorded = {
            n.removesuffix(SIDECAR): self.sidecar(n.removesuffix(SIDECAR))
            for n in listed
            if is_sidecar(n)
        }
        kept = self.verified_here(recorded)
        # S3 is the truth for every other file: a stale local file of the same size is not. A
        # local checkpoint file that no sidecar vouches for goes too: uploaded later, it would
        # get a sidecar of its own and pass for the trainer's.
        local_checkpoints = {n for n in self.local_files() if is_checkpoint_file(n)}
        for name in (remote.keys() | local_checkpoints) - kept.keys():
            (self.model_dir / name).unlink(missing_ok=True)
        transfer.download(
            self.cfg.bucket, self.prefix, {n: s for n, s in remote.items() if n not in kept},
            self.model_dir, f"restoring {model_prefix(self.cfg)}", note=self.log,
        )  # fmt: skip
        newest_committed, committed = (
            read_state(self.model_dir / STATE) if STATE in remote else (None, set())
        )
        self.committed_step = step_of(newest_committed) if newest_committed else -1
        chosen = choose_intact(
            self.model_dir, remote.keys() | kept.keys(), recorded.get, committed,
            f"{model_prefix(self.cfg)}checkpoints/", self.cfg.run, self.log,
            lambda name: kept.get(name) or sha256_file(self.model_dir / name),
        )  # fmt: skip
        if here := [n for n in kept if group([n]).keys() == {chosen}]:
            self.log(
                f"{chosen}: {len(here)} of its files are taken from this node's disk, each with "
                "the sha256 recorded in S3, not downloaded again; they go up to S3 again"
            )
        self.drop_newer_than(chosen)
        check_resumable(self.cfg, self.model_dir, committed)
        self.uploaded = self.in_s3_after_restore(remote, kept, chosen)
        self.restored = True
        return chosen

    def in_s3_after_restore(
        self, remote: dict[str, int], kept: dict[str, str], chosen: str | None
    ) -> dict[str, tuple[int, int]]:
        """The stamps of the local files S3 already holds as they are. A file kept from this
        disk goes up again when it belongs to the checkpoint the trainer resumes from (S3's copy
        was not the one verified) or S3's copy is missing or of another size; the state file
        then goes up after it, so S3 ends with that checkpoint whole and committed."""
        local = self.local_files()
        again = {
            n for n in kept.keys() & local.keys()
            if group([n]).keys() == {chosen} or remote.get(n) != local[n][0]
        }  # fmt: skip
        uploaded = {n: stamp for n, stamp in local.items() if n in remote and n not in again}
        if again:
            uploaded.pop(STATE, None)
        return uploaded

    def state_snapshot(self) -> tuple[tuple[int, int], bytes] | None:
        """checkpoints/checkpoint's stamp and content (TensorFlow replaces it whole: written by
        file_io.atomic_write_string_to_file in checkpoint_management.py, TF 2.15.1)."""
        path = self.model_dir / STATE
        try:
            stat = path.stat()
            return (stat.st_size, stat.st_mtime_ns), path.read_bytes()
        except OSError:
            return None

    def upload(self, policy: aws.RetryPolicy | None = None) -> int:
        """Copy what changed to S3, each phase verified there before the next: the sha256
        sidecars, the .data files (and the model dir's other files), the .index files, and last
        checkpoints/checkpoint, which commits them. TensorFlow's own order: a bundle's .data
        files before its .index (MergeBundles in tensorflow/core/util/tensor_bundle/
        tensor_bundle.cc), the state file after both (CheckpointManager.save registers
        _record_and_sweep_state as a write callback, which Checkpoint._write runs after
        self._saver.save: tensorflow/python/checkpoint/checkpoint_management.py and
        checkpoint.py, https://github.com/tensorflow/tensorflow/tree/v2.15.1). Returns how many
        files went up."""
        if not self.restored:
            self.log(
                f"not uploading {self.model_dir}: this attempt did not restore "
                f"{model_prefix(self.cfg)}, so it must not overwrite it"
            )
            return 0
        # Read before the listing: TensorFlow writes the state file after the checkpoint it
        # names, so every file it names is in the listing below.
        state = self.state_snapshot()
        current = {n: stamp for n, stamp in self.local_files().items() if n != STATE}
        changed = sorted(n for n, stamp in current.items() if self.uploaded.get(n) != stamp)
        s3 = self.s3.with_policy(policy) if policy else self.s3

        def put(key: str, body: bytes) -> None:
            s3.put_object(Bucket=self.cfg.bucket, Key=f"{self.prefix}{key}", Body=body)

        record_digests(put, self.model_dir, changed)
        indexes = [n for n in changed if is_checkpoint_file(n) and n.endswith(".index")]
        for names in ([n for n in changed if n not in indexes], indexes):
            transfer.upload(
                self.s3, self.cfg.bucket, self.prefix, self.model_dir, names,
                f"uploading {self.model_dir} to {model_prefix(self.cfg)}", policy, self.log,
            )  # fmt: skip
        self.uploaded.update({n: current[n] for n in changed})
        if state is None or self.uploaded.get(STATE) == state[0]:
            return len(changed)
        self.uploaded[STATE] = state[0]
        newest = parse_state(state[1].decode(errors="replace"))[0]
        if newest is None or step_of(newest) < self.committed_step:
            # S3's commit point never moves back: its state file names a newer checkpoint,
            # whole in S3, than this one (rank 0 moved to a node that holds only older ones).
            # The trainer's next save, newer than both, commits again.
            self.log(
                f"not committing {newest or 'no checkpoint'} in {model_prefix(self.cfg)}"
                f"checkpoints/checkpoint: it names step {self.committed_step} already, newer"
            )
            return len(changed)
        put(STATE, state[1])
        self.committed_step = step_of(newest)
        return len(changed) + 1


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
                self.log(f"checkpoint sync to S3 failed, retrying later: {one_line(exc)}")
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
