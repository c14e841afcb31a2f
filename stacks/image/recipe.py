"""The recipe as Image Builder sees it: its steps, versions that follow content, the AWSTOE
component documents, and what a bake costs."""

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aws_cdk import aws_s3_assets as s3_assets

from contract.names import PROJECT
from stacks.instance_types import GpuType, JitProofType
from stacks.node_code import CODE_ROOT, UBUNTU_AMI_PARAMETER

RECIPE_DIR = CODE_ROOT / "bootstrap" / "image"
PROOF_DIR = CODE_ROOT / "bootstrap" / "image_proof"
TRAINER_DIR = CODE_ROOT / "trainer"
# Ubuntu, resolved by Image Builder when it builds (a recipe parent may be "ssm:" + a
# parameter), so a new Canonical release never changes the template.
# https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/aws-resource-imagebuilder-imagerecipe.html
UBUNTU_PARENT = f"ssm:{UBUNTU_AMI_PARAMETER}"
# Where the recipe, the proof and the trainer they run live inside the image (the image keeps
# the recipe that made it); /opt/horovod-fleet/{bootstrap,trainer} stay the nodes' own code.
SOURCE_DIR = "/opt/horovod-fleet/src"
BASE_NAME = f"{PROJECT}-training-base"
PROVEN_NAME = f"{PROJECT}-training"
# The optional third stage (-c imageJitInstanceType): the proven image with a warmed CUDA JIT cache.
JIT_NAME = f"{PROJECT}-training-jit"


@dataclass(frozen=True)
class RecipeStep:
    """One script of bootstrap/image/, one Image Builder component."""

    script: str
    description: str
    timeout_s: int
    reboot_after: bool = False


# The recipe, in order (bootstrap/image/*.sh). AWSTOE stops a step after 2 h unless told.
RECIPE: tuple[RecipeStep, ...] = (
    RecipeStep("01-system", "Ubuntu 24.04, held LTS kernel, no unattended upgrades", 3600, True),
    RecipeStep("02-nvidia-driver", "NVIDIA R580 open modules and fabric manager, held", 3600),
    RecipeStep("03-efa", "EFA installer (signature verified), Open MPI 4, aws-ofi-nccl", 3600),
    RecipeStep("04-cuda-toolkit", "CUDA 12.6 compiler and headers (build only), no driver", 3600),
    RecipeStep("05-nccl", "NCCL built for sm_75/80/86/90", 7200),
    RecipeStep(
        "06-python-env", "Python 3.11 venv, TensorFlow 2.15.1, Horovod 0.28.1 (gcc-12)", 7200
    ),
    RecipeStep("07-agents", "CloudWatch agent (signature verified), SSM agent, AWS CLI", 1800),
    RecipeStep("08-manifest", "image.json: every version, Horovod's build, the recipe hash", 600),
)
PROOF_TIMEOUT_S = 5400
# Three starts of the trainer, the first of which may JIT-compile for 30 minutes or longer
# (TensorFlow's own warning on sm_90, tensorflow/tensorflow#62320).
JIT_TIMEOUT_S = 3 * 3600

# Bake cost estimate: list prices (us-east-1, Linux, on-demand; check them on
# https://aws.amazon.com/ec2/pricing/on-demand/) and hours per stage estimated from the steps,
# not measured: nothing of this project has run on AWS yet.
BUILD_INSTANCE_TYPE = "c6i.4xlarge"
BUILD_USD_PER_HOUR = 0.68
BASE_BUILD_HOURS = 1.25  # 16 vCPUs: upgrade + reboot, driver, EFA, CUDA, NCCL x4 archs, Horovod
BASE_TEST_HOURS = 0.25  # an instance booted from the base AMI re-checks every step
PROOF_BUILD_HOURS = 0.6  # boot, TensorFlow and NCCL checks, XLA compile, 200 ResNet-50 steps
PROOF_TEST_HOURS = 0.25  # boot the finished AMI, nvidia-smi, tag it
SNAPSHOT_HOURS = 0.25  # per image, while no instance runs
# The JIT proof: boot, a cold start that JIT-compiles (TensorFlow warns "30 minutes or longer"; no
# published figure for ResNet-50 on an H100), two warm starts, then the test boot. An estimate.
JIT_BUILD_HOURS = 1.0
JIT_TEST_HOURS = 0.25


def tree_sha256(directory: Path) -> str:
    """sha256 over the sorted `sha256sum ./path` lines of every file under directory, which is
    what bootstrap/image/step.sh's recipe_sha256 computes on the build instance."""
    files = sorted(
        path.relative_to(directory).as_posix()
        for path in directory.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    )
    lines = "".join(
        f"{hashlib.sha256((directory / name).read_bytes()).hexdigest()}  ./{name}\n"
        for name in files
    )
    return hashlib.sha256(lines.encode()).hexdigest()


def semantic_version(digest: str) -> str:
    """An Image Builder version from a content hash: each node may be up to 2^30 - 1."""
    return f"1.0.{int(digest[:7], 16)}"


def read_pins() -> dict[str, str]:
    """pins.env, the one list of the image's versions (the recipe's scripts source it)."""
    pins = {}
    for line in (RECIPE_DIR / "pins.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            pins[key] = value.strip('"')
    return pins


def bake_estimate(test_type: GpuType) -> str:
    """The line synthesis prints: what a bake costs and how long it takes."""
    build_usd = (BASE_BUILD_HOURS + BASE_TEST_HOURS) * BUILD_USD_PER_HOUR
    gpu_usd = (PROOF_BUILD_HOURS + PROOF_TEST_HOURS) * test_type.usd_per_hour
    hours = (
        BASE_BUILD_HOURS + BASE_TEST_HOURS + PROOF_BUILD_HOURS + PROOF_TEST_HOURS
    ) + 2 * SNAPSHOT_HOURS
    return (
        f"ImageStack: bakes only when bootstrap/image, bootstrap/image_proof or trainer/ change: "
        f"about {hours:.1f} h, ~${build_usd + gpu_usd:.2f} "
        f"({BASE_BUILD_HOURS + BASE_TEST_HOURS:g} h {BUILD_INSTANCE_TYPE} at "
        f"${BUILD_USD_PER_HOUR:g}/h + {PROOF_BUILD_HOURS + PROOF_TEST_HOURS:g} h "
        f"{test_type.name} at ${test_type.usd_per_hour:g}/h for the GPU proof; estimates)"
    )


def jit_estimate(jit_type: JitProofType) -> str:
    """The line synthesis prints when the JIT proof is on: what it adds to a bake."""
    hours = JIT_BUILD_HOURS + JIT_TEST_HOURS
    return (
        f"ImageStack JIT proof (-c imageJitInstanceType={jit_type.name}): each bake adds about "
        f"{hours + SNAPSHOT_HOURS:.1f} h and ~${hours * jit_type.usd_per_hour:.2f} ({hours:g} h "
        f"{jit_type.name}, {jit_type.gpus} x {jit_type.gpu_model}, at ${jit_type.usd_per_hour:g}/h: "
        "a cold and two warm starts of ResNet-50; an estimate)"
    )


# ------------------------------------------------------------------ component documents (AWSTOE)


def _scalar(value: Any) -> str:
    """A YAML scalar: JSON's double-quoted strings and numbers are valid YAML."""
    return json.dumps(value)


def _yaml(node: Any, indent: int = 0) -> list[str]:
    pad = " " * indent
    lines: list[str] = []
    if isinstance(node, Mapping):
        for key, value in node.items():
            if isinstance(value, Mapping | list) and value:
                lines.append(f"{pad}{key}:")
                lines.extend(_yaml(value, indent + 2))
            else:
                lines.append(f"{pad}{key}: {_scalar(value)}")
    else:
        for item in node:
            if isinstance(item, Mapping):
                first, *rest = _yaml(item, indent + 2)
                lines.append(f"{pad}- {first.lstrip()}")
                lines.extend(rest)
            else:
                lines.append(f"{pad}- {_scalar(item)}")
    return lines


def component_document(
    *,
    name: str,
    description: str,
    fetch: Sequence[tuple[s3_assets.Asset, str]],
    build: str,
    check: str,
    test: str,
    timeout_s: int,
    reboot_after: bool = False,
) -> str:
    """An AWSTOE document: the build phase fetches the code (asset zip -> directory under
    SOURCE_DIR) and runs the step; validate runs the check on the build instance; test runs
    `test` on an instance booted from the finished AMI, where the code is part of the image."""
    downloads = [
        {"source": asset.s3_object_url, "destination": f"/tmp/{Path(target).name}.zip"}
        for asset, target in fetch
    ]
    unpack = [
        f"rm -rf {SOURCE_DIR}/{target} && mkdir -p {SOURCE_DIR}/{target} && "
        f"python3 -m zipfile -e /tmp/{Path(target).name}.zip {SOURCE_DIR}/{target}"
        for _, target in fetch
    ]
    build_steps: list[dict[str, Any]] = [
        {"name": "Fetch", "action": "S3Download", "inputs": downloads},
        {
            "name": "Unpack",
            "action": "ExecuteBash",
            "inputs": {
                "commands": [
                    f"mkdir -p {SOURCE_DIR}/bootstrap",
                    f"touch {SOURCE_DIR}/bootstrap/__init__.py",
                    *unpack,
                ]
            },
        },
        {
            "name": "Run",
            "action": "ExecuteBash",
            "timeoutSeconds": timeout_s,
            "inputs": {"commands": [build]},
        },
    ]
    if reboot_after:
        build_steps.append({"name": "Reboot", "action": "Reboot", "inputs": {"delaySeconds": 0}})

    def phase(phase_name: str, command: str) -> dict[str, Any]:
        step = {"name": "Check", "action": "ExecuteBash", "timeoutSeconds": 1800}
        return {"name": phase_name, "steps": [{**step, "inputs": {"commands": [command]}}]}

    document = {
        "name": name,
        "description": description,
        "schemaVersion": 1.0,
        "phases": [
            {"name": "build", "steps": build_steps},
            phase("validate", check),
            phase("test", test),
        ],
    }
    return "\n".join(_yaml(document)) + "\n"
