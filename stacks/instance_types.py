"""The one table of instance types this app knows, with the on-demand prices its estimates use.

Prices are us-east-1 Linux on-demand list prices in USD per hour. They were not read live (the
app never contacts AWS); refresh them from https://aws.amazon.com/ec2/pricing/on-demand/ and
update PRICES_AS_OF when they change.
"""

from dataclasses import dataclass

PRICES_AS_OF = "2025-06 (us-east-1, Linux, on-demand)"
SC1_USD_PER_GIB_MONTH = 0.015
# Unlimited mode bills CPU use above the baseline at this rate per vCPU-hour (Linux, t2 and t3).
SURPLUS_CREDIT_USD_PER_VCPU_HOUR = 0.05


@dataclass(frozen=True)
class GpuType:
    """A GPU instance type a training node can be."""

    name: str
    gpus: int
    gpu_model: str
    efa_interfaces: int  # 0: no EFA; p4d and p5 spread EFA over several network cards
    nvme_drives: int  # instance-store NVMe SSDs; 0 means the dataset lives on the root volume
    vcpus: int
    usd_per_hour: float
    # Network settings the training nodes get through node.json (bootstrap/launch.py turns them
    # into the launch environment). efa_rdma_read: the EFA device has RDMA read, so libfabric
    # may be told FI_EFA_USE_DEVICE_RDMA=1; on first-generation EFA (p3dn) that setting makes
    # libfabric abort (https://github.com/ofiwg/libfabric/pull/8661), and its default is off on
    # device ids 0xefa0/0xefa1 (https://github.com/ofiwg/libfabric/pull/8573). Only the P
    # types from p4d on have GPUDirect RDMA over EFA
    # (https://github.com/aws/aws-ofi-nccl/issues/547, https://github.com/aws/aws-ofi-nccl/issues/104).
    efa_rdma_read: bool = False
    # The pre-training allreduce check fails below this NCCL bus bandwidth (GB/s) over all
    # nodes; 0: not enforced (no published figure). About half the lowest published multi-node
    # figure, so a healthy fleet passes and TCP or a misconfigured plugin does not:
    # p3dn 6-8 GB/s busbw on 8-32 nodes, 10 GB/s on 2 (https://github.com/NVIDIA/nccl/issues/235);
    # p4d 57 GB/s on 2 nodes, 30 GB/s on 3-4 (https://github.com/NVIDIA/nccl/issues/527).
    allreduce_floor_gbps: float = 0.0

    @property
    def efa(self) -> bool:
        return self.efa_interfaces > 0

    @property
    def quota(self) -> tuple[str, str]:
        """The EC2 vCPU quota (name, code) a fleet of this type draws from."""
        if self.name.startswith("p"):
            return "Running On-Demand P instances", "L-417A185B"
        return "Running On-Demand G and VT instances", "L-DB2E81BA"


@dataclass(frozen=True)
class BurstableType:
    """A t2/t3 instance type for the CPU-only preprocessing node."""

    name: str
    vcpus: int
    baseline_per_vcpu: float  # fraction of a vCPU each vCPU may use without spending credits
    usd_per_hour: float

    @property
    def max_surplus_usd_per_hour(self) -> float:
        """What unlimited mode adds per hour when every vCPU runs flat out."""
        return self.vcpus * (1 - self.baseline_per_vcpu) * SURPLUS_CREDIT_USD_PER_VCPU_HOUR


GPU_TYPES: dict[str, GpuType] = {
    t.name: t
    for t in (
        GpuType("p3.2xlarge", 1, "V100 16 GB", 0, 0, 8, 3.06),
        GpuType("p3.8xlarge", 4, "V100 16 GB", 0, 0, 32, 12.24),
        GpuType("p3.16xlarge", 8, "V100 16 GB", 0, 0, 64, 24.48),
        GpuType("p3dn.24xlarge", 8, "V100 32 GB", 1, 2, 96, 31.212, False, 3.0),
        GpuType("p4d.24xlarge", 8, "A100 40 GB", 4, 8, 96, 21.96, True, 15.0),
        GpuType("p5.48xlarge", 8, "H100 80 GB", 32, 8, 192, 55.04, True),
        GpuType("g4dn.xlarge", 1, "T4 16 GB", 0, 1, 4, 0.526),
        GpuType("g4dn.12xlarge", 4, "T4 16 GB", 1, 1, 48, 3.912),
        GpuType("g4dn.metal", 8, "T4 16 GB", 1, 2, 96, 7.824),
        GpuType("g5.xlarge", 1, "A10G 24 GB", 0, 1, 4, 1.006),
        GpuType("g5.12xlarge", 4, "A10G 24 GB", 1, 1, 48, 5.672),
        GpuType("g5.48xlarge", 8, "A10G 24 GB", 1, 2, 192, 16.288),
    )
}

BURSTABLE_TYPES: dict[str, BurstableType] = {
    t.name: t
    for t in (
        BurstableType("t2.large", 2, 0.30, 0.0928),
        BurstableType("t2.xlarge", 4, 0.225, 0.1856),
        BurstableType("t2.2xlarge", 8, 0.171, 0.3712),
        BurstableType("t3.large", 2, 0.30, 0.0832),
        BurstableType("t3.xlarge", 4, 0.40, 0.1664),
        BurstableType("t3.2xlarge", 8, 0.40, 0.3328),
    )
}


def fleet_usd_per_hour(gpu: GpuType, nodes: int) -> float:
    return gpu.usd_per_hour * nodes


def fleet_estimate(gpu: GpuType, nodes: int, max_hours: float) -> str:
    """The TrainStack line synthesis prints: hourly rate and the most the hard cap lets it cost."""
    hourly = fleet_usd_per_hour(gpu, nodes)
    return (
        f"TrainStack: {nodes} x {gpu.name} at ${gpu.usd_per_hour:g}/h = ${hourly:,.2f}/h; "
        f"capped at {max_hours:g} h -> at most ${hourly * max_hours:,.2f}"
    )


def quota_note(gpu: GpuType, nodes: int) -> str:
    """The vCPU quota a fleet needs: new accounts often have 0 for P instances."""
    name, code = gpu.quota
    return (
        f"TrainStack needs {gpu.vcpus * nodes} vCPUs of the EC2 quota '{name}' ({code}); check: "
        f"aws service-quotas get-service-quota --service-code ec2 --quota-code {code}"
    )


def zone_note(gpu: GpuType, region: str, az: str) -> str:
    """Not every zone offers every GPU type, and zone names differ between accounts."""
    return (
        f"TrainStack runs in {az}; check it offers {gpu.name}: aws ec2 "
        f"describe-instance-type-offerings --region {region} --location-type availability-zone "
        f"--filters Name=instance-type,Values={gpu.name} --query 'InstanceTypeOfferings[].Location'"
    )


def preprocess_estimate(node: BurstableType, volume_gib: int) -> str:
    """The PreprocessStack line: the instance, its worst-case credit surcharge, the volume."""
    return (
        f"PreprocessStack: {node.name} at ${node.usd_per_hour:g}/h "
        f"(+ up to ${node.max_surplus_usd_per_hour:.3f}/h unlimited CPU credits) "
        f"+ {volume_gib} GiB sc1 at ${volume_gib * SC1_USD_PER_GIB_MONTH:,.2f}/month"
    )
