"""A fault rehearsal row's shape (Row: its fault, when it strikes, what must come of it) and the
figures the rows share: the snapshots they start from and the times they are built on.
rehearsal/fault_rows.py lists the rows."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rehearsal.fault_actions import Action
from rehearsal.fault_checks import Check

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
# The heartbeat_timeout_s of the rows that wait for a lost node or head to be seen: the
# rehearsal's 60 s would only add idle time to them (a 2-node row waited 76 s for its lost head).
LOSS_SEEN_S = 20
# The elastic rows (the issue's: three nodes, four epochs): a node's loss is seen within
# LOSS_SEEN_S (the run controller's tick replaces a node the head finds silent), and the epochs
# are long enough (128-pixel images) that a replacement, which boots, pulls every shard and starts
# its trainer, joins before the run ends. At 64 pixels the CPU ranks with oneDNN
# (docs/trainer.md, "CPU training") stepped 3 times as fast, and a replacement launched 24 s
# after the loss did not join before the end (2026-11-30); at 128 a step costs what 64 did
# without it.
ELASTIC_NODES = 3
ELASTIC = {"heartbeat_timeout_s": LOSS_SEEN_S, "trainer": {"image_size": 128}}
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
