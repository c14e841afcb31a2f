"""bootstrap/node/mount_instance_store.sh finds the instance-store drives with the real lsblk, reading
a fake sysfs (`lsblk --sysroot`) laid out as a p4d's: an EBS root and NVMe instance-store drives
whose model strings NVMe pads with spaces. mdadm, mkfs, blkid and mount are stubs that log.

.venv/bin/python -m pytest tests/bootstrap/node/test_mount_instance_store.py
"""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "bootstrap" / "node" / "mount_instance_store.sh"
LSBLK = shutil.which("lsblk")
EBS = "Amazon Elastic Block Store"
INSTANCE_STORE = "Amazon EC2 NVMe Instance Storage"

pytestmark = pytest.mark.skipif(LSBLK is None, reason="util-linux lsblk is not installed")


def fake_sysfs(root: Path, models: list[str]) -> Path:
    """/sys/block/nvme<i>n1 for each model, as the kernel lays it out: a symlink into
    /sys/devices, the major:minor in `dev`, the controller's model padded to 40 characters."""
    for index, model in enumerate(models):
        name = f"nvme{index}n1"
        device = root / f"sys/devices/pci0000:00/nvme/nvme{index}/{name}"
        (device / "device").mkdir(parents=True)
        (device / "dev").write_text(f"259:{index}\n")
        (device / "size").write_text("3710937500\n")
        (device / "removable").write_text("0\n")
        (device / "ro").write_text("0\n")
        (device / "device/model").write_text(f"{model:<40}\n")
        for link, target in (
            (root / "sys/block" / name, f"../devices/pci0000:00/nvme/nvme{index}/{name}"),
            (
                root / f"sys/dev/block/259:{index}",
                f"../../devices/pci0000:00/nvme/nvme{index}/{name}",
            ),
        ):
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(target)
    return root


def stubs(bin_dir: Path, sysroot: Path, log: Path, rebooted: bool = False) -> None:
    """`rebooted`: the drives hold the array and its xfs from before a reboot, which mdadm's
    assemble finds again (it makes the array's device) and blkid identifies."""
    bin_dir.mkdir()
    md = bin_dir / "md"
    found = f"if [[ $1 == --assemble ]]; then touch {md}; fi" if rebooted else ":"
    scripts = {
        # The real lsblk, pointed at the fake sysfs.
        "lsblk": f'exec {LSBLK} --sysroot {sysroot} "$@"',
        "mountpoint": "exit 1",
        "mdadm": f'echo "mdadm $*" >>{log}; if [[ $1 == --create ]]; then touch {md}; fi; {found}',
        "readlink": "echo /dev/md127",
        "blkid": "exit 0" if rebooted else "exit 2",
        "mkfs.xfs": f'echo "mkfs.xfs $*" >>{log}',
        "mount": f'echo "mount $*" >>{log}',
        "df": "printf 'Size\\n 28T\\n'",
    }
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text(f"#!/usr/bin/env bash\n{body}\n")
        path.chmod(0o755)


def mount(
    tmp_path: Path, models: list[str], rebooted: bool = False
) -> tuple[subprocess.CompletedProcess, list[str]]:
    sysroot = fake_sysfs(tmp_path / "root", models)
    log = tmp_path / "calls.log"
    log.touch()
    stubs(tmp_path / "bin", sysroot, log, rebooted)
    env = {
        **os.environ,
        "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
        "HOROVOD_FLEET_MD": str(tmp_path / "bin" / "md"),
    }
    result = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "data")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return result, log.read_text().splitlines()


def test_lsblk_escapes_the_spaces_of_the_model_in_raw_mode(tmp_path):
    # Why the script must not use `lsblk -r`: it prints Amazon\x20EC2\x20NVMe...
    sysroot = fake_sysfs(tmp_path / "root", [EBS, INSTANCE_STORE])
    raw = subprocess.run(
        [LSBLK, "--sysroot", str(sysroot), "-dpnro", "NAME,MODEL"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "Amazon\\x20EC2" in raw and INSTANCE_STORE not in raw


def test_two_instance_store_drives_become_one_raid0(tmp_path):
    result, calls = mount(tmp_path, [EBS, INSTANCE_STORE, INSTANCE_STORE])
    assert result.returncode == 0, result.stdout + result.stderr
    [create] = [c for c in calls if c.startswith("mdadm --create")]
    assert "--raid-devices=2 /dev/nvme1n1 /dev/nvme2n1" in create
    assert "/dev/nvme0n1" not in create  # the EBS root is never touched
    assert f"mount -o noatime /dev/md127 {tmp_path / 'data'}" in calls
    assert "(2 drive(s))" in result.stdout


def test_eight_drives_of_a_p4d_are_all_found(tmp_path):
    result, calls = mount(tmp_path, [EBS] + [INSTANCE_STORE] * 8)
    assert result.returncode == 0, result.stdout + result.stderr
    [create] = [c for c in calls if c.startswith("mdadm --create")]
    assert "--raid-devices=8" in create
    assert all(f"/dev/nvme{i}n1" in create for i in range(1, 9))


def test_one_drive_is_mounted_directly(tmp_path):
    result, calls = mount(tmp_path, [EBS, INSTANCE_STORE])
    assert result.returncode == 0, result.stdout + result.stderr
    assert not [c for c in calls if c.startswith("mdadm")]
    assert "mkfs.xfs -q -f /dev/nvme1n1" in calls
    assert f"mount -o noatime /dev/nvme1n1 {tmp_path / 'data'}" in calls


def test_no_instance_store_fails_in_one_line(tmp_path):
    result, calls = mount(tmp_path, [EBS])
    assert result.returncode == 1
    assert "no NVMe instance store on this instance type" in result.stdout
    assert not calls


@pytest.mark.parametrize("drives", [1, 8])
def test_after_a_reboot_the_array_is_assembled_again_and_nothing_is_created_or_formatted(
    tmp_path, drives
):
    """A node the run controller rebooted in place keeps its instance store: the array its
    drives hold is assembled from their superblocks, blkid finds its xfs, and the dataset on it
    is mounted as it was."""
    result, calls = mount(tmp_path, [EBS] + [INSTANCE_STORE] * drives, rebooted=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert not [c for c in calls if c.startswith(("mdadm --create", "mkfs"))]
    device = "/dev/md127" if drives > 1 else "/dev/nvme1n1"
    assert f"mount -o noatime {device} {tmp_path / 'data'}" in calls
    assert "formatting" not in result.stdout and "creating RAID0" not in result.stdout
