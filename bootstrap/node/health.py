"""Node health (GPU count, EFA device), the NCCL transport check, the CloudWatch agent config."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

from bootstrap import aws
from bootstrap.image.manifest import ImageError, load
from bootstrap.node_config import Common, TrainConfig
from bootstrap.records import allreduce_summary
from contract import causes

# What the node writes under log_dir (the agent skips the ones a role does not have).
LOG_FILES = (
    "bootstrap.log", "preprocess.log", "allreduce-check.log", "train.log",
    "metrics.log",  # the head's EMF lines (bootstrap/records/status.py): CloudWatch Logs makes them metrics
)  # fmt: skip


class HealthError(RuntimeError):
    """A node, or the fleet's network, failed its check."""

    cause = causes.NODE_UNHEALTHY


def count_gpus() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    result = subprocess.run(
        ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if result.returncode != 0:
        raise HealthError(f"nvidia-smi failed: {result.stderr.strip() or result.stdout.strip()}")
    return len([line for line in result.stdout.splitlines() if line.strip()])


def efa_present(sys_infiniband: Path = Path("/sys/class/infiniband")) -> bool:
    if sys_infiniband.is_dir() and any(
        p.name.startswith(("efa", "rdmap")) for p in sys_infiniband.iterdir()
    ):
        return True
    if shutil.which("fi_info"):
        return subprocess.run(["fi_info", "-p", "efa"], capture_output=True).returncode == 0
    return False


def life_cycle(cfg: TrainConfig) -> str | None:
    """How EC2 sold this instance: "spot" or "on-demand" (IMDS `meta-data/instance-life-cycle`,
    https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-data-categories.html).
    None off EC2: a node.json that names its instance (the rehearsal) has no IMDS to ask."""
    return None if cfg.instance_id else aws.imds("meta-data/instance-life-cycle")


def check_node(cfg: TrainConfig, gpus: int, efa: bool, sold_as: str | None = None) -> str:
    """Compare what the node has with what node.json expects; returns a summary line.

    `sold_as` is the instance's life cycle (None: not known). A fleet deployed with
    -c market=spot that booted on demand would bill the on-demand price for the whole run while
    the user budgeted Spot, and the reverse would be interrupted without the Spot watcher: either
    fails here, before the data pull, so the deployment rolls back on the first node's signal.
    """
    # Only Spot is compared: a Capacity Block's instance may name its own market
    # (MarketType capacity-block), and any non-Spot instance is what an on-demand fleet wants.
    if sold_as is not None and (sold_as == "spot") != (cfg.market == "spot"):
        raise HealthError(
            f"EC2 launched this instance as {sold_as} (IMDS instance-life-cycle), node.json "
            f"expects market {cfg.market!r} (-c market): the launch template's market options "
            "did not reach it"
        )
    if gpus != cfg.gpus_per_node:
        raise HealthError(
            f"found {gpus} GPU(s), node.json expects gpus_per_node={cfg.gpus_per_node}"
        )
    if cfg.efa and not efa:
        raise HealthError(
            "node.json expects EFA, but no EFA device (/sys/class/infiniband, fi_info -p efa)"
        )
    sold = f", sold {sold_as}" if sold_as else ""
    return f"{gpus} GPU(s) as expected, EFA {'present' if efa else 'not expected'}{sold}"


# Which network carried the collective: NCCL logs each connection it makes for it, e.g.
# "Channel 00/0 : 0[0] -> 8[0] [send] via NET/Libfabric/0" (aws-ofi-nccl; "NET/AWS Libfabric" in
# older plugins, "/GDRDMA" with GPUDirect RDMA) or "... via NET/Socket/0" (TCP). Those lines prove
# where the bytes went; the init line "Using network X" only says what NCCL loaded. A plugin that
# loads but finds no provider also logs "NET/OFI ...", so a bare NET/OFI mention proves nothing.
_CHANNEL = re.compile(r"\bvia NET/([A-Za-z][A-Za-z ]*?)/\d")
# One inter-node connection with what follows its device number: "/GDRDMA" when NCCL moves the
# bytes between the GPU and the EFA device directly, "/Shared" and others besides. NCCL 2.26.2
# and later write "/GDRDMA(PCI)" where the GPU reaches the CPU over C2C
# (https://github.com/NVIDIA/nccl/blob/v2.26.2-1/src/transport/net.cc): GPUDirect all the same.
_NET_CONNECTION = re.compile(r"\bvia NET/[A-Za-z][A-Za-z ]*?/\d+(\S*)")
_GDRDMA = re.compile(r"/GDRDMA(\(PCI\))?(/|$)")
_CHOSEN = re.compile(r"NCCL INFO Using network (.+)")
_OFI_SELECTED = re.compile(r"NET/OFI Selected Provider is efa", re.IGNORECASE)
_SOCKET = re.compile(r"NET/Socket")
_LIBFABRIC = {"AWS Libfabric", "Libfabric"}


def _network_kind(names: set[str]) -> str:
    if names <= _LIBFABRIC:
        return "ofi"
    return "socket" if any("Socket" in name for name in names) else "unknown"


def nccl_transport(nccl_debug_log: str) -> str:
    """'ofi', 'socket' or 'unknown', from NCCL_DEBUG=INFO output: the networks of the
    collective's own connections first, else the network NCCL chose at init."""
    channels = {m.strip() for m in _CHANNEL.findall(nccl_debug_log)}
    if channels:
        return _network_kind(channels)
    chosen = {m.strip() for m in _CHOSEN.findall(nccl_debug_log)}
    if chosen:
        return _network_kind(chosen)
    if _SOCKET.search(nccl_debug_log):
        return "socket"
    return "ofi" if _OFI_SELECTED.search(nccl_debug_log) else "unknown"


def check_transport(nccl_debug_log: str, efa_expected: bool, gpudirect_expected: bool) -> str:
    """The allreduce check's log -> "ofi, 8.12 GB/s bus bandwidth over 8 nodes"; HealthError when
    EFA is expected and the collective did not cross the nodes through aws-ofi-nccl, or when
    GPUDirect RDMA is expected (p4d, p5) and any network connection went through host memory."""
    transport = nccl_transport(nccl_debug_log)
    summary = allreduce_summary.parse_summary(nccl_debug_log)
    if efa_expected and transport != "ofi":
        raise HealthError(
            f"EFA expected but NCCL used transport '{transport}' for the allreduce (no "
            "'via NET/Libfabric' connection in the NCCL_DEBUG=INFO output): check aws-ofi-nccl, "
            "FI_PROVIDER=efa and the EFA security group"
        )
    crossed = summary and summary["nodes"] > 1
    if efa_expected and crossed and not _CHANNEL.search(nccl_debug_log):
        raise HealthError(
            f"the allreduce crossed {summary['nodes']} nodes but NCCL logged no network "
            "connection for it ('via NET/...'): run the check with NCCL_DEBUG=INFO"
        )
    connections = _NET_CONNECTION.findall(nccl_debug_log)
    bounced = [suffix for suffix in connections if not _GDRDMA.search(suffix)]
    if gpudirect_expected and crossed and bounced:
        # The EFA driver names the GPU memory provider it uses in sysfs: "NVIDIA peermem" through
        # efa_nv_peermem (efa_nvmem_impl.h, amzn-drivers kernel/linux/efa).
        raise HealthError(
            f"GPUDirect RDMA expected but {len(bounced)} of {len(connections)} network connections "
            "went through host memory (no '/GDRDMA' after 'via NET/...'): check that lsmod lists "
            "efa_nv_peermem and that /sys/class/infiniband/*/device/p2p says 'NVIDIA peermem'"
        )
    if gpudirect_expected and crossed:
        transport += " with GPUDirect RDMA"
    if summary is None:
        return transport
    return (
        f"{transport}, {summary['busbw_gbps']:.2f} GB/s bus bandwidth over "
        f"{summary['nodes']} node(s), {summary['ranks']} ranks"
    )


def image_network_stack(manifest: str | Path) -> str:
    """What the node's image.json says carries NCCL across nodes, for the allreduce check's log
    line and failure: "EFA installer 1.47.0, efa driver 2.17.3g, aws-ofi-nccl 1.18.0-1,
    efa_nv_peermem loaded at the GPU proof on g5.xlarge". An image baked before a field
    existed says "not recorded" for it."""
    try:
        document = load(Path(manifest))
    except ImageError as exc:
        return f"not known ({exc})"
    versions = document.get("versions") or {}
    proof = document.get("proof") or {}

    def version(key: str) -> str:
        return str(versions.get(key) or "not recorded")

    peermem = (
        f"loaded at the GPU proof on {proof.get('instance_type')}"
        if proof.get("efa_nv_peermem_loaded")
        else "not recorded by a GPU proof"
    )
    return (
        f"EFA installer {version('efa_installer')}, efa driver {version('efa_driver')}, "
        f"aws-ofi-nccl {version('aws_ofi_nccl')}, efa_nv_peermem {peermem}"
    )


def cloudwatch_agent_config(cfg: Common) -> dict:
    """Ship the node's logs to log_group; training nodes also publish GPU utilisation under
    metrics.namespace, aggregated to metrics.dimension (what TeardownStack's idle alarm reads)."""
    files = [
        {
            "file_path": f"{cfg.log_dir}/{name}",
            "log_group_name": cfg.log_group,
            "log_stream_name": f"{{instance_id}}/{name}",
        }
        for name in LOG_FILES
    ]
    doc: dict = {"logs": {"logs_collected": {"files": {"collect_list": files}}}}
    if isinstance(cfg, TrainConfig) and cfg.gpus_per_node:
        dimension = cfg.metrics["dimension"]
        doc["metrics"] = {
            "namespace": cfg.metrics["namespace"],
            "aggregation_dimensions": [sorted(dimension)],
            "metrics_collected": {
                "nvidia_gpu": {
                    "measurement": ["utilization_gpu", "memory_used", "temperature_gpu"],
                    "metrics_collection_interval": 60,
                    "append_dimensions": dimension,
                }
            },
        }
    return doc


def write_cloudwatch_config(cfg: Common, path: str | Path) -> None:
    Path(path).write_text(json.dumps(cloudwatch_agent_config(cfg), indent=2))
