"""Bind a rank to the CPUs of its GPU's socket before TensorFlow starts its threads.

p3dn and p4d have two sockets. Unbound, a rank's JPEG decoding and the host side of its copies
run on either socket and reach the GPU across the inter-socket link; horovodrun's mpirun is
started with `-bind-to none`, and it could not know which socket a GPU hangs off anyway. The
kernel does: /sys/bus/pci/devices/<bus id>/local_cpulist lists the CPUs local to a PCI device
(https://www.kernel.org/doc/Documentation/ABI/testing/sysfs-bus-pci).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

# Set by horovodrun over Gloo, and by Open MPI's mpirun.
LOCAL_RANK_ENV = ("HOROVOD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK")


def parse_cpulist(text: str) -> set[int]:
    """The kernel's list format: "0-23,48-71" -> {0, ..., 23, 48, ..., 71}."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def sysfs_bus_id(nvidia_bus_id: str) -> str:
    """nvidia-smi's "00000000:1A:00.0" -> sysfs's "0000:1a:00.0"."""
    domain, rest = nvidia_bus_id.strip().split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"


def local_cpus(nvidia_bus_id: str, pci_root: Path = Path("/sys/bus/pci/devices")) -> set[int]:
    path = pci_root / sysfs_bus_id(nvidia_bus_id) / "local_cpulist"
    return parse_cpulist(path.read_text())


def gpu_bus_id(index: int) -> str | None:
    """PCI bus id of GPU `index` in nvidia-smi's (PCI) order; None without nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return None
    result = subprocess.run(
        ["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader", "-i", str(index)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return result.stdout.strip() or None if result.returncode == 0 else None


def bind_to_gpu_socket(environ=os.environ) -> str | None:
    """Restrict this process to the CPUs local to its GPU (local rank = GPU index, in PCI order:
    CUDA_DEVICE_ORDER=PCI_BUS_ID in the launch environment). Returns what it did, or None
    when there is nothing to do: no GPU, no local rank, one socket, or no sysfs entry."""
    local_rank = next((environ[key] for key in LOCAL_RANK_ENV if key in environ), None)
    if local_rank is None:
        return None
    bus_id = gpu_bus_id(int(local_rank))
    if bus_id is None:
        return None
    try:
        cpus = local_cpus(bus_id) & os.sched_getaffinity(0)
    except (OSError, ValueError):
        return None
    if not cpus or cpus == os.sched_getaffinity(0):
        return None
    os.sched_setaffinity(0, cpus)
    return f"GPU {local_rank} ({bus_id}): bound to its socket's {len(cpus)} CPUs"
