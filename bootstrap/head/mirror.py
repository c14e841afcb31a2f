"""Rank 0's model dir on the head: the head is the one writer of runs/<run>/model/ in S3.

Rank 0 writes the checkpoints, progress.json, train.json, eval.json, tensorboard/ and resets.json
into its node's --model-dir, and rank 0 moves to another node when its node is lost. The head
copies that dir into its own over ssh (it has ssh to every node): from the node whose
progress.json is newest (rank 0's now), every MIRROR_S and once more after horovodrun ends.
ModelStore's uploads, the progress watchdog and status.json read the head's copy.

The copy keeps TensorFlow's order, on which ModelStore.upload relies (bootstrap/head/
checkpoints.py): the listing reads checkpoints/checkpoint before it lists the files, so every
checkpoint the state file names is whole in the listing (TensorFlow writes the state file after
the files), and the head writes that state file last, once the files it names are in place.
Each file arrives under a temporary name and is renamed into place whole.

`python3 -m bootstrap.head.mirror list DIR` is the node's side: one line of JSON.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO

from bootstrap import aws
from bootstrap.fleet.supervision import NODE_STEPS_FILE
from bootstrap.head.checkpoints import parse_state, step_of
from bootstrap.lines import one_line

STATE = "checkpoints/checkpoint"  # TensorFlow's state file: the commit point
PROGRESS = "progress.json"  # rank 0 rewrites it at each log step (docs/contracts.md)
MIRROR_S = 5.0
LIST_TIMEOUT_S = 30
COPY_TIMEOUT_S = 600  # a checkpoint of a large model over a slow link
PARTIAL = ".mirror-partial"
# The state file goes last, by itself; node-steps.json is the node's own (its local rank 0's
# word that its ranks step: bootstrap/fleet/supervision.py), not rank 0's output.
NOT_COPIED = (STATE, NODE_STEPS_FILE)
CHECKPOINT_PREFIX = "checkpoints/"


def listing(model_dir: Path) -> dict:
    """The node's side: checkpoints/checkpoint's content (read first), then every file's size
    and modification time, relative to model_dir."""
    try:
        state = (model_dir / STATE).read_text()
    except (FileNotFoundError, NotADirectoryError):
        state = None
    files = {}
    for path in sorted(model_dir.rglob("*")) if model_dir.is_dir() else []:
        with contextlib.suppress(FileNotFoundError):  # the trainer deleted it meanwhile
            info = path.stat()
            name = path.relative_to(model_dir).as_posix()
            if path.is_file() and name not in NOT_COPIED and not name.endswith(PARTIAL):
                files[name] = [info.st_size, info.st_mtime_ns]
    return {"state": state, "files": files}


def state_names(state: str | None) -> set[str]:
    """The checkpoint prefixes a state file names (model_checkpoint_path and
    all_model_checkpoint_paths; their files are <prefix>.index and <prefix>.data-*)."""
    names = set()
    for line in (state or "").splitlines():
        if ":" in line and line.split(":")[0].strip().endswith(("_path", "_paths")):
            names.add(Path(line.split(":", 1)[1].strip().strip('"')).name)
    return names


def newest_step(state: str | None) -> int:
    """The step of the checkpoint a state file names as the newest (-1: none)."""
    newest = parse_state(state or "")[0]
    return step_of(newest) if newest else -1


def checkpoint_name(name: str) -> str:
    """`checkpoints/ckpt-40.index` -> `ckpt-40` (what step_of reads)."""
    return Path(name).name.split(".")[0]


def read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except (FileNotFoundError, NotADirectoryError):
        return None


def names_checkpoint(name: str, prefixes: set[str]) -> bool:
    stem = Path(name).name
    return any(stem == f"{p}.index" or stem.startswith(f"{p}.data-") for p in prefixes)


class Ssh:
    """ssh to a node as horovodrun does (the run's key, the nodes' port), with keep-alives and
    no questions: the command runs in the node's login shell, from the app's directory."""

    def __init__(self, key: Path, port: int, ssh: str = "ssh"):
        self.key, self.port, self.ssh = key, port, ssh
        self.app = Path(__file__).resolve().parents[2]

    def command(self, host: str, remote: str) -> list[str]:
        return [
            self.ssh, "-p", str(self.port), "-i", str(self.key),
            "-o", "BatchMode=yes", "-o", "PasswordAuthentication=no",
            "-o", "StrictHostKeyChecking=no", "-o", "ServerAliveInterval=5",
            "-o", "ServerAliveCountMax=3", "-o", "ConnectTimeout=10",
            host, remote,
        ]  # fmt: skip

    def reach(self, host: str, timeout_s: float = 15) -> str | None:
        """None when `true` runs on the host over ssh within timeout_s, else why not (ssh's last
        words): what horovodrun's start of a rank there needs."""
        try:
            result = subprocess.run(
                self.command(host, "true"), capture_output=True, text=True, timeout=timeout_s,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            return f"ssh {host} did not answer within {timeout_s:.0f} s"
        if result.returncode != 0:
            said = (result.stderr.strip().splitlines() or [""])[-1]
            return f"ssh {host} exited {result.returncode}" + (f": {said}" if said else "")
        return None

    def python(self, module_args: str) -> str:
        """A remote command running this bootstrap's Python (the same path on every node: one
        image, or the rehearsal's one checkout)."""
        return f"cd {shlex.quote(str(self.app))} && {shlex.quote(sys.executable)} -m {module_args}"


class Mirror(threading.Thread):
    """Copies rank 0's model dir from its node to local_dir every MIRROR_S until stopped."""

    def __init__(
        self,
        ssh: Ssh,
        hosts: Callable[[], list[str]],
        local_dir: Path,
        remote_dir: Path,
        *,
        source: str | None = None,
        interval_s: float = MIRROR_S,
        log: Callable[[str], None] = aws.log,
    ):
        super().__init__(daemon=True, name="mirror")
        self.ssh, self.hosts, self.local_dir, self.remote_dir = ssh, hosts, local_dir, remote_dir
        self.source, self.interval_s, self.log = source, interval_s, log
        self.stopped = threading.Event()
        self.lock = threading.Lock()  # one copy at a time: the thread's and the final one
        self.copied: dict[str, list[int]] = {}  # name -> [size, mtime_ns] at the source
        self.failing = False
        self.finished = False

    def run(self) -> None:
        while not self.stopped.wait(self.interval_s):
            self.sync()

    def sync(self) -> str | None:
        """One round: find rank 0's node, copy what changed; returns the node, or None when no
        node answered. A failed round is logged once until one works."""
        with self.lock:
            try:
                source = self.round()
                self.failing = False
                return source
            except Exception as exc:
                if not self.failing:
                    self.log(f"mirror: cannot copy rank 0's outputs yet: {one_line(exc)}")
                self.failing = True
                return None

    def stop(self) -> None:
        self.stopped.set()

    def final(self) -> str | None:
        """After horovodrun ended: stop the thread, then copy once more, from the node that held
        rank 0 last (its host may have left the discovery since). Once: a second call returns
        where the copy came from."""
        if self.finished:
            return self.source
        self.stop()
        if self.is_alive():
            self.join()
        self.finished = True
        return self.sync()

    def round(self) -> str | None:
        hosts = list(dict.fromkeys([*self.hosts(), *([self.source] if self.source else [])]))
        listings = self.list_all(hosts)
        if not listings:
            return None
        source = max(
            listings,
            key=lambda h: (listings[h]["files"].get(PROGRESS, [0, -1])[1], h == self.source),
        )
        if source != self.source:
            self.log(f"mirror: rank 0's outputs are on {source} now (its progress.json is newest)")
            self.source, self.copied = source, {}
        self.copy(source, listings[source])
        return source

    def list_all(self, hosts: list[str]) -> dict[str, dict]:
        remote = self.ssh.python(f"bootstrap.head.mirror list {shlex.quote(str(self.remote_dir))}")

        def one(host: str) -> dict | None:
            result = subprocess.run(
                self.ssh.command(host, remote), capture_output=True, text=True,
                timeout=LIST_TIMEOUT_S, stdin=subprocess.DEVNULL,
            )  # fmt: skip
            if result.returncode != 0:
                return None
            return json.loads(result.stdout.strip().splitlines()[-1])

        with ThreadPoolExecutor(max_workers=8) as pool:
            answers = dict(zip(hosts, pool.map(_quietly(one), hosts), strict=True))
        return {host: answer for host, answer in answers.items() if answer is not None}

    def copy(self, host: str, found: dict) -> None:
        """The files that changed at the source, then its state file; drops the checkpoints the
        source deleted (the trainer keeps a few) unless the new state file names them.

        Never back: when rank 0 moved to a node that holds only older checkpoints (its own node
        lost), the head keeps its newer ones and its state file until the new rank 0 saves one
        at least as new (the uploads take the state file here as the commit point)."""
        changed = sorted(n for n, stamp in found["files"].items() if self.copied.get(n) != stamp)
        if changed:
            self.fetch(host, changed)
            self.copied.update({n: found["files"][n] for n in changed})
        named = state_names(found["state"])
        files_named = [n for n in found["files"] if names_checkpoint(n, named)]
        whole = all(f"{CHECKPOINT_PREFIX}{p}.index" in files_named for p in named) and all(
            (self.local_dir / n).exists() for n in files_named
        )
        newest_there = newest_step(found["state"])
        behind = newest_there < newest_step(read_text(self.local_dir / STATE))
        if found["state"] is not None and whole and not behind:
            write_whole(self.local_dir / STATE, io.BytesIO(found["state"].encode()))
        for path in list((self.local_dir / "checkpoints").glob("*")):
            name = path.relative_to(self.local_dir).as_posix()
            dropped = name not in found["files"] and not names_checkpoint(name, named)
            if name != STATE and dropped and step_of(checkpoint_name(name)) <= newest_there:
                path.unlink(missing_ok=True)
                self.copied.pop(name, None)

    def fetch(self, host: str, names: list[str]) -> None:
        """One ssh that tars the files at the source; each arrives whole under its name. A file
        the trainer deleted since the listing is skipped (GNU tar --ignore-failed-read)."""
        quoted = " ".join(shlex.quote(n) for n in names)
        remote = (
            f"cd {shlex.quote(str(self.remote_dir))} && tar --ignore-failed-read -cf - -- {quoted}"
        )
        with subprocess.Popen(
            self.ssh.command(host, remote), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
        ) as proc:  # fmt: skip
            try:
                with tarfile.open(fileobj=proc.stdout, mode="r|") as archive:
                    for member in archive:
                        if member.isfile() and _inside(member.name):
                            write_whole(self.local_dir / member.name, archive.extractfile(member))
                proc.wait(COPY_TIMEOUT_S)
            finally:
                if proc.poll() is None:
                    proc.kill()
            error = proc.stderr.read().decode(errors="replace").strip()
        if proc.returncode != 0:
            raise RuntimeError(f"ssh {host} exited {proc.returncode}: {error[-300:]}")


def push_all(ssh: Ssh, hosts: list[str], local_dir: Path, remote_dir: Path) -> None:
    """push() to every host at once: whichever holds rank 0 resumes from the restored
    checkpoints, and no node keeps one of its own that S3 does not vouch for."""
    with ThreadPoolExecutor(max_workers=8) as pool:
        for done in [pool.submit(push, ssh, host, local_dir, remote_dir) for host in hosts]:
            done.result()


def push_newer(ssh: Ssh, hosts: list[str], local_dir: Path, remote_dir: Path) -> list[str]:
    """push() the head's checkpoints to each host whose newest is older than the head's (or that
    did not answer the listing: push says why it fails); returns the hosts pushed to. Before a
    horovodrun started again: its trainer resumes from the newest checkpoint on any rank's disk
    (trainer/resume.py restore_newest_anywhere), and the head may hold the newest (the mirror
    copied it from a rank 0 whose node is lost since). A node holding one at least as new keeps
    its own."""
    here = newest_step(read_text(local_dir / STATE))
    if here < 0:
        return []
    listings = Mirror(ssh, lambda: hosts, local_dir, remote_dir, log=lambda line: None).list_all(
        hosts
    )
    behind = [h for h in hosts if h not in listings or newest_step(listings[h]["state"]) < here]
    with ThreadPoolExecutor(max_workers=8) as pool:
        for done in [pool.submit(push, ssh, host, local_dir, remote_dir) for host in behind]:
            done.result()
    return behind


def push(ssh: Ssh, host: str, local_dir: Path, remote_dir: Path, timeout_s: float = 600) -> None:
    """Put the head's checkpoints (the restored ones, or none) into a node's model dir,
    replacing its own."""
    remote = shlex.quote(str(remote_dir))
    command = ssh.command(
        host, f"rm -rf {remote}/checkpoints && mkdir -p {remote} && tar -C {remote} -xf -"
    )
    with subprocess.Popen(command, stdin=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        try:
            with tarfile.open(fileobj=proc.stdin, mode="w|") as archive:
                if (local_dir / "checkpoints").is_dir():
                    archive.add(local_dir / "checkpoints", arcname="checkpoints")
            proc.stdin.close()
        except BrokenPipeError:  # ssh ended early: its exit code and words say why
            pass
        proc.wait(timeout_s)
        error = proc.stderr.read().decode(errors="replace").strip()
    if proc.returncode != 0:
        raise RuntimeError(f"copying the checkpoints to {host} failed: {error[-300:]}")


def write_whole(path: Path, body: BinaryIO) -> None:
    """Write under a temporary name, then rename: a reader sees the whole file or none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + PARTIAL)
    with partial.open("wb") as out:
        shutil.copyfileobj(body, out, 1 << 20)
    os.replace(partial, path)


def _inside(name: str) -> bool:
    """A member name the copy may write: relative, without `..` (a node's tar is trusted, but
    a path outside the model dir is never written)."""
    parts = Path(name).parts
    return bool(parts) and not Path(name).is_absolute() and ".." not in parts


def _quietly(function):
    def call(host):
        try:
            return function(host)
        except (subprocess.TimeoutExpired, ValueError, IndexError):
            return None

    return call


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "list":
        print("usage: python3 -m bootstrap.head.mirror list MODEL_DIR", file=sys.stderr)
        sys.exit(2)
    print(json.dumps(listing(Path(sys.argv[2]))))
