"""The fault rows of what holds the run's data: S3 (outages, cut uploads, corrupt objects) and the
nodes' disks."""

from __future__ import annotations

import re

from rehearsal.fault_actions import (
    SHARD,
    corrupt_local_shard,
    corrupt_newest_checkpoint,
    corrupt_shard,
    fill_model_dirs,
    freeze_s3,
    kill_host,
)
from rehearsal.fault_checks import (
    decisions,
    every_attempt_counted,
    first_attempt_ended,
    head_said,
    names_the_full_disk,
    no_epoch_retrained,
    no_node_blamed,
    node_said,
)
from rehearsal.fault_row import (
    CHECKPOINTED,
    DATASET,
    EVERY_EPOCH,
    LONG_OUTAGE_S,
    LOSS_SEEN_S,
    OUTAGE_S,
    Expect,
    Fault,
    Request,
    Row,
)

S3_ROWS = [
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
        {**EVERY_EPOCH, "heartbeat_timeout_s": LOSS_SEEN_S},
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
]

DISK_ROWS = [
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
        # Not in CI: its snapshot of a run with checkpoints is a run of its own, and the restore's
        # fallback and the commit after it are held in process (tests/bootstrap/head/
        # test_checkpoints.py); the drill's e2e test took its minutes.
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
]
