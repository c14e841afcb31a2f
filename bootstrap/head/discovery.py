"""Which nodes the head's elastic horovodrun may run ranks on: its host discovery.

Horovod runs the discovery script every second under its driver's lock, with no timeout, and
its first failure ends the job (horovod/runner/elastic/driver.py v0.28.1, `_discover_hosts`,
DISCOVER_HOSTS_FREQUENCY_SECS; the script runs through safe_shell_exec.execute, a non-zero exit
raises in elastic/discovery.py HostDiscoveryScript). So the script (bootstrap/head/hosts_file.py)
reads a file and nothing else, with the standard library only: a thread of the head's bootstrap (Discovery) keeps `<state_dir>/hosts` current from the
fleet's own record, and the head writes it before horovodrun starts.

A node is listed (`live_hosts`) while its registration in runs/<run>/nodes/ names the head's key
and was written since the head's rendezvous began, its heartbeat is fresh (judged as every
heartbeat is, from S3's return to the head after an outage: bootstrap/fleet/supervision.py), no
Spot notice of its instance is recorded (runs/<run>/interruptions/), EC2 runs its instance
(where the head can ask EC2), and it holds the shards its ranks will read: its own (`own`) for
the first world, every shard (`all`) to join a running job, whose reset re-shards.

A node that joins a running job (a replacement) is listed only once it is ready: its heartbeat
has advanced JOIN_BEATS times over at least join_steady_s, and the head reached it over ssh
(`reach`). A join is the fragile moment of elastic training (horovod v0.28.1): the driver
starts the joiner's ranks over ssh and every rank meets in Gloo's rendezvous for the new world
(horovod/runner/elastic/driver.py lines 181-186 `_activate_workers`, 284-302
`_start_worker_processes`). A joiner that dies there leaves the others waiting in the
rendezvous until horovod/common/gloo/http_store.cc line 54 throws "Wait timeout"; it is thrown
in Horovod's background thread (horovod/common/operations.cc line 444 BackgroundThreadLoop ->
GlooContext::Initialize, gloo_context.cc line 75 HTTPStore), so std::terminate aborts every
rank (SIGABRT), every worker of the world records FAILURE and the driver stops
(horovod/runner/elastic/registration.py lines 151-155: "failure count == N -> stop running").
A new instance that dies minutes after boot (a bad GPU, a Spot reclaim, a full disk) is thus
kept out until it has shown it lives; the head's restart of horovodrun (bootstrap/head/head.py
`Head.start_again`) covers one that dies in the join all the same.

Rank order: Horovod assigns ranks in the order it first saw the hosts, keeping the order of
those it knew (discovery.py `HostManager.order_available_hosts`), but hosts that arrive in one
discovery come in the order of a Python set (`find_available_hosts_and_slots` splits the
script's output into a set). So the script admits at most one new host per run (hosts_file.admit), in
node order: the first world is node 0, 1, 2, ... as the data pull and the restore expect (node
0's ranks are 0 .. G-1, and node 0 holds the restored checkpoint).
"""

from __future__ import annotations

import functools
import json
import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from bootstrap import aws
from bootstrap.fleet import node_failures
from bootstrap.fleet.rendezvous import read_object
from bootstrap.fleet.supervision import name_node, stale_for
from bootstrap.head.hosts_file import ADMITTED_FILE, HOSTS_FILE, read_lines, write_atomically
from bootstrap.lines import one_line
from bootstrap.node_config import TrainConfig
from contract import runs
from contract.runs import parse_stamp_s, stamp_at

REFRESH_S = 2.0  # how often the head reads the fleet's record: S3 lists and reads, one EC2 call
# What a registration says of its data (bootstrap/node/data_pull.py): the shards of its own
# ranks in the first world are on disk, or every shard. A registration without the key was
# written after the whole pull.
OWN_SHARDS, ALL_SHARDS = "own", "all"
EC2_RUNNING = "running"
NO_HEARTBEAT = "no heartbeat"
# A joiner's heartbeat must advance this many times (its first beat and two more) before it is
# listed: one beat says it booted, only more say it stays up.
JOIN_BEATS = 3
REACH_TIMEOUT_S = 15  # the head's ssh to a joiner (ConnectTimeout 10 s, mirror.Ssh)


def join_steady_s(cfg: TrainConfig) -> float:
    """How long a joiner's heartbeat must have been fresh: two heartbeat intervals
    (supervision.heartbeat_interval), heartbeat_timeout_s / 2; a minute on the fleet, beside a
    replacement's boot and pull of minutes."""
    return cfg.heartbeat_timeout_s / 2


@dataclass(frozen=True)
class Verdict:
    """live: (index, ip, slots) in index order; left: {index: why it is not listed}; silent:
    the indexes left out because their heartbeat went stale (status.json's `nodes_silent`, which
    the run controller replaces a running node on)."""

    live: tuple[tuple[int, str, int], ...]
    left: dict[int, str]
    silent: tuple[int, ...] = ()

    def lines(self) -> list[str]:
        """`ip:slots` in node order; nodes sharing an address (the rehearsal without network
        namespaces) become one line with their slots summed."""
        slots: dict[str, int] = {}
        for _, ip, count in self.live:
            slots[ip] = slots.get(ip, 0) + count
        return [f"{ip}:{count}" for ip, count in slots.items()]


def live_hosts(
    registrations: Iterable[dict],
    *,
    nodes: int,
    now: float,
    heartbeat_timeout_s: float,
    head_key: str,
    since: float,
    noticed: set[str],
    ec2_states: dict[str, str] | None,
    admitted: set[str],
    started: bool,
    s3_back_at: float | None = None,
    failed: set[str] = frozenset(),
    unready: dict[str, str] | None = None,
) -> Verdict:
    """Which registered nodes Horovod may use now, and why each other one is not listed.

    noticed: instance ids with a Spot notice this attempt; failed: instance ids that reported
    their own failure this attempt (bootstrap/fleet/node_failures.py); ec2_states: {instance id: state}, or
    None where there is no EC2 to ask (the rehearsal); admitted: the hosts Horovod runs ranks
    on now (they keep their place with `own` shards); started: whether the first world formed
    (after it, a node needs every shard to join); unready: {instance id: why it is not ready to
    join yet} for the nodes that would join a running job (Discovery.readiness)."""
    live, left, silent = [], {}, []
    for entry in sorted(registrations, key=lambda e: e.get("index", -1)):
        index = entry.get("index")
        if not isinstance(index, int) or not 0 <= index < nodes:
            continue
        joins = started and entry.get("ip") not in admitted
        why = (
            _why_not(
                entry, now, heartbeat_timeout_s, head_key, since, noticed, ec2_states, admitted,
                started, s3_back_at,
            )
            or ("it reported its own failure" if entry.get("instance_id") in failed else None)
            or ((unready or {}).get(entry.get("instance_id")) if joins else None)
        )  # fmt: skip
        if why:
            left[index] = f"{name_node(entry)}: {why}"
            if why.startswith(NO_HEARTBEAT):
                silent.append(index)
        else:
            live.append((index, entry["ip"], entry.get("gpus") or 1))
    return Verdict(tuple(live), left, tuple(silent))


def _why_not(
    entry, now, heartbeat_timeout_s, head_key, since, noticed, ec2_states, admitted, started,
    s3_back_at,
) -> str | None:  # fmt: skip
    if entry.get("head_key_sha256") != head_key:
        return "registered without the head's key"
    beat = parse_stamp_s(entry["registered_at"])
    if beat < math.floor(since):  # stamps carry whole seconds
        return "registered before this attempt's rendezvous"
    if stale_for(beat, now, s3_back_at) > heartbeat_timeout_s:
        return (
            f"{NO_HEARTBEAT} for {now - beat:.0f} s (heartbeat_timeout_s {heartbeat_timeout_s:.0f})"
        )
    instance = entry.get("instance_id")
    if instance in noticed:
        return "its Spot interruption notice came: it leaves at the next commit"
    if ec2_states is not None and ec2_states.get(instance) != EC2_RUNNING:
        return f"EC2 says its instance is {ec2_states.get(instance, 'gone')}"
    shards = entry.get("shards", ALL_SHARDS)
    if shards == ALL_SHARDS or (shards == OWN_SHARDS and (not started or entry["ip"] in admitted)):
        return None
    if shards == OWN_SHARDS:
        return "holds only its own shards, and a node that joins a running job needs all of them"
    return "has not pulled its shards yet"


class Discovery(threading.Thread):
    """Keeps `<state_dir>/hosts` current every REFRESH_S from the fleet's record; logs each node
    that comes or goes, with why. A refresh that fails (S3 or EC2 down) keeps the last file and
    says so once until one works again."""

    def __init__(
        self,
        cfg: TrainConfig,
        s3,
        *,
        head_key: str,
        since: float,
        ec2=None,
        log: Callable[[str], None] = aws.log,
        clock: Callable[[], float] = time.time,
        s3_back_at: Callable[[], float | None] = aws.s3_answered_again_at,
        reach: Callable[[str], str | None] = lambda ip: None,
    ):
        super().__init__(daemon=True, name="discovery")
        self.cfg, self.s3, self.ec2, self.log, self.clock = cfg, s3, ec2, log, clock
        # reach(ip): None when the head reached the node over ssh, else why not.
        self.reach = reach
        # A joiner's heartbeat as this discovery saw it: {instance id: (first fresh, beats)}.
        self.joiners: dict[str, tuple[float, set[str]]] = {}
        self.reached: set[str] = set()  # joiners the head reached over ssh
        # One refresh at a time: the thread's and the head's own (before it starts horovodrun
        # again) write the same hosts file through the same temporary name.
        self.refreshing = threading.Lock()
        self.head_key, self.since, self.s3_back_at = head_key, since, s3_back_at
        self.state_dir = Path(cfg.state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.stopped = threading.Event()
        self.started_world = False
        self.shown: tuple[list[str], dict[int, str]] = ([], {})
        # Every instance this attempt's discovery saw at each address, oldest first, with when
        # it first saw it: what names a reset's hosts (a replacement may reuse an address).
        self.known: dict[str, list[dict]] = {}
        self.failing = False
        self.verdict: Verdict | None = None  # the last refresh's

    def run(self) -> None:
        while not self.stopped.wait(REFRESH_S):
            try:
                self.refresh()
                self.failing = False
            except Exception as exc:
                if not self.failing:
                    self.log(
                        f"discovery: cannot read the fleet, keeping its last hosts: {one_line(exc)}"
                    )
                self.failing = True

    def refresh(self) -> Verdict:
        """Read the record, write the hosts file, log what changed; returns the verdict."""
        with self.refreshing:
            return self._refresh()

    def _refresh(self) -> Verdict:
        registrations = self.registrations()
        self.remember(registrations)
        instances = [e.get("instance_id") for e in registrations if e.get("instance_id")]
        admitted = read_lines(self.state_dir / ADMITTED_FILE)
        # horovodrun starts its first world once every node is admitted (-np is all of them).
        self.started_world = self.started_world or len(admitted) >= self.cfg.nodes
        now = self.clock()
        judged = functools.partial(
            live_hosts,
            registrations,
            nodes=self.cfg.nodes,
            now=now,
            heartbeat_timeout_s=self.cfg.heartbeat_timeout_s,
            head_key=self.head_key,
            since=self.since,
            noticed=self.noticed(),
            ec2_states=self.ec2_states(instances) if self.ec2 is not None else None,
            admitted={line.split(":")[0] for line in admitted},
            started=self.started_world,
            s3_back_at=self.s3_back_at(),
            failed={
                d["instance_id"] for d in node_failures.read_since(self.s3, self.cfg, self.since)
            },
        )
        verdict = judged()
        if self.started_world:
            verdict = judged(unready=self.readiness(registrations, verdict, admitted, now))
        lines = verdict.lines()
        write_atomically(self.state_dir / HOSTS_FILE, "".join(f"{line}\n" for line in lines))
        self.say(lines, verdict.left)
        self.verdict = verdict
        return verdict

    def readiness(
        self, registrations: list[dict], verdict: Verdict, admitted: list[str], now: float
    ) -> dict[str, str]:
        """{instance id: why it is not ready to join yet} for each node the verdict would list
        that Horovod does not run ranks on yet: its heartbeat must have advanced JOIN_BEATS
        times over join_steady_s while fresh, then the head must reach it over ssh."""
        hosts = {line.split(":")[0] for line in admitted}
        by_index = {e.get("index"): e for e in registrations}
        unready: dict[str, str] = {}
        candidates = set()
        for index, ip, _ in verdict.live:
            entry = by_index[index]
            instance = entry.get("instance_id")
            if ip in hosts or instance is None:
                continue
            candidates.add(instance)
            first, beats = self.joiners.setdefault(instance, (now, set()))
            beats.add(entry["registered_at"])
            steady, needed = now - first, join_steady_s(self.cfg)
            if len(beats) < JOIN_BEATS or steady < needed:
                unready[instance] = (
                    f"not ready to join yet: {len(beats)} heartbeat(s) over {steady:.0f} s, "
                    f"it joins after {JOIN_BEATS} over {needed:.0f} s"
                )
            elif instance not in self.reached:
                if (why := self.reach(ip)) is None:
                    self.reached.add(instance)
                    self.log(
                        f"discovery: {name_node(entry)} is ready to join: its heartbeat steady "
                        f"for {steady:.0f} s and the head reached it over ssh"
                    )
                else:
                    unready[instance] = f"not ready to join yet: the head cannot reach it: {why}"
        # A joiner that went stale or left starts over: its next heartbeat is a new first one.
        for instance in set(self.joiners) - candidates:
            del self.joiners[instance]
            self.reached.discard(instance)
        return unready

    def addresses(self) -> list[str]:
        """The live nodes' addresses, as the last refresh found them."""
        return [ip for _, ip, _ in self.verdict.live] if self.verdict else []

    def remember(self, registrations: list[dict]) -> None:
        for entry in registrations:
            if entry.get("head_key_sha256") != self.head_key or not entry.get("ip"):
                continue
            if parse_stamp_s(entry["registered_at"]) < math.floor(self.since):
                continue
            seen = self.known.setdefault(entry["ip"], [])
            if not seen or seen[-1]["instance_id"] != entry.get("instance_id"):
                seen.append(
                    {
                        "node": str(entry.get("index")),
                        "instance_id": entry.get("instance_id"),
                        "since": stamp_at(self.clock()),
                    }
                )

    def registrations(self) -> list[dict]:
        prefix = f"{self.cfg.runs_prefix}{runs.NODES}"
        entries = []
        for name in aws.list_sizes(self.s3, self.cfg.bucket, prefix):
            body = read_object(self.s3, self.cfg.bucket, prefix + name)
            try:
                entries.append(json.loads(body or b"{}"))
            except ValueError:
                continue  # half a write cannot happen in S3; a foreign file is not a node
        return [e for e in entries if "registered_at" in e]

    def noticed(self) -> set[str]:
        prefix = f"{self.cfg.runs_prefix}{runs.INTERRUPTIONS}"
        found = set()
        for name in aws.list_sizes(self.s3, self.cfg.bucket, prefix):
            try:
                doc = json.loads(read_object(self.s3, self.cfg.bucket, prefix + name) or b"{}")
                if parse_stamp_s(doc["noticed_at"]) >= math.floor(self.since):
                    found.add(doc["instance_id"])
            except (ValueError, KeyError, TypeError):
                continue
        return found

    def ec2_states(self, instance_ids: list[str]) -> dict[str, str]:
        """{instance id: state} of the registered instances EC2 still knows: a filter, not
        InstanceIds, which fails the whole call for one id EC2 no longer has
        (InvalidInstanceID.NotFound, https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeInstances.html)."""
        if not instance_ids:
            return {}
        pages = self.ec2.get_paginator("describe_instances").paginate(
            Filters=[{"Name": "instance-id", "Values": sorted(set(instance_ids))}]
        )
        return {
            i["InstanceId"]: i["State"]["Name"]
            for page in pages
            for reservation in page["Reservations"]
            for i in reservation["Instances"]
        }

    def say(self, lines: list[str], left: dict[int, str]) -> None:
        before, left_before = self.shown
        if lines != before:
            self.log(f"discovery: {len(lines)} host(s) live: {', '.join(lines) or 'none'}")
        for index, why in sorted(left.items()):
            if left_before.get(index) != why:
                self.log(f"discovery: not listing {why}")
        self.shown = (lines, left)

    def stop(self) -> None:
        self.stopped.set()
