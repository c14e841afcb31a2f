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


def kill_fleet_for(seconds: float) -> Action:
    """Every process of every node's host killed every second for `seconds`: the whole fleet
    goes silent at once (a network event, a wedged image) while every instance runs. Their
    systemd restarts a killed bootstrap 5 s later, at most 5 times, and each restart is killed
    too; no node is left to write DONE.json."""

    def kill(rehearsal: Rehearsal) -> None:
        namespaces = [node.namespace for node in rehearsal.fleet.nodes]
        say(f"FAULT: every node's host is dead for {seconds:.0f} s")

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
