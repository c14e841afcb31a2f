"""Every attempt ends on the record, once: a member that finds its leader lost writes the
attempt's DONE.json itself, every writer uses S3's conditional write so exactly one record
stands, and a bootstrap restarted in place keeps its attempt's start and records the restart.

moto (5.2.5, moto/s3/responses.py put_object) answers If-None-Match: * on an existing key and a
stale If-Match with 412 PreconditionFailed, as S3 does. It does not make the check and the write
one atomic step, so the races here are played in both orders rather than in threads.

    .venv/bin/python -m pytest tests/bootstrap/node/test_attempt_record.py
"""

import json
import time

import pytest
from bootstrap_helpers import BUCKET

from bootstrap import aws
from bootstrap.fleet import rendezvous
from bootstrap.member import Member
from bootstrap.node.attempt import Attempt
from bootstrap.records import results
from bootstrap.records.status import RunStatus
from bootstrap.steps import StepFailed, step
from contract.runs import stamp_at

KEY = "runs/r1/DONE.json"
LOST = (
    "the leader, node 0 (i-0lead, 10.0.0.1), is lost: its heartbeat s3://fleet-data/runs/r1/"
    "nodes/0.json is 61 s old (heartbeat_timeout_s 60); this member stops waiting for the "
    "run's DONE.json"
)


def done_json(s3) -> dict:
    return json.loads(s3.get_object(Bucket=BUCKET, Key=KEY)["Body"].read())


def leader_lost() -> StepFailed:
    """The member's rendezvous step as it fails when LeaderWatch names the leader lost."""

    def serve():
        raise rendezvous.HeadLost(LOST)

    with pytest.raises(StepFailed) as failed:
        step("rendezvous", serve)
    return failed.value


@pytest.fixture
def fleet(s3, train_config):
    """The leader's and member 1's node.json, and a run whose controller recorded one attempt."""
    aws.client.cache_clear()  # clients made before moto started would reach for AWS
    record = {"format": "horovod-fleet/attempts/1", "run": "r1", "max_restarts": 3,
              "attempts": [{"attempt": 1, "status": "failed", "cause": "rank_killed",
                            "reason": "rank 3 killed by SIGKILL"}]}  # fmt: skip
    s3.put_object(Bucket=BUCKET, Key="runs/r1/attempts.json", Body=json.dumps(record))
    yield train_config(), train_config(node_index=1)
    aws.client.cache_clear()


def member_attempt(cfg, s3) -> Attempt:
    attempt = Attempt()
    attempt.started = time.time() - 600
    attempt.status = RunStatus(cfg, aws.RetryingS3(s3), cfg.mount_point, attempt_started=0)
    attempt.earlier = attempt.status.earlier_attempts()
    return attempt


def test_a_member_that_finds_its_leader_lost_writes_the_attempt_s_done_json(fleet, s3, capsys):
    """Before: only the leader ever wrote DONE.json, so a dead leader ended nothing: no relaunch,
    and the fleet billed until the idle alarm."""
    _, member = fleet
    attempt = member_attempt(member, s3)
    Member(member, attempt).report(leader_lost())
    done = done_json(s3)
    assert (done["status"], done["cause"], done["written_by"]) == (
        "failed",
        "node_lost",
        "member 1",
    )
    assert done["reason"] == f"step 'rendezvous' failed: HeadLost: {LOST}"
    assert done["attempt"] == 2 and [a["attempt"] for a in done["attempts"]] == [1, 2]
    assert done["attempts"][-1] == {"attempt": 2, "status": "failed", "cause": "node_lost",
                                    "reason": done["reason"]}  # fmt: skip
    assert done["attempt_started_at"] == stamp_at(attempt.started)
    assert (done["top1"], done["epochs"], done["restarts"]) == (None, None, [])
    assert "wrote s3://fleet-data/runs/r1/DONE.json (status failed)" in capsys.readouterr().out


def test_a_member_s_other_failures_leave_the_record_to_the_leader(fleet, s3):
    _, member = fleet
    failure = StepFailed("health", "HealthError: 7 GPUs", "node_unhealthy")
    Member(member, member_attempt(member, s3)).report(failure)
    assert "Contents" not in s3.list_objects_v2(Bucket=BUCKET, Prefix=KEY)


@pytest.mark.parametrize("first", ["leader", "member"])
def test_the_head_and_a_node_racing_leave_exactly_one_record(fleet, s3, first):
    leader, member = fleet
    started = time.time() - 600
    s3r = aws.RetryingS3(s3)
    docs = {
        "leader": results.done_document(leader, "succeeded", None, None, time.time(), started),
        "member": results.done_document(
            member, "failed", LOST, None, time.time(), started, cause="node_lost",
            written_by="member 1",
        ),
    }  # fmt: skip
    second = "member" if first == "leader" else "leader"
    results.write_done(s3r, {"leader": leader, "member": member}[first], docs[first], started)
    # The loser of the race as it ends a training (the leader's success path) ...
    with pytest.raises(results.RecordTaken) as taken:
        results.write_done(s3r, leader, docs[second], started)
    writer = "head (status succeeded, cause None)" if first == "leader" else (
        "member 1 (status failed, cause node_lost)"
    )  # fmt: skip
    line = (
        f"s3://fleet-data/runs/r1/DONE.json already holds this attempt's record, written by "
        f"{writer}: not overwriting it"
    )
    assert str(taken.value) == line
    # ... and as it reports a failure: one line, naming who wrote the record.
    lines = []
    results.record_failure(s3r, member, docs[second], started, lines.append)
    assert lines == [line]
    assert done_json(s3) == docs[first]


def test_a_write_whose_answer_was_lost_finds_its_own_record(fleet, s3):
    """boto3 retries a request whose answer was lost: the retry's 412 is this write's own."""
    leader, _ = fleet
    started = time.time() - 600
    doc = results.done_document(leader, "succeeded", None, None, time.time(), started)
    results.write_done(aws.RetryingS3(s3), leader, doc, started)
    results.write_done(aws.RetryingS3(s3), leader, doc, started)
    assert done_json(s3) == doc


def test_a_record_an_earlier_attempt_left_is_replaced_and_cleared(fleet, s3):
    """A redeploy of a finished run: its DONE.json is the previous attempt's, not this one's."""
    leader, _ = fleet
    s3.put_object(Bucket=BUCKET, Key=KEY, Body=json.dumps({"status": "succeeded"}))
    started = time.time() + 2  # this attempt began after that record was written
    doc = results.done_document(leader, "failed", "x", None, started + 1, started)
    results.write_done(aws.RetryingS3(s3), leader, doc, started)
    assert done_json(s3) == doc
    s3.put_object(Bucket=BUCKET, Key=KEY, Body=json.dumps({"status": "succeeded"}))
    assert results.clear_done(aws.RetryingS3(s3), leader, started) is None
    assert "Contents" not in s3.list_objects_v2(Bucket=BUCKET, Prefix=KEY)


def test_a_rendezvous_keeps_this_attempt_s_record(fleet, s3):
    leader, member = fleet
    started = time.time() - 600
    doc = results.done_document(
        member, "failed", LOST, None, time.time(), started, cause="node_lost", written_by="member 1"
    )
    results.write_done(aws.RetryingS3(s3), member, doc, started)
    kept = results.clear_done(aws.RetryingS3(s3), leader, started)
    assert kept["doc"] == doc and done_json(s3) == doc


# ---------------------------------------------------------------- restarts in place


def test_a_bootstrap_restarted_in_place_keeps_its_start_and_records_the_restart(
    train_config, tmp_path
):
    """Before: systemd's restart began attempt 1 again at the restart's time, and the epochs
    retrained after it were nowhere on the record."""
    cfg = train_config(mount_point=str(tmp_path / "data"))
    model_dir = tmp_path / "data" / "model"
    lines = []
    first = Attempt()
    first.started = time.time() - 3600
    first.begin(cfg, model_dir, lines.append)
    assert (first.restarts, lines) == ([], ["attempt 1 of run r1"])
    # The trainer got to step 1234; the newest checkpoint it left in S3 is ckpt-1200.
    model_dir.mkdir(parents=True)
    (model_dir / "progress.json").write_text(json.dumps({"global_step": 1234, "epoch": 3}))
    restarted = Attempt()
    restarted.begin(cfg, model_dir, lines.append)
    assert restarted.started == int(first.started)
    (model_dir / "checkpoints").mkdir()
    (model_dir / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-1200"\n')
    restarted.resumes_from(model_dir)
    assert restarted.restarts == [
        {"at": stamp_at(time.time()), "resumed_from_step": 1200, "reached_step": 1234}
    ]
    assert lines[1] == (
        f"attempt 1 of run r1, restarted in place (restart 1): the attempt began at "
        f"{stamp_at(first.started)}, its trainer had reached step 1234"
    )
    done = results.done_document(cfg, "succeeded", None, model_dir, time.time(),
                                 restarted.started, restarts=restarted.restarts)  # fmt: skip
    assert done["restarts"] == restarted.restarts
    assert done["attempt_started_at"] == stamp_at(first.started)
    # A bootstrap that ended its attempt leaves it ended: a rerun after a reboot begins anew.
    restarted.end()
    rerun = Attempt()
    rerun.begin(cfg, model_dir, lines.append)
    assert (rerun.restarts, lines[-1]) == ([], "attempt 1 of run r1")
    assert rerun.started > first.started + 3000
    # The run controller's next attempt is a new one, whatever the disk holds.
    relaunched = Attempt()
    relaunched.earlier = [{"attempt": 1, "status": "failed"}]
    relaunched.begin(cfg, model_dir, lines.append)
    assert relaunched.restarts == [] and relaunched.started > first.started + 3000
    record = json.loads((tmp_path / "state0" / "attempt.json").read_text())
    assert (record["attempt"], record["restarts"]) == (2, [])
