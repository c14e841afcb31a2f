"""What a fault row does to the run (rehearsal/fault_rows.py): each an `Action` on the
rehearsal, run at the moment its row's `Fault` names (rehearsal/faults.py `run_row`). A fault
that goes on (a host kept dead) keeps its thread in `rehearsal.fault_threads`.
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
from pathlib import Path

from rehearsal.common import BUCKET, RUN, say
from rehearsal.core import Rehearsal
from rehearsal.hosts import NODE_INTERFACE

# The shard the corrupt-shard rows flip a byte of.
SHARD = "train-00001-of-00004"

Action = Callable[[Rehearsal], None]


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


def rank_pids(rehearsal: Rehearsal, rank: int) -> list[int]:
    """Rank `rank`'s trainer processes of this rehearsal only: other rehearsals may run on the
    same machine."""
    return processes_with(
        [f"HOROVOD_RANK={rank}", f"AWS_ENDPOINT_URL={rehearsal.endpoint}"], "trainer.train"
    )


def send(pids: list[int], signum: signal.Signals) -> None:
    """`signum` to each pid that still exists."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def kill_rank(rank: int) -> Action:
    def kill(rehearsal: Rehearsal) -> None:
        pids = rank_pids(rehearsal, rank)
        say(f"FAULT: SIGKILL to rank {rank} (pid {', '.join(map(str, pids)) or 'not found'})")
        send(pids, signal.SIGKILL)

    return kill


def stop_node(index: int) -> Action:
    """A shutdown of node `index`: SIGTERM to every process of its host (its ranks included,
    which leave the job at the next commit; its bootstrap, which tells the head)."""

    def stop(rehearsal: Rehearsal) -> None:
        say(f"FAULT: SIGTERM to every process of node {index}, as a shutdown does")
        rehearsal.services.pop(f"node{index}", None)  # a clean stop: systemd restarts nothing
        rehearsal.fleet.signal_host(rehearsal.fleet.nodes[index].namespace, signal.SIGTERM)

    return stop


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


def kill_head_bootstrap(rehearsal: Rehearsal) -> None:
    pid = rehearsal.named["head"].pid  # train_node.sh exec'd the bootstrap: same pid
    say(f"FAULT: SIGKILL to the head's bootstrap process only (pid {pid})")
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


def fill_model_dirs(rehearsal: Rehearsal) -> None:
    """Every node's model dir becomes a tmpfs the size of what the restore brings, plus less
    than one checkpoint: the first checkpoint of the attempt finds the disk full, wherever
    rank 0 is (a node's disk is every node's: one launch template)."""
    listing = rehearsal.s3.list_objects_v2(Bucket=BUCKET, Prefix=f"runs/{RUN}/model/")
    objects = listing["Contents"]
    restored = sum(o["Size"] for o in objects if not o["Key"].endswith(".sha256"))
    checkpoint = max(o["Size"] for o in objects if ".data-" in o["Key"])
    size = restored + checkpoint // 2
    target = rehearsal.workdir / "data" / "model"
    for index in range(rehearsal.args.nodes):
        pid = rehearsal.named[f"node{index}"].pid
        (rehearsal.node_home(index) / "data" / "model").mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["nsenter", "-t", str(pid), "-m", "mount", "-t", "tmpfs", "-o", f"size={size}",
             "tmpfs", str(target)],
            check=True,
        )  # fmt: skip
    say(f"FAULT: every node's {target} is a tmpfs of {size} bytes ({restored} restored)")


def set_link(rehearsal: Rehearsal, index: int, state: str) -> None:
    node = rehearsal.fleet.nodes[index]
    subprocess.run(
        ["ip", "netns", "exec", node.namespace, "ip", "link", "set", NODE_INTERFACE, state],
        check=True,
    )


def cut_network(index: int) -> Action:
    """Node `index`'s link down, for good: its processes run on, unreachable (a silent loss)."""

    def cut(rehearsal: Rehearsal) -> None:
        set_link(rehearsal, index, "down")
        rehearsal.noted["cut_at"] = time.time()
        say(f"FAULT: node {index}'s network is cut ({NODE_INTERFACE} down)")

    return cut


def host(rehearsal: Rehearsal, node: int | str):
    """Node `node`'s simulated host, or the head's ("head")."""
    return rehearsal.fleet.head if node == "head" else rehearsal.fleet.nodes[node]


def named(node: int | str) -> str:
    return "the head" if node == "head" else f"node {node}"


def trainer_pids(rehearsal: Rehearsal, index: int) -> list[int]:
    """The trainer processes on node `index`'s host (not the rank wrappers around them)."""
    pids = subprocess.run(
        ["ip", "netns", "pids", rehearsal.fleet.nodes[index].namespace],
        capture_output=True, text=True,
    ).stdout.split()  # fmt: skip
    found = []
    for pid in pids:
        with contextlib.suppress(OSError):
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            if "trainer.train" in cmdline and "bootstrap.fleet.rank" not in cmdline:
                found.append(int(pid))
    return sorted(found)


def kill_host(node: int | str, then: re.Pattern | None = None) -> Action:
    """Every process of node `node`'s host (or the head's) killed: it is gone (its hardware
    failed), sshd and ranks included, and its systemd restarts nothing. With `then`: every
    other node's trainer processes are noted now and again at the head's first line matching
    `then` (rehearsal.noted), to show they lived through the loss."""

    def kill(rehearsal: Rehearsal) -> None:
        others = [i for i in range(rehearsal.args.nodes) if i != node]
        if then is not None:
            rehearsal.noted["before"] = {i: trainer_pids(rehearsal, i) for i in others}

            def after() -> None:
                rehearsal.noted["after"] = {i: trainer_pids(rehearsal, i) for i in others}

            rehearsal.watches.append(("head", then, after))
        rehearsal.services.pop("head" if node == "head" else f"node{node}")
        rehearsal.noted["killed_at"] = time.time()
        pids = rehearsal.fleet.kill_host(host(rehearsal, node).namespace)
        say(f"FAULT: {named(node)}'s host is gone (SIGKILL to its {len(pids)} processes)")

    return kill


def kill_head_and_its_instance(rehearsal: Rehearsal) -> None:
    """The head's host is gone and EC2 ended its instance (a retired host, say): every process
    of its namespace killed, nothing restarts them, and its instance terminated in EC2 (moto),
    where the run controller sees it."""
    rehearsal.services.pop("head")
    pids = rehearsal.fleet.kill_host(rehearsal.fleet.head.namespace)
    rehearsal.noted["head_terminated"] = rehearsal.cloud.terminate_head()
    say(
        f"FAULT: the head's host is gone (SIGKILL to its {len(pids)} processes) and EC2 "
        f"terminated its instance {rehearsal.noted['head_terminated']}"
    )


def kill_host_for(node: int | str, seconds: float) -> Action:
    """Node `node`'s host (or the head's) killed now and kept dead: every process of it killed
    every second for `seconds` (before_relaunch waits for that to end)."""

    def kill(rehearsal: Rehearsal) -> None:
        rehearsal.services.pop("head" if node == "head" else f"node{node}")
        namespace = host(rehearsal, node).namespace
        say(f"FAULT: {named(node)}'s host is dead for {seconds:.0f} s")

        def keep_dead() -> None:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                rehearsal.fleet.kill_host(namespace)
                time.sleep(1)
            say(f"FAULT over: {named(node)}'s host is no longer killed")

        rehearsal.fault_threads.append(threading.Thread(target=keep_dead, daemon=True))
        rehearsal.fault_threads[-1].start()

    return kill


def kill_fleet_for(seconds: float) -> Action:
    """Every process of every node's host killed every second for `seconds`: the whole fleet
    goes silent at once (a network event, a wedged image) while every instance runs. Their
    systemd restarts a killed bootstrap 5 s later, at most 5 times, and each restart is killed
    too; no node is left to write DONE.json."""

    def kill(rehearsal: Rehearsal) -> None:
        nodes = rehearsal.fleet.nodes[: rehearsal.args.nodes]
        namespaces = [node.namespace for node in [*nodes, rehearsal.fleet.head]]
        say(f"FAULT: every node's host and the head's are dead for {seconds:.0f} s")

        def keep_dead() -> None:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                for namespace in namespaces:
                    rehearsal.fleet.kill_host(namespace)
                time.sleep(1)
            say("FAULT over: the nodes' hosts are no longer killed")

        rehearsal.fault_threads.append(threading.Thread(target=keep_dead, daemon=True))
        rehearsal.fault_threads[-1].start()

    return kill


def wait_for_fault_threads(rehearsal: Rehearsal) -> None:
    for thread in rehearsal.fault_threads:
        thread.join()


def pause_rank(rank: int, seconds: float) -> Action:
    """SIGSTOP to rank `rank`'s trainer, SIGCONT `seconds` later (if it still exists)."""

    def pause(rehearsal: Rehearsal) -> None:
        pids = rank_pids(rehearsal, rank)
        say(f"FAULT: rank {rank}'s trainer paused for {seconds:.0f} s (pid {pids})")
        send(pids, signal.SIGSTOP)
        timer = threading.Timer(seconds, send, args=(pids, signal.SIGCONT))
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


def kill_host_then_its_replacement(node: int, after_s: float) -> Action:
    """Node `node`'s host killed (kill_host), then its replacement's: every process of the
    instance the run controller launched for it killed `after_s` after the launch (a new
    instance lost early: a bad GPU, a Spot reclaim, a full disk). Its systemd restarts nothing;
    the controller may replace it again."""
    first = kill_host(node)

    def kill(rehearsal: Rehearsal) -> None:
        lost = rehearsal.launched.get(node)
        first(rehearsal)

        def kill_the_replacement() -> None:
            deadline = time.monotonic() + REPLACEMENT_WAIT_S
            while (instance := rehearsal.launched.get(node)) in (None, lost):
                if time.monotonic() > deadline:
                    say(f"FAULT: no replacement of node {node} within {REPLACEMENT_WAIT_S} s")
                    return
                time.sleep(0.2)
            time.sleep(after_s)
            rehearsal.services.pop(f"node{node}", None)
            rehearsal.noted["replacement_killed"] = instance
            pids = rehearsal.fleet.kill_host(rehearsal.fleet.nodes[node].namespace)
            say(
                f"FAULT: node {node}'s replacement {instance} is gone {after_s:.0f} s after its "
                f"launch (SIGKILL to its {len(pids)} processes)"
            )

        rehearsal.fault_threads.append(threading.Thread(target=kill_the_replacement, daemon=True))
        rehearsal.fault_threads[-1].start()

    return kill


# How long kill_host_then_its_replacement waits for the run controller's replacement: its tick
# finds the node silent after heartbeat_timeout_s and launches one at its next look.
REPLACEMENT_WAIT_S = 300


def pause_host(node: int | str, seconds: float) -> Action:
    """Every process of node `node`'s host (or the head's) paused (SIGSTOP), and continued
    (SIGCONT) `seconds` later: a host stalled by a slow disk, a blocked call, a stuck thread."""

    def pause(rehearsal: Rehearsal) -> None:
        namespace = host(rehearsal, node).namespace
        pids = rehearsal.fleet.signal_host(namespace, signal.SIGSTOP)
        rehearsal.noted["paused_at"] = time.time()
        say(
            f"FAULT: every process of {named(node)}'s host paused for {seconds:.0f} s ({len(pids)})"
        )

        def resume() -> None:
            time.sleep(seconds)
            rehearsal.fleet.signal_host(namespace, signal.SIGCONT)
            say(f"FAULT over: {named(node)}'s host runs again")

        rehearsal.fault_threads.append(threading.Thread(target=resume, daemon=True))
        rehearsal.fault_threads[-1].start()

    return pause
