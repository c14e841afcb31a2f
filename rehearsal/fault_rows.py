"""The fault rehearsal's rows as data (ROWS), grouped by family: S3, ranks, nodes, elastic, disk,
Spot.

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

from rehearsal.fault_actions import (
    SHARD,
    Action,
    corrupt_local_shard,
    corrupt_newest_checkpoint,
    corrupt_shard,
    cut_network,
    fill_model_dirs,
    forget_node,
    freeze_s3,
    kill_fleet_for,
    kill_head_and_its_instance,
    kill_head_bootstrap,
    kill_host,
    kill_host_for,
    kill_host_then_its_replacement,
    kill_rank,
    pause_host,
    pause_rank,
    spot_notice,
    stop_node,
    wait_for_fault_threads,
)
from rehearsal.fault_checks import (
    Check,
    a_new_head_took_over,
    decisions,
    every_attempt_counted,
    every_node_back_in_place_with_nothing_fetched,
    first_attempt_ended,
    head_said,
    interruption_named,
    left_with_no_step_redone,
    lost_in_a_reset,
    lost_joiner_named,
    names_the_full_disk,
    no_epoch_retrained,
    no_node_blamed,
    node_said,
    one_attempt,
    only_node_replaced,
    replacement_joined,
    the_controller_wrote_the_silence,
    trainer_kept_its_pid,
    training_again_within,
    waited_for_the_head,
)

DATASET = "dataset converted"
CHECKPOINTED = "a run with checkpoints"
# Longer than boto3's read timeout (20 s), so every kind of S3 call sees it time out and retry;
# short enough for CI.
OUTAGE_S = 40
# Longer than the rehearsal's heartbeat_timeout_s (60 s, rehearsal/nodes.py), inside the 5
# minutes an outage may last (bootstrap/aws.py OUTAGE_S): no heartbeat can be fresh through it.
LONG_OUTAGE_S = 75
# The paused rank's row: longer than the 30 s a Gloo collective waits under elastic training
# (bootstrap/head/elastic.py ELASTIC_COLLECTIVE_TIMEOUT_S).
PAUSE_S = 90
# How long the dead head's host stays dead: its processes, a restarted bootstrap included,
# are killed every second for this long.
DEAD_FOR_S = 60
MISSING_NODE_TIMEOUT_S = 70  # two of the head's every-30-s lines, then it gives up
# The trainer's line at an epoch's end ("Epoch 3/5 done in 3.0 s: ...").
EPOCH_DONE = re.compile(r"<stdout>:Epoch \d+/\d+ done in ")
FIRST_OF_FOUR_DONE = re.compile(r"<stdout>:Epoch 1/4 done in ")
SECOND_OF_FOUR_DONE = re.compile(r"<stdout>:Epoch 2/4 done in ")
# A checkpoint at every epoch's end (the trainer's default: the last epoch and after 600 s).
EVERY_EPOCH = {"trainer": {"checkpoint_every_s": 1}}
# The elastic rows (the issue's: three nodes, four epochs): a node's loss is seen within 20 s
# (heartbeat_timeout_s; the run controller's tick replaces a node the head finds silent), and
# the epochs are long enough (64-pixel images) that a replacement, which boots, pulls every
# shard and starts its trainer, joins before the run ends.
ELASTIC_NODES = 3
ELASTIC = {"heartbeat_timeout_s": 20, "trainer": {"image_size": 64}}
# Fewer than minNodes left: the head's elastic driver waits this long for minNodes' slots.
ELASTIC_TIMEOUT_S = 30
# Issue 47's: a replacement lost this long after its launch, and a head stalled this long.
REPLACEMENT_LOST_AFTER_S = 6
HEAD_PAUSE_S = 90


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
    family: str  # S3, ranks, nodes, elastic, disk, Spot
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
    nodes: int | None = None  # the row's fleet (None: the rehearsal's --nodes)


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
        "no node is blamed for S3's silence (no reset, none replaced); succeeded with every epoch",
        DATASET,
        2,
        Fault(freeze_s3(LONG_OUTAGE_S), when="Epoch 1/"),
        Expect("succeeded", 2, {"no_node_blamed": no_node_blamed}),
    ),
    Row(
        "S3",
        "the first checkpoint's upload cut: the head's host killed when its .index reaches S3",
        "the nodes find the head lost and write the attempt's DONE.json (node_lost); relaunched, "
        "the restore takes no half-uploaded checkpoint; succeeded with every epoch",
        DATASET,
        3,
        Fault(
            kill_host("head"),
            when=Request("PUT", re.compile(r"/runs/[^/]+/model/checkpoints/ckpt-\d+\.index$")),
        ),
        Expect(
            "succeeded",
            3,
            {
                "a_node_recorded_the_lost_head": first_attempt_ended("node_lost", "the head"),
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
        "a reset without node 1 (its host out for its cooldown, then back); succeeded with "
        "every epoch, attempt 1",
        DATASET,
        3,
        Fault(kill_rank(1), when="Epoch 2/"),
        Expect(
            "succeeded",
            3,
            {"one_attempt": one_attempt, "reset_without_node_1": lost_in_a_reset(1)},
        ),
        max_restarts=2,
    ),
    Row(
        "ranks",
        "the head's bootstrap killed (SIGKILL) after its first checkpoint",
        "systemd restarts it; it resumes from S3 and the run succeeds with every epoch",
        DATASET,
        3,
        Fault(kill_head_bootstrap, when="is in s3://"),
        Expect(
            "succeeded",
            3,
            {
                "restarted_once": lambda r, d: r.restarts.get("head") == 1,
                "resumed": lambda r, d: head_said(r, "Resuming from"),
                "nodes_saw_done": lambda r, d: node_said(r, 1, "DONE.json is written"),
            },
        ),
        EVERY_EPOCH,
    ),
    Row(
        "ranks",
        f"rank 1's trainer paused (SIGSTOP) for {PAUSE_S} s, past the 30 s collective timeout",
        "the others' collective times out and they reset; the paused rank rejoins once it runs "
        "again; succeeded with every epoch, attempt 1",
        DATASET,
        3,
        Fault(pause_rank(1, PAUSE_S), when=EPOCH_DONE),
        Expect(
            "succeeded",
            3,
            {"one_attempt": one_attempt, "a_reset": lambda r, d: bool(d.get("resets"))},
        ),
        max_restarts=2,
    ),
    Row(
        "nodes",
        "node 0 stopped (SIGTERM: its shutdown) after an epoch",
        "its ranks leave at the next commit and the others train on; succeeded with every "
        "epoch, attempt 1",
        DATASET,
        3,
        Fault(stop_node(0), when=EPOCH_DONE),
        Expect("succeeded", 3, {"one_attempt": one_attempt, "left": lost_in_a_reset(0)}),
        max_restarts=2,
        needs_hosts=True,
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
                        for line in r.output.get("head", [])
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
        f"the head's host dead for {DEAD_FOR_S} s after an epoch",
        "the nodes find the head lost and write the attempt's DONE.json (node_lost); relaunched, "
        "succeeded with every epoch, DONE.json counts 2 attempts",
        DATASET,
        3,
        Fault(kill_host_for("head", DEAD_FOR_S), when=EPOCH_DONE),
        Expect(
            "succeeded",
            3,
            {
                "a_node_recorded_the_lost_head": first_attempt_ended("node_lost", "the head"),
                "relaunched_once": decisions("relaunch", "teardown"),
                "counted": every_attempt_counted,
            },
        ),
        EVERY_EPOCH,
        max_restarts=2,
        before_relaunch=wait_for_fault_threads,
        needs_hosts=True,
        # Not in CI's subset: CI's upload-cut row loses the head's host too, and relaunches.
    ),
    Row(
        "nodes",
        f"every node's host and the head's dead for {DEAD_FOR_S} s right after epoch 2 of 4 "
        "(the whole fleet silent)",
        "no node can write DONE.json; the run controller finds every heartbeat stale, writes the "
        "attempt's record (node_lost, naming every node) and relaunches, every node and the head "
        "rebooted in place (each pull fetches 0 bytes); succeeded with every epoch",
        DATASET,
        4,
        Fault(kill_fleet_for(DEAD_FOR_S), when=SECOND_OF_FOUR_DONE),
        Expect(
            "succeeded",
            4,
            {
                "the_controller_wrote_it": the_controller_wrote_the_silence,
                "back_in_place_fetching_nothing": every_node_back_in_place_with_nothing_fetched,
            },
        ),
        max_restarts=2,
        before_relaunch=wait_for_fault_threads,
        needs_hosts=True,
    ),
    Row(
        "nodes",
        "the head's host lost and its instance terminated in EC2 after epoch 1 of 4 (once its "
        "checkpoint is committed)",
        "the nodes find the head lost and write the attempt's DONE.json (node_lost); the run "
        "controller launches a new head from its template and reboots the nodes in place; the "
        "new head resumes from S3 at epoch 2 and the run succeeds with 4 epochs, no deploy",
        DATASET,
        4,
        Fault(
            kill_head_and_its_instance,
            when=Request("PUT", re.compile(r"/runs/[^/]+/model/checkpoints/checkpoint$")),
        ),
        Expect(
            "succeeded",
            4,
            {
                "a_node_recorded_the_lost_head": first_attempt_ended("node_lost", "the head"),
                "relaunched_once": decisions("relaunch", "teardown"),
                "a_new_head_took_over": a_new_head_took_over,
                "resumed_at_epoch_2": no_epoch_retrained(2),
            },
        ),
        {"heartbeat_timeout_s": 20, "trainer": {"image_size": 64, "checkpoint_every_s": 1}},
        max_restarts=2,
        needs_hosts=True,
        nodes=ELASTIC_NODES,
    ),
    Row(
        "elastic",
        "node 2's host lost right after epoch 1 of 4 (every process SIGKILLed)",
        "a reset on nodes 0 and 1, node 0's trainer the same process; the run controller "
        "replaces node 2, which joins before the end; succeeded with 4 epochs, attempt 1",
        DATASET,
        4,
        Fault(kill_host(2, then=SECOND_OF_FOUR_DONE), when=FIRST_OF_FOUR_DONE),
        Expect(
            "succeeded",
            4,
            {
                "one_attempt": one_attempt,
                "reset_without_node_2": lost_in_a_reset(2),
                "node_0_kept_its_trainer": trainer_kept_its_pid(0),
                "replacement_joined": replacement_joined(2),
            },
        ),
        ELASTIC,
        max_restarts=2,
        needs_hosts=True,
        # In CI: a reset and the run controller's tick replacing a node while the head trains
        # on; it stands for the tick's path, so the whole fleet silent row left CI.
        in_ci=True,
        nodes=ELASTIC_NODES,
    ),
    Row(
        "elastic",
        "node 0's host lost right after epoch 1 of 4 (rank 0's node)",
        "a reset on nodes 1 and 2 (rank 0 moves; the head copies its outputs from there); "
        "succeeded with 4 epochs, attempt 1",
        DATASET,
        4,
        Fault(kill_host(0), when=FIRST_OF_FOUR_DONE),
        Expect("succeeded", 4, {"one_attempt": one_attempt, "reset": lost_in_a_reset(0)}),
        ELASTIC,
        max_restarts=2,
        needs_hosts=True,
        nodes=ELASTIC_NODES,
    ),
    Row(
        "elastic",
        "node 1's link down for good right after epoch 1 of 4 (a silent loss)",
        "the others train again within 120 s (Gloo's 30 s timeout, ssh keep-alives); the run "
        "controller replaces node 1; succeeded with 4 epochs, attempt 1",
        DATASET,
        4,
        Fault(cut_network(1), when=FIRST_OF_FOUR_DONE),
        Expect(
            "succeeded",
            4,
            {"one_attempt": one_attempt, "within_120_s": training_again_within(1, 120)},
        ),
        ELASTIC,
        max_restarts=2,
        needs_hosts=True,
        nodes=ELASTIC_NODES,
    ),
    Row(
        "elastic",
        f"node 2's host lost right after epoch 1 of 4, then its replacement's processes killed "
        f"{REPLACEMENT_LOST_AFTER_S} s after its launch",
        "the replacement is listed only once its heartbeat is steady and the head reaches it "
        "(lost in its join, horovodrun starts again on nodes 0 and 1); the record names node 2, "
        "never node 1; succeeded with 4 epochs, attempt 1",
        DATASET,
        4,
        Fault(kill_host_then_its_replacement(2, REPLACEMENT_LOST_AFTER_S), when=FIRST_OF_FOUR_DONE),
        Expect(
            "succeeded",
            4,
            {"one_attempt": one_attempt, "names_node_2_only": lost_joiner_named(2)},
        ),
        ELASTIC,
        max_restarts=2,
        needs_hosts=True,
        nodes=ELASTIC_NODES,
    ),
    Row(
        "elastic",
        f"every process of the head's host paused (SIGSTOP) for {HEAD_PAUSE_S} s right after "
        "epoch 1 of 4 (a stalled head)",
        "the nodes see its heartbeat stale but their ranks step: they wait, none writes "
        "DONE.json; the head runs again and the run succeeds with 4 epochs, attempt 1",
        DATASET,
        4,
        Fault(pause_host("head", HEAD_PAUSE_S), when=FIRST_OF_FOUR_DONE),
        Expect(
            "succeeded", 4, {"one_attempt": one_attempt, "waited_for_the_head": waited_for_the_head}
        ),
        ELASTIC,
        max_restarts=2,
        needs_hosts=True,
        nodes=ELASTIC_NODES,
    ),
    Row(
        "elastic",
        "fewer than minNodes left: node 1's host lost with minNodes 2 of 2",
        f"the head's driver waits {ELASTIC_TIMEOUT_S} s for minNodes, then the attempt ends "
        "node_lost (fewer than minNodes); relaunched, succeeded with every epoch",
        DATASET,
        3,
        Fault(kill_host(1), when=EPOCH_DONE),
        Expect(
            "succeeded",
            3,
            {
                "ended_below_min_nodes": first_attempt_ended(
                    "node_lost", "fewer than minNodes (2)"
                ),
                "relaunched_once": decisions("relaunch", "teardown"),
            },
        ),
        {**EVERY_EPOCH, "min_nodes": 2, "elastic_timeout_s": ELASTIC_TIMEOUT_S},
        max_restarts=2,
        needs_hosts=True,
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
                "said_so": lambda r, d: head_said(r, f"{r.corrupted} (sha256 of"),
                "fell_back": lambda r, d: head_said(r, "the newest intact checkpoint"),
            },
        ),
        EVERY_EPOCH,
        in_ci=True,
    ),
    Row(
        "disk",
        "disk full at a checkpoint (ENOSPC) on every node",
        "failed: no space left on device (ENOSPC) writing <path> ...; not relaunched",
        CHECKPOINTED,
        4,
        Fault(fill_model_dirs, when="step 'rendezvous': start"),
        Expect("failed", checks={"names_the_path": names_the_full_disk}),
        EVERY_EPOCH,
        needs_hosts=True,
    ),
    Row(
        "Spot",
        "Spot interruption of node 1 (two-minute notice) after an epoch",
        "node 1 leaves at the next commit with no step redone, the others train on; succeeded "
        "with every epoch, attempt 1",
        DATASET,
        3,
        Fault(spot_notice(1), when=EPOCH_DONE),
        Expect(
            "succeeded",
            3,
            {"one_attempt": one_attempt, "no_step_redone": left_with_no_step_redone(1)},
        ),
        {**EVERY_EPOCH, "market": "spot"},
        max_restarts=2,
        in_ci=True,
    ),
    Row(
        "Spot",
        "Spot interruption of node 1 with minNodes 2 of 2 (fewer would be left)",
        "attempt 1 interrupted: Spot interruption of node 1 (...): every rank stopped at one "
        "step with its checkpoint; relaunched, node 1 (its notice on record) on a new instance "
        "and node 0 rebooted in place; resumed, succeeded with every epoch",
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
                "node_1_replaced_node_0_in_place": only_node_replaced(1),
            },
        ),
        {**EVERY_EPOCH, "market": "spot", "min_nodes": 2},
        max_restarts=2,
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
