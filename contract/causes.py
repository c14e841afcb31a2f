"""Why an attempt ended, as a code: DONE.json's `cause` (docs/contracts.md, "Causes"). The nodes
write one (bootstrap/steps.py `cause_of`), and so does the run controller when it writes the
record of an attempt whose nodes could not, or gives a relaunch up. The run controller decides
on the code alone (controller/recovery.py): the reason beside it is for people.
"""

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
UNKNOWN = "unknown"  # anything else, and a DONE.json without a known cause

CAUSES = (
    NODE_LOST, NODES_MISSING, NODE_UNHEALTHY, RANK_KILLED, COLLECTIVE_TIMEOUT, STALLED,
    S3_UNREACHABLE, INTERRUPTED, CORRUPT_CHECKPOINT, TRAINER_INPUT, CORRUPT_SHARD,
    NO_INTACT_CHECKPOINT, DISK_FULL, IMAGE_MISMATCH, CONFIG_INVALID, NO_CAPACITY,
    RELAUNCH_REFUSED, UNKNOWN,
)  # fmt: skip

# The decision table: another attempt on new instances cannot get past these (the same input,
# data, disk size or image fails the same way), so the run controller tears the run down; each
# names why, for attempts.json and the e-mail. Every other cause is relaunched, `unknown` too
# (as SkyPilot's `max_restarts_on_errors` does): `maxRestarts` bounds what a deterministic one
# costs.
FINAL = {
    TRAINER_INPUT: "the trainer refused its input",
    CORRUPT_SHARD: "a dataset shard in S3 is corrupt",
    NO_INTACT_CHECKPOINT: "no checkpoint in S3 is intact",
    DISK_FULL: "the run does not fit the disk",
    IMAGE_MISMATCH: "the node's image is not the one expected",
    CONFIG_INVALID: "the node's configuration is unusable",
    NO_CAPACITY: "no zone had capacity for the fleet",
    RELAUNCH_REFUSED: "EC2 refused the relaunch",
}
RETRYABLE = tuple(cause for cause in CAUSES if cause not in FINAL)
# The causes only the run controller writes (a relaunch it gave up).
CONTROLLER_CAUSES = frozenset({NO_CAPACITY, RELAUNCH_REFUSED})
# The causes that would end the attempt on any node, so that one node's ends it (the head's part
# of bootstrap/fleet/node_failures.py): the final ones a node can meet.
FLEET_WIDE = frozenset(FINAL) - CONTROLLER_CAUSES


def final_cause(cause: str | None) -> str | None:
    """Why another attempt would fail the same way as one that ended with `cause` (DONE.json's),
    or None when it may not."""
    return FINAL.get(cause or UNKNOWN)
