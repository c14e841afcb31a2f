"""Rendezvous against moto S3: registration, key handling, waiting, hostfile, reruns.

.venv/bin/python -m pytest tests/bootstrap/fleet/test_rendezvous.py
"""

import json
import shutil

import pytest
from bootstrap_helpers import BUCKET
from botocore.exceptions import ClientError

from bootstrap.fleet import rendezvous

T0 = 1_800_000_000.0


class FakeClock:
    """time.time/time.sleep stand-ins: sleeping advances the clock instantly."""

    def __init__(self, now=T0):
        self.now = now

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def test_register_node_writes_the_contract_document(s3, train_config):
    cfg = train_config(node_index=1)
    rendezvous.register_node(s3, cfg, "10.0.0.2", "i-0abc", T0, shards="own", interface="ens32")
    doc = json.loads(s3.get_object(Bucket=BUCKET, Key="runs/r1/nodes/1.json")["Body"].read())
    assert doc == {
        "index": 1,
        "ip": "10.0.0.2",
        "gpus": 8,
        "instance_id": "i-0abc",
        "registered_at": "2027-01-15T08:00:00Z",
        "head_key_sha256": None,
        "shards": "own",
        "interface": "ens32",
    }


def test_wait_for_nodes_returns_all_in_index_order_and_writes_hostfile(s3, train_config, tmp_path):
    clock = FakeClock()
    for index, ip in ((1, "10.0.0.3"), (0, "10.0.0.2")):
        rendezvous.register_node(s3, train_config(node_index=index), ip, f"i-{index}", clock())
    cfg = train_config()
    nodes = rendezvous.wait_for_nodes(s3, cfg, clock, clock.sleep)
    assert [n["ip"] for n in nodes] == ["10.0.0.2", "10.0.0.3"]
    text = rendezvous.write_hostfile(s3, cfg, nodes, tmp_path / "hostfile")
    assert text == "10.0.0.2 slots=8\n10.0.0.3 slots=8\n"
    assert (tmp_path / "hostfile").read_text() == text
    assert s3.get_object(Bucket=BUCKET, Key="runs/r1/hostfile")["Body"].read().decode() == text


def test_cpu_nodes_get_one_slot(s3, train_config, tmp_path):
    cfg = train_config(gpus_per_node=0, nodes=1)
    rendezvous.register_node(s3, cfg, "10.213.0.2", "n0", T0)
    nodes = rendezvous.wait_for_nodes(s3, cfg, FakeClock(), FakeClock().sleep)
    assert rendezvous.write_hostfile(s3, cfg, nodes, tmp_path / "h") == "10.213.0.2 slots=1\n"


def test_missing_node_times_out_naming_its_index(s3, train_config):
    clock = FakeClock()
    cfg = train_config(nodes=3, rendezvous_timeout_s=60)
    rendezvous.register_node(s3, cfg, "10.0.0.2", "i-0", clock())
    rendezvous.register_node(s3, train_config(nodes=3, node_index=2), "10.0.0.4", "i-2", clock())
    with pytest.raises(rendezvous.RendezvousError, match=r"node\(s\) 1 of 3 did not register"):
        rendezvous.wait_for_nodes(s3, cfg, clock, clock.sleep)
    assert clock.now >= T0 + 60  # it did wait for the whole timeout


def test_stale_registration_from_a_previous_deployment_is_not_counted(s3, train_config):
    clock = FakeClock()
    cfg = train_config(heartbeat_timeout_s=120, rendezvous_timeout_s=30)
    # Node 1 of an earlier deployment registered an hour ago, with an IP that no longer exists.
    rendezvous.register_node(s3, train_config(node_index=1), "10.0.9.9", "i-old", T0 - 3600)
    rendezvous.register_node(s3, cfg, "10.0.0.2", "i-0", clock())
    with pytest.raises(rendezvous.RendezvousError, match=r"node\(s\) 1 of 2"):
        rendezvous.wait_for_nodes(s3, cfg, clock, clock.sleep)


def test_a_replaced_head_counts_only_nodes_that_trust_its_new_key(s3, train_config):
    """A Spot fleet relaunched as new instances: the new head's key differs from the one the
    run's earlier members installed, and its rendezvous began after their last beat."""
    clock = FakeClock()
    cfg = train_config(heartbeat_timeout_s=120, rendezvous_timeout_s=30)
    old_key = rendezvous.key_fingerprint("ssh-ed25519 AAAAold hvd-r1")
    new_key = rendezvous.key_fingerprint("ssh-ed25519 AAAAnew hvd-r1\n")
    member = train_config(node_index=1)
    # The interrupted attempt's member beat 20 s ago (fresh enough), with the old key.
    rendezvous.register_node(s3, member, "10.0.9.9", "i-old", clock() - 20, old_key)
    since = clock()
    rendezvous.register_node(s3, cfg, "10.0.0.2", "i-0", clock(), new_key)
    with pytest.raises(rendezvous.RendezvousError, match=r"node\(s\) 1 of 2"):
        rendezvous.wait_for_nodes(s3, cfg, clock, clock.sleep, head_key=new_key, since=since)
    # The replacement read head.pub before the new head published it: still the old key.
    rendezvous.register_node(s3, member, "10.0.0.3", "i-new", clock(), old_key)
    with pytest.raises(rendezvous.RendezvousError, match=r"node\(s\) 1 of 2"):
        rendezvous.wait_for_nodes(s3, cfg, clock, clock.sleep, head_key=new_key, since=since)
    # Its next beat names the key it installed since.
    rendezvous.register_node(s3, member, "10.0.0.3", "i-new", clock(), new_key)
    nodes = rendezvous.wait_for_nodes(s3, cfg, clock, clock.sleep, head_key=new_key, since=since)
    assert [n["instance_id"] for n in nodes] == ["i-0", "i-new"]


def test_a_nodes_own_entry_stays_live_however_long_it_waits(s3, train_config):
    clock = FakeClock()
    cfg = train_config(heartbeat_timeout_s=10, rendezvous_timeout_s=1000)
    rendezvous.register_node(s3, cfg, "10.0.0.2", "i-0", clock())
    clock.now += 500
    rendezvous.register_node(s3, train_config(node_index=1), "10.0.0.3", "i-1", clock())
    assert len(rendezvous.wait_for_nodes(s3, cfg, clock, clock.sleep)) == 2


def test_the_head_key_is_made_once_published_and_reused(s3, train_config):
    if shutil.which("ssh-keygen") is None:
        pytest.skip("ssh-keygen (openssh-client) not installed")
    cfg = train_config()
    key = rendezvous.ensure_head_key(s3, cfg)
    public = key.with_suffix(".pub").read_bytes()
    assert key.stat().st_mode & 0o077 == 0  # ssh refuses a private key others can read
    assert public.startswith(b"ssh-ed25519 ")
    assert s3.get_object(Bucket=BUCKET, Key="runs/r1/ssh/head.pub")["Body"].read() == public
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix="runs/r1/ssh/")["Contents"]
    assert [o["Key"] for o in listed] == ["runs/r1/ssh/head.pub"]  # never the private key
    # A rerun reuses the key, and republishes it if S3 lost it.
    s3.delete_object(Bucket=BUCKET, Key="runs/r1/ssh/head.pub")
    assert rendezvous.ensure_head_key(s3, cfg) == key
    assert key.with_suffix(".pub").read_bytes() == public
    assert s3.get_object(Bucket=BUCKET, Key="runs/r1/ssh/head.pub")["Body"].read() == public


def test_a_missing_key_that_s3_answers_with_403_counts_as_absent(s3):
    # The s3 fixture answers as S3 answers the node role (prefix-conditioned ListBucket).
    with pytest.raises(ClientError, match="AccessDenied"):
        s3.get_object(Bucket=BUCKET, Key="runs/r1/ssh/head.pub")
    assert rendezvous.read_object(s3, BUCKET, "runs/r1/ssh/head.pub") is None
    s3.put_object(Bucket=BUCKET, Key="runs/r1/ssh/head.pub", Body=b"key")
    assert rendezvous.read_object(s3, BUCKET, "runs/r1/ssh/head.pub") == b"key"


def test_other_errors_are_not_absence(s3):
    with pytest.raises(ClientError, match="NoSuchBucket"):
        rendezvous.read_object(s3, "no-such-bucket", "runs/r1/DONE.json")


def test_install_authorized_key_is_idempotent(tmp_path):
    path = tmp_path / "ssh" / "authorized_keys"
    path.parent.mkdir()
    path.write_text("ssh-rsa AAAA other@key\n")
    assert rendezvous.install_authorized_key(path, "ssh-ed25519 BBBB hvd-r1\n")
    assert not rendezvous.install_authorized_key(path, "ssh-ed25519 BBBB hvd-r1")
    assert path.read_text() == "ssh-rsa AAAA other@key\nssh-ed25519 BBBB hvd-r1\n"
    assert path.stat().st_mode & 0o777 == 0o600


def test_member_waits_for_the_key_then_times_out_loudly(s3, train_config):
    clock = FakeClock()
    with pytest.raises(
        rendezvous.RendezvousError, match=r"the head did not publish .*/ssh/head.pub within"
    ):
        rendezvous.wait_for_head_key(s3, train_config(node_index=1), clock, clock.sleep)


def test_member_installs_key_registers_and_stops_at_done(s3, train_config, tmp_path):
    clock = FakeClock(now=0)  # S3 LastModified is real time: the member started "long ago"
    member = train_config(node_index=1)
    s3.put_object(Bucket=BUCKET, Key="runs/r1/ssh/head.pub", Body=b"ssh-ed25519 KEY hvd-r1\n")
    beats = []

    def sleep(seconds):
        beats.append(seconds)
        clock.sleep(seconds)
        if len(beats) == 3:
            s3.put_object(Bucket=BUCKET, Key="runs/r1/DONE.json", Body=b"{}")

    rendezvous.serve_as_member(s3, member, "10.0.0.3", "i-1", lambda m: None, clock, sleep)
    assert len(beats) == 3  # kept re-registering (heartbeat) until DONE.json appeared
    assert (tmp_path / "authorized_keys").read_text() == "ssh-ed25519 KEY hvd-r1\n"
    entry = json.loads(s3.get_object(Bucket=BUCKET, Key="runs/r1/nodes/1.json")["Body"].read())
    assert entry["ip"] == "10.0.0.3"
    # The node names the key it installed, so a replaced head tells old nodes from new.
    assert entry["head_key_sha256"] == rendezvous.key_fingerprint("ssh-ed25519 KEY hvd-r1")


def test_member_signals_once_on_this_deployments_fleet_check_only(s3, train_config):
    """CloudFormation counts a node as created only on the head's fleet check of this
    deployment: a check left by an earlier deployment is not this fleet's."""
    # S3's LastModified is real time: the member started "long ago" for DONE.json to count.
    clock = FakeClock(now=10_000)
    head, member = train_config(), train_config(node_index=1)
    s3.put_object(Bucket=BUCKET, Key="runs/r1/ssh/head.pub", Body=b"ssh-ed25519 KEY hvd-r1\n")
    rendezvous.write_fleet_check(s3, head, "from the last deployment", 5_000)
    ready, beats = [], []

    def sleep(seconds):
        beats.append(seconds)
        clock.sleep(seconds)
        if len(beats) == 2:
            rendezvous.write_fleet_check(s3, head, "NCCL transport: ofi", clock())
        if len(beats) == 5:
            s3.put_object(Bucket=BUCKET, Key="runs/r1/DONE.json", Body=b"{}")

    rendezvous.serve_as_member(
        s3, member, "10.0.0.3", "i-1", lambda m: None, clock, sleep, fleet_ready=ready.append
    )
    assert len(beats) == 5
    assert [c["detail"] for c in ready] == ["NCCL transport: ofi"]


def test_registration_is_idempotent_on_rerun(s3, train_config):
    cfg = train_config(node_index=1)
    rendezvous.register_node(s3, cfg, "10.0.0.3", "i-1", T0)
    rendezvous.register_node(s3, cfg, "10.0.0.3", "i-1", T0 + 5)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="runs/r1/")["Contents"]]
    assert keys == ["runs/r1/nodes/1.json"]
