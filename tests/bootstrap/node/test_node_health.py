"""NCCL transport parser, node health comparison, CloudWatch agent config.

.venv/bin/python -m pytest tests/bootstrap/node/test_node_health.py
"""

import json

import pytest
from bootstrap_helpers import train_doc

from bootstrap.fleet import allreduce_check
from bootstrap.node import health
from bootstrap.node_config import parse
from bootstrap.records import allreduce_summary

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
    assert health.check_transport(OFI_LOG, efa_expected=True, gpudirect_expected=False) == "ofi"
    with pytest.raises(health.HealthError, match="EFA expected but NCCL used transport 'socket' "):
        health.check_transport(SOCKET_LOG, efa_expected=True, gpudirect_expected=False)
    with pytest.raises(health.HealthError, match="'unknown'"):
        health.check_transport("no NCCL output at all", efa_expected=True, gpudirect_expected=False)
    assert (
        health.check_transport(SOCKET_LOG, efa_expected=False, gpudirect_expected=False) == "socket"
    )


# Excerpts in the formats of public NCCL logs: the collective's connections over aws-ofi-nccl
# (https://github.com/aws/aws-ofi-nccl/issues/64, NCCL 2.7, "NET/AWS Libfabric"; the same with
# NCCL 2.18+'s "Channel 00/0" and the plugin's newer name "NET/Libfabric"), and over TCP sockets
# (https://github.com/NVIDIA/nccl/issues/952) after aws-ofi-nccl failed to initialise
# (https://github.com/aws/aws-ofi-nccl/issues/889). The check's own summary line comes last.
CHECK_SUMMARY = (
    "[1,0]<stdout>:allreduce check: 16 ranks on 2 nodes, 256 MiB x 10: bus bandwidth 8.40 GB/s\n"
)
OFI_COLLECTIVE_NCCL_2_7 = """\
ip-172-31-13-103:9738:9797 [0] NCCL INFO Channel 01 : 9[101d0] -> 0[101c0] [receive] via NET/AWS Libfabric/0
ip-172-31-6-104:9922:9980 [1] NCCL INFO Channel 01 : 9[101d0] -> 0[101c0] [send] via NET/AWS Libfabric/0
ip-172-31-6-104:9922:9980 [1] NCCL INFO Channel 01 : 9[101d0] -> 8[101c0] via P2P/IPC/read
"""
OFI_COLLECTIVE = """\
[1,0]<stdout>:ip-10-0-0-5:191:1175 [0] NCCL INFO NET/OFI Selected Provider is efa (found 1 nics)
[1,0]<stdout>:ip-10-0-0-5:191:1175 [0] NCCL INFO Using network Libfabric
[1,0]<stdout>:ip-10-0-0-5:191:1175 [0] NCCL INFO Channel 00/0 : 15[7] -> 0[0] [receive] via NET/Libfabric/0
[1,7]<stdout>:ip-10-0-0-5:194:1177 [7] NCCL INFO Channel 00/0 : 7[7] -> 8[0] [send] via NET/Libfabric/0
[1,1]<stdout>:ip-10-0-0-5:192:1178 [1] NCCL INFO Channel 00 : 1[1] -> 2[2] via P2P/IPC
"""
SOCKET_COLLECTIVE = """\
[1,0]<stdout>:ip-10-0-0-5:86:2554 [0] nccl_net_ofi_init:155 NCCL WARN NET/OFI Initializing plugin failed
[1,0]<stdout>:ip-10-0-0-5:86:2554 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.5<0>
[1,0]<stdout>:ip-10-0-0-5:86:2554 [0] NCCL INFO Using network Socket
[1,0]<stdout>:ip-10-0-0-5:919:1150 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [receive] via NET/Socket/0
[1,0]<stdout>:ip-10-0-0-5:919:1150 [0] NCCL INFO Channel 00/0 : 8[0] -> 0[0] [send] via NET/Socket/0
"""


def test_the_collective_s_connections_decide_the_transport():
    assert health.nccl_transport(OFI_COLLECTIVE_NCCL_2_7) == "ofi"
    assert health.nccl_transport(OFI_COLLECTIVE) == "ofi"
    assert health.nccl_transport(OFI_COLLECTIVE.replace("/0\n", "/0/GDRDMA\n")) == "ofi"
    assert health.nccl_transport(SOCKET_COLLECTIVE) == "socket"
    # The plugin loaded at init, but this collective's bytes went over TCP: that is a failure.
    tcp_after_ofi_init = OFI_LOG + SOCKET_COLLECTIVE.split("Using network Socket\n")[1]
    assert health.nccl_transport(tcp_after_ofi_init) == "socket"
    with pytest.raises(health.HealthError, match="'socket' for the allreduce"):
        health.check_transport(
            tcp_after_ofi_init + CHECK_SUMMARY, efa_expected=True, gpudirect_expected=False
        )


def test_check_reports_the_bandwidth_and_needs_network_connections_across_nodes():
    result = health.check_transport(
        OFI_COLLECTIVE + CHECK_SUMMARY, efa_expected=True, gpudirect_expected=False
    )
    assert result == "ofi, 8.40 GB/s bus bandwidth over 2 node(s), 16 ranks"
    # Init says Libfabric, but no connection of the collective was logged: not proof enough.
    with pytest.raises(health.HealthError, match="crossed 2 nodes but NCCL logged no network"):
        health.check_transport(OFI_LOG + CHECK_SUMMARY, efa_expected=True, gpudirect_expected=False)
    one_node = CHECK_SUMMARY.replace("16 ranks on 2 nodes", "8 ranks on 1 node")
    assert health.check_transport(
        OFI_LOG + one_node, efa_expected=True, gpudirect_expected=False
    ).startswith("ofi, 8.40")


def test_allreduce_summary_and_floor():
    assert allreduce_summary.parse_summary("nothing here") is None
    summary = allreduce_summary.parse_summary(OFI_COLLECTIVE + CHECK_SUMMARY)
    assert summary == {"ranks": 16, "nodes": 2, "busbw_gbps": 8.4}
    line = allreduce_summary.summary_line(16, 2, 8.4, 256, 10)
    assert allreduce_summary.parse_summary(line) == summary
    # 256 MiB in 0.1 s on 16 ranks: 2.68 GB/s algorithm bandwidth, x 2 x 15/16 on the bus.
    bus = allreduce_check.bus_bandwidth_gbps(16, 256 << 20, 0.1)
    assert bus == pytest.approx(2.684 * 2 * 15 / 16, rel=1e-3)
    assert allreduce_check.floor_error(8.4, 3.0, 2, "p4d.24xlarge") is None
    assert allreduce_check.floor_error(1.2, 0.0, 2, "g5.48xlarge") is None  # no floor
    error = allreduce_check.floor_error(1.2, 3.0, 8, "p4d.24xlarge")
    assert error.startswith("allreduce bus bandwidth 1.20 GB/s over 8 node(s) is below the floor")
    assert "3 GB/s for p4d.24xlarge" in error


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


# p4d and p5: the same collective, once with GPUDirect RDMA on every network connection (NCCL
# appends "/GDRDMA" to the connection: "[send] via NET/AWS Libfabric/0/GDRDMA" in the two-node
# p4d nccl-tests log of https://github.com/aws-samples/aws-efa-eks/blob/main/README.md, whose
# test script greps for exactly that), once with the bytes bounced through host memory on one
# rank, as when efa_nv_peermem is not loaded. Newer plugins name the network "Libfabric".
GDRDMA_COLLECTIVE = """\
[1,0]<stdout>:ip-10-0-0-5:191:1175 [0] NCCL INFO NET/OFI Selected Provider is efa (found 4 nics)
[1,0]<stdout>:ip-10-0-0-5:191:1175 [0] NCCL INFO Using network Libfabric
[1,0]<stdout>:ip-10-0-0-5:191:1175 [0] NCCL INFO Channel 00/0 : 15[7] -> 0[0] [receive] via NET/AWS Libfabric/0/GDRDMA
[1,7]<stdout>:ip-10-0-0-5:194:1177 [7] NCCL INFO Channel 00/0 : 7[7] -> 8[0] [send] via NET/Libfabric/3/GDRDMA/Shared
[1,1]<stdout>:ip-10-0-0-5:192:1178 [1] NCCL INFO Channel 00 : 1[1] -> 2[2] via P2P/IPC
"""


def test_a_gpudirect_type_fails_without_gdrdma_connections():
    with pytest.raises(health.HealthError) as error:
        health.check_transport(
            OFI_COLLECTIVE + CHECK_SUMMARY, efa_expected=True, gpudirect_expected=True
        )
    assert str(error.value) == (
        "GPUDirect RDMA expected but 2 of 2 network connections went through host memory (no "
        "'/GDRDMA' after 'via NET/...'): check that lsmod lists efa_nv_peermem and that "
        "/sys/class/infiniband/*/device/p2p says 'NVIDIA peermem'"
    )
    one_bounced = GDRDMA_COLLECTIVE.replace("/3/GDRDMA/Shared", "/3/Shared")
    with pytest.raises(health.HealthError, match="1 of 2 network connections went through host"):
        health.check_transport(
            one_bounced + CHECK_SUMMARY, efa_expected=True, gpudirect_expected=True
        )


def test_a_gpudirect_type_passes_with_gdrdma_connections():
    result = health.check_transport(
        GDRDMA_COLLECTIVE + CHECK_SUMMARY, efa_expected=True, gpudirect_expected=True
    )
    assert result == "ofi with GPUDirect RDMA, 8.40 GB/s bus bandwidth over 2 node(s), 16 ranks"
    # NCCL 2.26.2 and later mark GPUDirect over a C2C-attached GPU "/GDRDMA(PCI)" (net.cc).
    pci = GDRDMA_COLLECTIVE.replace("/0/GDRDMA", "/0/GDRDMA(PCI)").replace(
        "/3/GDRDMA/Shared", "/3/GDRDMA(PCI)/Shared"
    )
    assert "/3/GDRDMA(PCI)/Shared" in pci and "/0/GDRDMA(PCI)\n" in pci
    assert health.check_transport(
        pci + CHECK_SUMMARY, efa_expected=True, gpudirect_expected=True
    ).startswith("ofi with GPUDirect RDMA, 8.40")
    # A suffix that merely starts like it is no GPUDirect mark.
    with pytest.raises(health.HealthError, match="1 of 2 network connections"):
        health.check_transport(
            pci.replace("/0/GDRDMA(PCI)", "/0/GDRDMAX") + CHECK_SUMMARY,
            efa_expected=True,
            gpudirect_expected=True,
        )
    # Types without GPUDirect (g5.48xlarge) pass through host memory.
    assert health.check_transport(
        OFI_COLLECTIVE + CHECK_SUMMARY, efa_expected=True, gpudirect_expected=False
    ).startswith("ofi, 8.40")


def test_the_images_network_stack_is_read_from_its_image_json(tmp_path):
    manifest = tmp_path / "image.json"
    versions = {"efa_installer": "1.47.0", "efa_driver": "2.17.3g", "aws_ofi_nccl": "1.18.0-1"}
    proof = {"passed": True, "instance_type": "g5.xlarge", "efa_nv_peermem_loaded": True}
    manifest.write_text(json.dumps({"versions": versions, "proof": proof}))
    assert health.image_network_stack(manifest) == (
        "EFA installer 1.47.0, efa driver 2.17.3g, aws-ofi-nccl 1.18.0-1, efa_nv_peermem loaded "
        "at the GPU proof on g5.xlarge"
    )
    # An image baked before these fields existed, and a node without image.json.
    manifest.write_text(json.dumps({"versions": {"aws_ofi_nccl": "1.18.0-1"}, "proof": {}}))
    assert health.image_network_stack(manifest) == (
        "EFA installer not recorded, efa driver not recorded, aws-ofi-nccl 1.18.0-1, "
        "efa_nv_peermem not recorded by a GPU proof"
    )
    assert (
        health.image_network_stack(tmp_path / "none.json") == f"not known (no {tmp_path}/none.json)"
    )


def test_node_health_refuses_a_node_sold_on_another_market():
    spot = parse(train_doc() | {"market": "spot"})
    assert "sold spot" in health.check_node(spot, gpus=8, efa=True, sold_as="spot")
    with pytest.raises(health.HealthError, match=r"launched this instance as on-demand .* 'spot'"):
        health.check_node(spot, gpus=8, efa=True, sold_as="on-demand")
    on_demand = parse(train_doc())
    with pytest.raises(health.HealthError, match=r"as spot .* 'on-demand'"):
        health.check_node(on_demand, gpus=8, efa=True, sold_as="spot")
    assert "sold capacity-block" in health.check_node(
        on_demand, gpus=8, efa=True, sold_as="capacity-block"
    )


def test_life_cycle_asks_imds_only_on_ec2(monkeypatch):
    asked = []
    monkeypatch.setattr(health.aws, "imds", lambda path: asked.append(path) or "spot")
    assert health.life_cycle(parse(train_doc() | {"instance_id": "rehearsal-node-0"})) is None
    assert asked == []
    assert health.life_cycle(parse(train_doc() | {"instance_id": None})) == "spot"
    assert asked == ["meta-data/instance-life-cycle"]
