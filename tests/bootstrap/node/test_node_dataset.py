"""The pull beside the start-up: a node's own shards first, each shard verified as it arrives and
renamed into place only when whole, the failure of the rest raised by the step that looks, and
the leader's wait for every node to hold every shard.

.venv/bin/python -m pytest tests/bootstrap/node/test_dataset.py
"""

import hashlib
import json
import time

import pytest
from bootstrap_helpers import BUCKET, write_tfrecord

from bootstrap import aws, transfer
from bootstrap.fleet import rendezvous
from bootstrap.node import data_pull, dataset
from bootstrap.steps import StepFailed
from contract import causes

SHARDS = 8  # 6 train, 2 validation


@pytest.fixture
def dataset_in_s3(endpoint, tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    shards = []
    for index in range(SHARDS):
        split, number, total = ("train", index, 6) if index < 6 else ("validation", index - 6, 2)
        path = source / f"{split}-{number:05d}-of-{total:05d}"
        write_tfrecord(path, [bytes([index]) * 50, b"xy"])
        shards.append({"file": path.name, "split": split, "records": 2,
                       "bytes": path.stat().st_size,
                       "sha256": hashlib.sha256(path.read_bytes()).hexdigest()})  # fmt: skip
        endpoint.upload_file(str(path), BUCKET, f"tfrecords/{path.name}")
    manifest = {"splits": {"train": {"shards": 6, "records": 12},
                           "validation": {"shards": 2, "records": 4}}, "shards": shards}  # fmt: skip
    endpoint.put_object(Bucket=BUCKET, Key="tfrecords/manifest.json", Body=json.dumps(manifest))
    return manifest


def test_own_files_are_what_the_trainer_gives_the_node_s_ranks_first():
    """bootstrap mirrors trainer/data.py's rule (it never imports the trainer): node i of N with
    G slots holds what ranks i*G .. i*G+G-1 of N*G read, with fewer files than ranks too."""
    from trainer.data import shard_for_rank  # only the test may import trainer/

    for files, nodes, slots in ((6, 2, 1), (6, 3, 2), (2, 2, 2), (1024, 8, 8), (128, 8, 8)):
        names = [f"train-{i:05d}-of-{files:05d}" for i in range(files)]
        manifest = {"shards": [{"file": n, "split": "train"} for n in reversed(names)]}
        for node in range(nodes):
            ranks = range(node * slots, (node + 1) * slots)
            expected = {f for r in ranks for f in shard_for_rank(names, r, nodes * slots).files}
            assert data_pull.own_files(manifest, node, nodes, slots) == expected


def test_a_node_s_own_shards_are_verified_in_place_before_the_rest(dataset_in_s3, tmp_path):
    data = tmp_path / "data"
    own = data_pull.own_files(dataset_in_s3, 1, 2, 1)  # train 1, 3, 5 and validation 1
    seen = {}

    def on_own(at):
        seen["there"] = sorted(p.name for p in data.iterdir() if p.name.startswith(("tr", "va")))
        seen["manifest"] = (data / "manifest.json").is_file()

    lines = []
    pulled = data_pull.pull_dataset(BUCKET, "tfrecords/", data, lines.append, own=lambda m: own,
                                    on_own=on_own)  # fmt: skip
    assert seen["there"] == sorted(own) and seen["manifest"]  # the rest came after
    assert "pulling 8 of 8 shards" in lines[1] and "this node's own 4 first" in lines[1]
    assert pulled.bytes == sum(s["bytes"] for s in dataset_in_s3["shards"])
    assert pulled.started <= pulled.own_at <= pulled.finished
    assert not (data / data_pull.PARTIAL_DIR).exists()
    # A rerun with the same manifest skips it all, own shards included.
    again = data_pull.pull_dataset(BUCKET, "tfrecords/", data, lines.append, own=lambda m: own,
                                   on_own=lambda at: lines.append("own"))  # fmt: skip
    assert again.bytes == 0 and lines[-1] == "own" and "skipping the pull" in lines[-2]


def test_each_shard_is_verified_as_it_arrives_beside_the_downloads(dataset_in_s3, tmp_path,
                                                                    monkeypatch):  # fmt: skip
    """on_arrival hands a shard over while s5cmd still copies others: verified and placed
    before the last one has arrived."""
    placed_before_the_end = []
    real_download = transfer.download

    def download(bucket, prefix, sizes, dest, what, policy=None, note=aws.log, on_arrival=None):
        def arrived(name):
            on_arrival(name)
            placed_before_the_end.append(len(list(dest.parent.glob("train-*"))))

        real_download(bucket, prefix, sizes, dest, what, policy, note, arrived)

    monkeypatch.setattr(transfer, "download", download)
    monkeypatch.setattr(transfer, "DOWNLOAD_WORKERS", 1)  # one object at a time
    data_pull.pull_dataset(BUCKET, "tfrecords/", tmp_path / "data", print)
    assert len(placed_before_the_end) == SHARDS


def test_a_corrupt_shard_of_the_rest_fails_after_the_own_ones_are_in_place(
    endpoint, dataset_in_s3, tmp_path
):
    bad = dataset_in_s3["shards"][4]["file"]
    body = endpoint.get_object(Bucket=BUCKET, Key=f"tfrecords/{bad}")["Body"].read()
    endpoint.put_object(Bucket=BUCKET, Key=f"tfrecords/{bad}", Body=body[:-1] + b"!")
    data, owned = tmp_path / "data", []
    own = data_pull.own_files(dataset_in_s3, 1, 2, 1)
    assert bad not in own
    with pytest.raises(data_pull.VerificationError, match=f"{bad}: sha256 differs"):
        data_pull.pull_dataset(BUCKET, "tfrecords/", data, print, own=lambda m: own,
                               on_own=owned.append)  # fmt: skip
    assert owned and not (data / bad).exists()  # never in place: not whole
    assert not (data / data_pull.VERIFIED_MARKER).exists()


def test_the_pull_beside_the_start_up_says_what_the_node_holds(dataset_in_s3, tmp_path):
    pull = dataset.DatasetPull(BUCKET, "tfrecords/", tmp_path / "data",
                               lambda m: data_pull.own_files(m, 0, 2, 1), None)  # fmt: skip
    assert pull.holds is None
    pull.start()
    pull.wait_own()
    assert pull.holds in (dataset.OWN, dataset.ALL)
    pull.wait_all()
    assert pull.holds == dataset.ALL


def test_a_failed_pull_is_the_data_pull_s_failure_wherever_it_is_seen(
    endpoint, dataset_in_s3, tmp_path
):
    bad = dataset_in_s3["shards"][5]["file"]
    size = dataset_in_s3["shards"][5]["bytes"]
    endpoint.put_object(Bucket=BUCKET, Key=f"tfrecords/{bad}", Body=b"\0" * size)
    ended = []
    pull = dataset.DatasetPull(BUCKET, "tfrecords/", tmp_path / "data",
                               lambda m: data_pull.own_files(m, 0, 2, 1), None)  # fmt: skip
    pull.on_failure(lambda: ended.append("training ended"))
    pull.start()
    pull.wait_own()  # node 0's own shards (train 0, 2, 4; validation 0) were fine
    pull.done.wait(30)
    with pytest.raises(StepFailed) as failed:
        pull.check()
    assert failed.value.step == "data pull" and failed.value.cause == causes.CORRUPT_SHARD
    assert bad in failed.value.reason and ended == ["training ended"]
    pull.on_failure(lambda: ended.append("late listener"))  # told at once
    assert ended[-1] == "late listener"
    with pytest.raises(StepFailed):  # a step that waits raises it too
        pull.wait_all()


class FakeClock:
    def __init__(self, now):
        self.now = now

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


class Held:
    """A DatasetPull's face to the gate: what the leader itself holds."""

    def __init__(self, holds):
        self.holds = holds

    def check(self):
        pass


def test_the_leader_waits_until_every_node_holds_every_shard(s3, train_config):
    cfg = train_config(nodes=3, heartbeat_timeout_s=1000, rendezvous_timeout_s=600)
    clock, lines = FakeClock(time.time()), []
    members = {1: "own", 2: "own"}

    def beat_and_sleep(seconds):
        clock.sleep(seconds)
        if clock.now - start > 40:
            members[1] = "all"
        if clock.now - start > 70:
            members[2] = "all"
        register()

    def register():
        for index, holds in members.items():
            rendezvous.register_node(s3, train_config(node_index=index, nodes=3), "10.0.0.9",
                                     f"i-{index}", clock(), "key", holds)  # fmt: skip

    start = clock()
    register()
    leader = Held(dataset.ALL)
    dataset.wait_for_fleet_shards(s3, cfg, leader, "key", start - 1, clock, beat_and_sleep,
                                  lines.append)  # fmt: skip
    assert 70 < clock.now - start < 75
    assert lines and "node(s) 1 (own), 2 (own) to hold every shard" in lines[0]
    assert "node(s) 2 (own)" in lines[-1]


def test_a_member_gone_quiet_while_the_fleet_pulls_is_lost(s3, train_config):
    cfg = train_config(nodes=2, heartbeat_timeout_s=60, rendezvous_timeout_s=600)
    clock = FakeClock(time.time())
    rendezvous.register_node(s3, train_config(node_index=1), "10.0.0.9", "i-1", clock(), "key",
                             "own")  # fmt: skip
    with pytest.raises(dataset.NodesLost, match=r"node 1 \(i-1, 10.0.0.9\) lost") as lost:
        dataset.wait_for_fleet_shards(s3, cfg, Held(dataset.ALL), "key", clock() - 1, clock,
                                      clock.sleep)  # fmt: skip
    assert lost.value.cause == causes.NODE_LOST


def test_shards_that_never_all_arrive_end_the_wait(s3, train_config):
    cfg = train_config(nodes=1, rendezvous_timeout_s=30)
    clock = FakeClock(time.time())
    with pytest.raises(
        dataset.FleetShardsMissing, match=r"node\(s\) 0 \(own\) did not hold"
    ) as late:
        dataset.wait_for_fleet_shards(s3, cfg, Held(dataset.OWN), "key", clock(), clock,
                                      clock.sleep)  # fmt: skip
    assert late.value.cause == causes.NODES_MISSING
