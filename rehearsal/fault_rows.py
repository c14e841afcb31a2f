"""The fault rehearsal's rows as data (ROWS), grouped by family: S3, ranks, nodes, disk, Spot.

Each row names the snapshot it starts from, its fault (rehearsal/fault_actions.py) and when it
strikes, and what its outcome must be (rehearsal/fault_checks.py); rehearsal/faults.py runs them.
docs/rehearsal.md's table is `markdown_table()` (a test keeps the two equal). Rows with
`max_restarts` play the deployed fleet: after each attempt the run controller's state machine
runs (rehearsal/cloud.py), and the nodes its relaunch brought back boot again
(rehearsal/attempts.py `relaunch`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rehearsal.common import RUN
from rehearsal.fault_actions import (
    SHARD,
    Action,
    corrupt_local_shard,
    corrupt_newest_checkpoint,
    corrupt_shard,
    cut_network,
    fill_model_dir,
    forget_node,
    freeze_s3,
    kill_fleet_for,
    kill_host,
    kill_host_for,
    kill_leader_bootstrap,
    kill_rank,
    pause_rank,
    s3_object,
    set_link,
    spot_notice,
    stop_leader_node,
    wait_for_fault_threads,
)
from rehearsal.fault_checks import (
    Check,
    decisions,
    every_attempt_counted,
    every_node_replaced,
    first_attempt_ended,
    interruption_named,
    names_the_full_disk,
    names_the_lost_node,
    no_epoch_retrained,
    no_node_blamed,
    node_said,
    the_controller_wrote_the_silence,
)

DATASET = "dataset converted"
CHECKPOINTED = "a run with checkpoints"
# Longer than boto3's read timeout (20 s), so every kind of S3 call sees it time out and retry;
# short enough for CI.
OUTAGE_S = 40
# Longer than the rehearsal's heartbeat_timeout_s (60 s, rehearsal/nodes.py), inside the 5
# minutes an outage may last (bootstrap/aws.py OUTAGE_S): no heartbeat can be fresh through it.
LONG_OUTAGE_S = 75
# The paused rank's row: a collective timeout shorter than the pause, so the attempt ends.
PAUSE_S = 90
PAUSED_COLLECTIVE_TIMEOUT_S = 30
# How long the dead leader's host stays dead: its processes, a restarted bootstrap included,
# are killed every second for this long.
DEAD_FOR_S = 60
MISSING_NODE_TIMEOUT_S = 70  # two of the leader's every-30-s lines, then it gives up
# The trainer's line at an epoch's end ("Epoch 3/5 done in 3.0 s: ...").
EPOCH_DONE = re.compile(r"<stdout>:Epoch \d+/\d+ done in ")
SECOND_OF_FOUR_DONE = re.compile(r"<stdout>:Epoch 2/4 done in ")
# A checkpoint at every epoch's end (the trainer's default: the last epoch and after 600 s).
EVERY_EPOCH = {"trainer": {"checkpoint_every_s": 1}}


@dataclass(frozen=True)
class Request:
    """A request the local S3 answered: its method and a pattern of its path."""

    method: str
    path: re.Pattern


@dataclass(frozen=True)
class Fault:
    """What is done to the run, and when: at the head's first output line (its own, and its horovodrun's: the ranks') that matches `when`
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
        # Not in CI's subset: CI's upload-cut row loses the leader's host too, and relaunches.
    ),
    Row(
        "nodes",
        f"every node's host dead for {DEAD_FOR_S} s right after epoch 2 of 4 (the whole fleet "
        "silent)",
        "no node can write DONE.json; the run controller finds every heartbeat stale, writes the "
        "attempt's record (node_lost, naming every node) and relaunches; succeeded with every "
        "epoch",
        DATASET,
        4,
        Fault(kill_fleet_for(DEAD_FOR_S), when=SECOND_OF_FOUR_DONE),
        Expect("succeeded", 4, {"the_controller_wrote_it": the_controller_wrote_the_silence}),
        max_restarts=2,
        before_relaunch=wait_for_fault_threads,
        needs_hosts=True,
        # In CI: the one row whose attempt only the run controller can end (no node is left to
        # write DONE.json), instead of node 1's lost host, whose DONE.json a node writes as in
        # the upload-cut and Spot rows; the two rows take the same time.
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
        # Not in CI's subset: a node's DONE.json after a lost host is in the upload-cut row.
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
