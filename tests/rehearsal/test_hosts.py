"""rehearsal/hosts.py without namespaces: what killing a simulated host leaves on the shared disk."""

import subprocess
import time

import pytest

from rehearsal import hosts


@pytest.fixture
def pyenv_root(tmp_path, monkeypatch):
    (tmp_path / "shims").mkdir()
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path))
    return tmp_path


def killed_host(monkeypatch, command: list[str], becomes: str) -> subprocess.Popen:
    """A fleet whose one namespace holds one process running `command`, killed once the process
    is what the test says (its command line starts with `becomes`): right after Popen, bash may
    not have exec'd its command yet, and a read during an exec sees an empty command line."""
    process = subprocess.Popen(command)
    deadline = time.monotonic() + 10
    while not hosts.command_line(process.pid).startswith(becomes):
        assert time.monotonic() < deadline, f"{command} never became {becomes!r}"
        time.sleep(0.01)
    monkeypatch.setattr(hosts, "namespace_pids", lambda namespace: [process.pid])
    fleet = hosts.Fleet.__new__(hosts.Fleet)  # no bridge, no namespaces: only kill_host
    assert fleet.kill_host("hf-test-n2") == [process.pid]
    assert process.wait(timeout=10) == -9
    return process


def test_a_host_killed_in_pyenv_rehash_releases_its_lock(monkeypatch, pyenv_root):
    lock = pyenv_root / "shims" / ".pyenv-shim"
    lock.write_text("#!/usr/bin/env bash\n")
    killed_host(monkeypatch, ["bash", "-c", "exec -a pyenv-rehash sleep 60"], "pyenv-rehash 60")
    assert not lock.exists()


def test_a_host_killed_outside_pyenv_rehash_leaves_another_s_lock(monkeypatch, pyenv_root):
    lock = pyenv_root / "shims" / ".pyenv-shim"
    lock.write_text("#!/usr/bin/env bash\n")
    killed_host(monkeypatch, ["sleep", "60"], "sleep 60")
    assert lock.exists()
