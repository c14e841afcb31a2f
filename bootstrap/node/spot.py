"""Spot interruption notices (node.json `market` "spot"): the two-minute warning becomes the
trainer's coordinated SIGTERM checkpoint, and the head's DONE.json names the node.

Every training node polls its notice every POLL_S seconds. AWS answers
`GET meta-data/spot/instance-action` with 404 until an interruption is scheduled, then with
`{"action": "terminate", "time": "2026-11-25T14:02:00Z"}` about two minutes ahead
(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html).
On the first notice the node records it in runs/<run>/interruptions/<node_index>.json and sends
SIGTERM to its Horovod ranks: every rank stops at the same step and rank 0 saves a checkpoint
(docs/contracts.md, "Stopping a run"), well within the two minutes.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import threading
import time
import urllib.error
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

from bootstrap import aws
from bootstrap.fleet import supervision
from bootstrap.fleet.rendezvous import read_object
from bootstrap.lines import one_line
from bootstrap.node_config import TrainConfig
from bootstrap.records.files import this_attempts
from contract import runs
from contract.runs import parse_stamp_s, stamp_at

POLL_S = 5
NOTICE_PATH = "meta-data/spot/instance-action"
# The record must not eat the ranks' two minutes: an S3 outage costs the record, not the
# checkpoint (the SIGTERM follows whatever the put did).
RECORD_POLICY = aws.RetryPolicy(budget_s=20, max_delay_s=5)
# trainer/recorder.py's INTERRUPTED_FILE, mirrored: bootstrap never imports trainer/.
INTERRUPTED_FILE = "interrupted.json"


def imds_notice() -> dict | None:
    """The instance's interruption notice, or None while none is scheduled (IMDS answers 404)."""
    try:
        return json.loads(aws.imds(NOTICE_PATH))
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise


def file_notice(path: Path) -> dict | None:
    """The rehearsal's stand-in for IMDS: the notice is the file's JSON once it exists."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    return json.loads(text)


def notice_source(cfg: TrainConfig) -> Callable[[], dict | None]:
    if cfg.spot_notice_file:
        return partial(file_notice, Path(cfg.spot_notice_file))
    return imds_notice


def is_rank(argv: list[str]) -> bool:
    """A process that runs `python3 -m bootstrap.fleet.rank ...` itself. horovodrun, mpirun, ssh and the
    shells between carry the same words among their arguments, and must not get the SIGTERM:
    horovodrun and mpirun SIGKILL their ranks 5 s after their own."""
    return argv[1:3] == ["-m", "bootstrap.fleet.rank"]


def rank_processes(proc: Path = Path("/proc")) -> list[int]:
    """The pids of this machine's Horovod ranks: sshd's
    (or orted's) on a member. Only those in this process's network namespace: on an instance
    that is every one, and where several nodes share a kernel (the rehearsal's hosts are network
    namespaces) it is this node's."""
    own = os.readlink(proc / "self" / "ns" / "net")
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            network = os.readlink(entry / "ns" / "net")
        except OSError:  # gone since the listing, or not ours to inspect
            continue
        if is_rank(argv) and network == own:
            found.append(int(entry.name))
    return sorted(found)


def record_key(cfg: TrainConfig) -> str:
    return f"{cfg.runs_prefix}{runs.INTERRUPTIONS}{cfg.node_index}.json"


class SpotWatch(threading.Thread):
    """Polls the notice every interval_s until stopped; acts on the first one, once. A failed
    poll (IMDS unreachable, a half-written notice file) is logged the first time only and
    never ends the watch: the node must keep its chance to checkpoint."""

    def __init__(
        self,
        cfg: TrainConfig,
        s3,
        fetch: Callable[[], dict | None],
        *,
        ranks: Callable[[], list[int]] = rank_processes,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], object] | None = None,
        log: Callable[[str], None] = aws.log,
        interval_s: float = POLL_S,
    ):
        super().__init__(daemon=True, name="spot-watch")
        self.cfg, self.s3, self.fetch, self.ranks = cfg, s3, fetch, ranks
        self.clock, self.log, self.interval_s = clock, log, interval_s
        self.stopped = threading.Event()
        # The stop event's wait by default, so that stop() ends a sleep at once.
        self.sleep = sleep or self.stopped.wait
        self.failed_before = False

    def run(self) -> None:
        while not self.stopped.is_set() and not self.poll():
            self.sleep(self.interval_s)

    def poll(self) -> bool:
        """One look at the notice; True once it was acted on."""
        try:
            notice = self.fetch()
        except Exception as exc:
            if not self.failed_before:
                self.failed_before = True
                self.log(
                    "cannot read the Spot interruption notice, still polling every "
                    f"{self.interval_s:g} s (further errors are not logged): {one_line(exc)}"
                )
            return False
        if notice is None:
            return False
        self.act(notice if isinstance(notice, dict) else {})
        return True

    def act(self, notice: dict) -> None:
        noticed_at = stamp_at(self.clock())
        self.log(f"Spot interruption notice: {notice.get('action')} at {notice.get('time')}")
        try:
            self.record(notice, noticed_at)
        except Exception as exc:
            self.log(f"could not record the Spot interruption: {one_line(exc)}")
        self.stop_ranks()

    def record(self, notice: dict, noticed_at: str) -> None:
        doc = {
            "index": self.cfg.node_index,
            "instance_id": aws.instance_id(self.cfg),
            "ip": aws.private_ip(self.cfg),
            "action": notice.get("action"),
            "time": notice.get("time"),
            "noticed_at": noticed_at,
        }
        self.s3.put_object(
            Bucket=self.cfg.bucket,
            Key=record_key(self.cfg),
            Body=json.dumps(doc).encode(),
            ContentType="application/json",
        )

    def stop_ranks(self) -> None:
        signalled = []
        for pid in self.ranks():
            with contextlib.suppress(ProcessLookupError):  # ended on its own meanwhile
                os.kill(pid, signal.SIGTERM)
                signalled.append(pid)
        self.log(
            f"sent SIGTERM to {len(signalled)} Horovod rank process(es) on this node "
            f"(pids {', '.join(map(str, signalled)) or 'none'}): they checkpoint and stop"
        )

    def stop(self) -> None:
        self.stopped.set()
        self.join()


@contextlib.contextmanager
def watching(cfg: TrainConfig, s3=None, **injected) -> Iterator[SpotWatch | None]:
    """A SpotWatch running for the block's time on a Spot node; None (no thread) on-demand."""
    if cfg.market != "spot" or cfg.is_head:  # the head is on demand, whatever the nodes are
        yield None
        return
    s3 = s3 or aws.s3_client(cfg.region, RECORD_POLICY)
    injected.setdefault("fetch", notice_source(cfg))
    watch = SpotWatch(cfg, s3, **injected)
    watch.start()
    try:
        yield watch
    finally:
        watch.stop()


def interruptions_since(s3, cfg: TrainConfig, started: float) -> list[dict]:
    """The interruption records noticed since `started` (a previous attempt's are history), by
    node index."""
    prefix = f"{cfg.runs_prefix}{runs.INTERRUPTIONS}"
    found = []
    for name in aws.list_sizes(s3, cfg.bucket, prefix):
        body = read_object(s3, cfg.bucket, prefix + name)
        with contextlib.suppress(ValueError, TypeError, KeyError):
            doc = json.loads(body or b"")
            if parse_stamp_s(doc["noticed_at"]) >= math.floor(started):  # stamps are whole seconds
                found.append(doc)
    return sorted(found, key=lambda doc: doc.get("index", 0))


def interruption_reason(
    s3, cfg: TrainConfig, model_dir: Path, started: float, outputs_since: float
) -> str | None:
    """DONE.json's reason when this attempt's training ended in the trainer's coordinated stop
    (interrupted.json written since the restore) because of Spot notices of this attempt; None
    otherwise, so every other end keeps its reason."""
    stopped = this_attempts(model_dir / INTERRUPTED_FILE, outputs_since)
    if not stopped:
        return None
    try:
        records = interruptions_since(s3, cfg, started)
    except Exception as exc:  # the failure it would explain must still be reported
        aws.log(f"could not read the Spot interruption records: {one_line(exc)}")
        return None
    if not records:
        return None
    nodes = "; ".join(
        f"{supervision.name_node(doc)}, {doc.get('action')} at {doc.get('time')}" for doc in records
    )
    return (
        f"Spot interruption of {nodes}: every rank stopped at step {stopped.get('step')} and its "
        "checkpoint was saved"
    )
