"""The preprocessing node tells PreprocessStack's wait condition whether it can start converting.

A rehearsal of preprocess_node.sh with stub commands first on PATH: a python3 whose `-m venv`
fails as Ubuntu's does without python3-venv, an apt-get that records what it was asked, and a
local HTTP server in place of CloudFormation's presigned wait-condition URL.

.venv/bin/python -m pytest tests/bootstrap/preprocess/test_preprocess_ready_signal.py
"""

import json
import os
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from bootstrap.preprocess import ready_signal

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "bootstrap" / "preprocess_node.sh"
# What the script needs from the system besides the stubs (no systemctl: no boot service).
TOOLS = ("bash", "env", "dirname", "basename", "date", "tee", "mkdir", "grep", "rm", "cat")

PYTHON_STUB = """#!/bin/bash
# Ubuntu's python3 without python3-venv: everything works but creating a venv.
if [[ "$1 $2" == "-m venv" ]]; then
    echo "The virtual environment was not created successfully because ensurepip is not" >&2
    echo "available.  On Debian/Ubuntu systems, you need to install the python3-venv package" >&2
    exit 1
fi
# The conversion itself is not under test: it only records that it was started.
if [[ " $* " == *" preprocess-node "* ]]; then
    echo "converter started" >> "$STUB_LOG"
    exit 0
fi
exec {python} "$@"
"""
APT_STUB = """#!/bin/bash
echo "apt-get $*" >> "$STUB_LOG"
"""
DPKG_QUERY_STUB = """#!/bin/bash
echo "dpkg-query: no packages found matching python3-venv" >&2
exit 1
"""


class Handle:
    """Stands in for the wait condition handle: records each PUT's JSON."""

    def __init__(self):
        self.signals: list[dict] = []
        handle = self

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                handle.signals.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *_):
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/waitcondition?signature=x"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def handle():
    server = Handle()
    yield server
    server.close()


def write_stub(directory: Path, name: str, text: str) -> None:
    path = directory / name
    path.write_text(text)
    path.chmod(0o755)


def run_node(
    tmp_path: Path, handle: Handle, install: bool
) -> tuple[subprocess.CompletedProcess, str]:
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for tool in TOOLS:
        (stubs / tool).symlink_to(shutil.which(tool))
    write_stub(stubs, "python3", PYTHON_STUB.format(python=sys.executable))
    write_stub(stubs, "apt-get", APT_STUB)
    write_stub(stubs, "dpkg-query", DPKG_QUERY_STUB)
    node_json = tmp_path / "node.json"
    node_json.write_text(
        json.dumps(
            {
                "role": "preprocess",
                "region": "us-east-1",
                "bucket": "horovod-fleet-rehearsal",
                "log_group": None,
                "project": "horovod-fleet",
                "signal": None,
                "mount_point": str(tmp_path / "data"),
                "install": install,
                "log_dir": str(tmp_path / "log"),
                "state_dir": str(tmp_path / "state"),
                "raw_prefix": "raw/",
                "output_prefix": "tfrecords/",
                "volume_id": None,
                "download_secret_arn": None,
                "train_shards": 2,
                "val_shards": 1,
                "stop_when_done": False,
                "ready_signal_url": handle.url,
            }
        )
    )
    stub_log = tmp_path / "stub.log"
    stub_log.touch()
    env = {
        "PATH": str(stubs),
        "NODE_JSON": str(node_json),
        "STUB_LOG": str(stub_log),
        "HOROVOD_FLEET_VENV": str(tmp_path / "venv"),
        "HOME": str(tmp_path),
    }
    result = subprocess.run(
        [shutil.which("bash"), str(SCRIPT)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result, stub_log.read_text()


def test_a_node_whose_venv_cannot_be_made_signals_failure_with_the_step(tmp_path, handle):
    result, calls = run_node(tmp_path, handle, install=True)
    assert result.returncode != 0
    # python3-venv was missing, so it was installed (the stub leaves venv broken regardless).
    assert "install -y -q python3-venv" in calls
    assert "converter started" not in calls
    [signal] = handle.signals
    assert signal["Status"] == "FAILURE"
    assert signal["Reason"].startswith(
        "preprocessing node: step 'python environment' failed (exit 1 at line"
    )
    # The line is ensure_venv's `python3 -m venv`, in lib.sh.
    lib = (ROOT / "bootstrap" / "lib.sh").read_text().splitlines()
    line = int(signal["Reason"].split(" at line ")[1].split()[0])
    assert "of lib.sh)" in signal["Reason"] and "-m venv" in lib[line - 1]
    assert signal["UniqueId"] == ready_signal.UNIQUE_ID
    # The clear line in the node's log, beside the stub's own error.
    assert "step 'python environment' failed" in result.stdout
    assert "ensurepip is not" in result.stdout + result.stderr
    assert not (tmp_path / "venv").exists()


def test_a_ready_node_signals_success_before_it_converts(tmp_path, handle):
    result, calls = run_node(tmp_path, handle, install=False)
    assert result.returncode == 0, result.stdout + result.stderr
    [signal] = handle.signals
    assert signal["Status"] == "SUCCESS"
    assert "s3://horovod-fleet-rehearsal/raw/" in signal["Reason"]
    assert calls.splitlines() == ["converter started"]


def test_no_url_means_no_signal(tmp_path, capsys):
    path = tmp_path / "node.json"
    path.write_text(json.dumps({"role": "preprocess", "ready_signal_url": None}))
    assert ready_signal.main(["--node-json", str(path), "SUCCESS", "ready"]) == 0
    assert "not signalled" in capsys.readouterr().out


def test_an_unreachable_handle_is_one_error_line(tmp_path, capsys):
    path = tmp_path / "node.json"
    path.write_text(json.dumps({"ready_signal_url": "http://127.0.0.1:9/handle"}))
    assert ready_signal.main(["--node-json", str(path), "FAILURE", "x"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: could not signal FAILURE") and "Traceback" not in err


def test_reason_is_one_bounded_line():
    document = json.loads(ready_signal.signal_document("FAILURE", "a\nb " + "x" * 5000))
    assert document["Reason"].startswith("a b x")
    assert len(document["Reason"]) == ready_signal.MAX_REASON
    assert os.linesep not in document["Reason"]
