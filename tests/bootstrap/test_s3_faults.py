"""S3 faults on a node: outages ridden out and reported, transfers verified instead of trusted,
shards repaired by a rerun, a SIGTERM flushed, and a rendezvous that says who is missing (the
checkpoints' restore and upload: test_checkpoints.py).

Fault-injecting stubs: an s5cmd that exits 0 having done nothing (as s5cmd v2.3.0 does when the
listing behind a sync fails), an s5cmd that never answers, boto3 calls that raise for N seconds.

    .venv/bin/python -m pytest tests/bootstrap/test_s3_faults.py
"""

import hashlib
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from bootstrap_helpers import BUCKET, QUICK, head_doc, train_doc, write_tfrecord
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError

from bootstrap import aws, transfer
from bootstrap.fleet import rendezvous
from bootstrap.node import data_pull
from bootstrap.node_config import parse

REPO = Path(__file__).resolve().parents[2]


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def refused():
    return EndpointConnectionError(endpoint_url="https://s3.example")


def failing_for(seconds, clock, error=refused):
    calls = []

    def action():
        calls.append(clock())
        if clock() < seconds:
            raise error()
        return "done"

    return action, calls


# ---------------------------------------------------------------- the retry policy


def test_a_five_minute_outage_is_ridden_out_with_a_line_a_minute():
    clock, notes = FakeClock(), []
    action, calls = failing_for(300, clock)
    result = aws.with_retries(
        "put_object s3://b/k", action, aws.STEP_POLICY, notes.append, clock, clock.sleep,
        random.Random(12).random,
    )  # fmt: skip
    assert result == "done" and clock() >= 300
    assert 4 <= len(notes) <= 5  # one a minute (at the first retry past each minute)
    assert all("S3 unreachable" in n and "put_object s3://b/k" in n for n in notes)
    assert "EndpointConnectionError" in notes[0]
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    assert max(gaps) <= aws.STEP_POLICY.max_delay_s
    assert len(set(round(g, 6) for g in gaps)) > 1  # jitter: not a fixed beat


def test_past_its_budget_a_step_names_s3_what_and_the_last_error():
    clock, notes = FakeClock(), []
    action, _ = failing_for(10_000, clock, lambda: ReadTimeoutError(endpoint_url="https://s3"))
    with pytest.raises(aws.S3Unavailable) as failure:
        aws.with_retries("reading manifest.json", action, aws.STEP_POLICY, notes.append, clock,
                         clock.sleep)  # fmt: skip
    message = str(failure.value)
    assert message.startswith("S3 unreachable for 33")
    assert "while reading manifest.json; last error: ReadTimeoutError" in message
    assert clock() <= aws.STEP_POLICY.budget_s + 1


def test_a_refusal_is_not_an_outage_and_fails_at_once():
    clock = FakeClock()
    denied = ClientError({"Error": {"Code": "AccessDenied", "Message": "no"}}, "ListObjectsV2")
    calls = []

    def action():
        calls.append(1)
        raise denied

    with pytest.raises(ClientError):
        aws.with_retries("listing", action, aws.STEP_POLICY, print, clock, clock.sleep)
    assert calls == [1]


def test_results_are_retried_until_they_are_in():
    clock, notes = FakeClock(), []
    action, _ = failing_for(3 * 3600, clock)
    assert aws.with_retries("upload", action, aws.UNTIL_DONE, notes.append, clock, clock.sleep)
    assert "retrying until it works" in notes[0]


def test_a_shutdown_ends_every_wait_within_its_time(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(aws, "_shutdown_deadline", [])
    aws.shutdown_within(40, clock)
    action, _ = failing_for(10_000, clock)
    with pytest.raises(aws.S3Unavailable):
        aws.with_retries("upload", action, aws.UNTIL_DONE, print, clock, clock.sleep)
    assert 40 <= clock() <= 41


def test_a_call_that_waited_through_an_outage_marks_when_s3_answered_again(monkeypatch):
    clock = FakeClock()
    reachability = aws.S3Reachability(clock)
    monkeypatch.setattr(aws, "S3_REACHABILITY", reachability)
    clock.now = 1000.0
    action, _ = failing_for(1075, clock)
    aws.with_retries("put_object s3://b/k", action, aws.STEP_POLICY, print, clock, clock.sleep)
    assert 1075 <= aws.s3_answered_again_at() == clock() <= 1075 + aws.STEP_POLICY.max_delay_s
    assert aws.s3_unreachable_s(0, clock()) == pytest.approx(clock() - 1000)
    # Only the part inside the window counts, and an outage still going on counts up to now.
    assert aws.s3_unreachable_s(1050, 1060) == 10
    reachability.unanswered()
    assert aws.s3_unreachable_s(clock(), clock() + 30) == 30


def test_outages_seen_by_several_threads_count_once(monkeypatch):
    """The heartbeat, status and checkpoint-sync threads wait through the same outage: the
    timeline gets its length, not their sum."""
    reachability = aws.S3Reachability()
    monkeypatch.setattr(aws, "S3_REACHABILITY", reachability)
    started = time.time()
    quick = aws.RetryPolicy(budget_s=5, first_delay_s=0.01, max_delay_s=0.02)

    def outage_until(end):
        def action():
            if time.time() < end:
                raise refused()

        return action

    threads = [
        threading.Thread(
            target=aws.with_retries, args=("x", outage_until(started + 0.4), quick, print)
        )
        for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert 0.35 <= aws.s3_unreachable_s(started, time.time()) <= 0.9  # their sum: 1.2
    assert aws.s3_answered_again_at() >= started + 0.4


def test_a_refusal_is_s3_answering_and_cloudformation_is_not_s3(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(aws, "S3_REACHABILITY", aws.S3Reachability(clock))
    action, _ = failing_for(30, clock)
    aws.with_retries("signal", action, aws.STEP_POLICY, print, clock, clock.sleep, of_s3=False)
    assert aws.s3_answered_again_at() is None and aws.s3_unreachable_s(0, clock()) == 0
    aws.S3_REACHABILITY.unanswered()

    def refuse():
        raise ClientError({"Error": {"Code": "AccessDenied", "Message": "no"}}, "GetObject")

    with pytest.raises(ClientError):
        aws.with_retries("get", refuse, aws.STEP_POLICY, print)
    assert aws.s3_answered_again_at() == clock()


def test_boto3_clients_time_out_every_request():
    config = aws.client("s3", "us-east-1").meta.config
    assert config.connect_timeout == aws.CONNECT_TIMEOUT_S
    assert config.read_timeout == aws.READ_TIMEOUT_S
    assert config.retries["total_max_attempts"] == aws.REQUEST_ATTEMPTS


def test_retrying_client_rides_out_boto3_raising_for_a_while():
    started = time.monotonic()

    class Flaky:
        def put_object(self, **kwargs):
            if time.monotonic() - started < 0.3:
                raise refused()
            return {"ok": kwargs["Key"]}

    s3 = aws.RetryingS3(Flaky(), QUICK, print)
    assert s3.put_object(Bucket="b", Key="k") == {"ok": "k"}


# ---------------------------------------------------------------- s5cmd stubs


def test_s5cmd_that_exits_0_without_the_files_is_a_failure(fake_s5cmd, tmp_path, monkeypatch):
    fake_s5cmd("exit 0")
    monkeypatch.setattr(aws, "STEP_POLICY", QUICK)
    with pytest.raises(aws.S3Unavailable, match="s5cmd exited 0 but 1 of 1 objects are not in"):
        transfer.download(
            "b", "runs/r1/model/", {"checkpoints/checkpoint": 10}, tmp_path, "restoring"
        )


def test_s5cmd_that_never_answers_is_killed_and_the_error_is_an_outage(fake_s5cmd):
    fake_s5cmd("sleep 600")
    started = time.monotonic()
    with pytest.raises(aws.S5cmdFailed, match="killed after no answer from S3") as failure:
        transfer.run_s5cmd("cp", "s3://b/k", "k", stall_s=0.5)
    assert failure.value.transient and time.monotonic() - started < 10


def test_s5cmd_refusal_is_not_retried(fake_s5cmd):
    fake_s5cmd('echo "ERROR AccessDenied: Access Denied status code: 403" >&2; exit 1')
    with pytest.raises(aws.S5cmdFailed) as failure:
        transfer.run_s5cmd("cp", "s3://b/k", "k")
    assert not failure.value.transient


# ---------------------------------------------------------------- data pull repair


@pytest.fixture
def dataset_in_s3(endpoint, tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    shards = []
    for index in range(2):
        path = source / f"train-0000{index}-of-00002"
        write_tfrecord(path, [bytes([index]) * 20, b"xy"])
        shards.append({"file": path.name, "split": "train", "records": 2,
                       "bytes": path.stat().st_size,
                       "sha256": hashlib.sha256(path.read_bytes()).hexdigest()})  # fmt: skip
        endpoint.upload_file(str(path), BUCKET, f"tfrecords/{path.name}")
    manifest = {"splits": {"train": {"shards": 2, "records": 4}}, "shards": shards}
    endpoint.put_object(Bucket=BUCKET, Key="tfrecords/manifest.json", Body=json.dumps(manifest))
    return source


def test_same_size_corruption_in_s3_is_repaired_by_a_rerun(endpoint, dataset_in_s3, tmp_path):
    good = (dataset_in_s3 / "train-00001-of-00002").read_bytes()
    bad = good[:-1] + bytes([good[-1] ^ 1])
    endpoint.put_object(Bucket=BUCKET, Key="tfrecords/train-00001-of-00002", Body=bad)
    data = tmp_path / "data"
    with pytest.raises(data_pull.VerificationError, match="differs from its manifest: fix it"):
        data_pull.pull_dataset(BUCKET, "tfrecords/", data, print, workers=1)
    assert not (data / "train-00001-of-00002").exists()  # never under its own name: not whole
    endpoint.put_object(Bucket=BUCKET, Key="tfrecords/train-00001-of-00002", Body=good)
    lines = []
    data_pull.pull_dataset(BUCKET, "tfrecords/", data, lines.append, workers=1)
    # The bad copy never reached the data dir (verified before its rename): only it comes again.
    assert any("pulling 1 of 2 shards" in line and "1 already here" in line for line in lines)
    assert not (data / ".partial" / "train-00001-of-00002").exists()
    assert (data / "train-00001-of-00002").read_bytes() == good


def test_a_pull_that_gets_nothing_names_s3_not_a_missing_shard(
    endpoint, dataset_in_s3, tmp_path, fake_s5cmd
):
    """s5cmd exits 0 and copies nothing: the reason says S3 and what did not arrive."""
    data = tmp_path / "data"
    data.mkdir()
    fake_s5cmd(
        f'[[ $* == *manifest.json* ]] && cp {dataset_in_s3.parent}/manifest.json "${{@: -1}}"; exit 0'
    )
    body = endpoint.get_object(Bucket=BUCKET, Key="tfrecords/manifest.json")["Body"].read()
    (dataset_in_s3.parent / "manifest.json").write_bytes(body)
    with pytest.raises(aws.S3Unavailable, match="s5cmd exited 0 but 2 of 2 objects"):
        data_pull.pull_dataset(BUCKET, "tfrecords/", data, print, workers=1)


# ---------------------------------------------------------------- rendezvous


def test_waiting_for_a_missing_node_names_it_every_30_s(s3, train_config):
    clock, lines = FakeClock(), []
    clock.now = 1_800_000_000.0
    cfg = train_config(nodes=3, rendezvous_timeout_s=100)
    for index in (0, 2):
        rendezvous.register_node(s3, train_config(node_index=index, nodes=3), "10.0.0.1",
                                 f"i-{index}", clock())  # fmt: skip
    with pytest.raises(rendezvous.RendezvousError, match=r"node\(s\) 1 of 3 did not register"):
        rendezvous.wait_for_nodes(s3, cfg, clock, clock.sleep, lines.append)
    assert len(lines) == 3
    assert all("waiting" in line and "node(s) 1 of 3" in line for line in lines)


# ---------------------------------------------------------------- SIGTERM


def test_sigterm_flushes_and_writes_done_interrupted(endpoint, dataset_in_s3, tmp_path):
    """The head is stopped while training: it passes the SIGTERM on to horovodrun, uploads
    what it has and writes DONE.json with status interrupted."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    horovodrun = bin_dir / "horovodrun"
    model = tmp_path / "node" / "data" / "model"
    horovodrun.write_text(
        "#!/usr/bin/env bash\n"
        f"mkdir -p {model}/checkpoints && echo ckpt > {model}/checkpoints/ckpt-1.index\n"
        "trap 'echo horovodrun stopped; exit 143' TERM\necho training; while :; do sleep 0.1; done\n"
    )
    horovodrun.chmod(0o755)
    home = tmp_path / "node"
    doc = head_doc(gpus_per_node=0, efa=False, install=False, instance_store=False, nodes=1,
                   mount_point=str(home / "data"), log_dir=str(home / "logs"),
                   state_dir=str(home / "state"), ip="127.0.0.1", instance_id="i-test",
                   authorized_keys_file=str(home / "authorized_keys"), checkpoint_sync_s=600)  # fmt: skip
    (tmp_path / "node.json").write_text(json.dumps(doc))
    node = parse(train_doc(**{**doc, "role": "train", "node_index": 0}))
    stop = threading.Event()

    def member() -> None:
        """Node 0 on this host, as its bootstrap registers: naming the head's key."""
        while not stop.wait(0.5):
            public = rendezvous.read_object(endpoint, BUCKET, "runs/r1/ssh/head.pub")
            if public:
                fingerprint = rendezvous.key_fingerprint(public.decode())
                rendezvous.register_node(
                    endpoint, node, "127.0.0.1", "i-n0", time.time(), fingerprint, "all"
                )

    registering = threading.Thread(target=member, daemon=True)
    registering.start()
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "bootstrap", "--node-json", str(tmp_path / "node.json"),
         "train-node"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
    )  # fmt: skip
    output = []
    for line in proc.stdout:
        output.append(line)
        if line.startswith("training"):
            proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 1, "".join(output)
    stop.set()
    text = "".join(output)
    assert "horovodrun stopped" in text
    done = json.loads(endpoint.get_object(Bucket=BUCKET, Key="runs/r1/DONE.json")["Body"].read())
    assert done["status"] == "interrupted"
    assert done["reason"] == "step 'training' was interrupted: the node was stopped (SIGTERM)"
    keys = aws.list_sizes(endpoint, BUCKET, "runs/r1/")
    assert "model/checkpoints/ckpt-1.index" in keys
    assert any(k.startswith("logs/head/") for k in keys)


def test_log_lines_reach_the_file_when_stdout_is_gone(tmp_path, monkeypatch):
    """A shutdown stops the script's tee with the node: the flush's own lines still land."""

    class Gone:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", Gone())
    monkeypatch.setattr(aws, "log_fallback", [tmp_path / "bootstrap.log"])
    aws.log("INTERRUPTED: step 'training' was interrupted")
    assert "INTERRUPTED" in (tmp_path / "bootstrap.log").read_text()
