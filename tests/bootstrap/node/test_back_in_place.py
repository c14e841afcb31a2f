"""A node the run controller brought back in place (rebooted: its instance store and disks kept)
for a new attempt: it verifies every shard it kept against the manifest and fetches only what
is missing or wrong, never trains on or reports the earlier attempt's outputs, and says how it
came back, which DONE.json's `attempts` carries for every node with the bytes its pull fetched.

.venv/bin/python -m pytest tests/bootstrap/node/test_back_in_place.py
"""

import json
import time

import pytest
from bootstrap_helpers import BUCKET
from test_node_dataset import dataset_in_s3  # noqa: F401  (a fixture)

from bootstrap import aws
from bootstrap.head import results
from bootstrap.node import data_pull, phases
from bootstrap.node.attempt import Attempt

# ruff: noqa: F811  (dataset_in_s3 is a fixture)

FIRST, SECOND = "run r1 attempt 1", "run r1 attempt 2"


def pull(data, lines, verified_for):
    return data_pull.pull_dataset(
        BUCKET, "tfrecords/", data, lines.append, verified_for=verified_for
    )


def test_a_node_back_in_place_for_a_new_attempt_verifies_what_it_kept_and_fetches_nothing(
    dataset_in_s3, tmp_path, monkeypatch
):
    data = tmp_path / "data"
    lines = []
    assert pull(data, lines, FIRST).bytes == sum(s["bytes"] for s in dataset_in_s3["shards"])
    checked = []
    real = data_pull.check_shards
    monkeypatch.setattr(data_pull, "check_shards",
                        lambda d, shards, *a: checked.extend(shards) or real(d, shards, *a))  # fmt: skip
    again = pull(data, lines, SECOND)
    assert again.bytes == 0
    assert {s["file"] for s in checked} == {s["file"] for s in dataset_in_s3["shards"]}
    assert "pulling 0 of 8 shards" in lines[-2] and "(8 already here and verified)" in lines[-2]
    assert "(0 bytes fetched)" in lines[-1]
    # The same attempt's bootstrap restarted in place trusts what it verified.
    checked.clear()
    assert pull(data, lines, SECOND).bytes == 0 and "skipping the pull" in lines[-1]
    assert checked == []


@pytest.mark.parametrize("damage", ["a flipped byte", "missing"])
def test_a_node_back_in_place_fetches_only_the_shard_it_lost_or_that_went_bad(
    dataset_in_s3, tmp_path, damage
):
    data = tmp_path / "data"
    lines = []
    pull(data, lines, FIRST)
    shard = dataset_in_s3["shards"][3]
    path = data / shard["file"]
    if damage == "missing":
        path.unlink()
    else:  # the same size, another sha256
        body = bytearray(path.read_bytes())
        body[-8] ^= 0xFF
        path.write_bytes(bytes(body))
    again = pull(data, lines, SECOND)
    assert again.bytes == shard["bytes"]
    assert data_pull.check_shards(data, dataset_in_s3["shards"]) == []
    assert "pulling 1 of 8 shards" in lines[-2]


@pytest.fixture
def model_dir(tmp_path):
    found = tmp_path / "data" / "model"
    (found / "checkpoints").mkdir(parents=True)
    (found / "progress.json").write_text(json.dumps({"global_step": 900, "epoch": 3}))
    (found / "checkpoints" / "ckpt-900.index").write_text("never committed")
    (found / "resets.json").write_text("[]")
    return found


def begin(cfg, model_dir, earlier, lines) -> Attempt:
    attempt = Attempt()
    attempt.earlier = earlier
    attempt.begin(cfg, model_dir, lines.append)
    return attempt


def test_a_node_back_in_place_never_trains_on_the_earlier_attempts_outputs(
    train_config, tmp_path, model_dir
):
    """Its bootstrap was killed mid-attempt 1 (the record left open), the controller rebooted
    it for attempt 2: the model dir's progress, uncommitted checkpoint and resets are gone before
    anything reads them (the head puts the restored checkpoints there)."""
    cfg = train_config(mount_point=str(tmp_path / "data"))
    lines = []
    begin(cfg, model_dir, [], lines)  # attempt 1, then the bootstrap was killed
    (model_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    (model_dir / "progress.json").write_text("{}")
    restarted = begin(cfg, model_dir, [], lines)  # systemd's restart of attempt 1: kept
    assert restarted.restarts and (model_dir / "progress.json").exists()
    relaunched = begin(cfg, model_dir, [{"attempt": 1, "status": "failed"}], lines)
    assert relaunched.number == 2 and relaunched.restarts == []
    assert not model_dir.exists()
    assert lines[-2].startswith("came back in place from r1 attempt 1: removed its trainer "
                                "outputs (checkpoints, progress.json, resets.json) from")  # fmt: skip
    assert lines[-1] == "attempt 2 of run r1"


def test_the_head_back_in_place_keeps_its_model_dir_for_its_restore(
    train_config, tmp_path, model_dir
):
    """The head's restore reuses only checkpoint files S3's sidecars vouch for, and reads only
    trainer outputs written since its attempt began: its disk stays."""
    cfg = train_config(role="head", mount_point=str(tmp_path / "data"))
    begin(cfg, model_dir, [], [])
    begin(cfg, model_dir, [{"attempt": 1, "status": "failed"}], [])
    assert (model_dir / "checkpoints" / "ckpt-900.index").exists()


def relaunch(s3, attempt, nodes) -> None:
    """controller.json as the run controller's Launch leaves it (steps_fleet.py)."""
    doc = {"relaunch": {"attempt": attempt, "try": 1, "nodes": nodes}}
    s3.put_object(Bucket=BUCKET, Key="runs/r1/controller.json", Body=json.dumps(doc))


def record_of(s3, node="0") -> dict:
    body = s3.get_object(Bucket=BUCKET, Key=f"runs/r1/phases/{node}.json")["Body"].read()
    return json.loads(body)


def test_a_node_says_how_the_relaunch_brought_it_back_once_controller_json_says(s3, train_config):
    cfg = train_config()
    record = phases.PhaseRecord(cfg, aws.RetryingS3(s3), 2, "i-0abc", "10.0.0.7")
    record.begin(launched=None, kernel_started=None, now=time.time())
    assert record_of(s3)["came_back"] is None  # the relaunch has not said so yet
    relaunch(s3, 2, {"0": {"instance_id": "i-0abc", "came_back": "rebooted"}})
    record.measure("data_pull", 1.0, 2.0, bytes=0, mb_per_s=None)
    assert record_of(s3)["came_back"] == "rebooted"
    # Another instance serving node 0 now (the tick replaced it during the attempt) was not
    # brought back by the relaunch.
    other = phases.PhaseRecord(cfg, aws.RetryingS3(s3), 2, "i-0new", "10.0.0.9")
    other.save()
    assert record_of(s3)["came_back"] is None
    # The deployment launched attempt 1's nodes: nothing to read.
    first = phases.PhaseRecord(cfg, aws.RetryingS3(s3), 1, "i-0abc", "10.0.0.7")
    first.save()
    assert record_of(s3)["came_back"] is None and first.came_back_known


def test_done_json_says_for_every_node_how_it_came_back_and_what_its_pull_fetched(train_config):
    cfg = train_config()
    records = [
        {"node": "head", "instance_id": "i-head", "came_back": "replaced", "phases": {}},
        {"node": "1", "instance_id": "i-1", "came_back": "started",
         "phases": {"data_pull": {"s": 30.0, "bytes": 150_000}}},
        {"node": "0", "instance_id": "i-0", "came_back": "rebooted",
         "phases": {"data_pull": {"s": 2.0, "bytes": 0}}},
    ]  # fmt: skip
    earlier = [{"attempt": 1, "status": "failed", "cause": "node_lost", "reason": "lost",
                "nodes": {"0": {"instance_id": "i-0", "came_back": None, "pull_bytes": 9}}}]  # fmt: skip
    done = results.done_document(cfg, "succeeded", None, None, time.time(), time.time() - 60,
                                 earlier=earlier, records=records)  # fmt: skip
    first, own = done["attempts"]
    assert first["nodes"] == earlier[0]["nodes"]
    assert own["attempt"] == 2
    assert own["nodes"] == {
        "0": {"instance_id": "i-0", "came_back": "rebooted", "pull_bytes": 0},
        "1": {"instance_id": "i-1", "came_back": "started", "pull_bytes": 150_000},
        "head": {"instance_id": "i-head", "came_back": "replaced", "pull_bytes": None},
    }
    assert list(own["nodes"]) == ["0", "1", "head"]
