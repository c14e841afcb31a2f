"""Causes as codes (contract/causes.py, docs/contracts.md "Causes"): what each failure of a
node's step is, and what a failed training's output says, by codes the run controller reads."""

import errno

import pytest

from bootstrap import aws
from bootstrap.fleet import rendezvous
from bootstrap.head import checkpoints
from bootstrap.head.failures import classify
from bootstrap.node import data_pull, health
from bootstrap.node_config import ConfigError
from bootstrap.steps import cause_of
from contract import causes

MARK = "horovod-fleet rank exit:"
HOSTS = "10.0.0.5 slots=1\n10.0.0.6 slots=1\n"


@pytest.mark.parametrize(
    ("step", "error", "cause"),
    [
        ("data pull", aws.S3Unavailable("S3 unreachable for 330 s"), "s3_unreachable"),
        ("data pull", data_pull.VerificationError("sha256 differs"), "corrupt_shard"),
        ("restore checkpoints", checkpoints.NoIntactCheckpoint("none"), "no_intact_checkpoint"),
        ("restore checkpoints", checkpoints.RefusedFreshStart("no"), "no_intact_checkpoint"),
        ("rendezvous", rendezvous.RendezvousError("node(s) 1 of 2"), "nodes_missing"),
        ("rendezvous", rendezvous.HeadLost("the leader is lost"), "node_lost"),
        ("health", health.HealthError("7 GPUs"), "node_unhealthy"),
        ("bootstrap", ConfigError("node.json: bad"), "config_invalid"),
        ("upload results", OSError(errno.ENOSPC, "No space left on device"), "disk_full"),
        # A step that says what failed, whatever the error was.
        ("training image", RuntimeError("exit 1 at line 22"), "image_mismatch"),
        ("instance store", RuntimeError("mdadm"), "node_unhealthy"),
        ("bootstrap", KeyError("x"), "unknown"),
    ],
)
def test_a_failure_s_cause_comes_from_its_error_else_its_step(step, error, cause):
    assert cause_of(step, error) == cause
    assert cause in causes.CAUSES


@pytest.mark.parametrize(
    ("tail", "cause", "reason"),
    [
        (f"[1]<stderr>:error: label 9 outside 1..4\n{MARK} rank 1 exited 2\n"
         "Process 1 exit with status code 2", "trainer_input", "label 9 outside 1..4"),
        (f"{MARK} rank 1 killed by SIGKILL\nProcess 1 exit with status code 137",
         "rank_killed", "rank 1 on node 1 (10.0.0.6) killed by SIGKILL (out of memory?)"),
        ("Process 1 exit with status code 255", "node_lost", "ssh's code for a lost connection"),
        ("[0]<stderr>:OSError: [Errno 28] No space left on device: '/data/m/ckpt-9'",
         "disk_full", "no space left on device (ENOSPC) writing /data/m/ckpt-9 on rank 0"),
        ("[0]<stderr>:DataLossError: Checksum does not match", "corrupt_checkpoint",
         "corrupt checkpoint (checksum does not match) on rank 0"),
        ("[0]<stderr>:RuntimeError: Timed out waiting 30000ms for recv operation to complete",
         "collective_timeout", "rank 1 on node 1 (10.0.0.6) stopped answering rank 0"),
        (f"[0]<stdout>:interrupted\n{MARK} rank 0 exited 75\nProcess 0 exit with status code 75",
         "interrupted", "rank 0 on node 0 (10.0.0.5) exited 75"),
        ("something else entirely", "unknown", "something else entirely"),
    ],
)  # fmt: skip
def test_a_failed_training_s_cause_is_read_from_codes_its_ranks_printed(tail, cause, reason):
    found = classify(tail, HOSTS, filesystem=lambda path: None)
    assert found.cause == cause
    assert reason in found.reason


def test_an_error_line_without_exit_code_2_is_not_the_trainer_refusing_its_input():
    """A rank that printed an `error:` line but died of a signal: the signal is the cause."""
    tail = f"[1]<stderr>:error: something\n{MARK} rank 1 killed by SIGKILL\nProcess 1 exit with status code 137"
    assert classify(tail, HOSTS).cause == "rank_killed"


def test_the_fleet_wide_causes_are_the_ones_the_contracts_tear_down():
    """A node's failure of one of these ends the attempt (bootstrap/fleet/node_failures.py):
    they are the causes docs/contracts.md says the run controller tears down on, less the
    controller's own."""
    from pathlib import Path

    table = (Path(__file__).resolve().parents[2] / "docs" / "contracts.md").read_text()
    rows = [line.split("|") for line in table.splitlines() if line.startswith("| `")]
    teardown = {row[1].strip().strip("`") for row in rows if row[3].strip() == "teardown"}
    assert teardown - {"no_capacity", "relaunch_refused"} == causes.FLEET_WIDE
