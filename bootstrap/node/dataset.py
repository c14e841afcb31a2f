"""The node's dataset pull, beside its start-up: it registers as soon as its own shards are
verified, so the rendezvous, the allreduce check and the trainer's start run while the rest of
the dataset arrives (docs/contracts.md, "Start-up, resets and goodput").

What the node holds is what its registration says (`shards`): "own" (the shards its ranks read
in the fleet's first world) or "all". A failure of the pull is kept and raised, as the data
pull's failure, by whichever step of the node looks next (wait_own, check, wait_all), and
passed to whoever asked to hear of it (on_failure: the one who started a training ends it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from bootstrap import aws, causes
from bootstrap.fleet import rendezvous, supervision
from bootstrap.lines import REASON_LIMIT, one_line
from bootstrap.node import data_pull
from bootstrap.node.phases import PhaseRecord
from bootstrap.node_config import TrainConfig
from bootstrap.steps import StepFailed

STEP = "data pull"
OWN, ALL = "own", "all"


class DatasetPull(threading.Thread):
    def __init__(
        self,
        bucket: str,
        prefix: str,
        data_dir: Path,
        own: Callable[[dict], set[str]],
        record: PhaseRecord | None,
        log: Callable[[str], None] = aws.log,
        verified_for: str = "",
    ) -> None:
        super().__init__(name="data-pull", daemon=True)
        self.bucket, self.prefix, self.data_dir = bucket, prefix, Path(data_dir)
        self.verified_for = verified_for  # the attempt (data_pull.pull_dataset)
        self.own, self.record, self.log = own, record, log
        self.holds: str | None = None  # None, OWN, ALL
        self.error: BaseException | None = None
        self.own_ready = threading.Event()
        self.done = threading.Event()
        self.listeners: list[Callable[[], None]] = []
        self.lock = threading.Lock()
        self.started_at = time.time()

    def run(self) -> None:
        self.started_at = time.time()
        try:
            pulled = data_pull.pull_dataset(
                self.bucket, self.prefix, self.data_dir, self.log,
                own=self.own, on_own=self._own_ready, verified_for=self.verified_for,
            )  # fmt: skip
        except BaseException as exc:
            with self.lock:
                self.error = exc
                listeners = list(self.listeners)
            self.own_ready.set()
            self.done.set()
            for listener in listeners:
                listener()
            return
        self.holds = ALL
        if self.record:
            seconds = pulled.finished - pulled.started
            rate = round(pulled.bytes / seconds / 1e6, 1) if pulled.bytes and seconds else None
            self.record.measure(
                "data_pull", pulled.started, pulled.finished, bytes=pulled.bytes, mb_per_s=rate
            )
        self.done.set()

    def _own_ready(self, at: float) -> None:
        self.holds = OWN
        if self.record:
            self.record.measure("own_shards", self.started_at, at)
        self.own_ready.set()

    def failure(self) -> StepFailed | None:
        """The pull's failure as the data pull step's, or None."""
        error = self.error
        if error is None:
            return None
        if isinstance(error, StepFailed):
            return error
        return StepFailed(STEP, one_line(error, REASON_LIMIT), causes.of(STEP, error))

    def check(self) -> None:
        """Raise the pull's failure, if it failed (a step's look while it waits on others)."""
        if failure := self.failure():
            raise failure

    def wait_own(self) -> None:
        """Until this node's own shards are verified here."""
        self.own_ready.wait()
        self.check()

    def wait_all(self) -> None:
        self.done.wait()
        self.check()

    def on_failure(self, listener: Callable[[], None]) -> None:
        """listener() once, on the pull's thread, if it fails (at once if it has)."""
        with self.lock:
            failed = self.error is not None
            if not failed:
                self.listeners.append(listener)
        if failed:
            listener()


class FleetShardsMissing(RuntimeError):
    """Nodes did not hold every shard in time."""

    cause = causes.NODES_MISSING


class NodesLost(RuntimeError):
    """Members stopped beating while the fleet pulled."""

    cause = causes.NODE_LOST


WAITING_NOTE_EVERY_S = 30


def wait_for_fleet_shards(
    s3,
    cfg: TrainConfig,
    pull: DatasetPull | None,
    head_key: str | None,
    since: float,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    log: Callable[[str], None] = aws.log,
    while_waiting: Callable[[], None] = lambda: None,
) -> None:
    """Until every node's registration says it holds every shard (this node's own pull says so
    for itself), saying every 30 s which it waits for. A node whose registration went stale
    is lost (node_lost); none within rendezvous_timeout_s is nodes_missing; this node's own
    pull failing is the data pull's failure; while_waiting() at each look (it may raise: a
    node's reported failure)."""
    started = clock()
    next_note = started + WAITING_NOTE_EVERY_S
    while True:
        while_waiting()
        if pull is not None:
            pull.check()
        now = clock()
        live = rendezvous.live_nodes(s3, cfg, now, head_key, since)
        held = {i: e.get("shards") for i, e in live.items()}
        held[cfg.node_index] = pull.holds if pull is not None else ALL
        if lost := [i for i in range(cfg.nodes) if i not in live and i != cfg.node_index]:
            named = [supervision.name_node(supervision.read_entry(s3, cfg, i) or {"index": i})
                     for i in lost]  # fmt: skip
            raise NodesLost(
                f"{', '.join(named)} lost: no heartbeat for over {cfg.heartbeat_timeout_s:.0f} s "
                "(heartbeat_timeout_s) while the fleet pulled its shards"
            )
        waiting = [i for i in range(cfg.nodes) if held.get(i) != ALL]
        if not waiting:
            return
        listed = ", ".join(f"{i} ({held.get(i) or 'none'})" for i in waiting)
        if now - started > cfg.rendezvous_timeout_s:
            raise FleetShardsMissing(
                f"node(s) {listed} did not hold every shard within {cfg.rendezvous_timeout_s:.0f} s"
            )
        if now >= next_note:
            log(f"waiting {now - started:.0f} s for node(s) {listed} to hold every shard")
            next_note = now + WAITING_NOTE_EVERY_S
        sleep(cfg.poll_interval_s)
