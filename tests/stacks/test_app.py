"""app.py as the CDK CLI runs it: bad context fails in one line, good context synthesizes offline,
passes cdk-nag and cfn-lint, and prints the cost estimate."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

import app as fleet_app
from stacks.config import ConfigError

# Node 20 makes the jsii runtime print a multi-line end-of-life banner on stderr; these tests
# are about the app's own output.
QUIET_NODE = {
    "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
    "JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION": "1",
}


def offline_env(outdir: Path, context: dict | None = None) -> dict[str, str]:
    """No credentials, no instance metadata: nothing can reach AWS."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AWS_", "CDK_"))
        and k != "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION"
    }
    env |= QUIET_NODE | {
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": str(outdir / "no-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(outdir / "no-credentials"),
        "CDK_OUTDIR": str(outdir),
    }
    if context is not None:
        env["CDK_CONTEXT_JSON"] = json.dumps(context)
    return env


def run_app(tmp_path: Path, cwd: Path = ROOT, **context) -> subprocess.CompletedProcess:
    """`python app.py` the way the CLI calls it: context through CDK_CONTEXT_JSON."""
    return subprocess.run(
        [sys.executable, "app.py"],
        cwd=cwd,
        env=offline_env(tmp_path, {**fleet_app.default_context(), **context}),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    ("key", "value", "allowed"),
    [
        ("nodes", 0, "an integer from 1 to 64"),
        ("nodes", -1, "an integer from 1 to 64"),
        ("nodes", "abc", "an integer from 1 to 64"),
        ("nodes", 2.5, "an integer from 1 to 64"),
        ("nodes", 100000, "an integer from 1 to 64"),
        ("instanceType", "p7.mega", "a known GPU instance type: p4d.24xlarge"),
        ("instanceType", "c5.large", "c5.large has no GPU"),
        ("instanceType", "p3dn.24xlarge", "issues/8685); use p4d.24xlarge"),
        ("instanceType", "p3.16xlarge", "a type AWS still sells: AWS retired P3"),
        ("instanceType", "p6-b200.48xlarge", "a type this image can drive: Blackwell"),
        ("batchPerGpu", 1024, "at most 640 on p4d.24xlarge (A100 40 GB)"),
        ("dataVolumeGiB", 100, "an integer from 500 to 16384"),
        ("az", "eu-west-1a", "a zone of region us-east-1"),
        (
            "az",
            "us-east-1z",
            "a zone of region us-east-1 (us-east-1a to us-east-1f) or its zone ID",
        ),
        ("imageTestInstanceType", "p9.huge", "a known GPU instance type: p4d.24xlarge"),
        ("imageTestInstanceType", "c6i.4xlarge", "c6i.4xlarge has no GPU"),
        ("imageTestInstanceType", "p3.2xlarge", "issues/8685); use g5.xlarge"),
        ("ami", "ami-xyz", "empty (the image ImageStack bakes) or an AMI id like ami-0abc1234"),
        ("ami", "/aws/service/deeplearning/ami/id", "or an AMI id like ami-0abc1234"),
    ],
)
def test_bad_context_fails_with_one_line(key, value, allowed):
    with pytest.raises(ConfigError) as refused:
        fleet_app.build({key: value})
    line = str(refused.value)
    assert "\n" not in line
    assert line.startswith(f"error: context key {key}={value!r} is invalid; allowed: ")
    assert allowed in line


def test_bad_context_is_one_line_and_exit_2_from_the_process(tmp_path):
    """The process contract, once: what the CLI shows of a bad value, and nothing written."""
    result = run_app(tmp_path, nodes="abc")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: context key nodes='abc' is invalid; allowed: an integer from 1 to 64"
    ]
    assert "Traceback" not in result.stderr + result.stdout
    assert not list(tmp_path.glob("*.template.json"))


def test_what_the_readme_shows_of_a_bad_value_is_what_npx_cdk_prints(tmp_path):
    """The README's transcript of `npx cdk synth -c nodes=abc` is the CLI's own: the app's one
    line, the line the CDK CLI adds, and the CLI's exit status (1: it wraps the app's 2)."""
    readme = (ROOT / "README.md").read_text().splitlines()
    command = '    $ npx cdk synth -c nodes=abc; echo "exit $?"'
    start = readme.index(command) + 1
    shown = []
    for line in readme[start:]:
        if not line.startswith("    "):
            break
        shown.append(line[4:])
    result = subprocess.run(
        ["npx", "--no-install", "cdk", "synth", "--no-notices", "-c", "nodes=abc"],
        cwd=ROOT,
        env=offline_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    printed = (result.stdout + result.stderr).strip().splitlines()
    assert [*printed, f"exit {result.returncode}"] == shown
    assert not list(tmp_path.glob("*.template.json"))


def copy_sources(source: Path) -> Path:
    """A copy of what `python app.py` reads, to synthesize from edited or frozen sources."""
    source.mkdir()
    for name in ("app.py", "cdk.json"):
        shutil.copy(ROOT / name, source / name)
    # Every package of the checkout: the stacks stage assets from several (the controller, the
    # contract, the node code), and a package added later must not be missed here.
    for package in sorted(path.parent.name for path in ROOT.glob("*/__init__.py")):
        shutil.copytree(
            ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    return source


@pytest.fixture(scope="module")
def cli_synth(tmp_path_factory):
    """The real `npx cdk synth`, offline and without credentials."""
    outdir = tmp_path_factory.mktemp("cli")
    context_file = ROOT / "cdk.context.json"
    before = context_file.read_text() if context_file.exists() else None
    result = subprocess.run(
        ["npx", "--no-install", "cdk", "synth", "--no-notices", "--quiet", "-o", str(outdir)],
        cwd=ROOT,
        env=offline_env(outdir),
        capture_output=True,
        text=True,
        timeout=600,
    )
    after = context_file.read_text() if context_file.exists() else None
    return result, outdir, before == after


@pytest.mark.slow  # the app as `npx cdk synth` makes it: make check's work too
def test_cdk_synth_works_offline_and_passes_cdk_nag(cli_synth):
    result, outdir, _ = cli_synth
    assert result.returncode == 0, result.stdout + result.stderr
    names = {p.name for p in outdir.glob("*.template.json")}
    assert names == {
        "DatasetStack.template.json",
        "TeardownStack.template.json",
        "PreprocessStack.template.json",
        "ImageStack.template.json",
        "TrainStack.template.json",
    }
    assert "AwsSolutions" not in result.stdout + result.stderr


@pytest.mark.slow  # the app as `npx cdk synth` makes it: make check's work too
def test_cdk_synth_needs_no_lookups(cli_synth):
    _, outdir, context_unchanged = cli_synth
    manifest = json.loads((outdir / "manifest.json").read_text())
    assert not manifest.get("missing")
    assert context_unchanged


@pytest.mark.slow  # the app as `npx cdk synth` makes it: make check's work too
def test_synthesis_prints_the_cost_estimate(cli_synth):
    result, _, _ = cli_synth
    assert (
        "TrainStack: 8 x p4d.24xlarge at $21.958/h + head c6i.xlarge at $0.17/h = $175.83/h; "
        "capped at 4 h -> at most $703.34" in result.stderr
    )
    assert "TrainStack needs 768 vCPUs of the EC2 quota 'Running On-Demand P instances'" in (
        result.stderr
    )
    assert (
        "TrainStack takes at deploy the first zone of us-east-1 that offers p4d.24xlarge "
        "(-c az= prefers one) in your account" in result.stderr
    )
    assert "PreprocessStack: t2.large at $0.0928/h" in result.stderr
    # 43,200 ticks x (0.25 GB x 1 s x $0.0000166667 + $0.0000002) + 43,200 x $0.000001.
    assert (
        "TeardownStack: the run controller's tick every minute (43,200 a month, ~1 s at 256 MB) "
        "costs ~$0.23 a month at list price" in result.stderr
    )
    assert "1000 GiB sc1 at $15.00/month" in result.stderr
    assert (
        "ImageStack: bakes only when bootstrap/image, bootstrap/image_proof or trainer/ change"
        in (result.stderr)
    )
    assert "g5.xlarge at $1.006/h for the GPU proof" in result.stderr
    assert "JIT proof" not in result.stderr  # only with -c imageJitInstanceType
    assert "TrainStack training estimate: 90 epochs (recipe goyal) x 1,281,167 images" in (
        result.stderr
    )
    # Each start-up phase's budget, its source or "unmeasured" (docs/cost.md, Start-up).
    assert "TrainStack start-up budget, launch to the first step: ~9.3 min on 8 x p4d.24xlarge" in (
        result.stderr
    )
    for phase in ("launch", "boot", "health", "own_shards", "data_pull", "framework_start"):
        assert f"\n  {phase} " in result.stderr, phase
    assert "own_shards         3.1 s  19.3 GB (1/8 of at most 154.6 GB) at 6,269 MB/s" in (
        result.stderr
    )
    assert "launch             120 s  unmeasured" in result.stderr


@pytest.mark.slow  # the app as `npx cdk synth` makes it: make check's work too
def test_dataset_stack_is_termination_protected(cli_synth):
    _, outdir, _ = cli_synth
    artifacts = json.loads((outdir / "manifest.json").read_text())["artifacts"]
    assert artifacts["DatasetStack"]["properties"]["terminationProtection"] is True
    for name in ("TeardownStack", "PreprocessStack", "ImageStack", "TrainStack"):
        assert not artifacts[name]["properties"].get("terminationProtection"), name


@pytest.mark.slow  # the app as `npx cdk synth` makes it: make check's work too
def test_stack_dependencies(cli_synth):
    _, outdir, _ = cli_synth
    artifacts = json.loads((outdir / "manifest.json").read_text())["artifacts"]

    def depends(name: str) -> set[str]:
        return {d for d in artifacts[name].get("dependencies", []) if d.endswith("Stack")}

    assert "DatasetStack" in depends("TeardownStack")
    assert "TeardownStack" in depends("PreprocessStack")
    assert "TeardownStack" in depends("TrainStack")
    # TrainStack reads ImageStack's image when it deploys, and never bakes first (issue 50).
    assert "ImageStack" not in depends("TrainStack")
    assert depends("ImageStack") == set()


def cfn_lint(templates: list[Path]) -> list[dict]:
    result = subprocess.run(
        [str(Path(sys.executable).with_name("cfn-lint")), "--format", "json", *map(str, templates)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    return json.loads(result.stdout or "[]")


@pytest.mark.slow  # the app as `npx cdk synth` makes it: make check's work too
def test_cfn_lint_finds_no_errors(cli_synth):
    _, outdir, _ = cli_synth
    findings = cfn_lint(sorted(outdir.glob("*.template.json")))
    assert not [f for f in findings if f["Level"] == "Error"], findings
    ours = [f for f in findings if "TeardownStack" not in f["Filename"]]
    assert not ours, ours


# Other configurations than cdk.json's, each with the features it turns on: a zone ID for a new
# subnet (p5) and for a given one (your VPC), your own dataset bucket, e-mails and a target.
OTHER_CONFIGURATIONS = {
    "p5, a zone ID, a snapshot": {"instanceType": "p5.48xlarge", "nodes": 2,
                                  "snapshotDataVolume": True, "az": "use1-az4"},
    "your VPC and dataset, a zone ID": {"vpcId": "vpc-0123abcd", "subnetId": "subnet-0123abcd",
                                        "datasetBucket": "my-imagenet", "az": "use1-az4"},
    "one g5, e-mails, a target": {"instanceType": "g5.xlarge", "nodes": 1,
                                  "budgetEmail": "ml@example.com",
                                  "notifyEmail": "ml@example.com", "targetTop1": 0.759},
}  # fmt: skip


@pytest.fixture(scope="module")
def other_configurations(tmp_path_factory) -> dict[str, Path]:
    """Each of OTHER_CONFIGURATIONS synthesized in this process as app.py does, cdk-nag included
    (a finding fails the synthesis)."""
    synthesized = {}
    for name, context in OTHER_CONFIGURATIONS.items():
        outdir = tmp_path_factory.mktemp("other")
        app, _, _ = fleet_app.build(context, outdir=str(outdir))
        app.synth()
        synthesized[name] = outdir
    return synthesized


@pytest.mark.slow  # the app as `npx cdk synth` makes it: make check's work too
def test_other_configurations_pass_cdk_nag_and_cfn_lint(other_configurations):
    templates = [
        t for d in other_configurations.values() for t in sorted(d.glob("*.template.json"))
    ]
    assert len(templates) == 5 * len(OTHER_CONFIGURATIONS) - 1  # your dataset: no DatasetStack
    findings = cfn_lint(templates)  # one cfn-lint for all of them
    assert not [f for f in findings if f["Level"] == "Error"], findings


@pytest.mark.slow  # the app as `npx cdk synth` makes it: make check's work too
def test_synthesis_is_deterministic(tmp_path):
    """`python app.py` in another process writes exactly what this process synthesizes: no set
    order, hash seed or clock reaches a template (the assets' hashes follow the code alone)."""
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    there.mkdir()
    fleet_app.build(outdir=str(here))[0].synth()
    assert run_app(there).returncode == 0
    templates = sorted(here.glob("*.template.json"))
    assert len(templates) == 5
    for template in templates:
        assert template.read_text() == (there / template.name).read_text(), template.name
