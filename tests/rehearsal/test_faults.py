"""The fault rehearsal's rows as data (rehearsal/fault_rows.py), their snapshots, their judge, and
the cleanup that runs whatever ends a rehearsal. The rows themselves run in `python -m rehearsal
--faults` (make test-e2e)."""

import argparse
import re
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from rehearsal import common, core, fault_row, fault_rows, faults, snapshots

REPO = Path(__file__).resolve().parents[2]


def test_the_docs_table_is_the_rows():
    text = (REPO / "docs" / "rehearsal.md").read_text()
    assert fault_rows.markdown_table() in text


def test_every_row_starts_from_a_snapshot_and_is_chosen_by_its_name():
    names = [row.name for row in fault_rows.ROWS]
    assert len(set(names)) == len(names)
    assert {row.start for row in fault_rows.ROWS} == {fault_row.DATASET, fault_row.CHECKPOINTED}
    assert {row.family for row in fault_rows.ROWS} == {
        "S3",
        "ranks",
        "nodes",
        "elastic",
        "disk",
        "Spot",
    }
    # Rows keep the table's order, whatever order --fault names them in.
    chosen = faults.chosen_rows(["Spot", "rank 1 killed"])
    assert [row.name for row in chosen] == [
        "rank 1 killed (SIGKILL)",
        "Spot interruption of node 1 (two-minute notice) after an epoch",
        "Spot interruption of node 1 with minNodes 2 of 2 (fewer would be left)",
    ]
    assert faults.chosen_rows(None) == fault_rows.ROWS
    ci = faults.chosen_rows(None, "ci")
    assert ci and all(row.in_ci for row in ci) and len(ci) < len(fault_rows.ROWS)
    assert faults.chosen_rows(["Spot"], "ci") == [r for r in ci if "Spot" in r.name]


@pytest.fixture
def bucket(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=common.BUCKET)
        yield s3


def test_a_restored_snapshot_is_exactly_what_was_saved(bucket, tmp_path):
    bucket.put_object(Bucket=common.BUCKET, Key="tfrecords/train-0", Body=b"shard",
                      Metadata={"sha256": "abc"})  # fmt: skip
    bucket.put_object(Bucket=common.BUCKET, Key="runs/r/DONE.json", Body=b"{}",
                      ContentType="application/json")  # fmt: skip
    bucket.put_object(Bucket=common.BUCKET, Key="runs/r/model/ckpt-1.index", Body=b"i")
    assert snapshots.save(bucket, common.BUCKET, tmp_path / "s", ("runs/r/DONE.json",)) == 2
    # What a row does to S3: overwrites, adds, deletes.
    bucket.put_object(Bucket=common.BUCKET, Key="tfrecords/train-0", Body=b"flipped")
    bucket.put_object(Bucket=common.BUCKET, Key="runs/r/attempts.json", Body=b"[]")
    bucket.delete_object(Bucket=common.BUCKET, Key="runs/r/model/ckpt-1.index")
    assert snapshots.restore(bucket, common.BUCKET, tmp_path / "s") == 2
    assert sorted(snapshots.keys(bucket, common.BUCKET)) == [
        "runs/r/model/ckpt-1.index",
        "tfrecords/train-0",
    ]
    shard = bucket.get_object(Bucket=common.BUCKET, Key="tfrecords/train-0")
    assert (shard["Body"].read(), shard["Metadata"]) == (b"shard", {"sha256": "abc"})


def row_expecting(status: str, epochs: int | None, **checks) -> fault_row.Row:
    fault = fault_row.Fault(lambda r: None)
    expect = fault_row.Expect(status, epochs, checks)
    return fault_row.Row("S3", "r", "e", fault_row.DATASET, 2, fault, expect)


def test_the_judge_reads_status_epochs_and_every_named_check():
    done = {"status": "succeeded", "epochs": 2, "reason": None}
    assert faults.judge(None, row_expecting("succeeded", 2), done) == (True, "succeeded, epochs 2")
    assert faults.judge(None, row_expecting("succeeded", 3), done)[0] is False
    ok, seen = faults.judge(None, row_expecting("succeeded", 2, named=lambda r, d: False), done)
    assert (ok, seen) == (False, "succeeded, epochs 2 (not: named)")
    failed = {
        "status": "failed",
        "epochs": None,
        "reason": "step 'training' failed: RuntimeError: horovodrun exited 1: rank 1 died",
    }
    assert faults.judge(None, row_expecting("failed", None), failed) == (
        True, "failed: step 'training' failed: rank 1 died")  # fmt: skip
    assert faults.judge(None, row_expecting("failed", None), None) == (False, "no DONE.json")


def test_a_rehearsal_cleans_up_whatever_ends_it(monkeypatch, tmp_path):
    """An error nobody foresaw (a package missing from an unfinished setup, say) still ends
    every process and removes the namespaces before it propagates."""
    rehearsal = core.Rehearsal(argparse.Namespace(workdir=tmp_path))
    closed = []
    monkeypatch.setattr(rehearsal, "close", lambda: closed.append(True))

    def setup_unfinished():
        raise LookupError("No package metadata was found for horovod")

    monkeypatch.setattr(rehearsal, "plan_steps", lambda: [("local S3 endpoint", setup_unfinished)])
    with pytest.raises(LookupError, match=re.escape("No package metadata")):
        rehearsal.run()
    assert closed == [True]
