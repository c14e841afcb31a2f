"""`python -m rehearsal --faults [--fault TEXT ...]`: the fault rehearsal.

After the rehearsal's setup (local S3, sample dataset, preprocessing) the local S3 is saved as
the snapshot "dataset converted"; when a chosen row starts later, a short run with a checkpoint
at each epoch is trained once and saved as "a run with checkpoints" (rehearsal/snapshots.py).
Each row then starts from its snapshot on a fleet deployed anew (every node's disks empty),
injects one fault, lets the run's attempts end, and is judged. So a row passes or fails alone,
and any subset of the rows, in any order, has the same outcomes.

The rows are data (ROWS), grouped by family; docs/rehearsal.md's table is `markdown_table()`
(a test keeps the two equal). Rows with `max_restarts` play the deployed fleet: after each
attempt the run controller's own code decides, and a relaunch brings the fleet back (EC2's part
played by the rehearsal: rehearsal/core.py `relaunch`).

Prints a table of fault, expected and observed outcome, pass or FAIL; exit 0 only if every row
chosen passes. `--fault TEXT` (repeatable) keeps the rows whose name contains TEXT; `--rows ci`
keeps CI's subset (the rows marked `in_ci`; CI has 40 minutes for every tier, and the other
rows run under `make test-all`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rehearsal.core import BUCKET, RUN, Rehearsal, StepFailed, say
from rehearsal.hosts import NODE_INTERFACE

DATASET = "dataset converted"
CHECKPOINTED = "a run with checkpoints"
CHECKPOINTED_EPOCHS = 2  # the run of that snapshot: a checkpoint after each of its epochs
# Longer than boto3's read timeout (20 s), so every kind of S3 call sees it time out and retry;
# short enough for CI.
OUTAGE_S = 40
# Longer than the rehearsal's heartbeat_timeout_s (60 s, rehearsal/core.py), inside the 5
# minutes an outage may last (bootstrap/aws.py OUTAGE_S): no heartbeat can be fresh through it.
LONG_OUTAGE_S = 75
# The paused rank's row: a collective timeout shorter than the pause, so the attempt ends.
PAUSE_S = 90
PAUSED_COLLECTIVE_TIMEOUT_S = 30
# How long the dead leader's host stays dead: its processes, a restarted bootstrap included,
# are killed every second for this long.
DEAD_FOR_S = 60
SHARD = "train-00001-of-00004"
MISSING_NODE_TIMEOUT_S = 70  # two of the leader's every-30-s lines, then it gives up
# The trainer's line at an epoch's end ("Epoch 3/5 done in 3.0 s: ...").
EPOCH_DONE = re.compile(r"<stdout>:Epoch \d+/\d+ done in ")
# A checkpoint at every epoch's end (the trainer's default: the last epoch and after 600 s).
EVERY_EPOCH = {"trainer": {"checkpoint_every_s": 1}}

Check = Callable[[Rehearsal, dict], bool]
Action = Callable[[Rehearsal], None]


@dataclass(frozen=True)
class Request:
    """A request the local S3 answered: its method and a pattern of its path."""

    method: str
    path: re.Pattern


@dataclass(frozen=True)
class Fault:
    """What is done to the run, and when: at node 0's first output line that matches `when`
    (text or pattern), once the local S3 has answered a Request, or before the attempt starts
    (None)."""

    what: Action
    when: str | re.Pattern | Request | None = None


@dataclass(frozen=True)
class Expect:
    """The last attempt's DONE.json status (and epochs), and named checks that must all hold."""

    status: str
    epochs: int | None = None
    checks: dict[str, Check] = field(default_factory=dict)


@dataclass(frozen=True)
class Row:
    family: str  # S3, ranks, nodes, disk, Spot
    name: str
    expected: str  # the outcome, for people (the table)
    start: str  # the snapshot the row starts from: DATASET or CHECKPOINTED
    epochs: int  # the run's epochs in the row's node.json
    fault: Fault
    expect: Expect
    overrides: dict = field(default_factory=dict)  # node.json keys for the row's attempts
    # Set: the row's attempts go through the run controller with this maxRestarts, and a
    # relaunch brings the fleet back (before_relaunch first: what the new hardware fixes).
    max_restarts: int | None = None
    before_relaunch: Action | None = None
    needs_hosts: bool = False  # namespaces (root): a link, a tmpfs or a host per node
    in_ci: bool = False  # one of CI's subset (`--rows ci`): CI has 40 minutes for every tier


# ------------------------------------------------------------------ what a fault does


def freeze_s3(seconds: float) -> Action:
    def freeze(rehearsal: Rehearsal) -> None:
        say(f"FAULT: the S3 endpoint stops answering for {seconds:.0f} s")
        os.killpg(rehearsal.moto.pid, signal.SIGSTOP)

        def thaw() -> None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(rehearsal.moto.pid, signal.SIGCONT)
            say("FAULT over: the S3 endpoint answers again")

        timer = threading.Timer(seconds, thaw)
        timer.daemon = True
        timer.start()

    return freeze


def processes_with(env_entries: list[str], command_part: str) -> list[int]:
    """Processes whose environment holds every entry and whose command line holds the part."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if (
            command_part in cmdline
            and "bootstrap.fleet.rank"
            not in cmdline  # the rank's program, not the wrapper around it
            and all(e.encode() in environ for e in env_entries)
        ):
            found.append(int(proc.name))
    return found


def kill_rank(rank: int) -> Action:
    def kill(rehearsal: Rehearsal) -> None:
        # Only this rehearsal's ranks: other rehearsals may run on the same machine.
        pids = processes_with(
            [f"HOROVOD_RANK={rank}", f"AWS_ENDPOINT_URL={rehearsal.endpoint}"], "trainer.train"
        )
        say(f"FAULT: SIGKILL to rank {rank} (pid {', '.join(map(str, pids)) or 'not found'})")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    return kill


def stop_leader_node(rehearsal: Rehearsal) -> None:
    """A shutdown: SIGTERM to every process of node 0's host (its rank included, which stops at
    a step and saves it; horovodrun, which got it too, ends the ranks 5 s later)."""
    say("FAULT: SIGTERM to every process of node 0, as a shutdown does")
    if rehearsal.fleet:
        rehearsal.fleet.signal_host(rehearsal.fleet.nodes[0].namespace, signal.SIGTERM)
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(rehearsal.node_processes[0].pid, signal.SIGTERM)


def s3_object(rehearsal: Rehearsal, key: str) -> bytes | None:
    try:
        return rehearsal.s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    except Exception:
        return None


def flipped(data: bytes) -> bytes:
    """The same bytes but one, 100 from the end: the same size, another sha256."""
    return data[:-100] + bytes([data[-100] ^ 0xFF]) + data[-99:]


def corrupt_shard(rehearsal: Rehearsal) -> None:
    good = s3_object(rehearsal, f"tfrecords/{SHARD}")
    rehearsal.s3.put_object(Bucket=BUCKET, Key=f"tfrecords/{SHARD}", Body=flipped(good))
    say(f"FAULT: s3://{BUCKET}/tfrecords/{SHARD} replaced by a same-size copy with a flipped byte")


def corrupt_local_shard(rehearsal: Rehearsal) -> None:
    """Every node holds the dataset from an earlier pull, one shard of it corrupt (S3's copy
    was, then): S3 now holds the good one."""
    for index in range(rehearsal.args.nodes):
        target = rehearsal.node_home(index) / "data" / "tfrecords"
        target.mkdir(parents=True, exist_ok=True)
        listing = rehearsal.s3.list_objects_v2(Bucket=BUCKET, Prefix="tfrecords/", Delimiter="/")
        for obj in listing["Contents"]:  # the shards and the manifest, not the converter's state
            body = s3_object(rehearsal, obj["Key"])
            name = obj["Key"].removeprefix("tfrecords/")
            (target / name).write_bytes(flipped(body) if name == SHARD else body)
    say(f"FAULT: every node holds a same-size copy of {SHARD} with a flipped byte")


def forget_node(index: int) -> Action:
    def forget(rehearsal: Rehearsal) -> None:
        say(f"FAULT: node {index} will not boot")

    return forget


def kill_leader_bootstrap(rehearsal: Rehearsal) -> None:
    pid = rehearsal.node_processes[0].pid  # train_node.sh exec'd the bootstrap: same pid
    say(f"FAULT: SIGKILL to node 0's bootstrap process only (pid {pid})")
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def checkpoint_step(key: str) -> int:
    return int(re.search(r"ckpt-(\d+)\.", key).group(1))


def corrupt_newest_checkpoint(rehearsal: Rehearsal) -> None:
    listing = rehearsal.s3.list_objects_v2(Bucket=BUCKET, Prefix=f"runs/{RUN}/model/checkpoints/")
    data = [o["Key"] for o in listing["Contents"] if re.search(r"\.data-\d+-of-\d+$", o["Key"])]
    newest = max(data, key=checkpoint_step)
    rehearsal.s3.put_object(Bucket=BUCKET, Key=newest, Body=flipped(s3_object(rehearsal, newest)))
    rehearsal.corrupted = newest.rsplit("/", 1)[1].split(".")[0]
    say(f"FAULT: s3://{BUCKET}/{newest} replaced by a same-size copy with a flipped byte")


def fill_model_dir(rehearsal: Rehearsal) -> None:
    """Node 0's model dir becomes a tmpfs the size of what the restore brings, plus less than
    one checkpoint: the first checkpoint of the attempt finds the disk full."""
    listing = rehearsal.s3.list_objects_v2(Bucket=BUCKET, Prefix=f"runs/{RUN}/model/")
    objects = listing["Contents"]
    restored = sum(o["Size"] for o in objects if not o["Key"].endswith(".sha256"))
    checkpoint = max(o["Size"] for o in objects if ".data-" in o["Key"])
    size = restored + checkpoint // 2
    target = rehearsal.workdir / "data" / "model"
    pid = rehearsal.node_processes[0].pid
    (rehearsal.node_home(0) / "data" / "model").mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["nsenter", "-t", str(pid), "-m", "mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
         str(target)],
        check=True,
    )  # fmt: skip
    say(f"FAULT: node 0's {target} is a tmpfs of {size} bytes ({restored} restored)")


def set_link(rehearsal: Rehearsal, index: int, state: str) -> None:
    node = rehearsal.fleet.nodes[index]
    subprocess.run(
        ["ip", "netns", "exec", node.namespace, "ip", "link", "set", NODE_INTERFACE, state],
        check=True,
    )


def cut_network(index: int) -> Action:
    def cut(rehearsal: Rehearsal) -> None:
        set_link(rehearsal, index, "down")
        say(f"FAULT: node {index}'s network is cut ({NODE_INTERFACE} down)")

    return cut


def kill_host(index: int) -> Action:
    """Every process of node `index`'s host killed: the node is gone (its hardware failed), sshd
    and ranks included, and its systemd restarts nothing."""

    def kill(rehearsal: Rehearsal) -> None:
        rehearsal.services.pop(f"node{index}")
        pids = rehearsal.fleet.kill_host(rehearsal.fleet.nodes[index].namespace)
        say(f"FAULT: node {index}'s host is gone (SIGKILL to its {len(pids)} processes)")

    return kill


def kill_host_for(index: int, seconds: float) -> Action:
    """Node `index`'s host killed now and kept dead: every process of it killed every second
    for `seconds` (before_relaunch waits for that to end)."""

    def kill(rehearsal: Rehearsal) -> None:
        rehearsal.services.pop(f"node{index}")
        namespace = rehearsal.fleet.nodes[index].namespace
        say(f"FAULT: node {index}'s host is dead for {seconds:.0f} s")

        def keep_dead() -> None:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                rehearsal.fleet.kill_host(namespace)
                time.sleep(1)
            say(f"FAULT over: node {index}'s host is no longer killed")

        rehearsal.fault_threads.append(threading.Thread(target=keep_dead, daemon=True))
        rehearsal.fault_threads[-1].start()

    return kill


def wait_for_fault_threads(rehearsal: Rehearsal) -> None:
    for thread in rehearsal.fault_threads:
        thread.join()


def pause_rank(rank: int, seconds: float) -> Action:
    """SIGSTOP to rank `rank`'s trainer, SIGCONT `seconds` later (if it still exists)."""

    def pause(rehearsal: Rehearsal) -> None:
        pids = processes_with(
            [f"HOROVOD_RANK={rank}", f"AWS_ENDPOINT_URL={rehearsal.endpoint}"], "trainer.train"
        )
        say(f"FAULT: rank {rank}'s trainer paused for {seconds:.0f} s (pid {pids})")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

        def resume() -> None:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

        timer = threading.Timer(seconds, resume)
        timer.daemon = True
        timer.start()

    return pause


def spot_notice(index: int) -> Action:
    """EC2's two-minute warning to node `index`'s instance: its IMDS `spot/instance-action`
    starts answering (the notice file stands in for it)."""

    def notify(rehearsal: Rehearsal) -> None:
        path = rehearsal.notice_file(index)
        path.parent.mkdir(parents=True, exist_ok=True)
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 120))
        path.write_text(json.dumps({"action": "terminate", "time": at}))
        rehearsal.interrupted_instance = rehearsal.instance_id(index)
        say(f"FAULT: EC2 will interrupt node {index} ({rehearsal.instance_id(index)}) at {at}")

    return notify


# ------------------------------------------------------------------ what the outcome must show


def node_said(rehearsal: Rehearsal, index: int, text: str) -> bool:
    return any(text in line for line in rehearsal.output.get(f"node{index}", []))


def decisions(*expected: str) -> Check:
    """The run controller decided exactly these, in order, for the row's attempts."""
    return lambda r, done: [e["decision"] for e in r.entries] == list(expected)


def every_attempt_counted(rehearsal: Rehearsal, done: dict) -> bool:
    """DONE.json counts the attempts and lists each one's end, the earlier ones from the
    controller's attempts.json."""
    attempts = done.get("attempts") or []
    return done.get("attempt") == len(attempts) >= 2 and attempts[0]["status"] != "succeeded"


def names_the_lost_node(index: int) -> Check:
    """The first attempt of the row ended naming node `index` from its stale heartbeat."""
    return lambda r, done: (r.entries[0]["reason"] or "").startswith(
        f"step 'training' failed: RuntimeError: node {index} ({r.instance_id(index)}, "
        f"{r.fleet.nodes[index].ip}) lost: no heartbeat for "
    )


def interruption_named(index: int) -> Check:
    """The first attempt of the row ended interrupted, naming node `index`'s first instance."""
    return lambda r, done: (
        r.entries[0]["status"] == "interrupted"
        and (
            f"Spot interruption of node {index} ({r.interrupted_instance}, "
            in r.entries[0]["reason"]
        )
    )


def every_node_replaced(rehearsal: Rehearsal, done: dict) -> bool:
    """The last attempt ran on new instances: each node registered with its replacement's id and
    address, and the leader resumed from S3."""
    for index in range(rehearsal.args.nodes):
        entry = json.loads(s3_object(rehearsal, f"runs/{RUN}/nodes/{index}.json") or b"{}")
        if (entry.get("instance_id"), entry.get("ip")) != (
            rehearsal.instance_id(index),
            rehearsal.node_ip(index),
        ) or not rehearsal.replacements.get(index):
            return False
    return node_said(rehearsal, 0, "Resuming from")


def names_the_full_disk(rehearsal: Rehearsal, done: dict) -> bool:
    reason = done["reason"] or ""
    return (
        "ENOSPC" in reason
        and f"{rehearsal.workdir / 'data' / 'model'}/checkpoints/" in reason
        and "filesystem tmpfs (tmpfs)" in reason
    )


def first_attempt_ended(cause: str, *texts: str) -> Check:
    """The row's first attempt ended with `cause`, its reason holding every text."""
    return lambda r, done: (
        r.entries[0].get("cause") == cause
        and all(text in (r.entries[0]["reason"] or "") for text in texts)
    )


def no_node_blamed(rehearsal: Rehearsal, done: dict) -> bool:
    return not any(
        node_said(rehearsal, index, text)
        for index in range(rehearsal.args.nodes)
        for text in ("is lost", "lost: no heartbeat")
    )


def no_epoch_retrained(first_epoch: int) -> Check:
    return lambda r, done: (
        not any(node_said(r, 0, f"Epoch {e}/") for e in range(1, first_epoch))
        and node_said(r, 0, "Resuming from")
    )


# ------------------------------------------------------------------ the rows

ROWS = [
    Row(
        "S3",
        f"S3 unanswered for {OUTAGE_S} s mid-training",
        "succeeded with every epoch",
        DATASET,
        2,
        Fault(freeze_s3(OUTAGE_S), when="Epoch 1/"),
        Expect("succeeded", 2),
    ),
    Row(
        "S3",
        f"S3 unanswered for {OUTAGE_S} s at restore",
        "the run waits, resumes at the epoch after its checkpoint, succeeds",
        CHECKPOINTED,
        3,
        Fault(freeze_s3(OUTAGE_S), when="step 'restore checkpoints': start"),
        Expect("succeeded", 3, {"resumed_at_epoch_3": no_epoch_retrained(3)}),
    ),
    Row(
        "S3",
        f"S3 unanswered for {LONG_OUTAGE_S} s mid-training (past heartbeat_timeout_s)",
        "no node is blamed for S3's silence; succeeded with every epoch",
        DATASET,
        2,
        Fault(freeze_s3(LONG_OUTAGE_S), when="Epoch 1/"),
        Expect("succeeded", 2, {"no_node_blamed": no_node_blamed}),
    ),
    Row(
        "S3",
        "the first checkpoint's upload cut: node 0's host killed when its .index reaches S3",
        "node 1 finds its leader lost and writes the attempt's DONE.json (node_lost); relaunched, "
        "the restore takes no half-uploaded checkpoint; succeeded with every epoch",
        DATASET,
        3,
        Fault(
            kill_host(0),
            when=Request("PUT", re.compile(r"/runs/[^/]+/model/checkpoints/ckpt-\d+\.index$")),
        ),
        Expect(
            "succeeded",
            3,
            {
                "member_recorded_the_lost_leader": first_attempt_ended("node_lost", "leader"),
                "relaunched_once": decisions("relaunch", "teardown"),
                "counted": every_attempt_counted,
            },
        ),
        EVERY_EPOCH,
        max_restarts=2,
        needs_hosts=True,
        in_ci=True,
    ),
    Row(
        "S3",
        "shard corrupted in S3 (same size)",
        f"failed at the data pull, naming {SHARD} and its sha256; not relaunched (not retryable)",
        DATASET,
        2,
        Fault(corrupt_shard),
        Expect(
            "failed",
            checks={
                "names_the_shard": lambda r, d: (
                    "data pull" in d["reason"] and SHARD in d["reason"] and "sha256" in d["reason"]
                ),
                "not_relaunched": decisions("teardown"),
            },
        ),
        max_restarts=3,
        in_ci=True,
    ),
    Row(
        "S3",
        "nodes hold a corrupt shard that S3 has good",
        "the nodes re-fetch that shard only; succeeded with every epoch",
        DATASET,
        2,
        Fault(corrupt_local_shard),
        Expect(
            "succeeded",
            2,
            {"refetched": lambda r, d: all(node_said(r, i, "re-fetched") for i in range(2))},
        ),
    ),
    Row(
        "ranks",
        "rank 1 killed (SIGKILL)",
        "failed: rank 1 on node 1 (<its host>) killed by SIGKILL (out of memory?)",
        DATASET,
        3,
        Fault(kill_rank(1), when="Epoch 2/"),
        Expect(
            "failed",
            checks={
                "names_the_rank": lambda r, d: (
                    "rank 1 on node 1 (" in d["reason"] and "killed by SIGKILL" in d["reason"]
                )
            },
        ),
    ),
    Row(
        "ranks",
        "leader's bootstrap killed (SIGKILL) after its first checkpoint",
        "systemd restarts it; it resumes from S3 and the run succeeds with every epoch",
        DATASET,
        3,
        Fault(kill_leader_bootstrap, when="is in s3://"),
        Expect(
            "succeeded",
            3,
            {
                "restarted_once": lambda r, d: r.restarts.get("node0") == 1,
                "resumed": lambda r, d: node_said(r, 0, "Resuming from"),
                "member_saw_done": lambda r, d: node_said(r, 1, "the leader wrote DONE.json"),
            },
        ),
        EVERY_EPOCH,
    ),
    Row(
        "ranks",
        f"rank 1's trainer paused (SIGSTOP) for {PAUSE_S} s, past a "
        f"{PAUSED_COLLECTIVE_TIMEOUT_S} s collective timeout",
        "attempt 1 failed: collective timeout: rank 1 on node 1 (<its ip>) stopped answering "
        "rank 0 ...; relaunched, succeeded with every epoch",
        DATASET,
        3,
        Fault(pause_rank(1, PAUSE_S), when=EPOCH_DONE),
        Expect(
            "succeeded",
            3,
            {
                "names_rank_1_and_node_1": first_attempt_ended(
                    "collective_timeout", "rank 1 on node 1 (", "stopped answering"
                ),
                "relaunched_once": decisions("relaunch", "teardown"),
            },
        ),
        {"collective_timeout_s": PAUSED_COLLECTIVE_TIMEOUT_S},
        max_restarts=2,
    ),
    Row(
        "nodes",
        "leader's node stopped (SIGTERM)",
        "interrupted; its checkpoint and logs in S3",
        DATASET,
        3,
        Fault(stop_leader_node, when=EPOCH_DONE),
        Expect(
            "interrupted",
            checks={
                "logs_in_s3": lambda r, d: (
                    s3_object(r, f"runs/{RUN}/logs/node-0/train.log") is not None
                ),
                "checkpoint_kept": lambda r, d: (
                    b"ckpt-" in (s3_object(r, f"runs/{RUN}/model/checkpoints/checkpoint") or b"")
                ),
            },
        ),
        # Every step a check step: the ranks stop within a step, inside horovodrun's 5 s.
        {"trainer": {"log_every": 1}},
    ),
    Row(
        "nodes",
        "node 1 never boots (maxRestarts 1)",
        "failed: node(s) 1 of 2 did not register, named every 30 s; relaunched once, then "
        "stopped: restarts exhausted",
        DATASET,
        2,
        Fault(forget_node(1)),
        Expect(
            "failed",
            checks={
                "names_the_node": lambda r, d: "node(s) 1 of 2 did not register" in d["reason"],
                "said_so_every_30_s": lambda r, d: (
                    sum(
                        "rendezvous: waiting" in line and "node(s) 1 of 2" in line
                        for line in r.output.get("node0", [])
                    )
                    >= 2
                ),
                "relaunched_once_then_stopped": decisions("relaunch", "stop"),
                "says_restarts_exhausted": lambda r, d: (
                    "restarts exhausted" in r.entries[-1]["why"]
                ),
            },
        ),
        {"absent": (1,), "rendezvous_timeout_s": MISSING_NODE_TIMEOUT_S},
        max_restarts=1,
    ),
    Row(
        "nodes",
        f"node 0's host dead for {DEAD_FOR_S} s after an epoch (the leader lost)",
        "node 1 finds its leader lost and writes the attempt's DONE.json (node_lost); relaunched, "
        "succeeded with every epoch, DONE.json counts 2 attempts",
        DATASET,
        3,
        Fault(kill_host_for(0, DEAD_FOR_S), when=EPOCH_DONE),
        Expect(
            "succeeded",
            3,
            {
                "member_recorded_the_lost_leader": first_attempt_ended("node_lost", "leader"),
                "relaunched_once": decisions("relaunch", "teardown"),
                "counted": every_attempt_counted,
            },
        ),
        EVERY_EPOCH,
        max_restarts=2,
        before_relaunch=wait_for_fault_threads,
        needs_hosts=True,
        in_ci=True,
    ),
    Row(
        "nodes",
        "network of node 1 cut mid-training (a hung collective)",
        "attempt 1 failed: node 1 (<its instance>, <its ip>) lost: no heartbeat for ... s; "
        "relaunched (the link back: new hardware), succeeded with every epoch",
        DATASET,
        3,
        Fault(cut_network(1), when="<stdout>:Epoch "),
        Expect(
            "succeeded",
            3,
            {
                "attempt_1_names_node_1_not_rank_0": names_the_lost_node(1),
                "relaunched_once": decisions("relaunch", "teardown"),
                "counted": every_attempt_counted,
            },
        ),
        max_restarts=2,
        before_relaunch=lambda r: set_link(r, 1, "up"),
        needs_hosts=True,
    ),
    Row(
        "nodes",
        "node 1's host lost right after an epoch (every process killed)",
        "relaunched once; succeeded with every epoch, DONE.json counts 2 attempts",
        DATASET,
        3,
        Fault(kill_host(1), when=EPOCH_DONE),
        Expect(
            "succeeded",
            3,
            {
                "relaunched_once": decisions("relaunch", "teardown"),
                "counted": every_attempt_counted,
            },
        ),
        EVERY_EPOCH,
        max_restarts=2,
        needs_hosts=True,
        in_ci=True,
    ),
    Row(
        "disk",
        "newest checkpoint corrupt in S3 (same size)",
        "the restore says so, resumes from the newest intact one, the run succeeds",
        CHECKPOINTED,
        3,
        Fault(corrupt_newest_checkpoint),
        Expect(
            "succeeded",
            3,
            {
                "said_so": lambda r, d: node_said(r, 0, f"{r.corrupted} (sha256 of"),
                "fell_back": lambda r, d: node_said(r, 0, "the newest intact checkpoint"),
            },
        ),
        EVERY_EPOCH,
        in_ci=True,
    ),
    Row(
        "disk",
        "disk full at a checkpoint (ENOSPC)",
        "failed: no space left on device (ENOSPC) writing <path> ...; filesystem tmpfs ...",
        CHECKPOINTED,
        4,
        Fault(fill_model_dir, when="step 'rendezvous': start"),
        Expect("failed", checks={"names_the_path_and_filesystem": names_the_full_disk}),
        EVERY_EPOCH,
        needs_hosts=True,
    ),
    Row(
        "Spot",
        "Spot interruption of node 1 (two-minute notice) after an epoch",
        "attempt 1 interrupted: Spot interruption of node 1 (...): every rank stopped at one "
        "step with its checkpoint; relaunched as new instances, resumed, succeeded with every "
        "epoch",
        DATASET,
        3,
        Fault(spot_notice(1), when=EPOCH_DONE),
        Expect(
            "succeeded",
            3,
            {
                "attempt_1_names_node_1": interruption_named(1),
                "relaunched_once": decisions("relaunch", "teardown"),
                "counted": every_attempt_counted,
                "on_new_instances": every_node_replaced,
            },
        ),
        {**EVERY_EPOCH, "market": "spot"},
        max_restarts=2,
        in_ci=True,
    ),
]


def markdown_table(rows: list[Row] = ROWS) -> str:
    """docs/rehearsal.md's table of the rows."""
    lines = [
        "| family | fault | starts from | expected outcome | in CI |",
        "| --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {r.family} | {r.name} | {r.start} | {r.expected} | {'yes' if r.in_ci else ''} |"
        for r in rows
    ]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ running them


def judge(rehearsal: Rehearsal, row: Row, done: dict | None) -> tuple[bool, str]:
    """Whether the row's outcome is the expected one, and what was observed, in one line."""
    if done is None:
        return False, "no DONE.json"
    seen = done["status"] + (f", epochs {done['epochs']}" if done["epochs"] else "")
    if done["status"] != "succeeded":
        # The step and what happened; the exception's type adds nothing to a table row.
        seen += ": " + re.sub(
            r"failed: \w+: (horovodrun exited \d+: )?", "failed: ", done["reason"]
        )
    expect = row.expect
    failed = [name for name, check in expect.checks.items() if not check(rehearsal, done)]
    ok = done["status"] == expect.status and expect.epochs in (None, done["epochs"])
    if failed:
        seen += f" (not: {', '.join(failed)})"
    return ok and not failed, seen


def prepare_start(rehearsal: Rehearsal, start: str) -> None:
    """The row's S3 snapshot, made on first use, and a fleet deployed anew."""
    if not (rehearsal.workdir / "snapshots" / start).is_dir():
        rehearsal.restore_snapshot(DATASET)
        rehearsal.renew_fleet()
        say(f"--- snapshot '{CHECKPOINTED}': {CHECKPOINTED_EPOCHS} epochs, a checkpoint each")
        rehearsal.train(CHECKPOINTED_EPOCHS, **EVERY_EPOCH)
        # What a deployment finds of an earlier one: its model, logs and key; not its end.
        ended = ("DONE.json", "attempts.json", "status.json")
        rehearsal.save_snapshot(CHECKPOINTED, tuple(f"runs/{RUN}/{name}" for name in ended))
    rehearsal.restore_snapshot(start)
    rehearsal.renew_fleet()


def run_row(rehearsal: Rehearsal, row: Row) -> tuple[str, str, str, str]:
    """One row, from its snapshot to its verdict: (fault, expected, observed, pass|FAIL)."""
    if row.needs_hosts and rehearsal.fleet is None:
        return row.name, row.expected, "needs the namespaces (root): a host per node", "FAIL"
    prepare_start(rehearsal, row.start)
    rehearsal.watches.clear()
    if rehearsal.iam:
        rehearsal.iam.watches.clear()
    rehearsal.fault_threads.clear()
    rehearsal.entries = []
    when = row.fault.when
    if when is None:
        row.fault.what(rehearsal)
    elif isinstance(when, Request):
        rehearsal.iam.on_request(when.method, when.path, lambda: row.fault.what(rehearsal))
    else:
        rehearsal.watches.append(("node0", when, lambda: row.fault.what(rehearsal)))
    refused_before = len(rehearsal.iam.refusals) if rehearsal.iam else 0
    overrides = dict(row.overrides)
    try:
        if row.max_restarts is None:
            rehearsal.train(row.epochs, **overrides)
        else:
            rehearsal.entries = rehearsal.train_under_controller(
                row.epochs, row.max_restarts, row.before_relaunch, **overrides
            )
    except StepFailed as exc:  # a node failed, as the fault may want
        say(f"the nodes: {exc}")
    ok, observed = judge(rehearsal, row, rehearsal.done_json())
    wait_for_fault_threads(rehearsal)
    if rehearsal.watches or (rehearsal.iam and rehearsal.iam.watches):
        return row.name, row.expected, "the fault was never injected", "FAIL"
    # A request a deployed role may not make fails on AWS, whatever the row's outcome.
    if refused := rehearsal.iam.refusals[refused_before:] if rehearsal.iam else []:
        return row.name, row.expected, f"IAM refused {len(refused)}: {refused[0]}", "FAIL"
    return row.name, row.expected, observed, "pass" if ok else "FAIL"


def chosen_rows(texts: list[str] | None, subset: str = "all") -> list[Row]:
    """The rows whose name contains one of `texts` (every row without any), of `subset`: "all",
    or "ci" (the rows marked in_ci)."""
    rows = [row for row in ROWS if subset == "all" or row.in_ci]
    return [row for row in rows if any(text in row.name for text in texts or [""])]


def run_faults(rehearsal: Rehearsal) -> int:
    rows = []
    try:
        setup = [
            ("local S3 endpoint", rehearsal.start_s3),
            ("sample dataset", rehearsal.make_sample),
            ("preprocessing node", rehearsal.preprocess),
            (f"snapshot '{DATASET}'", lambda: rehearsal.save_snapshot(DATASET)),
        ]
        for step, action in setup:
            rehearsal.step = step
            say(f"--- {step}")
            action()
        chosen = chosen_rows(rehearsal.args.fault, rehearsal.args.rows)
        say(f"fault rows ({rehearsal.args.rows}): {', '.join(row.name for row in chosen)}")
        for row in chosen:
            rehearsal.step = f"fault: {row.name}"
            say(f"--- {rehearsal.step} (from '{row.start}'; expected: {row.expected})")
            try:
                rows.append(run_row(rehearsal, row))
            except (RuntimeError, OSError) as exc:  # this row's own; the next starts afresh
                rows.append((row.name, row.expected, f"the row broke: {exc}", "FAIL"))
    except (RuntimeError, OSError) as exc:
        rows.append((rehearsal.step, "the rehearsal runs", f"{exc}", "FAIL"))
    finally:
        rehearsal.keep_s3()
        rehearsal.close()
    print_table(rows)
    failed = sum(row[3] != "pass" for row in rows)
    say(
        f"fault rehearsal: {len(rows) - failed} of {len(rows)} passed; files in {rehearsal.workdir}"
    )
    return 1 if failed or not rows else 0


def print_table(rows: list[tuple[str, str, str, str]]) -> None:
    header = ("fault", "expected", "observed", "result")
    clipped = [
        tuple(cell if len(cell) <= 150 else cell[:147] + "..." for cell in row) for row in rows
    ]
    widths = [max(len(r[i]) for r in [header, *clipped]) for i in range(4)]
    for row in [header, tuple("-" * w for w in widths), *clipped]:
        print(" | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)), flush=True)
