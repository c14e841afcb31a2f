"""NCCL transport parser, node health comparison, CloudWatch agent config.

.venv/bin/python -m pytest tests/bootstrap/test_node_health.py
"""

import pytest
from bootstrap_helpers import train_doc

from bootstrap import health
from bootstrap.node_config import parse

OFI_LOG = """\
ip-10-0-0-5:1234:1300 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to ^lo,docker
ip-10-0-0-5:1234:1300 [0] NCCL INFO NET/OFI Using aws-ofi-nccl 1.7.4-aws
ip-10-0-0-5:1234:1300 [0] NCCL INFO NET/OFI Selected Provider is efa (found 4 nics)
ip-10-0-0-5:1234:1300 [0] NCCL INFO Using network AWS Libfabric
"""
SOCKET_LOG = """\
ip-10-0-0-5:1234:1300 [0] NCCL INFO NET/OFI No eligible providers were found
ip-10-0-0-5:1234:1300 [0] NCCL INFO NET/IB : No device found.
ip-10-0-0-5:1234:1300 [0] NCCL INFO NET/Socket : Using [0]ens5:10.0.0.5<0>
ip-10-0-0-5:1234:1300 [0] NCCL INFO Using network Socket
"""


def test_parser_tells_efa_from_socket_fallback():
    assert health.nccl_transport(OFI_LOG) == "ofi"
    assert health.nccl_transport("ip:1:1 [0] NCCL INFO Using network Socket") == "socket"
    assert health.nccl_transport("allreduce check: 16 ranks") == "unknown"
    # Without the "Using network" line (older NCCL): the plugin's selection, unless a socket shows.
    assert health.nccl_transport("NCCL INFO NET/OFI Selected Provider is efa") == "ofi"
    assert health.nccl_transport(SOCKET_LOG.replace("Using network Socket", "")) == "socket"


def test_fallback_to_tcp_fails_loudly_when_efa_is_expected():
    assert health.check_transport(OFI_LOG, efa_expected=True) == "ofi"
    with pytest.raises(health.HealthError, match="EFA expected but NCCL used transport 'socket'"):
        health.check_transport(SOCKET_LOG, efa_expected=True)
    with pytest.raises(health.HealthError, match="'unknown'"):
        health.check_transport("no NCCL output at all", efa_expected=True)
    assert health.check_transport(SOCKET_LOG, efa_expected=False) == "socket"


def test_node_health_compares_gpus_and_efa():
    cfg = parse(train_doc())
    assert "8 GPU(s) as expected" in health.check_node(cfg, gpus=8, efa=True)
    with pytest.raises(health.HealthError, match="found 7 GPU"):
        health.check_node(cfg, gpus=7, efa=True)
    with pytest.raises(health.HealthError, match="no EFA device"):
        health.check_node(cfg, gpus=8, efa=False)


def test_efa_device_is_found_in_sysfs(tmp_path):
    assert not health.efa_present(tmp_path / "missing")
    (tmp_path / "rdmap16s27").mkdir()
    assert health.efa_present(tmp_path)


def test_cloudwatch_config_ships_logs_and_gpu_utilisation_per_run():
    doc = health.cloudwatch_agent_config(parse(train_doc(log_group="/horovod-fleet/r1")))
    files = doc["logs"]["logs_collected"]["files"]["collect_list"]
    assert {f["log_group_name"] for f in files} == {"/horovod-fleet/r1"}
    assert "/var/log/horovod-fleet/train.log" in {f["file_path"] for f in files}
    metrics = doc["metrics"]
    assert metrics["namespace"] == "HorovodFleet"
    assert metrics["aggregation_dimensions"] == [["Run"]]
    gpu = metrics["metrics_collected"]["nvidia_gpu"]
    assert "utilization_gpu" in gpu["measurement"]  # published as nvidia_smi_utilization_gpu
    assert gpu["append_dimensions"] == {"Run": "r1"}
    assert "metrics" not in health.cloudwatch_agent_config(parse(train_doc(gpus_per_node=0)))
