"""`python -m rehearsal --faults`: the fault rehearsal. One run of the rehearsal (local S3, the
sample dataset, preprocessing), then training attempts of the same run, each with one fault
injected, in order (each attempt starts from what the previous one left in S3):

    S3 unanswered mid-training   the endpoint stops answering (SIGSTOP of the S3 server: it still
                                 accepts connections) for OUTAGE_S during training
    S3 unanswered at restore     the same while the leader restores the checkpoints of a rerun
    rank killed                  SIGKILL of rank 1's trainer during training
    leader node stopped          SIGTERM to every process of node 0 (what systemd does to the
                                 unit at a shutdown or Spot interruption) during training
    shard corrupted in S3        a shard replaced by one of the same size with a flipped byte,
                                 on nodes that must pull it again: the run controller does not
                                 relaunch (not retryable)
    rerun after the S3 fix       the good shard put back; the same nodes run again
    node never boots             node 1 is not started: the leader names it every 30 s, then
                                 gives up; with maxRestarts 1 the controller relaunches once,
                                 then stops: restarts exhausted
    leader's bootstrap killed    SIGKILL of node 0's bootstrap process only, after the attempt's
                                 first epoch: the rehearsal restarts it as systemd does
                                 (Restart=on-abnormal), and the run resumes and finishes
    newest checkpoint corrupt    a byte of the newest checkpoint's data flipped in S3 (same
                                 size): the restore falls back to the newest intact one
    disk full at a checkpoint    node 0's model dir on a tmpfs that the restored files fill
                                 (namespaces only): the reason names ENOSPC, the path, the
                                 filesystem
    network of node 1 cut        node 1's link goes down mid-training (namespaces only): the
                                 reason names node 1 from its stale heartbeat, not rank 0; the
                                 controller relaunches (the link is back: new hardware) and the
                                 run finishes
    node 1's host lost           every process of node 1's namespace killed after an epoch: the
                                 controller relaunches, the run finishes, DONE.json counts both
    Spot interruption of node 1  a Spot fleet; node 1's instance gets EC2's two-minute notice
                                 after an epoch: every rank stops at one step with a checkpoint,
                                 DONE.json names node 1, the controller relaunches, and the
                                 rehearsal plays the reaper's Spot relaunch: every node a new
                                 instance (new id and address, empty disks, a new leader key);
                                 the run resumes from S3 and finishes

Rows with a run controller play the deployed fleet: after each attempt the controller's own code
(stacks/teardown/reaper/controller.py, run as a program against the local S3) decides, and on
`relaunch` the rehearsal plays EC2's stop and start: every process of every node ends and each
node's /data comes back empty (a Spot fleet's nodes come back as new instances instead).

and prints a table: fault, expected outcome, observed outcome, pass or fail. Exit 0 only if every
row passes. `--fault TEXT` (repeatable) keeps only the rows whose name contains TEXT, in order;
a row builds on what the rows before it left in S3 (the corrupt checkpoint needs a run with
checkpoints: `--fault "bootstrap killed" --fault "newest checkpoint"`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rehearsal.core import BUCKET, RUN, Rehearsal, StepFailed, say
from rehearsal.hosts import NODE_INTERFACE

# Longer than boto3's read timeout (20 s), so every kind of S3 call sees it time out and retry;
# short enough for CI.
OUTAGE_S = 40
SHARD = "train-00001-of-00004"
MISSING_NODE_TIMEOUT_S = 70  # two of the leader's every-30-s lines, then it gives up
# The trainer's line at an epoch's end ("Epoch 3/5 done in 3.0 s: ...").
EPOCH_DONE = re.compile(r"<stdout>:Epoch \d+/\d+ done in ")
# A checkpoint at every epoch's end (the trainer's default: the last epoch and after 600 s).
EVERY_EPOCH = {"trainer": {"checkpoint_every_s": 1}}


@dataclass
class Fault:
    name: str
    expected: str
    epochs: int
    prepare: Callable[[Rehearsal], None]
    judge: Callable[[Rehearsal, dict | None], tuple[bool, str]]
    overrides: dict | None = None
    cleanup: Callable[[Rehearsal], None] | None = None
    # Set: the row's attempts go through the run controller with this maxRestarts, and a
    # relaunch brings the fleet back (before_relaunch first: what the new hardware fixes).
    max_restarts: int | None = None
    before_relaunch: Callable[[Rehearsal], None] | None = None


def freeze_s3(rehearsal: Rehearsal, seconds: float) -> Callable[[], None]:
    def freeze() -> None:
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
            and "bootstrap.rank" not in cmdline  # the rank's program, not the wrapper around it
            and all(e.encode() in environ for e in env_entries)
        ):
            found.append(int(proc.name))
    return found


def kill_rank(rehearsal: Rehearsal, rank: int) -> Callable[[], None]:
    def kill() -> None:
        # Only this rehearsal's ranks: other rehearsals may run on the same machine.
        pids = processes_with(
            [f"HOROVOD_RANK={rank}", f"AWS_ENDPOINT_URL={rehearsal.endpoint}"], "trainer.train"
        )
        say(f"FAULT: SIGKILL to rank {rank} (pid {', '.join(map(str, pids)) or 'not found'})")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    return kill


def stop_leader_node(rehearsal: Rehearsal) -> Callable[[], None]:
    def stop() -> None:
        say("FAULT: SIGTERM to every process of node 0, as a shutdown does")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(rehearsal.node_processes[0].pid, signal.SIGTERM)

    return stop


def s3_object(rehearsal: Rehearsal, key: str) -> bytes | None:
    try:
        return rehearsal.s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    except Exception:
        return None


def corrupt_shard(rehearsal: Rehearsal) -> None:
    good = s3_object(rehearsal, f"tfrecords/{SHARD}")
    rehearsal.good_shard = good
    flipped = good[:-100] + bytes([good[-100] ^ 0xFF]) + good[-99:]
    rehearsal.s3.put_object(Bucket=BUCKET, Key=f"tfrecords/{SHARD}", Body=flipped)
    # Nodes that must pull the shard again (new instances in a redeployed fleet).
    for index in range(rehearsal.args.nodes):
        shutil.rmtree(rehearsal.node_home(index) / "data" / "tfrecords", ignore_errors=True)
    say(f"FAULT: s3://{BUCKET}/tfrecords/{SHARD} replaced by a same-size copy with a flipped byte")


def fix_shard(rehearsal: Rehearsal) -> None:
    good = rehearsal.good_shard
    digest = hashlib.sha256(good).hexdigest()
    rehearsal.s3.put_object(
        Bucket=BUCKET, Key=f"tfrecords/{SHARD}", Body=good, Metadata={"sha256": digest}
    )
    say(f"s3://{BUCKET}/tfrecords/{SHARD} fixed; the nodes keep their corrupt local copy")


def forget_node(index: int) -> Callable[[Rehearsal], None]:
    """Node 1 registered in the previous attempt seconds ago; a fleet deployed again finds only
    entries older than the heartbeat timeout, which the leader ignores. Start from that."""

    def forget(rehearsal: Rehearsal) -> None:
        rehearsal.s3.delete_object(Bucket=BUCKET, Key=f"runs/{RUN}/nodes/{index}.json")
        say(f"FAULT: node {index} will not boot")

    return forget


def kill_leader_bootstrap(rehearsal: Rehearsal) -> Callable[[], None]:
    def kill() -> None:
        pid = rehearsal.node_processes[0].pid  # train_node.sh exec'd the bootstrap: same pid
        say(f"FAULT: SIGKILL to node 0's bootstrap process only (pid {pid})")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

    return kill


def checkpoints_in_s3(rehearsal: Rehearsal) -> dict[str, int]:
    prefix = f"runs/{RUN}/model/checkpoints/"
    listing = rehearsal.s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix)
    return {o["Key"]: o["Size"] for o in listing.get("Contents", [])}


def corrupt_newest_checkpoint(rehearsal: Rehearsal) -> None:
    keys = checkpoints_in_s3(rehearsal)
    data = [k for k in keys if ".data-" in k and not k.endswith(".sha256")]
    if len(data) < 2:
        raise RuntimeError(
            "the corrupt-checkpoint row needs two checkpoints in S3 from a row before"
        )
    newest = max(data, key=lambda k: int(re.search(r"ckpt-(\d+)\.", k).group(1)))
    good = s3_object(rehearsal, newest)
    flipped = good[:-100] + bytes([good[-100] ^ 0xFF]) + good[-99:]
    rehearsal.s3.put_object(Bucket=BUCKET, Key=newest, Body=flipped)
    rehearsal.corrupted = newest.rsplit("/", 1)[1].split(".")[0]
    say(f"FAULT: s3://{BUCKET}/{newest} replaced by a same-size copy with a flipped byte")


def fill_model_dir(rehearsal: Rehearsal) -> None:
    """Node 0's model dir becomes a tmpfs the size of what the restore brings, plus less than
    one checkpoint: the first checkpoint of the attempt finds the disk full."""
    if rehearsal.fleet is None:
        raise RuntimeError("the full-disk row needs the namespaces (root): a tmpfs per node")
    model = f"runs/{RUN}/model/"
    listing = rehearsal.s3.list_objects_v2(Bucket=BUCKET, Prefix=model)
    objects = listing.get("Contents", [])
    restored = sum(o["Size"] for o in objects if not o["Key"].endswith(".sha256"))
    checkpoint = max(o["Size"] for o in objects if ".data-" in o["Key"])
    size = restored + checkpoint // 2
    target = rehearsal.workdir / "data" / "model"

    def mount() -> None:
        pid = rehearsal.node_processes[0].pid
        (rehearsal.node_home(0) / "data" / "model").mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["nsenter", "-t", str(pid), "-m", "mount", "-t", "tmpfs", "-o", f"size={size}",
             "tmpfs", str(target)],
            check=True,
        )  # fmt: skip
        say(f"FAULT: node 0's {target} is a tmpfs of {size} bytes ({restored} restored)")

    rehearsal.watches.append(("node0", "step 'rendezvous': start", mount))


def names_the_full_disk(rehearsal: Rehearsal, done: dict) -> bool:
    reason = done["reason"] or ""
    return (
        "ENOSPC" in reason
        and f"{rehearsal.workdir / 'data' / 'model'}/checkpoints/" in reason
        and "filesystem tmpfs (tmpfs)" in reason
    )


def set_link(rehearsal: Rehearsal, index: int, state: str) -> None:
    node = rehearsal.fleet.nodes[index]
    subprocess.run(
        ["ip", "netns", "exec", node.namespace, "ip", "link", "set", NODE_INTERFACE, state],
        check=True,
    )


def cut_network(index: int) -> Callable[[Rehearsal], None]:
    def prepare(rehearsal: Rehearsal) -> None:
        if rehearsal.fleet is None:
            raise RuntimeError("the network-cut row needs the namespaces (root): a link per node")

        def cut() -> None:
            set_link(rehearsal, index, "down")
            say(f"FAULT: node {index}'s network is cut ({NODE_INTERFACE} down)")

        rehearsal.watches.append(("node0", "<stdout>:Epoch ", cut))

    return prepare


def kill_host(index: int) -> Callable[[Rehearsal], None]:
    """Every process of node `index`'s host killed right after an epoch ends: the node is
    gone (its hardware failed), sshd and ranks included."""

    def prepare(rehearsal: Rehearsal) -> None:
        if rehearsal.fleet is None:
            raise RuntimeError("the lost-host row needs the namespaces (root): a host per node")

        def kill() -> None:
            rehearsal.services.pop(f"node{index}")  # a dead host's systemd restarts nothing
            pids = rehearsal.fleet.kill_host(rehearsal.fleet.nodes[index].namespace)
            say(f"FAULT: node {index}'s host is gone (SIGKILL to its {len(pids)} processes)")

        rehearsal.watches.append(("node0", EPOCH_DONE, kill))

    return prepare


def spot_notice(index: int) -> Callable[[Rehearsal], None]:
    """EC2's two-minute warning to node `index`'s instance right after an epoch ends: its IMDS
    `spot/instance-action` starts answering (the notice file stands in for it)."""

    def prepare(rehearsal: Rehearsal) -> None:
        def notify() -> None:
            path = rehearsal.notice_file(index)
            path.parent.mkdir(parents=True, exist_ok=True)
            at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 120))
            path.write_text(json.dumps({"action": "terminate", "time": at}))
            say(f"FAULT: EC2 will interrupt node {index} ({rehearsal.instance_id(index)}) at {at}")

        rehearsal.watches.append(("node0", EPOCH_DONE, notify))

    return prepare


def interruption_named(index: int):
    """The first attempt of the row ended interrupted, naming node `index`'s first instance."""
    return lambda r, done: (
        r.entries[0]["status"] == "interrupted"
        and (
            f"Spot interruption of node {index} (rehearsal-node-{index}, " in r.entries[0]["reason"]
        )
    )


def every_node_replaced(rehearsal: Rehearsal, done: dict) -> bool:
    """The last attempt ran on new instances: each node registered with its replacement's id and
    address, and the leader published a key other than the first attempt's."""
    for index in range(rehearsal.args.nodes):
        body = s3_object(rehearsal, f"runs/{RUN}/nodes/{index}.json") or b"{}"
        entry = json.loads(body)
        ip = rehearsal.node_ip(index)
        if entry.get("instance_id") != f"rehearsal-node-{index}-r1" or entry.get("ip") != ip:
            return False
    return node_said(rehearsal, 0, "Resuming from")


def decisions(*expected: str):
    """The run controller decided exactly these, in order, for the row's attempts."""
    return lambda r, done: [e["decision"] for e in r.entries] == list(expected)


def every_attempt_counted(rehearsal: Rehearsal, done: dict) -> bool:
    """DONE.json counts the attempts and lists each one's end, the earlier ones from the
    controller's attempts.json."""
    attempts = done.get("attempts") or []
    return done.get("attempt") == len(attempts) >= 2 and attempts[0]["status"] != "succeeded"


def names_the_lost_node(rehearsal: Rehearsal, index: int) -> bool:
    """The first attempt of the row ended naming node `index` from its stale heartbeat."""
    node = rehearsal.fleet.nodes[index]
    return (rehearsal.entries[0]["reason"] or "").startswith(
        f"step 'training' failed: RuntimeError: node {index} ({rehearsal.instance_id(index)}, "
        f"{node.ip}) lost: no heartbeat for "
    )


def restarted_once(node: str):
    return lambda r, done: r.restarts.get(node) == 1


def node_said(rehearsal: Rehearsal, index: int, text: str) -> bool:
    return any(text in line for line in rehearsal.output.get(f"node{index}", []))


def expect(status: str, epochs: int | None = None, **checks: bool):
    """A judge: DONE.json has this status (and epochs), and every named check holds."""

    def judge(rehearsal: Rehearsal, done: dict | None) -> tuple[bool, str]:
        if done is None:
            return False, "no DONE.json"
        seen = done["status"] + (f", epochs {done['epochs']}" if done["epochs"] else "")
        if done["status"] != "succeeded":
            # The step and what happened; the exception's type adds nothing to a table row.
            seen += ": " + re.sub(
                r"failed: \w+: (horovodrun exited \d+: )?", "failed: ", done["reason"]
            )
        failed = [name for name, check in checks.items() if not check(rehearsal, done)]
        ok = done["status"] == status and (epochs is None or done["epochs"] == epochs)
        if failed:
            seen += f" (not: {', '.join(failed)})"
        return ok and not failed, seen

    return judge


def no_epoch_retrained(first_epoch: int):
    return lambda r, done: (
        not any(node_said(r, 0, f"Epoch {e}/") for e in range(1, first_epoch))
        and node_said(r, 0, "Resuming from")
    )


def faults(nodes: int) -> list[Fault]:
    return [
        Fault(
            f"S3 unanswered for {OUTAGE_S} s mid-training",
            "succeeded, 2 epochs",
            2,
            lambda r: r.watches.append(("node0", "Epoch 1/", freeze_s3(r, OUTAGE_S))),
            expect("succeeded", 2),
        ),
        Fault(
            f"S3 unanswered for {OUTAGE_S} s at restore",
            "succeeded, 3 epochs, resumed at epoch 3",
            3,
            lambda r: r.watches.append(
                ("node0", "step 'restore checkpoints': start", freeze_s3(r, OUTAGE_S))
            ),
            expect("succeeded", 3, resumed_at_epoch_3=no_epoch_retrained(3)),
        ),
        Fault(
            "rank 1 killed (SIGKILL)",
            "failed: rank 1 on node 1 (<its host>) killed by SIGKILL",
            5,
            lambda r: r.watches.append(("node0", "Epoch 4/", kill_rank(r, 1))),
            expect(
                "failed",
                reason_names_the_rank=lambda r, d: (
                    "rank 1 on node 1 (" in d["reason"] and "killed by SIGKILL" in d["reason"]
                ),
            ),
        ),
        Fault(
            "leader's node stopped (SIGTERM)",
            "interrupted; its checkpoints and logs in S3",
            5,
            lambda r: r.watches.append(("node0", "<stdout>:Epoch ", stop_leader_node(r))),
            expect(
                "interrupted",
                logs_in_s3=lambda r, d: (
                    s3_object(r, f"runs/{RUN}/logs/node-0/train.log") is not None
                ),
                checkpoint_kept=lambda r, d: (
                    b"ckpt-" in (s3_object(r, f"runs/{RUN}/model/checkpoints/checkpoint") or b"")
                ),
            ),
        ),
        Fault(
            "shard corrupted in S3 (same size)",
            f"failed at the data pull, naming {SHARD}; not relaunched (not retryable)",
            5,
            corrupt_shard,
            expect(
                "failed",
                names_the_shard=lambda r, d: (
                    "data pull" in d["reason"] and SHARD in d["reason"] and "sha256" in d["reason"]
                ),
                not_relaunched=decisions("teardown"),
            ),
            max_restarts=3,
        ),
        Fault(
            "rerun after the shard is fixed in S3",
            "succeeded, 5 epochs; the shard re-fetched",
            5,
            fix_shard,
            expect(
                "succeeded",
                5,
                refetched=lambda r, d: all(node_said(r, i, "re-fetched") for i in range(nodes)),
            ),
        ),
        Fault(
            "node 1 never boots (maxRestarts 1)",
            "failed: node(s) 1 of 2 did not register, named every 30 s; relaunched once, then "
            "stopped: restarts exhausted",
            5,
            forget_node(1),
            expect(
                "failed",
                names_the_node=lambda r, d: "node(s) 1 of 2 did not register" in d["reason"],
                said_so_every_30_s=lambda r, d: (
                    sum(
                        "rendezvous: waiting" in line and "node(s) 1 of 2" in line
                        for line in r.output.get("node0", [])
                    )
                    >= 2
                ),
                relaunched_once_then_stopped=decisions("relaunch", "stop"),
                says_restarts_exhausted=lambda r, d: "restarts exhausted" in r.entries[-1]["why"],
            ),
            {"absent": (1,), "rendezvous_timeout_s": MISSING_NODE_TIMEOUT_S},
            max_restarts=1,
        ),
        Fault(
            "leader's bootstrap killed (SIGKILL) after the first epoch",
            "succeeded, 7 epochs: restarted once, resumed from S3, the member waited",
            7,
            lambda r: r.watches.append(("node0", "is in s3://", kill_leader_bootstrap(r))),
            expect(
                "succeeded",
                7,
                restarted_once=restarted_once("node0"),
                resumed=lambda r, d: node_said(r, 0, "Resuming from"),
                member_saw_done=lambda r, d: node_said(r, 1, "the leader wrote DONE.json"),
            ),
            EVERY_EPOCH,
        ),
        Fault(
            "newest checkpoint corrupt in S3 (same size)",
            "succeeded, 8 epochs: the restore fell back to the newest intact one and said so",
            8,
            corrupt_newest_checkpoint,
            expect(
                "succeeded",
                8,
                said_so=lambda r, d: node_said(r, 0, f"{r.corrupted} (sha256 of"),
                fell_back=lambda r, d: node_said(r, 0, "the newest intact checkpoint"),
            ),
            EVERY_EPOCH,
        ),
        Fault(
            "disk full at a checkpoint (ENOSPC)",
            "failed: no space left on device (ENOSPC) writing <path>; filesystem tmpfs ...",
            9,
            fill_model_dir,
            expect("failed", names_the_path_and_filesystem=names_the_full_disk),
            EVERY_EPOCH,
        ),
        Fault(
            "network of node 1 cut mid-training (a hung collective)",
            "attempt 1 failed: node 1 (rehearsal-node-1, <its ip>) lost: no heartbeat for ... s; "
            "relaunched, succeeded, 10 epochs",
            10,
            cut_network(1),
            expect(
                "succeeded",
                10,
                attempt_1_names_node_1_not_rank_0=lambda r, d: names_the_lost_node(r, 1),
                relaunched_once=decisions("relaunch", "teardown"),
                counted=every_attempt_counted,
            ),
            cleanup=lambda r: set_link(r, 1, "up"),
            max_restarts=5,  # the run's earlier rows relaunched too: the count is per run
            before_relaunch=lambda r: set_link(r, 1, "up"),
        ),
        Fault(
            "node 1's host lost right after an epoch (every process killed)",
            "succeeded, 12 epochs after one relaunch; DONE.json counts 2 attempts",
            12,
            kill_host(1),
            expect(
                "succeeded",
                12,
                relaunched_once=decisions("relaunch", "teardown"),
                counted=every_attempt_counted,
            ),
            EVERY_EPOCH,
            max_restarts=5,
        ),
        Fault(
            "Spot interruption of node 1 (two-minute notice) after an epoch",
            "attempt 1 interrupted: Spot interruption of node 1 (...), every rank stopped at one "
            "step; relaunched as new instances, resumed, succeeded, 16 epochs",
            16,
            spot_notice(1),
            expect(
                "succeeded",
                16,
                attempt_1_names_node_1=interruption_named(1),
                relaunched_once=decisions("relaunch", "teardown"),
                counted=every_attempt_counted,
                on_new_instances=every_node_replaced,
            ),
            {**EVERY_EPOCH, "market": "spot"},
            max_restarts=5,
        ),
    ]


def run_faults(rehearsal: Rehearsal) -> int:
    rows = []
    try:
        setup = [
            ("local S3 endpoint", rehearsal.start_s3),
            ("sample dataset", rehearsal.make_sample),
            ("preprocessing node", rehearsal.preprocess),
        ]
        for step, action in setup:
            rehearsal.step = step
            say(f"--- {step}")
            action()
        chosen = rehearsal.args.fault or [""]
        for fault in faults(rehearsal.args.nodes):
            if not any(text in fault.name for text in chosen):
                continue
            rehearsal.step = f"fault: {fault.name}"
            say(f"--- {rehearsal.step} (expected: {fault.expected})")
            rehearsal.watches.clear()
            fault.prepare(rehearsal)
            rehearsal.entries = []
            refused_before = len(rehearsal.iam.refusals) if rehearsal.iam else 0
            try:
                if fault.max_restarts is None:
                    rehearsal.train(fault.epochs, **(fault.overrides or {}))
                else:
                    rehearsal.entries = rehearsal.train_under_controller(
                        fault.epochs,
                        fault.max_restarts,
                        fault.before_relaunch,
                        **(fault.overrides or {}),
                    )
            except StepFailed as exc:  # a node failed, as the fault may want
                say(f"the nodes: {exc}")
            ok, observed = fault.judge(rehearsal, rehearsal.done_json())
            if fault.cleanup:
                fault.cleanup(rehearsal)
            rows.append((fault.name, fault.expected, observed, "pass" if ok else "FAIL"))
            if rehearsal.watches:
                rows[-1] = (*rows[-1][:2], "the fault was never injected", "FAIL")
            # A request a deployed role may not make fails on AWS, whatever the row's outcome.
            if refused := rehearsal.iam.refusals[refused_before:] if rehearsal.iam else []:
                rows[-1] = (*rows[-1][:2], f"IAM refused {len(refused)}: {refused[0]}", "FAIL")
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
    return 1 if failed else 0


def print_table(rows: list[tuple[str, str, str, str]]) -> None:
    header = ("fault", "expected", "observed", "result")
    clipped = [
        tuple(cell if len(cell) <= 150 else cell[:147] + "..." for cell in row) for row in rows
    ]
    widths = [max(len(r[i]) for r in [header, *clipped]) for i in range(4)]
    for row in [header, tuple("-" * w for w in widths), *clipped]:
        print(" | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)), flush=True)
