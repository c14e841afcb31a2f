"""A node without a baked CloudWatch agent (the preprocessing node boots stock Ubuntu) installs it
only with AWS's signature, checked against the image's pinned key (bootstrap/lib.sh, run here
with stub commands first on PATH)."""

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PINNED = next(
    line.split("=", 1)[1]
    for line in (REPO / "bootstrap" / "image" / "pins.env").read_text().splitlines()
    if line.startswith("CLOUDWATCH_AGENT_GPG_FINGERPRINT=")
)


def stub(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text(f'#!/usr/bin/env bash\necho "{name} $*" >>"$STUB_LOG"\n{body}\n')
    path.chmod(0o755)


def install_agent(tmp_path: Path, signed_by: str) -> tuple[subprocess.CompletedProcess, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # curl -fsSL --retry 5 -o FILE URL: the file appears; gpg answers as it would for signed_by.
    stub(bin_dir, "curl", 'while [[ $# -gt 0 ]]; do [[ $1 == -o ]] && touch "$2"; shift; done')
    stub(bin_dir, "gpg", f'[[ $* == *--verify* ]] && echo "[GNUPG:] VALIDSIG {signed_by} x"; true')
    stub(bin_dir, "dpkg", "exit 0")
    script = f"""
source {REPO / "bootstrap" / "lib.sh"}
on_error() {{ echo "on_error $*"; exit 3; }}
config() {{ [[ $1 == log_group ]] && echo /horovod-fleet/run; }}
start_cloudwatch_agent
"""
    log = tmp_path / "calls.log"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STUB_LOG": str(log)}
    result = subprocess.run(
        ["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    return result, log.read_text() if log.exists() else ""


@pytest.mark.skipif(
    Path("/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl").exists(),
    reason="this machine has the agent: the install path is skipped",
)
def test_the_agent_is_installed_only_after_its_signature_checks_out(tmp_path):
    result, calls = install_agent(tmp_path, PINNED)
    lines = calls.splitlines()
    verify = next(i for i, line in enumerate(lines) if "--verify" in line)
    install = next(i for i, line in enumerate(lines) if line.startswith("dpkg -i"))
    assert verify < install, calls
    assert lines[install].endswith("/amazon-cloudwatch-agent.deb")
    assert any("amazon-cloudwatch-agent.deb.sig" in line for line in lines)
    # Past the install the real agent's ctl is missing here: the step fails after dpkg.
    assert result.returncode == 3


@pytest.mark.skipif(
    Path("/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl").exists(),
    reason="this machine has the agent: the install path is skipped",
)
def test_an_agent_signed_by_another_key_is_never_installed(tmp_path):
    result, calls = install_agent(tmp_path, "0" * 40)
    assert result.returncode == 3
    assert "dpkg" not in calls
    assert f"FAILED: amazon-cloudwatch-agent.deb: no valid signature by {PINNED}" in result.stdout
