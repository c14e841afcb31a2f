"""S3's commit point never moves back (issue 47): when rank 0's node is lost, rank 0 moves to a
node that holds only older checkpoints; the head's mirror (bootstrap/head/mirror.py) follows it,
and its uploads (bootstrap/head/checkpoints.py) must not make S3's `checkpoints/checkpoint` name
an older checkpoint than S3 already holds whole. The real s5cmd against a moto server, the
nodes' model dirs behind the mirror's stub ssh.

    .venv/bin/python -m pytest tests/bootstrap/head/test_commit_point.py
"""

import re
import time

import pytest
from bootstrap_helpers import BUCKET, QUICK
from test_mirror import REMOTE, STUB, host_model, progress, write_checkpoint

from bootstrap import aws
from bootstrap.head import checkpoints
from bootstrap.head.mirror import Mirror, Ssh

STATE_KEY = "runs/r1/model/checkpoints/checkpoint"


def s3_newest(s3) -> str:
    body = s3.get_object(Bucket=BUCKET, Key=STATE_KEY)["Body"].read().decode()
    return re.search(r'^model_checkpoint_path: "([^"]+)"', body, re.MULTILINE).group(1)


@pytest.fixture
def stub_ssh(tmp_path, monkeypatch):
    """ssh to a host directory under <tmp>/hosts (test_mirror.py's stub)."""
    ssh = tmp_path / "bin" / "ssh"
    ssh.parent.mkdir()
    ssh.write_text(STUB)
    ssh.chmod(0o755)
    monkeypatch.setenv("STUB_ROOT", str(tmp_path / "hosts"))
    return Ssh(tmp_path / "key", 2222, ssh=str(ssh))


def test_s3s_checkpoint_never_names_an_older_one_after_rank_0_moves(
    endpoint, train_config, tmp_path, stub_ssh
):
    local = tmp_path / "head" / "model"
    store = checkpoints.ModelStore(aws.RetryingS3(endpoint, QUICK), train_config(), local)
    assert store.restore() is None  # a new run
    node0, node1 = host_model(tmp_path, "10.0.0.10"), host_model(tmp_path, "10.0.0.11")
    hosts = ["10.0.0.10", "10.0.0.11"]
    copy = Mirror(stub_ssh, lambda: list(hosts), local, REMOTE, log=lambda line: None)
    # Both nodes hold the restored ckpt-20 (the head pushed it); rank 0 is on node 0.
    write_checkpoint(node0, 20)
    write_checkpoint(node1, 20)
    write_checkpoint(node0, 40, named=(20, 40))
    progress(node0, 45, time.time() - 10)
    assert copy.sync() == "10.0.0.10"
    store.upload()
    assert s3_newest(endpoint) == "ckpt-40"
    # Node 0 is lost: rank 0 moves to node 1, which holds only ckpt-20, and steps on.
    hosts.remove("10.0.0.10")
    progress(node1, 50, time.time())
    assert copy.sync() == "10.0.0.11"
    store.upload()
    assert s3_newest(endpoint) == "ckpt-40"  # not back to ckpt-20
    assert (local / "checkpoints" / "ckpt-40.index").exists()  # the head keeps it too
    assert checkpoints.newest_named(local) == "ckpt-40"
    # The new rank 0 saves a newer one: the commit point moves on, and ckpt-40 goes here.
    write_checkpoint(node1, 60, named=(20, 60))
    progress(node1, 60, time.time() + 1)
    copy.sync()
    store.upload()
    assert s3_newest(endpoint) == "ckpt-60"
    assert not (local / "checkpoints" / "ckpt-40.index").exists()


def test_an_upload_never_commits_an_older_checkpoint_than_s3_names(
    endpoint, train_config, tmp_path
):
    local = tmp_path / "m"
    store = checkpoints.ModelStore(aws.RetryingS3(endpoint, QUICK), train_config(), local)
    store.restore()
    write_checkpoint(local, 40)
    store.upload()
    assert s3_newest(endpoint) == "ckpt-40"
    lines = []
    store.log = lines.append
    write_checkpoint(local, 20)  # a state file naming an older one, whatever wrote it
    store.upload()
    assert s3_newest(endpoint) == "ckpt-40"
    assert "not committing ckpt-20" in lines[-1]
    write_checkpoint(local, 40)  # as new as S3's: committed (the trainer saved it again)
    store.upload()
    write_checkpoint(local, 41)
    store.upload()
    assert s3_newest(endpoint) == "ckpt-41"
