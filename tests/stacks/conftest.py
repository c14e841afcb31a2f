"""The app's templates for the tests of tests/stacks (`synth` is tests/synthesis.py's), and the
helpers that read them."""

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from synthesis import Templates, made_once, shared_root

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def default(synth: Callable[..., Templates]) -> Templates:
    return synth()


@pytest.fixture(scope="session")
def drill_cli(tmp_path_factory: pytest.TempPathFactory, worker_id: str):
    """`npx cdk synth --quiet -c drill=true` as a user runs it, offline, cdk-nag included:
    (the finished process, its output directory, {stack name: Template}). Made once per test
    session: the xdist workers share it (the first makes it under a lock, the others read it)."""
    import subprocess

    from aws_cdk.assertions import Template
    from test_app import offline_env

    shared = shared_root(tmp_path_factory, worker_id)
    outdir = shared / "drill-cli"

    def cdk_synth() -> dict:
        result = subprocess.run(
            ["npx", "--no-install", "cdk", "synth", "--no-notices", "--quiet", "-c",
             "drill=true", "-o", str(outdir)],
            cwd=ROOT,
            env=offline_env(outdir),
            capture_output=True,
            text=True,
            timeout=300,
        )  # fmt: skip
        return {"args": result.args, "returncode": result.returncode,
                "stdout": result.stdout, "stderr": result.stderr}  # fmt: skip

    result = subprocess.CompletedProcess(**made_once(shared / "drill-cli.json", cdk_synth))
    templates = {
        path.name.removesuffix(".template.json"): Template.from_json(json.loads(path.read_text()))
        for path in outdir.glob("*.template.json")
    }
    return result, outdir, templates


def node_tag(instance: dict) -> str | None:
    """An instance's `horovod-fleet:node` tag: its index, or "head"."""
    tags = {t["Key"]: t["Value"] for t in instance["Properties"].get("Tags", [])}
    return tags.get("horovod-fleet:node")


def fleet_nodes(template: Any) -> dict[str, dict]:
    """TrainStack's GPU node instances (logical ID -> resource), without the head."""
    return {
        logical_id: instance
        for logical_id, instance in template.find_resources("AWS::EC2::Instance").items()
        if node_tag(instance) != "head"
    }


def head_instance(template: Any) -> tuple[str, dict]:
    """TrainStack's one head instance (logical ID, resource)."""
    [found] = [
        (logical_id, instance)
        for logical_id, instance in template.find_resources("AWS::EC2::Instance").items()
        if node_tag(instance) == "head"
    ]
    return found


def user_data(instance: dict) -> str:
    """An instance's user-data with every token replaced by a placeholder: the script as text."""
    body = instance["Properties"]["UserData"]["Fn::Base64"]
    if isinstance(body, str):
        return body
    return "".join(p if isinstance(p, str) else "<token>" for p in body["Fn::Join"][1])


def node_document(instance: dict) -> dict:
    """The node.json an instance's user-data writes, tokens as "<token>"."""
    text = user_data(instance)
    start = text.index("<<'NODE_JSON'\n") + len("<<'NODE_JSON'\n")
    return json.loads(text[start : text.index("\nNODE_JSON\n")])


def fleet_launch_template(template: Any) -> tuple[str, dict]:
    """The launch template every node's instance names (logical ID, resource); the others are
    the replacement template and the head's."""
    [found] = [
        (logical_id, resource)
        for logical_id, resource in template.find_resources("AWS::EC2::LaunchTemplate").items()
        if "Replacement" not in logical_id and not logical_id.startswith("Head")
    ]
    return found


def replacement_template(template: Any) -> tuple[str, dict]:
    """The one launch template every replacement node is launched from (logical ID, resource)."""
    [found] = [
        (logical_id, resource)
        for logical_id, resource in template.find_resources("AWS::EC2::LaunchTemplate").items()
        if "Replacement" in logical_id and not logical_id.startswith("Head")
    ]
    return found


def head_template(template: Any, kind: str) -> tuple[str, dict]:
    """The head's launch template of `kind`: "LaunchTemplate" (its instance names it) or
    "Replacement" (the run controller launches the head again from it)."""
    [found] = [
        (logical_id, resource)
        for logical_id, resource in template.find_resources("AWS::EC2::LaunchTemplate").items()
        if logical_id.startswith(f"Head{kind}")
    ]
    return found


def statements(template: Any, policy_prefix: str) -> list[dict]:
    """Every statement of the IAM policies whose logical ID starts with policy_prefix."""
    found = [
        s
        for logical_id, policy in template.find_resources("AWS::IAM::Policy").items()
        if logical_id.startswith(policy_prefix)
        for s in policy["Properties"]["PolicyDocument"]["Statement"]
    ]
    assert found, f"no IAM policy {policy_prefix}*"
    return found


def resources(statement: dict) -> list[str]:
    """A statement's resources as text (CDK merges statements that share their actions)."""
    value = statement["Resource"]
    return [as_text(v) for v in (value if isinstance(value, list) else [value])]


def as_text(value: Any) -> str:
    """A resource ARN with intrinsic functions flattened to text, for readable assertions."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "Fn::Join" in value:
        return "".join(as_text(p) for p in value["Fn::Join"][1])
    if isinstance(value, dict) and "Ref" in value:
        return f"<{value['Ref']}>"
    return json.dumps(value)


@pytest.fixture
def aws_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fake credentials and the region for every client a test or the code under test makes."""
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


@pytest.fixture
def workflow(default: Templates, aws_credentials):
    """The run controller as TeardownStack deploys it, running in moto (rehearsal/state_machine.py):
    every execution it starts runs the synthesized state machine with the real step code, and
    its tick is the synthesized Tick function's handler."""
    from moto import mock_aws

    from rehearsal.state_machine import Workflow

    template = default["TeardownStack"].to_json()
    with mock_aws(config=Workflow.CONFIG), Workflow(template) as running:
        yield running
