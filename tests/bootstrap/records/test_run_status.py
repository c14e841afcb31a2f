"""bootstrap/records/status.py: the leader's status.json, its EMF metrics line and its e-mails."""

import json
import time

import pytest
from bootstrap_helpers import BUCKET
from botocore.exceptions import EndpointConnectionError

from bootstrap import aws
from bootstrap.records.status import RunStatus, emf_line
from contract.records import STATUS_FORMAT as FORMAT
from contract.runs import stamp_at

COST = {"usd_per_hour": 31.212, "prices_as_of": "2025-06", "max_hours": 4}
TOPIC = "arn:aws:sns:us-east-1:123456789012:run-r1"


class RecordingSns:
    def __init__(self):
        self.published = []

    def publish(self, **kwargs):
        self.published.append(kwargs)
        return {"MessageId": "1"}


def heartbeat(s3, index, age_s, now):
    entry = {"index": index, "ip": f"10.0.0.{index}", "gpus": 8, "instance_id": f"i-{index}"}
    entry["registered_at"] = stamp_at(now - age_s)
    s3.put_object(Bucket=BUCKET, Key=f"runs/r1/nodes/{index}.json", Body=json.dumps(entry))


def status_json(s3) -> dict:
    return json.loads(s3.get_object(Bucket=BUCKET, Key="runs/r1/status.json")["Body"].read())


def make_status(train_config, s3, tmp_path, **config):
    cfg = train_config(role="head", nodes=3, cost=COST, **config)
    lines = []
    status = RunStatus(
        cfg, aws.RetryingS3(s3), tmp_path / "model", attempt_started=time.time() - 60,
        log=lines.append, sns=RecordingSns(),
    )  # fmt: skip
    return status, lines


def test_booting_counts_the_nodes_with_a_fresh_heartbeat(train_config, s3, tmp_path):
    now = time.time()
    heartbeat(s3, 0, 5, now)  # fresh
    heartbeat(s3, 1, 10, now)  # fresh
    heartbeat(s3, 2, 600, now)  # older than heartbeat_timeout_s (120): lost
    status, lines = make_status(train_config, s3, tmp_path)
    status.phase("booting")
    status.publish()
    doc = status_json(s3)
    assert set(doc) == {
        "format", "run", "attempt", "phase", "updated_at", "attempt_started_at",
        "instance_type", "nodes", "gpus_per_node", "nodes_healthy", "progress", "checkpoint",
        "reason", "cost", "goodput", "nodes_training", "resets", "nodes_silent",
    }  # fmt: skip
    assert (doc["nodes_training"], doc["resets"], doc["nodes_silent"]) == (None, [], [])
    assert (doc["format"], doc["run"], doc["attempt"], doc["phase"]) == (FORMAT, "r1", 1, "booting")
    assert doc["goodput"] is None  # nothing trained yet
    assert (doc["nodes"], doc["nodes_healthy"], doc["gpus_per_node"]) == (3, 2, 8)
    assert (doc["progress"], doc["checkpoint"], doc["reason"], doc["cost"]) == (
        None, None, None, COST,
    )  # fmt: skip
    assert lines == []
    status.end("done", None)


def test_training_follows_progress_writes_metrics_and_names_the_newest_checkpoint(
    train_config, s3, tmp_path
):
    status, _ = make_status(train_config, s3, tmp_path, log_dir=str(tmp_path / "logs"))
    for step in (10, 200, 30):
        s3.put_object(Bucket=BUCKET, Key=f"runs/r1/model/checkpoints/ckpt-{step}.index", Body=b"")
    (tmp_path / "model").mkdir()
    progress = {"phase": "evaluating", "epoch": 2, "epochs": 3, "step": 5, "loss": 1.5,
                "images_per_s": 120.5, "top1": None, "updated_at": "2026-11-22T04:00:00Z"}  # fmt: skip
    (tmp_path / "model" / "progress.json").write_text(json.dumps(progress))
    status.phase("training")
    status.publish()
    status.publish()  # the same progress.json: no second metrics line
    doc = status_json(s3)
    assert (doc["phase"], doc["progress"]) == ("evaluating", progress)
    assert doc["checkpoint"]["key"] == "runs/r1/model/checkpoints/ckpt-200"
    assert doc["checkpoint"]["step"] == 200 and doc["checkpoint"]["at"].endswith("Z")
    lines = (tmp_path / "logs" / "metrics.log").read_text().splitlines()
    assert len(lines) == 1
    emf = json.loads(lines[0])
    directive = emf["_aws"]["CloudWatchMetrics"][0]
    assert (directive["Namespace"], directive["Dimensions"]) == ("HorovodFleet", [["Run"]])
    # top1 is null before the first evaluation: not a metric.
    names = [m["Name"] for m in directive["Metrics"]]
    assert names == ["images_per_s", "loss", "usd_so_far", "attempt"]
    assert emf["attempt"] == 1
    assert (emf["Run"], emf["images_per_s"], emf["loss"]) == ("r1", 120.5, 1.5)
    # The attempt started a minute ago: a minute of the fleet at $31.212/h, for the dashboard.
    assert emf["usd_so_far"] == pytest.approx(31.212 / 60, abs=0.02)
    status.end("done", None)


def test_status_json_carries_goodput_live_then_done_json_s(train_config, s3, tmp_path):
    status, lines = make_status(train_config, s3, tmp_path)
    (tmp_path / "model").mkdir()
    progress = {"phase": "training", "global_step": 10, "images_per_s": 100.0,
                "updated_at": "2026-11-22T04:00:00Z"}  # fmt: skip
    (tmp_path / "model" / "progress.json").write_text(json.dumps(progress))
    seen = []
    status.live_goodput = lambda p: seen.append(p) or {"goodput": 0.4, "runtime_goodput": 0.6}
    status.phase("training")
    assert status.publish()["goodput"] == {"goodput": 0.4, "runtime_goodput": 0.6}
    assert seen[-1]["global_step"] == 10  # worked out from the trainer's progress
    status.live_goodput = lambda p: 1 / 0  # a report: never a reason to stop
    assert status.publish()["goodput"] is None and "could not work out goodput" in lines[-1]
    status.end("done", None, record={"goodput": 0.81, "runtime_goodput": 0.93, "top1": 0.7})
    assert status_json(s3)["goodput"] == {"goodput": 0.81, "runtime_goodput": 0.93}


def test_status_json_names_the_nodes_training_and_the_resets_live_then_done_json_s(
    train_config, s3, tmp_path
):
    status, lines = make_status(train_config, s3, tmp_path)  # 3 nodes of 8 GPUs
    (tmp_path / "model").mkdir()
    # After a reset, the world has 16 ranks: two nodes of three train.
    progress = {"phase": "training", "global_step": 10, "ranks": 16}
    (tmp_path / "model" / "progress.json").write_text(json.dumps(progress))
    reset = {"at": "2026-11-22T04:00:00Z", "lost": [{"node": "2", "instance_id": "i-2",
             "ip": "10.0.0.2"}], "added": [], "ranks_before": 24, "ranks_after": 16,
             "recovery_s": 41.0, "steps_redone": 3}  # fmt: skip
    status.live_resets = lambda: [reset]
    status.silent = lambda: ["2"]  # the head's discovery: node 2's heartbeat went stale
    status.phase("training")
    doc = status.publish()
    assert (doc["nodes"], doc["nodes_training"], doc["resets"]) == (3, 2, [reset])
    assert doc["nodes_silent"] == ["2"]
    status.live_resets = lambda: 1 / 0  # a report: never a reason to stop
    assert status.publish()["resets"] == [] and "could not read the resets" in lines[-1]
    status.end("done", None, record={"resets": [reset, reset], "goodput": None})
    assert status_json(s3)["resets"] == [reset, reset]


def test_attempt_is_one_more_than_the_recorded_attempts(train_config, s3, tmp_path):
    record = {"format": "horovod-fleet/attempts/1", "run": "r1", "max_restarts": 3,
              "attempts": [{"attempt": 1, "status": "failed"}]}  # fmt: skip
    s3.put_object(Bucket=BUCKET, Key="runs/r1/attempts.json", Body=json.dumps(record))
    status, _ = make_status(train_config, s3, tmp_path)
    assert status.publish()["attempt"] == 2
    status.end("done", None)


def test_end_publishes_the_reason_and_emails_start_and_end_once(train_config, s3, tmp_path):
    status, _ = make_status(train_config, s3, tmp_path, notify_topic_arn=TOPIC)
    status.phase("training")
    status.publish()
    status.publish()
    status.end("failed", "step 'training' failed: rank 1 killed by SIGKILL")
    doc = status_json(s3)
    assert (doc["phase"], doc["reason"]) == (
        "failed", "step 'training' failed: rank 1 killed by SIGKILL",
    )  # fmt: skip
    published = status.sns.published
    assert [p["Subject"] for p in published] == [
        "horovod-fleet: run r1 started training",
        "horovod-fleet: run r1 failed",
    ]
    assert all(p["TopicArn"] == TOPIC for p in published)
    assert "Reason: step 'training' failed" in published[1]["Message"]
    assert "horovod-fleet status --run r1" in published[1]["Message"]


def test_s3_trouble_is_a_log_line_never_an_error(train_config, tmp_path):
    class Refusing:
        def __getattr__(self, name):
            def fail(**_):
                raise ConnectionError("endpoint unreachable")

            return fail

    cfg = train_config(role="head", nodes=3)
    lines = []
    status = RunStatus(
        cfg, aws.RetryingS3(Refusing()), tmp_path, attempt_started=0, log=lines.append
    )
    status.end("failed", "boom", wait_s=5)
    assert not status.thread.is_alive()
    assert any("could not write status.json" in line for line in lines), lines


class S3Down:
    """An S3 that resets every connection while clock() < until, then answers as `s3` does."""

    def __init__(self, s3, clock, until):
        self.s3, self.clock, self.until = s3, clock, until

    def __getattr__(self, name):
        def call(**kwargs):
            if self.clock() < self.until:
                raise EndpointConnectionError(endpoint_url="https://s3.example")
            return getattr(self.s3, name)(**kwargs)

        return call


@pytest.mark.parametrize(("outage_s", "expected"), [(45, 2), (150, 4)])
def test_an_outage_is_a_line_when_it_begins_about_one_a_minute_and_one_when_it_ends(
    train_config, s3, tmp_path, outage_s, expected
):
    """Before: a 45 s outage printed 129 lines of `S3 unreachable for 0 s`, one per failed
    call, about three a second."""
    now = [1_800_000_000.0]
    clock = lambda: now[0]  # noqa: E731 - the injected clock
    lines = []
    status = RunStatus(
        train_config(role="head", nodes=3, status_every_s=3600), aws.RetryingS3(S3Down(s3, clock, now[0] + outage_s)),
        tmp_path / "model", attempt_started=now[0], log=lines.append, clock=clock,
    )  # fmt: skip
    for _ in range(outage_s + 5):  # a publish every second, through the outage and after it
        status.publish()
        now[0] += 1
    assert len(lines) == expected, lines
    assert lines[0].startswith(f"status: S3 unreachable since {stamp_at(1_800_000_000)} (")
    assert "EndpointConnectionError" in lines[0] and "for 0 s" not in lines[0]
    assert [line.split(" (")[0] for line in lines[1:-1]] == [
        f"status: S3 unreachable for {minute * 60} s" for minute in range(1, expected - 1)
    ]
    assert lines[-1] == f"status: S3 answers again after {outage_s} s"
    assert status_json(s3)["phase"] == "booting"  # rewritten once S3 answers
    status.end("done", None)


def test_members_publish_nothing(train_config, s3, tmp_path):
    status = RunStatus(train_config(node_index=1), aws.RetryingS3(s3), tmp_path, attempt_started=0)
    status.end("done", None)
    assert not status.thread.is_alive() and "Contents" not in s3.list_objects_v2(Bucket=BUCKET)


def test_emf_line_follows_the_specification(train_config):
    line = emf_line(train_config(), {"top1": 0.5}, 1700000000.5)
    assert line["_aws"]["Timestamp"] == 1700000000500  # milliseconds since the epoch
    assert line["_aws"]["CloudWatchMetrics"][0]["Metrics"] == [{"Name": "top1", "Unit": "None"}]
    assert (line["Run"], line["top1"]) == ("r1", 0.5)  # each dimension and metric at the top
