"""The run controller: its decision for each end of an attempt, and what it records in S3."""

import datetime
import json
import re

import boto3
import pytest
from conftest import ROOT
from moto import mock_aws

from contract import causes
from controller import records, recovery

REGION = "us-east-1"
BUCKET = "horovod-fleet-dataset"
RUN = "resnet50-r1"
NOW = datetime.datetime(2026, 11, 25, 12, 0, 0, tzinfo=datetime.timezone.utc)
FAR = NOW + datetime.timedelta(hours=3)

# Causes as the nodes write them (contract/causes.py), with a reason of the kind that comes with
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
    assert why == f"not retryable: {causes.FINAL[cause]}"


def test_every_cause_is_tested_here_and_listed_in_the_contract():
    assert set(RETRYABLE) | set(FINAL) == set(causes.CAUSES)  # this file tests each of them
    assert sorted(documented_decisions()) == sorted(causes.CAUSES)


def documented_decisions() -> dict[str, str]:
    """docs/contracts.md's table of causes: {code: the decision its last column names}."""
    contract = (ROOT / "docs" / "contracts.md").read_text()
    listed = contract[contract.index("## Causes") :].split("\n## ")[0]
    rows = re.findall(r"^\| `(\w+)` \|.*\| (\w+)[^|]*\|$", listed, re.M)
    return dict(rows)


@pytest.mark.parametrize("status", ["failed", "interrupted"])
def test_each_cause_s_documented_decision_is_the_controller_s(status):
    """The contract's "another attempt" column says what the controller does with each cause: a
    change to the retry table, or to the page, fails here until the two agree."""
    differ = {
        cause: (documented, decide({"status": status, "cause": cause})[1])
        for cause, documented in documented_decisions().items()
        if decide({"status": status, "cause": cause})[1] != documented
    }
    assert not differ, f"cause: (docs/contracts.md, the controller): {differ}"


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


# --- what it records ---------------------------------------------------------------------------


@pytest.fixture
def s3(monkeypatch):
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    with mock_aws():
        client = boto3.client("s3", region_name=REGION)
        client.create_bucket(Bucket=BUCKET)
        yield client


STACK = "arn:aws:cloudformation:us-east-1:123456789012:stack/TrainStack/x"


def put(s3, name: str, document: dict) -> None:
    s3.put_object(Bucket=BUCKET, Key=f"runs/{RUN}/{name}", Body=json.dumps(document).encode())


def read(s3, name: str) -> dict | None:
    return records.read_json(s3, BUCKET, f"runs/{RUN}/{name}")


def done(attempt: int, status: str = "failed", cause: str = "node_lost", **more) -> dict:
    reason = {**RETRYABLE, **FINAL}[cause]
    return {"run": RUN, "status": status, "cause": cause, "reason": reason, "attempt": attempt,
            "epochs": 3, "finished_at": "2026-11-25T11:59:00Z", **more}  # fmt: skip


def entry_of(document: dict, earlier=(), **kwargs) -> dict:
    settings = {"max_restarts": 2, "now": NOW, "deadline": FAR, "started_at": None,
                "stack_id": STACK, **kwargs}  # fmt: skip
    return recovery.attempt_entry(document, list(earlier), **settings)


def test_an_attempts_entry_says_what_ended_it_and_the_decision_with_its_stack():
    entry = entry_of(done(1), started_at="2026-11-25T10:00:00Z")
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
        "stack_id": STACK,
    }


def test_an_attempts_entry_keeps_what_its_done_json_says_of_its_time():
    """docs/contracts.md, "Start-up, resets and goodput": a relaunch deletes the DONE.json, and
    bootstrap/records/goodput.py reads the earlier attempts' figures here."""
    from bootstrap.records import goodput

    steps = {"start_step": 0, "end_step": 900, "step_s": 0.4, "steps_redone": 0}
    timeline = {"launched_at": "2026-11-25T10:00:00Z", "first_step_at": "2026-11-25T10:20:00Z",
                "lost_s": {"boot": 300.0}, "steps": steps, "phases": {}}  # fmt: skip
    entry = entry_of(done(1, timeline=timeline))
    assert {k: entry[k] for k in ("launched_at", "first_step_at", "lost_s", *steps)} == {
        "launched_at": "2026-11-25T10:00:00Z",
        "first_step_at": "2026-11-25T10:20:00Z",
        "lost_s": {"boot": 300.0},
        **steps,
    }
    attempt = goodput.Attempt.from_entry(entry)
    assert (attempt.start_step, attempt.end_step, attempt.lost_s) == (0, 900, {"boot": 300.0})
    assert "phases" not in entry


def test_attempts_accumulate_until_restarts_run_out(s3):
    decisions = []
    for attempt in (1, 2, 3):
        earlier = records.attempts(s3, BUCKET, RUN)
        entry = records.append_attempt(s3, BUCKET, RUN, entry_of(done(attempt), earlier), 2)
        decisions.append(entry["decision"])
    assert decisions == ["relaunch", "relaunch", "stop"]
    recorded = read(s3, "attempts.json")["attempts"]
    assert [e["attempt"] for e in recorded] == [1, 2, 3]
    assert recorded[-1]["why"] == "restarts exhausted (2 of maxRestarts 2)"


def test_an_attempt_recorded_twice_keeps_its_first_entry(s3):
    first = records.append_attempt(s3, BUCKET, RUN, entry_of(done(1, cause="trainer_input")), 2)
    again = entry_of(done(1, cause="trainer_input"), now=NOW + datetime.timedelta(minutes=5))
    assert records.append_attempt(s3, BUCKET, RUN, again, 2) == first
    assert len(read(s3, "attempts.json")["attempts"]) == 1


def test_a_record_changed_under_a_write_is_read_again_and_both_changes_stay(s3, monkeypatch):
    """Two ticks at once: one writes controller.json between the other's read and write. The
    other's conditional write (If-Match) gets 412, reads again and merges into what is there."""
    put(s3, "controller.json", {"phase": "training"})
    real_put, raced = records.put, []

    def another_tick_first(client, bucket, name, document, etag):
        if not raced:
            raced.append(etag)
            real_put(client, bucket, name, {"phase": "relaunching", "attempt": 2}, etag)
        return real_put(client, bucket, name, document, etag)

    monkeypatch.setattr(records, "put", another_tick_first)
    records.update_controller(s3, BUCKET, RUN, at="2026-11-25T12:00:00Z", execution="arn:x")
    assert read(s3, "controller.json") == {
        "phase": "relaunching",
        "attempt": 2,
        "execution": "arn:x",
        "updated_at": "2026-11-25T12:00:00Z",
    }


def test_a_new_record_is_written_only_where_none_is(s3):
    """If-None-Match: * for a record that was not there: a concurrent first write wins."""
    assert records.put(s3, BUCKET, f"runs/{RUN}/attempts.json", {"a": 1}, None)
    assert not records.put(s3, BUCKET, f"runs/{RUN}/attempts.json", {"a": 2}, None)
    assert read(s3, "attempts.json") == {"a": 1}


def test_a_record_that_keeps_changing_fails_loudly(monkeypatch):
    """A stub S3 that answers every conditional write with 412 (moto answers it only when the
    ETag differs): the update gives up after its tries, loudly."""
    from botocore.exceptions import ClientError

    class Changing:
        def get_object(self, **_):
            return {"ETag": '"e"', "Body": __import__("io").BytesIO(b"{}")}

        def put_object(self, **_):
            raise ClientError({"Error": {"Code": "PreconditionFailed"}}, "PutObject")

    with pytest.raises(records.RecordChanged):
        records.update(Changing(), BUCKET, "runs/r/controller.json", lambda d: {**d, "x": 1})


@pytest.mark.parametrize("code", ["AccessDenied", "KMS.AccessDeniedException", "InternalError"])
def test_a_refused_read_is_never_an_absent_record(code):
    """An S3 or KMS AccessDenied fails the tick or the step; only 404 NoSuchKey is absent."""
    from botocore.exceptions import ClientError

    class Refusing:
        def get_object(self, **_):
            raise ClientError({"Error": {"Code": code, "Message": "no"}}, "GetObject")

    with pytest.raises(ClientError):
        records.read(Refusing(), BUCKET, "runs/r/DONE.json")


def test_a_missing_record_is_absent(s3):
    assert records.read(s3, BUCKET, f"runs/{RUN}/DONE.json") == (None, None)
