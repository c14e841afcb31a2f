"""`python -m bootstrap`: a user mistake is one `error: ...` line and exit 2; a failure report
whose own AWS calls fail still names the original failure, in one line each, and exits 1. The
leader's steps: tests/bootstrap/head/test_leader.py.

.venv/bin/python -m pytest tests/bootstrap/test_bootstrap_main.py
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from bootstrap_helpers import head_doc, train_doc
from botocore.exceptions import EndpointConnectionError, NoCredentialsError

from bootstrap import __main__ as bootstrap_main
from bootstrap import aws
from bootstrap.head import checkpoints
from bootstrap.node.attempt import Attempt
from bootstrap.node_config import parse
from bootstrap.records import results
from bootstrap.steps import StepFailed


def bootstrap(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bootstrap", *argv], capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def node_json(tmp_path):
    path = tmp_path / "node.json"
    path.write_text(json.dumps(train_doc(log_dir=str(tmp_path / "logs"))))
    return str(path)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bogus"], "argument command: invalid choice: 'bogus' (choose from"),
        ([], "the following arguments are required: command"),
        (["fail", "data pull"], "the following arguments are required: reason"),
        (["cloudwatch-config"], "the following arguments are required: path"),
        (["--bogus", "train-node"], "unrecognized arguments: --bogus"),
    ],
)
def test_usage_mistake_is_one_line(node_json, argv, message):
    result = bootstrap("--node-json", node_json, *argv)
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: {message}")
    assert result.stderr.endswith(" (see --help)\n") and result.stderr.count("\n") == 1
    assert result.stdout == ""


def test_binary_node_json_is_one_line_naming_the_file(tmp_path):
    path = tmp_path / "node.json"
    path.write_bytes(b"{\xff\xfe}")
    result = bootstrap("--node-json", str(path), "train-node")
    assert result.returncode == 2
    assert result.stderr == f"error: node.json: {path} is not UTF-8 text (byte 0xff at offset 1)\n"


@pytest.mark.parametrize(
    ("target", "problem"),
    [("missing-dir/agent.json", "No such file or directory"), (".", "Is a directory")],
)
def test_unwritable_cloudwatch_config_is_one_line(node_json, tmp_path, target, problem):
    path = tmp_path / target
    result = bootstrap("--node-json", node_json, "cloudwatch-config", str(path))
    assert result.returncode == 2
    assert result.stderr == (f"error: cannot write the CloudWatch agent config {path}: {problem}\n")
    assert not (tmp_path / "missing-dir").exists()


def test_cloudwatch_config_is_written(node_json, tmp_path):
    result = bootstrap("--node-json", node_json, "cloudwatch-config", str(tmp_path / "agent.json"))
    assert result.returncode == 0, result.stderr
    assert "logs" in json.loads((tmp_path / "agent.json").read_text())


def test_failure_report_survives_unreachable_aws(tmp_path, monkeypatch, capsys):
    """No network, no credentials: every AWS call of the report fails; the report still logs the
    original failure once, says in one line each what it could not do, and does not raise."""
    cfg = parse(
        head_doc(
            signal={"stack": "TrainStack", "resource": "HeadInstance"},
            mount_point=str(tmp_path / "data"),
            log_dir=str(tmp_path / "logs"),
        )
    )

    def unreachable(*args):
        raise EndpointConnectionError(endpoint_url="https://aws.example")

    def no_credentials(*args):
        raise NoCredentialsError()

    monkeypatch.setattr(aws, "signal_cloudformation", unreachable)
    monkeypatch.setattr(checkpoints.ModelStore, "upload", unreachable)
    monkeypatch.setattr(results, "write_done", no_credentials)
    failure = StepFailed("data pull", "RuntimeError: s5cmd cp failed", "unknown")
    attempt = Attempt()
    attempt.store = checkpoints.ModelStore(None, cfg, tmp_path / "data" / "model")

    bootstrap_main.node_for(cfg, attempt).report(failure)

    refused = (
        'EndpointConnectionError: Could not connect to the endpoint URL: "https://aws.example"'
    )
    messages = [line.split(" [bootstrap] ", 1)[1] for line in capsys.readouterr().out.splitlines()]
    assert messages == [
        "FAILED: step 'data pull' failed: RuntimeError: s5cmd cp failed",
        f"could not signal FAILURE to CloudFormation: {refused}",
        f"could not upload the checkpoints: {refused}",
        "could not write s3://fleet-data/runs/r1/DONE.json: "
        "NoCredentialsError: Unable to locate credentials",
    ]


def test_children_get_the_nodes_region(node_json, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_REGION", "recorded-so-teardown-restores-it")
    monkeypatch.delenv("AWS_REGION")
    assert (
        bootstrap_main.main(
            ["--node-json", node_json, "cloudwatch-config", str(tmp_path / "a.json")]
        )
        == 0
    )
    region = json.loads(Path(node_json).read_text())["region"]
    assert os.environ["AWS_REGION"] == region
