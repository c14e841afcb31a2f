"""A node's own failure, told to the head: runs/<run>/failures/<index>.json (docs/contracts.md).

The head writes the attempt's DONE.json; a node that fails (its data pull found a corrupt
shard, its health check failed, its disk filled) writes what failed where the head reads it,
and the head decides: a failure that would fail on any node (the dataset differs from its
manifest, the image is not the expected one, ...: causes.FLEET_WIDE) ends the attempt with the
node's cause and reason; any other costs that node (an elastic reset, or the attempt before
training) as its loss would.
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
from collections.abc import Callable

from bootstrap import aws
from bootstrap.fleet.rendezvous import read_object
from bootstrap.lines import one_line
from bootstrap.node_config import TrainConfig
from contract import causes, runs
from contract.runs import parse_stamp_s, stamp_at

PREFIX = runs.FAILURES
WATCH_S = 5.0


class NodeFailed(RuntimeError):
    """A node's failure ended the attempt: its cause, its reason."""

    def __init__(self, reason: str, cause: str):
        super().__init__(reason)
        self.cause = cause


def write(s3, cfg: TrainConfig, ip: str, instance_id: str, cause: str, reason: str, now: float):
    doc = {
        "node": cfg.node_index,
        "instance_id": instance_id,
        "ip": ip,
        "cause": cause,
        "reason": reason,
        "at": stamp_at(now),
    }
    key = f"{cfg.runs_prefix}{PREFIX}{cfg.node_index}.json"
    s3.put_object(Bucket=cfg.bucket, Key=key, Body=json.dumps(doc).encode())


def read_since(s3, cfg: TrainConfig, since: float) -> list[dict]:
    """The nodes' failure records written since `since` (an earlier attempt's are history)."""
    prefix = f"{cfg.runs_prefix}{PREFIX}"
    found = []
    for name in aws.list_sizes(s3, cfg.bucket, prefix):
        with contextlib.suppress(ValueError, KeyError, TypeError):
            doc = json.loads(read_object(s3, cfg.bucket, prefix + name) or b"")
            if parse_stamp_s(doc["at"]) >= math.floor(since):  # stamps are whole seconds
                found.append(doc)
    return sorted(found, key=lambda doc: doc["at"])


def named(doc: dict) -> str:
    return f"node {doc.get('node')} ({doc.get('instance_id')}, {doc.get('ip')})"


def as_failure(doc: dict) -> NodeFailed:
    cause = doc.get("cause") if doc.get("cause") in causes.CAUSES else causes.UNKNOWN
    return NodeFailed(f"{named(doc)} failed: {doc.get('reason')}", cause)


class Watch(threading.Thread):
    """Reads the failure records every WATCH_S while the head waits or trains; the first one
    that ends the attempt (ends(doc)) is kept in `ended` and on_end() is called once."""

    def __init__(
        self,
        cfg: TrainConfig,
        s3,
        since: float,
        ends: Callable[[dict], bool] = lambda doc: True,
        log: Callable[[str], None] = aws.log,
    ):
        super().__init__(daemon=True, name="node-failures")
        self.cfg, self.s3, self.since, self.ends, self.log = cfg, s3, since, ends, log
        self.ended: NodeFailed | None = None
        self.on_end: Callable[[], None] = lambda: None
        self.seen: set[str] = set()
        self.stopped = threading.Event()

    def check(self) -> None:
        """One look; raises the failure that ends the attempt (also what `ended` holds)."""
        if self.ended is None:
            for doc in read_since(self.s3, self.cfg, self.since):
                if doc["at"] + str(doc.get("node")) in self.seen:
                    continue
                self.seen.add(doc["at"] + str(doc.get("node")))
                self.log(f"{named(doc)} reported: {doc.get('reason')} (cause {doc.get('cause')})")
                if self.ends(doc):
                    self.ended = as_failure(doc)
                    self.on_end()
                    break
        if self.ended is not None:
            raise self.ended

    def run(self) -> None:
        while not self.stopped.wait(WATCH_S):
            try:
                self.check()
            except NodeFailed:
                return
            except Exception as exc:  # S3 down: the next look retries
                self.log(f"cannot read the nodes' failure records: {one_line(exc)}")

    def stop(self) -> None:
        self.stopped.set()
