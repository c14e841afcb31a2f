"""The Ubuntu 24.04 base of the training image (bootstrap/image/01 to 06), run with stub commands on
a scratch IMAGE_ROOT: the held LTS kernel, the R580 driver and its fabric manager, CUDA 12.6 from
the ubuntu2404 repository, NCCL for every architecture, Python 3.11 and Horovod built with gcc-12.
Each validate check fails in one FAILED line naming what is wrong, and passes with the right
stubs."""

from pathlib import Path

import pytest
from image_bake import KERNEL, PINS, Bake, failed_line, index

from stacks.image.recipe import RECIPE_DIR

LTS_TRACK = PINS["KERNEL_TRACK"]
DRIVER = "580.95.05"
OS_RELEASE = 'PRETTY_NAME="Ubuntu {0} LTS"\nNAME="Ubuntu"\nVERSION_ID="{0}"\nID=ubuntu\n'


@pytest.fixture
def bake(tmp_path: Path) -> Bake:
    return Bake(tmp_path)


# ------------------------------------------------------------------------ 01: base and kernel


def system_stubs(
    bake: Bake, *, release: str = "24.04", running: str = KERNEL, rolling_installed: bool = False
) -> None:
    """A noble system whose LTS track depends on KERNEL; `running` is what uname reports."""
    bake.file("etc/os-release", OS_RELEASE.format(release))
    bake.file(
        "etc/apt/apt.conf.d/99-horovod-fleet-no-auto-upgrades",
        'APT::Periodic::Unattended-Upgrade "0";\n',
    )
    bake.file(
        "boot/grub/grub.cfg", f"\tmenuentry 'Ubuntu, with Linux {KERNEL}' --class ubuntu {{\n"
    )
    bake.output("uname", running)
    rolling = "ii " if rolling_installed else "un "
    bake.stub(
        "dpkg-query",
        f"""#!/usr/bin/env bash
printf '%s\\n' "dpkg-query $*" >>"$STUB_LOG"
case "$*" in
*Depends*linux-image-aws-lts-24.04) echo "linux-image-{KERNEL}, linux-modules-extra-{KERNEL}";;
*Status-Abbrev*" linux-aws"*|*Status-Abbrev*" linux-image-aws"|*Status-Abbrev*" linux-headers-aws") echo "{rolling}";;
*Status-Abbrev*) echo "un ";;
esac
""",
    )
    held = [LTS_TRACK, "linux-image-aws-lts-24.04", f"linux-image-{KERNEL}"]
    bake.output("apt-mark", "\n".join(held))


def test_system_step_moves_to_the_lts_kernel_track_and_points_grub_at_it(bake):
    system_stubs(bake, running="6.17.0-1005-aws", rolling_installed=True)
    result = bake.run("01-system")
    assert result.returncode == 0, result.stdout + result.stderr
    calls = bake.calls()
    assert index(calls, "systemctl disable --now unattended-upgrades") < index(
        calls, "full-upgrade"
    )
    assert index(calls, f"install {LTS_TRACK}") < index(calls, "purge linux-aws")
    assert any("purge linux-image-aws" in call for call in bake.calls("apt-get"))
    grub = (bake.root / "etc/default/grub.d/99-horovod-fleet-kernel.cfg").read_text()
    assert grub == f'GRUB_DEFAULT="Advanced options for Ubuntu>Ubuntu, with Linux {KERNEL}"\n'
    assert index(calls, "update-grub") > index(calls, "purge linux-aws")
    [hold] = [c for c in bake.calls("apt-mark") if c.startswith("apt-mark hold")]
    assert hold == (
        f"apt-mark hold {LTS_TRACK} linux-image-aws-lts-24.04 linux-headers-aws-lts-24.04 "
        f"linux-image-{KERNEL}"
    )
    conf = bake.root / "etc/apt/apt.conf.d/99-horovod-fleet-no-auto-upgrades"
    assert 'APT::Periodic::Unattended-Upgrade "0";' in conf.read_text()


def test_system_step_refuses_to_reboot_into_a_kernel_grub_has_no_entry_for(bake):
    system_stubs(bake)
    (bake.root / "boot/grub/grub.cfg").write_text("menuentry 'Ubuntu' {\n")
    assert failed_line(bake.run("01-system")).endswith(
        f"GRUB has no entry for kernel {KERNEL}: the reboot would not start the {LTS_TRACK} kernel"
    )
    assert not [c for c in bake.calls("apt-mark") if c.startswith("apt-mark hold")]


def test_system_step_passes_on_noble_running_the_held_lts_kernel(bake):
    system_stubs(bake)
    result = bake.run("01-system", "validate")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"Ubuntu 24.04, kernel {KERNEL} from {LTS_TRACK}, held" in result.stdout


@pytest.mark.parametrize(
    ("stubs", "message"),
    [
        (
            {"release": "22.04"},
            "the base is Ubuntu 22.04 (/etc/os-release VERSION_ID), not 24.04",
        ),
        (
            {"running": "6.17.0-1005-aws"},
            f"running kernel 6.17.0-1005-aws is not {LTS_TRACK}'s kernel {KERNEL} "
            "(a rolling linux-aws kernel?)",
        ),
        (
            {"rolling_installed": True},
            "the rolling kernel meta-package linux-aws is installed: an upgrade would bring a "
            "newer kernel series",
        ),
    ],
    ids=["22.04", "rolling-kernel", "rolling-meta-package"],
)
def test_system_step_fails_in_one_line_off_the_lts_base(bake, stubs, message):
    system_stubs(bake, **stubs)
    assert message in failed_line(bake.run("01-system", "validate"))


def test_system_step_fails_when_the_lts_kernel_is_not_held(bake):
    system_stubs(bake)
    bake.output("apt-mark", LTS_TRACK)
    line = failed_line(bake.run("01-system", "validate"))
    assert "not held: linux-image-6.8.0-1064-aws linux-image-aws-lts-24.04" in line


def test_a_failing_command_names_the_step_and_the_command(bake):
    bake.exit_code("apt-get", 100)
    result = bake.run("01-system")
    assert result.returncode == 100
    assert "FAILED: image step '01-system' stopped the bake (exit 100" in result.stdout
    assert not any("full-upgrade" in call for call in bake.calls())


# ----------------------------------------------------------------- 02: driver, fabric manager


def driver_stubs(
    bake: Bake,
    license_: str = "Dual MIT/GPL",
    modules: str = DRIVER,
    fabric_manager: str = f"{DRIVER}-0ubuntu0.24.04.1",
) -> None:
    bake.stub(
        "modinfo",
        f"""#!/usr/bin/env bash
printf '%s\\n' "modinfo $*" >>"$STUB_LOG"
case "$*" in *license*) echo "{license_}";; *) echo "{modules}";; esac
""",
    )
    bake.stub(
        "dpkg-query",
        f"""#!/usr/bin/env bash
printf '%s\\n' "dpkg-query $*" >>"$STUB_LOG"
case "$*" in
*nvidia-fabricmanager-580) printf '%s' "{fabric_manager}";;
*"linux-image-[0-9]*"*) printf '%s\n' "linux-image-{KERNEL} ii " "linux-image-6.17.0-1005-aws ii " \
    "linux-headers-6.17.0-1005-aws ii " "linux-modules-6.14.0-1011-aws rc ";;
*) printf '%s' "{DRIVER}-0ubuntu0.24.04.2";;
esac
""",
    )
    held = [
        f"linux-modules-nvidia-580-server-open-{KERNEL}",
        "nvidia-headless-no-dkms-580-server-open",
        "nvidia-utils-580-server",
        "nvidia-fabricmanager-580",
    ]
    bake.output("apt-mark", "\n".join(held))


def test_driver_step_installs_r580_open_modules_for_the_held_kernel_and_holds_them(bake):
    driver_stubs(bake)
    result = bake.run("02-nvidia-driver")
    assert result.returncode == 0, result.stdout + result.stderr
    [install] = [c for c in bake.calls("apt-get") if " install " in c]
    for package in (
        f"linux-modules-nvidia-580-server-open-{KERNEL}",
        "nvidia-headless-no-dkms-580-server-open",
        "nvidia-utils-580-server",
        "nvidia-fabricmanager-580",
    ):
        assert f" {package}" in install
    # The rolling kernels step 1 left installed go first (removed ones, "rc", are left alone).
    [purge] = [c for c in bake.calls("apt-get") if " purge " in c]
    assert purge.endswith(" purge linux-image-6.17.0-1005-aws linux-headers-6.17.0-1005-aws")
    assert bake.calls().index(purge) < bake.calls().index(install)
    # The rolling track's module meta-package would pull the rolling kernel back in.
    assert "open-aws" not in install and "dkms" not in install.replace("no-dkms", "")
    [hold] = [c for c in bake.calls("apt-mark") if c.startswith("apt-mark hold")]
    assert "nvidia-fabricmanager-580" in hold and "nvidia-utils-580-server" in hold
    assert bake.calls().index(install) < bake.calls().index(hold)
    assert f"fabric manager {DRIVER}-0ubuntu0.24.04.1" in result.stdout


@pytest.mark.parametrize(
    ("stubs", "message"),
    [
        (
            {"license_": "NVIDIA"},
            "is the closed one (license NVIDIA): GPUDirect RDMA over EFA needs the open one",
        ),
        ({"modules": "580.82.07"}, "does not match the kernel module 580.82.07"),
        (
            {"fabric_manager": "580.82.07-0ubuntu0.24.04.1"},
            f"nvidia-fabricmanager-580 580.82.07-0ubuntu0.24.04.1 is not the driver's version "
            f"{DRIVER}: the fabric manager does not start on NVSwitch systems (p4d, p5)",
        ),
    ],
    ids=["closed-modules", "userspace-mismatch", "fabric-manager-mismatch"],
)
def test_driver_step_fails_in_one_line(bake, stubs, message):
    driver_stubs(bake, **stubs)
    line = failed_line(bake.run("02-nvidia-driver", "validate"))
    assert "FAILED: image step '02-nvidia-driver': " in line and message in line


# ----------------------------------------------------------------------------- 04: CUDA 12.6

CUDA = PINS["CUDA_VERSION"]


def cuda_stubs(bake: Bake, release: str, cached: str = "libcudart.so.12 (libc6,x86-64)") -> None:
    bake.output("ldconfig", f"\t{cached} => /usr/local/cuda-{CUDA}/targets/x86_64-linux/lib/x")
    nvcc = f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.85'\n"
    bake.file(f"usr/local/cuda-{CUDA}/bin/nvcc", nvcc, 0o755)
    bake.file(f"usr/local/cuda-{CUDA}/bin/cuobjdump", "", 0o755)
    bake.file(f"usr/local/cuda-{CUDA}/include/cuda_runtime.h")
    bake.output("apt-mark", "nvidia-headless-no-dkms-580-server-open\nnvidia-utils-580-server")


def test_cuda_step_installs_12_6_from_the_ubuntu2404_repository_with_drivers_pinned_out(bake):
    cuda_stubs(bake, CUDA)
    result = bake.run("04-cuda-toolkit")
    assert result.returncode == 0, result.stdout + result.stderr
    pin = (bake.root / "etc/apt/preferences.d/horovod-fleet-no-cuda-repo-drivers").read_text()
    assert "Pin: origin developer.download.nvidia.com" in pin and "Pin-Priority: -1" in pin
    assert "nvidia-*" in pin and "cuda-drivers*" in pin
    [install] = [c for c in bake.calls("apt-get") if " install " in c]
    for package in ("cuda-nvcc-12-6", "cuda-cudart-dev-12-6", "cuda-cuobjdump-12-6"):
        assert package in install
    assert "cuda-drivers" not in install and "cuda-toolkit" not in install
    assert "/repos/ubuntu2404/x86_64/cuda-keyring" in " ".join(bake.calls("curl"))


@pytest.mark.parametrize(
    ("release", "cached", "held", "message"),
    [
        ("13.0", "libcudart.so.12 (libc6,x86-64)", True, "release '13.0', not 12.6"),
        (
            "12.6",
            "libcudart.so.11.0 (libc6,x86-64)",
            True,
            "the loader cannot find libcudart.so.12",
        ),
        ("12.6", "libcudart.so.12 (libc6,x86-64)", False, "nvidia-utils-580-server is not held"),
    ],
    ids=["other-release", "no-runtime", "driver-not-held"],
)
def test_cuda_step_fails_in_one_line(bake, release, cached, held, message):
    cuda_stubs(bake, release, cached)
    if not held:
        bake.output("apt-mark", "nvidia-headless-no-dkms-580-server-open")
    assert message in failed_line(bake.run("04-cuda-toolkit"))


# --------------------------------------------------------------------------------- 05: NCCL


def nccl_stubs(bake: Bake, commit: str, archs: str = "sm_75 sm_80 sm_86 sm_90") -> None:
    bake.output("git", commit)
    bake.stub(
        "make",
        """#!/usr/bin/env bash
printf '%s\\n' "make $*" >>"$STUB_LOG"
for arg; do case $arg in BUILDDIR=*) dir=${arg#BUILDDIR=};; esac; done
mkdir -p "$dir/include" "$dir/lib"
printf '#define NCCL_MAJOR 2\\n#define NCCL_MINOR 23\\n#define NCCL_PATCH 4\\n' >"$dir/include/nccl.h"
touch "$dir/lib/libnccl_static.a" "$dir/lib/libnccl.so"
""",
    )
    listing = "".join(
        f"echo 'ELF file    {i}: all_reduce.{arch}.cubin'\n"
        for i, arch in enumerate(archs.split(), 1)
    )
    bake.file(f"usr/local/cuda-{CUDA}/bin/cuobjdump", f"#!/bin/sh\n{listing}", 0o755)


def test_nccl_step_builds_the_pinned_commit_for_every_fleet_architecture_with_gcc_12(bake):
    nccl_stubs(bake, PINS["NCCL_COMMIT"])
    result = bake.run("05-nccl")
    assert result.returncode == 0, result.stdout + result.stderr
    [clone] = [c for c in bake.calls("git") if " clone " in c]
    assert f"--branch v{PINS['NCCL_VERSION']}" in clone
    [build] = bake.calls("make")
    for arch in ("75", "80", "86", "90"):
        assert f"-gencode=arch=compute_{arch},code=sm_{arch}" in build
    assert "CXX=g++-12" in build
    assert (bake.root / "opt/nccl/lib/libnccl_static.a").exists()
    assert "for sm_75 sm_80 sm_86 sm_90" in result.stdout


def test_nccl_step_refuses_a_tag_that_moved(bake):
    nccl_stubs(bake, "f" * 40)
    assert "pinned" in failed_line(bake.run("05-nccl"))
    assert not bake.calls("make")


def test_nccl_step_fails_in_one_line_without_sm_90(bake):
    nccl_stubs(bake, PINS["NCCL_COMMIT"], archs="sm_75 sm_80 sm_86")
    bake.run("05-nccl")
    line = failed_line(bake.run("05-nccl", "validate"))
    assert line.endswith(
        f"NCCL at {bake.root}/opt/nccl has no code for sm_90 (cuobjdump lists: sm_75 sm_80 "
        "sm_86); the fleet's GPUs need 75, 80, 86, 90"
    )


# --------------------------------------------------------------- 06: Python 3.11 and Horovod

CHECK_BUILD = """Available Frameworks:
    [X] TensorFlow
    [ ] PyTorch
Available Controllers:
    [X] MPI
    [X] Gloo
Available Tensor Operations:
    [X] NCCL
    [ ] DDL"""


def python_env_stubs(
    bake: Bake, *, check_build: str = CHECK_BUILD, python: str = "3.11.18", gcc: str = "12.3.0"
) -> None:
    """System python3 makes the tool venv (pip, uv); uv finds a managed CPython whose `-m venv`
    makes the training venv: a pip that records the Horovod build's environment and prints
    CMake's compiler lines, a python that reports `python`, a horovodrun that prints
    `check_build`."""
    venv = bake.root / PINS["PYTHON_VENV"].lstrip("/")
    managed = bake.root / "opt/horovod-fleet/python/cpython/bin/python3.11"
    training_pip = f"""#!/usr/bin/env bash
printf '%s\\n' "pip $* CC=$CC CXX=$CXX HOROVOD_NCCL_LINK=$HOROVOD_NCCL_LINK \
CC_LIST=$HOROVOD_BUILD_CUDA_CC_LIST NCCL=$HOROVOD_NCCL_HOME CMAKE=$HOROVOD_CMAKE" >>"$STUB_LOG"
case "$*" in *horovod==*)
echo "-- The C compiler identification is GNU {gcc}"
echo "-- The CXX compiler identification is GNU {gcc}"
echo "-- The CUDA compiler identification is NVIDIA 12.6.85";;
esac
"""
    bake.file(
        str(managed.relative_to(bake.root)),
        f"""#!/usr/bin/env bash
printf '%s\\n' "managed-python $*" >>"$STUB_LOG"
mkdir -p "{venv}/bin"
cat >"{venv}/bin/pip" <<'PIP'
{training_pip}PIP
printf '#!/bin/sh\\ncase "$1" in --version) echo "Python {python}";; *) cat >/dev/null;; esac\\n' \
    >"{venv}/bin/python"
printf '#!/bin/sh\\ncat <<EOF\\n{check_build}\\nEOF\\n' >"{venv}/bin/horovodrun"
chmod +x "{venv}/bin/"*
""",
        0o755,
    )
    bake.stub(
        "python3",
        f"""#!/usr/bin/env bash
printf '%s\\n' "python3 $*" >>"$STUB_LOG"
tools=${{@: -1}}
mkdir -p "$tools/bin"
printf '#!/bin/sh\\nprintf "%%s\\\\n" "tool-pip $*" >>"$STUB_LOG"\\n' >"$tools/bin/pip"
cat >"$tools/bin/uv" <<'UV'
#!/usr/bin/env bash
printf '%s\\n' "uv $* UV_PYTHON_INSTALL_DIR=$UV_PYTHON_INSTALL_DIR" >>"$STUB_LOG"
[[ $2 == find ]] && echo "{managed}"
exit 0
UV
chmod +x "$tools/bin/"*
""",
    )


def test_python_env_step_makes_a_python_3_11_venv_and_builds_horovod_with_gcc_12(bake):
    python_env_stubs(bake)
    result = bake.run("06-python-env")
    assert result.returncode == 0, result.stdout + result.stderr
    calls = bake.calls()
    [apt] = [c for c in bake.calls("apt-get") if " install " in c]
    assert "gcc-12" in apt and "g++-12" in apt and "python3-venv" in apt
    [uv_pip] = [c for c in calls if c.startswith("tool-pip")]
    assert "--require-hashes" in uv_pip
    uv_install = next(c for c in bake.calls("uv") if " install " in c)
    assert f"python install --no-bin {PINS['PYTHON_VERSION']}" in uv_install
    assert uv_install.endswith(f"UV_PYTHON_INSTALL_DIR={bake.root}/opt/horovod-fleet/python")
    assert index(calls, "uv python find") < index(calls, "managed-python -m venv")
    pip = bake.calls("pip")
    assert any(f"--requirement {RECIPE_DIR}/requirements.lock" in call for call in pip)
    [horovod] = [call for call in pip if f"horovod=={PINS['HOROVOD_VERSION']}" in call]
    assert "CC=gcc-12 CXX=g++-12" in horovod and "--verbose" in horovod
    assert "HOROVOD_NCCL_LINK=STATIC" in horovod and "CC_LIST=75,80,86,90" in horovod
    assert f"NCCL={bake.root}/opt/nccl" in horovod
    assert f"CMAKE={bake.root}{PINS['PYTHON_VENV']}/bin/cmake" in horovod
    record = (bake.root / "opt/horovod-fleet/horovod-build.txt").read_text()
    assert "The CXX compiler identification is GNU 12.3.0" in record
    assert "Python 3.11.18, TensorFlow 2.15.1 + Horovod 0.28.1 (GCC 12.3.0;" in result.stdout


@pytest.mark.parametrize(
    ("stubs", "message"),
    [
        (
            {"python": "3.12.3"},
            "the venv's Python is '3.12.3', not 3.11.18: TensorFlow 2.15.1 has wheels up to "
            "Python 3.11",
        ),
        (
            {"gcc": "13.3.0"},
            "Horovod was built with GCC 13.3.0 ({root}/opt/horovod-fleet/horovod-build.txt), not "
            "g++-12: Horovod 0.28.1 does not build with gcc 13 (horovod/horovod#3957 came after it)",
        ),
        (
            {"check_build": CHECK_BUILD.replace("[X] NCCL", "[ ] NCCL")},
            "horovodrun --check-build does not list NCCL as built",
        ),
    ],
    ids=["python-3.12", "gcc-13", "no-nccl"],
)
def test_python_env_step_fails_in_one_line(bake, stubs, message):
    python_env_stubs(bake, **stubs)
    line = failed_line(bake.run("06-python-env"))
    assert "FAILED: image step '06-python-env': " in line
    assert message.format(root=bake.root) in line


def test_python_env_step_fails_without_a_build_record(bake):
    python_env_stubs(bake)
    assert bake.run("06-python-env").returncode == 0
    (bake.root / "opt/horovod-fleet/horovod-build.txt").write_text("")
    line = failed_line(bake.run("06-python-env", "validate"))
    assert "no C++ compiler identification in" in line
