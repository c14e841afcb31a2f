"""Rank 0's model dir on the head (bootstrap/head/mirror.py): copied whole, in TensorFlow's
order, from whichever node holds rank 0 now; and the restored checkpoints pushed to a node.

Two ssh's: a stub that runs the command on this machine in a directory per host (the remote
model dir /remote/model of host H is <root>/H/model), and, as root with sshd installed, the
real client against a real sshd on 127.0.0.1."""

import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from bootstrap.head.mirror import STATE, Mirror, Ssh, listing, push, state_names

REMOTE = Path("/remote/model")
STUB = """#!/usr/bin/env bash
# ssh as the mirror calls it: options, the host, one command; the host is a directory here.
while [[ $1 == -* ]]; do shift 2; done
host=$1 command=$2
[[ -d $STUB_ROOT/$host ]] || { echo "ssh: connect to host $host: No route to host" >&2; exit 255; }
exec bash -c "${command//\\/remote\\/model/$STUB_ROOT/$host/model}"
"""


def state_file(*names: str) -> str:
    newest = names[-1]
    lines = [f'model_checkpoint_path: "{newest}"']
    lines += [f'all_model_checkpoint_paths: "{n}"' for n in names]
    return "\n".join(lines) + "\n"


def write_checkpoint(model: Path, step: int, *, named: tuple[int, ...] | None = None) -> None:
    """As TensorFlow does: the .data, the .index, then the state file naming the kept ones."""
    checkpoints = model / "checkpoints"
    checkpoints.mkdir(parents=True, exist_ok=True)
    (checkpoints / f"ckpt-{step}.data-00000-of-00001").write_bytes(os.urandom(4096))
    (checkpoints / f"ckpt-{step}.index").write_bytes(f"index {step}".encode())
    kept = named if named is not None else (step,)
    (checkpoints / "checkpoint").write_text(state_file(*(f"ckpt-{s}" for s in kept)))


def progress(model: Path, step: int, at: float) -> None:
    path = model / "progress.json"
    path.write_text(json.dumps({"global_step": step}))
    os.utime(path, (at, at))


@pytest.fixture
def stub_ssh(tmp_path, monkeypatch):
    ssh = tmp_path / "bin" / "ssh"
    ssh.parent.mkdir()
    ssh.write_text(STUB)
    ssh.chmod(0o755)
    monkeypatch.setenv("STUB_ROOT", str(tmp_path / "hosts"))
    return Ssh(tmp_path / "key", 2222, ssh=str(ssh))


def host_model(tmp_path: Path, host: str) -> Path:
    model = tmp_path / "hosts" / host / "model"
    model.mkdir(parents=True, exist_ok=True)
    return model


def mirror(tmp_path, ssh, hosts, lines=None) -> Mirror:
    log = lines.append if lines is not None else (lambda line: None)
    return Mirror(ssh, lambda: hosts, tmp_path / "head" / "model", REMOTE, log=log)


def test_the_listing_reads_the_state_file_before_the_files(tmp_path):
    write_checkpoint(tmp_path, 5)
    found = listing(tmp_path)
    assert state_names(found["state"]) == {"ckpt-5"}
    assert set(found["files"]) == {
        "checkpoints/ckpt-5.data-00000-of-00001",
        "checkpoints/ckpt-5.index",
    }
    assert listing(tmp_path / "none") == {"state": None, "files": {}}


def test_rank_0s_node_is_the_one_with_the_newest_progress_and_its_files_arrive_whole(
    tmp_path, stub_ssh
):
    now = time.time()
    a, b = host_model(tmp_path, "10.0.0.10"), host_model(tmp_path, "10.0.0.11")
    progress(a, 10, now - 60)  # node 0 held rank 0 before it was lost
    write_checkpoint(b, 20)
    progress(b, 25, now)
    (b / "tensorboard").mkdir()
    (b / "tensorboard" / "events.out").write_bytes(b"e" * 100)
    lines = []
    copy = mirror(tmp_path, stub_ssh, ["10.0.0.10", "10.0.0.11", "10.0.0.99"], lines)
    assert copy.sync() == "10.0.0.11"  # 10.0.0.99 does not answer: left out, not fatal
    local = tmp_path / "head" / "model"
    assert (local / "checkpoints" / "ckpt-20.index").read_bytes() == b"index 20"
    assert (local / STATE).read_text() == (b / STATE).read_text()
    assert (local / "tensorboard" / "events.out").stat().st_size == 100
    assert json.loads((local / "progress.json").read_text()) == {"global_step": 25}
    assert not list(local.rglob("*.mirror-partial"))
    assert "rank 0's outputs are on 10.0.0.11 now" in lines[0]


def test_a_state_file_naming_files_the_listing_lacks_is_not_copied(tmp_path, stub_ssh):
    """TensorFlow writes the state file after the files it names; a state file whose files are
    not whole here must not reach the head, whose uploads take it as the commit point."""
    b = host_model(tmp_path, "10.0.0.11")
    write_checkpoint(b, 20)
    (b / "checkpoints" / "checkpoint").write_text(state_file("ckpt-20", "ckpt-30"))
    progress(b, 30, time.time())
    copy = mirror(tmp_path, stub_ssh, ["10.0.0.11"])
    copy.sync()
    local = tmp_path / "head" / "model"
    assert (local / "checkpoints" / "ckpt-20.index").exists() and not (local / STATE).exists()
    write_checkpoint(b, 30, named=(20, 30))  # the files arrive: the next round commits
    copy.sync()
    assert state_names((local / STATE).read_text()) == {"ckpt-20", "ckpt-30"}


def test_only_what_changed_is_copied_and_what_the_trainer_dropped_is_dropped(tmp_path, stub_ssh):
    b = host_model(tmp_path, "10.0.0.11")
    write_checkpoint(b, 20)
    progress(b, 20, time.time())
    copy = mirror(tmp_path, stub_ssh, ["10.0.0.11"])
    copy.sync()
    local = tmp_path / "head" / "model"
    marker = local / "checkpoints" / "ckpt-20.index"
    os.utime(marker, (1, 1))  # copied again only if it changed at the source
    for name in ("ckpt-20.index", "ckpt-20.data-00000-of-00001"):
        (b / "checkpoints" / name).unlink()  # the trainer keeps the newest few only
    write_checkpoint(b, 30)
    copy.sync()
    assert sorted(p.name for p in (local / "checkpoints").iterdir()) == [
        "checkpoint", "ckpt-30.data-00000-of-00001", "ckpt-30.index",
    ]  # fmt: skip


def test_after_horovodrun_the_last_copy_comes_from_the_node_that_held_rank_0(tmp_path, stub_ssh):
    b = host_model(tmp_path, "10.0.0.11")
    progress(b, 1, time.time())
    hosts = ["10.0.0.11"]
    copy = Mirror(
        stub_ssh, lambda: list(hosts), tmp_path / "head" / "model", REMOTE, interval_s=3600
    )
    copy.start()
    copy.sync()
    hosts.clear()  # the discovery lists no host any more: the job is over
    (b / "train.json").write_text('{"epochs": 4}')
    assert copy.final() == "10.0.0.11" and not copy.is_alive()
    assert (tmp_path / "head" / "model" / "train.json").read_text() == '{"epochs": 4}'


def test_the_restored_checkpoints_replace_the_nodes_own(tmp_path, stub_ssh):
    head = tmp_path / "head" / "model"
    write_checkpoint(head, 40)
    a = host_model(tmp_path, "10.0.0.10")
    write_checkpoint(a, 99)  # an older attempt's leftovers on the node
    (a / "eval.json").write_text("{}")
    push(stub_ssh, "10.0.0.10", head, REMOTE)
    assert sorted(p.name for p in (a / "checkpoints").iterdir()) == [
        "checkpoint", "ckpt-40.data-00000-of-00001", "ckpt-40.index",
    ]  # fmt: skip
    assert (a / "eval.json").exists()
    with pytest.raises(RuntimeError, match=r"copying the checkpoints to 10\.0\.0\.77 failed"):
        push(stub_ssh, "10.0.0.77", head, REMOTE)


# --- the real ssh against a real sshd -------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def sshd(tmp_path):
    if os.geteuid() != 0 or not Path("/usr/sbin/sshd").exists() or not shutil.which("ssh"):
        pytest.skip("needs root, sshd and ssh")
    keys = tmp_path / "sshd"
    keys.mkdir(mode=0o700)
    for name in ("host", "client"):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / name)], check=True
        )
    (keys / "authorized_keys").write_text((keys / "client.pub").read_text())
    port = free_port()
    config = keys / "sshd_config"
    config.write_text(
        f"ListenAddress 127.0.0.1\nPort {port}\nHostKey {keys / 'host'}\n"
        f"AuthorizedKeysFile {keys / 'authorized_keys'}\nPidFile none\nUsePAM no\n"
        "PermitRootLogin prohibit-password\nPasswordAuthentication no\nStrictModes no\n"
    )
    Path("/run/sshd").mkdir(exist_ok=True)
    server = subprocess.Popen(
        ["/usr/sbin/sshd", "-D", "-e", "-f", str(config)], stderr=subprocess.DEVNULL
    )
    try:
        for _ in range(50):
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        yield Ssh(keys / "client", port)
    finally:
        server.terminate()
        server.wait(10)


def test_the_mirror_and_the_push_over_real_ssh(tmp_path, sshd):
    remote = tmp_path / "node" / "model"
    write_checkpoint(remote, 7)
    progress(remote, 7, time.time())
    copy = Mirror(sshd, lambda: ["127.0.0.1"], tmp_path / "head" / "model", remote)
    assert copy.sync() == "127.0.0.1"
    local = tmp_path / "head" / "model"
    assert (local / STATE).read_text() == (remote / STATE).read_text()
    write_checkpoint(local, 8)
    push(sshd, "127.0.0.1", local, remote)
    assert state_names((remote / STATE).read_text()) == {"ckpt-8"}


def test_the_nodes_own_step_file_is_not_copied(tmp_path, stub_ssh):
    b = host_model(tmp_path, "10.0.0.11")
    progress(b, 20, time.time())
    (b / "node-steps.json").write_text('{"global_step": 20}')
    mirror(tmp_path, stub_ssh, ["10.0.0.11"]).sync()
    assert not (tmp_path / "head" / "model" / "node-steps.json").exists()


def test_before_horovodrun_starts_again_the_newest_checkpoint_goes_where_it_is_older(
    tmp_path, stub_ssh
):
    """The head mirrored ckpt-40 from a rank 0 whose node is lost since: a node holding only
    ckpt-20 gets it (its trainer resumes from the newest on any rank's disk); one holding a
    newer one keeps its own."""
    from bootstrap.head.mirror import push_newer

    head = tmp_path / "head" / "model"
    write_checkpoint(head, 40)
    older, newer = host_model(tmp_path, "10.0.0.10"), host_model(tmp_path, "10.0.0.11")
    write_checkpoint(older, 20)
    write_checkpoint(newer, 50)
    assert push_newer(stub_ssh, ["10.0.0.10", "10.0.0.11"], head, REMOTE) == ["10.0.0.10"]
    assert state_names((older / STATE).read_text()) == {"ckpt-40"}
    assert state_names((newer / STATE).read_text()) == {"ckpt-50"}
    assert push_newer(stub_ssh, ["10.0.0.10"], tmp_path / "none", REMOTE) == []
