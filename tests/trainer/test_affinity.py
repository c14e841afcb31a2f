"""Binding a rank to its GPU's socket, from a fake sysfs."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer import affinity

REPO = Path(__file__).resolve().parents[2]


def test_kernel_cpu_lists_and_bus_ids():
    assert affinity.parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert affinity.sysfs_bus_id("00000000:1A:00.0") == "0000:1a:00.0"


def test_local_cpus_are_read_for_the_gpu_s_pci_device(tmp_path):
    device = tmp_path / "0000:1a:00.0"
    device.mkdir()
    (device / "local_cpulist").write_text("0-23,48-71\n")
    cpus = affinity.local_cpus("00000000:1A:00.0", tmp_path)
    assert len(cpus) == 48 and 23 in cpus and 24 not in cpus and 71 in cpus


def test_nothing_to_bind_without_a_local_rank_or_a_gpu(monkeypatch):
    assert affinity.bind_to_gpu_socket({}) is None
    monkeypatch.setattr(affinity, "gpu_bus_id", lambda index: None)  # no nvidia-smi: CPU node
    assert affinity.bind_to_gpu_socket({"HOROVOD_LOCAL_RANK": "0"}) is None


BIND_IN_A_CHILD = """
import os
from trainer import affinity
allowed = sorted(os.sched_getaffinity(0))
affinity.gpu_bus_id = lambda index: "00000000:1A:00.0" if index == 3 else None
affinity.local_cpus = lambda bus_id: {allowed[0]}
print(affinity.bind_to_gpu_socket({"OMPI_COMM_WORLD_LOCAL_RANK": "3"}))
print(sorted(os.sched_getaffinity(0)) == [allowed[0]])
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to bind to one")
def test_binding_restricts_the_rank_to_its_gpu_s_cpus():
    # In a child: binding this test process would slow every test after it.
    result = subprocess.run(
        [sys.executable, "-c", BIND_IN_A_CHILD], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "GPU 3 (00000000:1A:00.0): bound to its socket's 1 CPUs",
        "True",
    ]
