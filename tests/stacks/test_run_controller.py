"""The run controller: its decision for each end of an attempt, and what it records in S3."""

import datetime
import json
import re

import boto3
import pytest
import records
import recovery
from conftest import ROOT
from moto import mock_aws

REGION = "us-east-1"
BUCKET = "horovod-fleet-dataset"
RUN = "resnet50-r1"
NOW = datetime.datetime(2026, 11, 25, 12, 0, 0, tzinfo=datetime.timezone.utc)
FAR = NOW + datetime.timedelta(hours=3)

# Causes as the nodes write them (bootstrap/causes.py), with a reason of the kind that comes with
# each: the decision reads the cause alone.
RETRYABLE = {
    "node_lost": "step 'training' failed: RuntimeError: node 1 (i-0abc, 10.0.0.12) lost: no "
    "heartbeat for 120 s (heartbeat_timeout_s 120); horovodrun exited 1: ...",
    "stalled": "step 'training' failed: RuntimeError: no rank advanced for 600 s after global "
    "step 1200 (details in train.log)",
    "rank_killed": "step 'training' failed: RuntimeError: horovodrun exited 1: rank 3 on "
    "10.0.0.12 killed by SIGKILL (out of memory?)",
    "nodes_missing": "step 'rendezvous' failed: RendezvousError: node(s) 1 of 8 did not register "
    "under s3://b/runs/r/nodes/ within 1800 s",
    "s3_unreachable": "step 'upload results' failed: S3 unreachable for 330 s",
    "collective_timeout": "step 'training' failed: collective timeout on rank 0",
    "node_unhealthy": "step 'health' failed: HealthError: 7 GPUs, node.json says 8",
    "interrupted": "step 'training' was interrupted: the node was stopped (SIGTERM)",
    "corrupt_checkpoint": "step 'training' failed: corrupt checkpoint (checksum does not match)",
    "unknown": "step 'bootstrap' failed: KeyError: 'x'",
}
FINAL = {
    "trainer_input": "step 'training' failed: RuntimeError: horovodrun exited 1: error: "
    "--batch-size must be positive",
    "corrupt_shard": "step 'data pull' failed: VerificationError: train-00001-of-01024: sha256 "
    "differs from the manifest",
    "no_intact_checkpoint": "step 'restore checkpoints' failed: no intact checkpoint in s3://b/: "
    "ckpt-3 (sha256 differs)",
    "disk_full": "step 'training' failed: RuntimeError: no space left on device (ENOSPC) "
    "writing /data/model/ckpt-9",
    "image_mismatch": "step 'training image' failed: image.json says tensorflow 2.14.0, "
    "node.json expects 2.15.1",
    "config_invalid": "step 'read node.json' failed: exit 2 at line 14 of train_node.sh",
    "no_capacity": "no capacity for the fleet in us-east-1a, us-east-1b: "
    "InsufficientInstanceCapacity on each of 8 tries; deploy again later, in another region, "
    "or with a capacity reservation",
    "relaunch_refused": "the relaunch failed: EC2 answered UnauthorizedOperation: ...",
}


def decide(done: dict, earlier: list[dict] | None = None, **kwargs):
    settings = {"max_restarts": 3, "now": NOW, "deadline": FAR, "deleting": False, **kwargs}
    return recovery.decide(done, earlier or [], **settings)


@pytest.mark.parametrize(("cause", "reason"), RETRYABLE.items(), ids=RETRYABLE.keys())
@pytest.mark.parametrize("status", ["failed", "interrupted"])
def test_retryable_ends_are_relaunched(cause, reason, status):
    retryable, decision, why = decide({"status": status, "cause": cause, "reason": reason})
    assert (retryable, decision, why) == (True, "relaunch", "restart 1 of 3")


@pytest.mark.parametrize("cause", [None, "a_cause_of_a_newer_node"])
def test_a_done_json_without_a_known_cause_is_retried_as_unknown(cause):
    """A reason that reads like a final one decides nothing: only the cause does."""
    done = {"status": "failed", "cause": cause, "reason": FINAL["trainer_input"]}
    assert decide(done)[1] == "relaunch"


def test_a_spot_interruption_or_shutdown_is_relaunched():
    done = {"status": "interrupted", "reason": "step 'training' was interrupted: the node was "
            "stopped (SIGTERM)"}  # fmt: skip
    assert decide(done)[1] == "relaunch"


@pytest.mark.parametrize(("cause", "reason"), FINAL.items(), ids=FINAL.keys())
def test_ends_another_attempt_cannot_get_past_are_torn_down(cause, reason):
    retryable, decision, why = decide({"status": "failed", "cause": cause, "reason": reason})
    assert (retryable, decision) == (False, "teardown")
    assert why == f"not retryable: {recovery.FINAL[cause]}"


def test_the_retry_table_covers_every_cause_the_nodes_write_and_the_contract_lists():
    from bootstrap import causes

    assert set(recovery.FINAL) | set(recovery.RETRYABLE) == set(causes.CAUSES)
    assert not set(recovery.FINAL) & set(recovery.RETRYABLE)
    assert set(RETRYABLE) | set(FINAL) == set(causes.CAUSES)  # this file tests each of them
    contract = (ROOT / "docs" / "contracts.md").read_text()
    listed = contract[contract.index("## Causes") :].split("\n## ")[0]
    assert sorted(re.findall(r"^\| `(\w+)` \|", listed, re.M)) == sorted(causes.CAUSES)


def test_a_finished_run_and_a_benchmark_are_torn_down():
    assert decide({"status": "succeeded", "reason": None})[1:] == ("teardown", "the run finished")
    benchmark = {"status": "failed", "cause": "node_lost", "reason": RETRYABLE["node_lost"],
                 "benchmark": "synthetic"}  # fmt: skip
    assert decide(benchmark)[1] == "teardown"


def test_restarts_are_bounded_by_max_restarts():
    failed = {"status": "failed", "cause": "node_lost", "reason": RETRYABLE["node_lost"]}
    earlier = [{"attempt": n, "decision": "relaunch"} for n in (1, 2)]
    assert decide(failed, earlier)[1:] == ("relaunch", "restart 3 of 3")
    earlier.append({"attempt": 3, "decision": "relaunch"})
    assert decide(failed, earlier)[1:] == (
        "stop",
        "restarts exhausted (3 of maxRestarts 3)",
    )
    assert decide(failed, max_restarts=0)[1] == "stop"


def test_nothing_is_relaunched_too_close_to_the_hard_cap():
    failed = {"status": "failed", "cause": "node_lost", "reason": RETRYABLE["node_lost"]}
    soon = NOW + recovery.MIN_ATTEMPT - datetime.timedelta(seconds=1)
    retryable, decision, why = decide(failed, deadline=soon)
    assert (retryable, decision) == (True, "stop")
    assert "hard cap" in why
    assert decide(failed, deadline=NOW + recovery.MIN_ATTEMPT)[1] == "relaunch"


def test_nothing_is_relaunched_while_the_stack_is_being_deleted():
    failed = {"status": "failed", "cause": "node_lost", "reason": RETRYABLE["node_lost"]}
    assert decide(failed, deleting=True)[1:] == ("stop", "the stack is being deleted")


# --- what it records -------------------------------------------------------------------------


@pytest.fixture
def s3(monkeypatch):
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    with mock_aws():
        client = boto3.client("s3", region_name=REGION)
        client.create_bucket(Bucket=BUCKET)
        yield client


def put(s3, name: str, document: dict) -> None:
    s3.put_object(Bucket=BUCKET, Key=f"runs/{RUN}/{name}", Body=json.dumps(document).encode())


def read(s3, name: str) -> dict | None:
    return records.read_json(s3, BUCKET, f"runs/{RUN}/{name}")


def end(s3, **kwargs):
    settings = {"max_restarts": 2, "now": NOW, "deadline": FAR, **kwargs}
    return recovery.end_attempt(s3, BUCKET, RUN, **settings)


def done(attempt: int, status: str = "failed", cause: str = "node_lost") -> dict:
    reason = {**RETRYABLE, **FINAL}[cause]
    return {"run": RUN, "status": status, "cause": cause, "reason": reason, "attempt": attempt,
            "epochs": 3, "finished_at": "2026-11-25T11:59:00Z"}  # fmt: skip


def test_a_relaunch_is_recorded_and_removes_done_json(s3):
    put(s3, "status.json", {"phase": "failed", "attempt": 1,
                            "attempt_started_at": "2026-11-25T10:00:00Z"})  # fmt: skip
    put(s3, "DONE.json", done(1))
    entry = end(s3)
    assert entry == {
        "attempt": 1,
        "started_at": "2026-11-25T10:00:00Z",
        "ended_at": "2026-11-25T11:59:00Z",
        "status": "failed",
        "cause": "node_lost",
        "reason": RETRYABLE["node_lost"],
        "epochs": 3,
        "retryable": True,
        "decision": "relaunch",
        "why": "restart 1 of 2",
        "decided_at": "2026-11-25T12:00:00Z",
    }
    assert read(s3, "attempts.json") == {
        "format": "horovod-fleet/attempts/1",
        "run": RUN,
        "max_restarts": 2,
        "attempts": [entry],
    }
    # The next attempt's members must not see this DONE.json and end at once.
    assert read(s3, "DONE.json") is None
    # status.json stays the leader's; the controller says what it does in its own document.
    assert read(s3, "status.json")["phase"] == "failed"
    status = read(s3, "controller.json")
    assert (status["phase"], status["attempt"]) == ("relaunching", 2)
    assert status["reason"].startswith("step 'training' failed")


def test_attempts_accumulate_until_restarts_run_out(s3):
    decisions = []
    for attempt in (1, 2, 3):
        put(s3, "DONE.json", done(attempt))
        decisions.append(end(s3)["decision"])
    assert decisions == ["relaunch", "relaunch", "stop"]
    recorded = read(s3, "attempts.json")["attempts"]
    assert [e["attempt"] for e in recorded] == [1, 2, 3]
    assert recorded[-1]["why"] == "restarts exhausted (2 of maxRestarts 2)"
    assert read(s3, "DONE.json") is not None  # kept: the teardown waits on its results


def test_a_repeated_event_counts_the_attempt_once(s3):
    put(s3, "DONE.json", done(1, "failed", "trainer_input"))
    first = end(s3)
    again = end(s3, now=NOW + datetime.timedelta(minutes=5))
    assert first == again
    assert len(read(s3, "attempts.json")["attempts"]) == 1


def test_no_done_json_records_nothing(s3):
    assert end(s3) is None
    assert read(s3, "attempts.json") is None
