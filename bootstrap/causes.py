"""Why an attempt ended, as a code: DONE.json's `cause` (docs/contracts.md, "Causes"). The run
controller's retry rule is a table keyed by it; the reason beside it is for people, and no
decision reads it. A failure's exception names its cause (a `cause` attribute: its class's, or
its own); a failure that does not is the cause of the step it failed in, else `unknown`.
"""

from __future__ import annotations

import errno

NODE_LOST = "node_lost"  # a node's heartbeat went stale, or its ssh connection dropped
NODES_MISSING = "nodes_missing"  # nodes did not register within rendezvous_timeout_s
NODE_UNHEALTHY = "node_unhealthy"  # a node, or the fleet's network, failed its check
RANK_KILLED = "rank_killed"  # a rank died of a signal
COLLECTIVE_TIMEOUT = "collective_timeout"  # a collective waited past its timeout
STALLED = "stalled"  # the trainer's progress stopped (the progress watchdog)
S3_UNREACHABLE = "s3_unreachable"  # S3 past a step's retry budget
INTERRUPTED = "interrupted"  # SIGTERM: a shutdown, a Spot notice
CORRUPT_CHECKPOINT = "corrupt_checkpoint"  # the trainer read a damaged checkpoint file
TRAINER_INPUT = "trainer_input"  # the trainer refused its input (exit 2, one `error:` line)
CORRUPT_SHARD = "corrupt_shard"  # the dataset in S3 differs from its manifest
NO_INTACT_CHECKPOINT = "no_intact_checkpoint"  # S3 holds the run's checkpoints, none whole
DISK_FULL = "disk_full"  # ENOSPC
IMAGE_MISMATCH = "image_mismatch"  # the node's image is not the one node.json expects
CONFIG_INVALID = "config_invalid"  # node.json unusable
NO_CAPACITY = "no_capacity"  # the run controller: no zone had capacity for the relaunch
RELAUNCH_REFUSED = "relaunch_refused"  # the run controller: EC2 refused the relaunch
UNKNOWN = "unknown"

CAUSES = (
    NODE_LOST, NODES_MISSING, NODE_UNHEALTHY, RANK_KILLED, COLLECTIVE_TIMEOUT, STALLED,
    S3_UNREACHABLE, INTERRUPTED, CORRUPT_CHECKPOINT, TRAINER_INPUT, CORRUPT_SHARD,
    NO_INTACT_CHECKPOINT, DISK_FULL, IMAGE_MISMATCH, CONFIG_INVALID, NO_CAPACITY,
    RELAUNCH_REFUSED, UNKNOWN,
)  # fmt: skip

# The causes that would end the attempt on any node, so that one node's ends it (the head's part
# of bootstrap/fleet/node_failures.py): the run controller tears such a run down rather than
# relaunch it (docs/contracts.md's table says "teardown"; a test keeps the two equal).
FLEET_WIDE = frozenset(
    {TRAINER_INPUT, CORRUPT_SHARD, NO_INTACT_CHECKPOINT, DISK_FULL, IMAGE_MISMATCH, CONFIG_INVALID}
)

# The node's steps whose failure is a cause whatever the error (train_node.sh's shell steps
# report through `python3 -m bootstrap fail STEP`).
STEP_CAUSES = {
    "read node.json": CONFIG_INVALID,
    "training image": IMAGE_MISMATCH,
    "boot service": NODE_UNHEALTHY,
    "instance store": NODE_UNHEALTHY,
    "gpu fabric": NODE_UNHEALTHY,
    "cloudwatch agent": NODE_UNHEALTHY,
    "health": NODE_UNHEALTHY,
    "instance identity": NODE_UNHEALTHY,
    "launch assignment": NODE_UNHEALTHY,
    "allreduce check": NODE_UNHEALTHY,
}


def of(step: str, error: BaseException) -> str:
    """The cause of `error`, raised in `step`."""
    cause = getattr(error, "cause", None)
    if cause in CAUSES:
        return cause
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
        return DISK_FULL
    return STEP_CAUSES.get(step, UNKNOWN)
