"""A replacement node learns its index at boot (bootstrap/node/assignment.py): its node.json names
none, the run controller's launch assignment in S3 does, and a node that finds none within the
wait fails in one line with its cause.

.venv/bin/python -m pytest tests/bootstrap/node/test_launch_assignment.py
"""

import json

import pytest
from bootstrap_helpers import BUCKET, train_doc

from bootstrap import __main__ as bootstrap_main
from bootstrap import aws
from bootstrap.member import Member
from bootstrap.node import assignment
from bootstrap.node.attempt import Attempt
from bootstrap.node_config import ConfigError, parse

INSTANCE = "i-0123456789abcdef0"
KEY = f"runs/r1/launches/{INSTANCE}.json"


def replacement_doc(tmp_path, **overrides) -> dict:
    doc = train_doc(log_dir=str(tmp_path / "logs"), state_dir=str(tmp_path / "state"), **overrides)
    del doc["node_index"]
    return doc


def put_assignment(s3, document) -> None:
    s3.put_object(Bucket=BUCKET, Key=KEY, Body=json.dumps(document).encode())


class Clock:
    """A clock that advances only when the wait sleeps, and counts the reads."""

    def __init__(self, on_sleep=None):
        self.now, self.sleeps, self.on_sleep = 0.0, 0, on_sleep

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.sleeps += 1
        if self.on_sleep:
            self.on_sleep(self.sleeps)


def test_a_node_json_without_an_index_is_a_replacement_node(tmp_path):
    cfg = parse(replacement_doc(tmp_path))
    assert cfg.node_index is None and not cfg.is_head


@pytest.mark.parametrize("index", [0, 1])
def test_a_replacement_node_runs_as_the_node_its_assignment_names(s3, tmp_path, monkeypatch, index):
    """The instance id from IMDS (stubbed) names the assignment; the node is then node `index`,
    a member whatever its index (the head runs horovodrun), in every other respect the
    node.json it booted with."""
    monkeypatch.setattr(aws, "imds", lambda path: {"meta-data/instance-id": INSTANCE}[path])
    monkeypatch.setattr(aws, "s3_client", lambda region: s3)
    put_assignment(s3, {"node_index": index, "instance_id": INSTANCE, "run": "r1"})
    cfg = parse(replacement_doc(tmp_path))
    launched = bootstrap_main.as_launched(cfg, "train-node")
    assert launched.node_index == index
    assert launched == parse({**replacement_doc(tmp_path), "node_index": index})
    node = bootstrap_main.node_for(launched, Attempt())
    assert type(node) is Member


def test_the_assignment_written_during_the_wait_is_read(s3, tmp_path):
    """The controller writes it seconds after the launch; the node polls until it is there."""
    clock = Clock(on_sleep=lambda n: n == 3 and put_assignment(s3, {"node_index": 1}))
    cfg = parse(replacement_doc(tmp_path))
    launched = assignment.assigned(
        cfg, s3, INSTANCE, wait_s=600, interval_s=5, clock=clock, sleep=clock.sleep
    )
    assert launched.node_index == 1 and clock.sleeps == 3


def test_the_wait_for_an_assignment_is_bounded(s3, tmp_path):
    clock = Clock()
    cfg = parse(replacement_doc(tmp_path))
    with pytest.raises(assignment.Unassigned, match=f"no launch assignment s3://{BUCKET}/{KEY}"):
        assignment.assigned(
            cfg, s3, INSTANCE, wait_s=600, interval_s=5, clock=clock, sleep=clock.sleep
        )
    assert clock.now == 600 and clock.sleeps == 120


def test_a_node_that_finds_no_assignment_fails_in_one_line_with_its_cause(
    s3, tmp_path, monkeypatch, capsys
):
    path = tmp_path / "node.json"
    path.write_text(json.dumps(replacement_doc(tmp_path)))
    monkeypatch.setattr(aws, "imds", lambda path: {"meta-data/instance-id": INSTANCE}[path])
    monkeypatch.setattr(aws, "s3_client", lambda region: s3)
    monkeypatch.setattr(assignment, "WAIT_S", 0)
    assert bootstrap_main.main(["--node-json", str(path), "train-node"]) == 1
    out = capsys.readouterr().out
    [failed] = [line for line in out.splitlines() if "FAILED" in line]
    assert failed.endswith(
        f"[bootstrap] FAILED: step 'launch assignment' failed: Unassigned: no launch assignment "
        f"s3://{BUCKET}/{KEY} after 0 s: the run controller launched {INSTANCE} but never said "
        "which node it is (cause nodes_missing)"
    )
    assert "Traceback" not in out


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"node_index": 2}, "key 'node_index' must be < nodes (2), got 2"),
        ({"node_index": "1"}, "key 'node_index' must be int, got '1'"),
        ({"node_index": True}, "key 'node_index' must be int, got True"),
        ({"index": 1}, "no 'node_index' in it"),
    ],
)
def test_an_assignment_that_names_no_node_of_the_fleet_is_refused(s3, tmp_path, document, message):
    put_assignment(s3, document)
    cfg = parse(replacement_doc(tmp_path))
    with pytest.raises(ConfigError) as refused:
        assignment.assigned(cfg, s3, INSTANCE, wait_s=0)
    assert str(refused.value) == f"launch assignment s3://{BUCKET}/{KEY}: {message}"
