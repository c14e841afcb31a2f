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
    """A GPU instance type a training node can be: one row of GPU_TYPES, every figure sourced."""

    name: str
    gpus: int
    gpu_model: str
    gpu_memory_gib: int
    compute_capability: int  # 80 for sm_80: the image's NCCL is built for each row's
    efa_interfaces: int  # 0: no EFA; p4d and p5 spread EFA over several network cards
    nvme_drives: int  # instance-store NVMe SSDs; 0 means the dataset lives on the root volume
    vcpus: int
    usd_per_hour: float
    # GPUDirect RDMA over EFA: NCCL reads and writes GPU memory straight from the EFA device.
    # aws-ofi-nccl's platform table requires it on p4d and p5 and stops NCCL without it, so the
    # allreduce check fails unless NCCL's inter-node connections say GDRDMA; these types also get
    # FI_EFA_USE_DEVICE_RDMA=1 (their EFA has RDMA read).
    gpudirect: bool = False
    # NVSwitch types (HGX A100 and H100 boards) bring their GPUs up only with NVIDIA's fabric
    # manager running, of exactly the driver's version.
    fabric_manager: bool = False
    # The pre-training allreduce check fails below this NCCL bus bandwidth (GB/s) over all
    # nodes; 0: not enforced (no published figure). About half the lowest published multi-node
    # figure, so a healthy fleet passes and TCP or a misconfigured plugin does not.
    allreduce_floor_gbps: float = 0.0

    @property
    def efa(self) -> bool:
        return self.efa_interfaces > 0

    @property
    def max_batch_per_gpu(self) -> int:
        """The largest ResNet-50 batch per GPU at 224 px that fits this GPU's memory in mixed
        precision: NVIDIA trains 256 per 16 GB V100 (DeepLearningExamples' ResNet-50 v1.5 for
        TensorFlow, https://github.com/NVIDIA/DeepLearningExamples/tree/master/TensorFlow/Classification/ConvNets/resnet50v1.5),
        and activations grow with the batch, so 16 images per GiB."""
        return 16 * self.gpu_memory_gib

    @property
    def spot_quota(self) -> str:
        """The EC2 Spot vCPU quota a Spot fleet of this type draws from (0 by default for P):
        https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/using-spot-limits.html"""
        if self.name.startswith("p5"):
            return "All P5 Spot Instance Requests"
        if self.name.startswith("p"):
            return "All P4, P3 and P2 Spot Instance Requests"
        if self.name.startswith("g"):
            return "All G and VT Spot Instance Requests"
        return f"the Spot Instance Requests quota of {self.name.split('.')[0]}"

    @property
    def spot_quota_code(self) -> str | None:
        """The Service Quotas code of spot_quota, where one was found: L-3819A6DF for G and VT,
        as SkyPilot's catalogue maps g4dn and g5 (skypilot-org/skypilot-catalog,
        catalogs/v5/aws/instance_quota_mapping.csv at 206e4675), beside L-DB2E81BA for their
        on-demand quota, which the same file pairs with it."""
        return "L-3819A6DF" if self.name.startswith("g") else None

    @property
    def quota(self) -> tuple[str, str]:
        """The EC2 vCPU quota (name, code) a fleet of this type draws from."""
        if self.name.startswith("p"):
            return "Running On-Demand P instances", "L-417A185B"
        return "Running On-Demand G and VT instances", "L-DB2E81BA"


@dataclass(frozen=True)
class HeadType:
    """The elastic fleet's head (stacks/train/head.py): an on-demand CPU instance in the fleet's
    subnet that runs horovodrun's elastic driver, so that no GPU node's loss ends the attempt."""

    name: str
    vcpus: int
    memory_gib: int
    usd_per_hour: float


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


# The training fleet's default, and the GPU proof's: the cheapest single-GPU type the image's
# driver, CUDA and NCCL serve (sm_86), so a broken image fails for about a dollar.
DEFAULT_FLEET_TYPE = "p4d.24xlarge"
DEFAULT_PROOF_TYPE = "g5.xlarge"

# Specifications: https://docs.aws.amazon.com/ec2/latest/instancetypes/ac.html (GPUs, memory,
# vCPUs, instance store) and https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa.html
# (EFA interfaces per network card). Compute capabilities: https://developer.nvidia.com/cuda-gpus.
# Prices: PRICES_AS_OF, https://aws.amazon.com/ec2/pricing/on-demand/; P4d and P5 after AWS's
# June 2025 reduction of up to 45% (https://aws.amazon.com/about-aws/whats-new/2025/06/pricing-usage-model-ec2-instances-nvidia-gpus/).
# The on-demand prices as SkyPilot's AWS catalogue lists them (skypilot-org/skypilot-catalog,
# catalogs/v8/aws/vms.csv: p4d.24xlarge 21.957642, p4de.24xlarge 27.44705, p5.48xlarge 55.04,
# p5en.48xlarge 63.296, g5.xlarge 1.006, g4dn.xlarge 0.526); p5en also as dstack's catalogue
# lists it (https://github.com/dstackai/dstack/pull/4110, 2026-08), with 192 vCPUs and 8 x H200
# 141 GB. g4dn.8xlarge and g5.8xlarge (one GPU and one EFA interface each, the smallest sizes
# with EFA: a drill of the EFA path): 32 vCPUs, one 900 GB NVMe drive, $2.176 and $2.448 an hour
# in us-east-1, from the AWS Pricing API as aws/karpenter-provider-aws generated them
# (pkg/providers/pricing/zz_generated.pricing_aws.go at 6fc13b52, 2026-07-20) and its
# DescribeInstanceTypes table (website/content/en/preview/reference/instance-types.md at
# 692ccdd0: instance-gpu-count 1, vpc.amazonaws.com/efa 1). EFA: p5 32 network cards (efa-acc-inst-types.html above); p5en 16 as torchx declares
# them (https://github.com/meta-pytorch/torchx/pull/995); p4d and p4de 4 x 100 Gbps
# (https://github.com/aws-samples/aws-efa-eks). p5e is left out: it has no on-demand price in
# either catalogue.
# Allreduce floors: about half the lowest published multi-node bus bandwidth; p4d: 57 GB/s on 2
# nodes, about 30 on 3-4 (https://github.com/NVIDIA/nccl/issues/527); p4de shares p4d's network.
# p5's published figures (nccl-tests, 321-478 GB/s on 2-32 nodes) are for 8 GiB messages, far
# above what the check's 256 MiB reaches, so p5 and p5en enforce only GPUDirect RDMA (floor 0).
GPU_TYPES: dict[str, GpuType] = {
    t.name: t
    for t in (
        # name, GPUs, model, GiB, sm, EFA interfaces, NVMe drives, vCPUs, USD/h
        GpuType("p4d.24xlarge", 8, "A100 40 GB", 40, 80, 4, 8, 96, 21.958, True, True, 15.0),
        GpuType("p4de.24xlarge", 8, "A100 80 GB", 80, 80, 4, 8, 96, 27.447, True, True, 15.0),
        GpuType("p5.48xlarge", 8, "H100 80 GB", 80, 90, 32, 8, 192, 55.04, True, True),
        GpuType("p5en.48xlarge", 8, "H200 141 GB", 141, 90, 16, 8, 192, 63.296, True, True),
        GpuType("g4dn.xlarge", 1, "T4 16 GB", 16, 75, 0, 1, 4, 0.526),
        GpuType("g4dn.8xlarge", 1, "T4 16 GB", 16, 75, 1, 1, 32, 2.176),
        GpuType("g4dn.12xlarge", 4, "T4 16 GB", 16, 75, 1, 1, 48, 3.912),
        GpuType("g5.xlarge", 1, "A10G 24 GB", 24, 86, 0, 1, 4, 1.006),
        GpuType("g5.8xlarge", 1, "A10G 24 GB", 24, 86, 1, 1, 32, 2.448),
        GpuType("g5.12xlarge", 4, "A10G 24 GB", 24, 86, 1, 1, 48, 5.672),
        GpuType("g5.48xlarge", 8, "A10G 24 GB", 24, 86, 1, 2, 192, 16.288),
    )
}

# Families AWS no longer sells, with the source; config refuses them in one line with a successor.
RETIRED_FAMILIES: dict[str, str] = {
    "p2": "AWS retired P2 (K80)",
    "p3": (
        "AWS retired P3 (V100), telling customers to migrate by 2025-12-20 "
        "(https://github.com/zalando-incubator/kubernetes-on-aws/issues/8685)"
    ),
}
# Families AWS sells that this image cannot drive.
UNDRIVABLE_FAMILIES: dict[str, str] = {
    "p6": (
        "Blackwell GPUs (p6) need CUDA 12.8 or later and the image runs TensorFlow 2.15.1 on "
        "CUDA 12.2 (https://www.tensorflow.org/install/source#gpu); use p5en.48xlarge or "
        "p5.48xlarge"
    ),
}


@dataclass(frozen=True)
class JitProofType:
    """A type the training image's optional JIT proof may run on (-c imageJitInstanceType): its
    GPUs are of compute capability 9.0 (H100, H200), which TensorFlow 2.15.1's wheel has no
    native code for, so the first start there JIT-compiles TensorFlow's kernels."""

    name: str
    gpus: int
    gpu_model: str
    usd_per_hour: float


# p5.4xlarge: one H100 80 GB, 16 vCPUs, $6.88 an hour on demand in us-east-1 (the p5.48xlarge's
# price per GPU; as third-party price lists read AWS's, e.g. github.com/datareceipts/data-receipts
# 109-gpu-pricing, and SageMaker's ml.p5.4xlarge in the AWS API changelog of 2026-05-19). It is no
# fleet type (one GPU, its EFA and instance store are not checked against a source), so it is not
# in GPU_TYPES; the two 8-GPU types are, and cost eight times as much for the same proof.
JIT_PROOF_TYPES: dict[str, JitProofType] = {
    t.name: t
    for t in (
        JitProofType("p5.4xlarge", 1, "H100 80 GB", 6.88),
        *(
            JitProofType(g.name, g.gpus, g.gpu_model, g.usd_per_hour)
            for g in GPU_TYPES.values()
            if g.compute_capability == 90
        ),
    )
}

# The head: horovodrun's elastic driver, its discovery thread, the ssh sessions of every rank
# and the mirror of rank 0's outputs, plus the uploads and status.json. No training, no data:
# 4 vCPUs of a current-generation x86 type (the training image is x86_64). c6i.xlarge: 4 vCPUs,
# 8 GiB, $0.17 an hour on demand in us-east-1, us-east-2 and us-west-2, offered in every zone of
# us-east-1 that offers p4d or p5 (use1-az1, -az2, -az4, -az5, -az6) in SkyPilot's AWS catalogue
# (skypilot-org/skypilot-catalog, catalogs/v8/aws/vms.csv at e385a0d, the same source as the GPU
# prices above). The zone check refuses a zone that does not offer it (stacks/train/stack.py).
HEAD_TYPE = HeadType("c6i.xlarge", 4, 8, 0.17)

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


# us-east-1 Spot prices per zone, lowest and highest, as SkyPilot's AWS catalogue recorded them
# beside the on-demand prices above (skypilot-org/skypilot-catalog, catalogs/v8/aws/vms.csv at
# e385a0d348eda9cefd9806423e7725944dc249e4, SpotPrice column: p4d.24xlarge use1-az1 6.289,
# use1-az6 12.4991, use1-az2 14.1051; p4de.24xlarge use1-az6 9.7262, use1-az4 11.4593;
# p5.48xlarge use1-az5 14.246 ... use1-az1 and use1-az4 55.04, the on-demand price). Spot
# prices move with demand: the live ones come from describe-spot-price-history (spot_estimate).
SPOT_PRICES_AS_OF = "SkyPilot's AWS catalogue v8 @e385a0d (us-east-1, after the June 2025 cut)"
SPOT_USD_PER_HOUR: dict[str, tuple[float, float]] = {
    "p4d.24xlarge": (6.289, 14.1051),
    "p4de.24xlarge": (9.7262, 11.4593),
    "p5.48xlarge": (14.246, 55.04),
}


def fleet_usd_per_hour(gpu: GpuType, nodes: int) -> float:
    """The whole fleet's rate: its GPU nodes and its head (always on demand)."""
    return gpu.usd_per_hour * nodes + HEAD_TYPE.usd_per_hour


def fleet_estimate(gpu: GpuType, nodes: int, max_hours: float) -> str:
    """The TrainStack line synthesis prints: hourly rate and the most the hard cap lets it cost."""
    hourly = fleet_usd_per_hour(gpu, nodes)
    return (
        f"TrainStack: {nodes} x {gpu.name} at ${gpu.usd_per_hour:g}/h + head {HEAD_TYPE.name} "
        f"at ${HEAD_TYPE.usd_per_hour:g}/h = ${hourly:,.2f}/h; capped at {max_hours:g} h -> at "
        f"most ${hourly * max_hours:,.2f}"
    )


def spot_estimate(gpu: GpuType, nodes: int, region: str) -> str:
    """The Spot line synthesis prints beside the on-demand one: the recorded range, and the
    command that gives today's prices in the region's zones."""
    live = (
        f"aws ec2 describe-spot-price-history --region {region} --instance-types {gpu.name} "
        "--product-descriptions Linux/UNIX --start-time $(date -u +%FT%TZ) "
        "--query 'SpotPriceHistory[].[AvailabilityZone,SpotPrice]'"
    )
    recorded = SPOT_USD_PER_HOUR.get(gpu.name)
    if recorded is None:
        return f"TrainStack on Spot (-c market=spot): no recorded price for {gpu.name}; {live}"
    low, high = recorded
    head = HEAD_TYPE.usd_per_hour  # the head is never Spot: its loss would end the attempt
    return (
        f"TrainStack on Spot (-c market=spot): {nodes} x {gpu.name} at ${low:g}-{high:g}/h "
        f"+ head ${head:g}/h on demand = ${low * nodes + head:,.2f}-{high * nodes + head:,.2f}/h "
        "by zone (on demand "
        f"${fleet_usd_per_hour(gpu, nodes):,.2f}/h), {SPOT_PRICES_AS_OF}; today's: {live}"
    )


def quota_note(gpu: GpuType, nodes: int, market: str = "on-demand") -> str:
    """The vCPU quota a fleet needs: new accounts often have 0 for P instances."""
    if market == "spot" and gpu.spot_quota_code:
        code = gpu.spot_quota_code
        return (
            f"TrainStack needs {gpu.vcpus * nodes} vCPUs of the EC2 quota '{gpu.spot_quota}' "
            f"({code}); check: aws service-quotas get-service-quota --service-code ec2 "
            f"--quota-code {code}"
        )
    if market == "spot":
        return (
            f"TrainStack needs {gpu.vcpus * nodes} vCPUs of the EC2 quota "
            f"'{gpu.spot_quota}' (0 by default for P instances); check: aws service-quotas "
            "list-service-quotas --service-code ec2 --query "
            "\"Quotas[?contains(QuotaName,'Spot')].[QuotaName,Value]\""
        )
    name, code = gpu.quota
    return (
        f"TrainStack needs {gpu.vcpus * nodes} vCPUs of the EC2 quota '{name}' ({code}); check: "
        f"aws service-quotas get-service-quota --service-code ec2 --quota-code {code}"
    )


def zone_note(gpu: GpuType, region: str, az: str | None) -> str:
    """Not every zone offers every GPU type, and zone names differ between accounts: the zone is
    picked at deploy time (TrainStack's Zone resource); `az` None: -c az was not given."""
    chosen = (
        f"TrainStack prefers {az}; at deploy it takes a zone of {region} that offers {gpu.name}"
        if az
        else f"TrainStack takes at deploy the first zone of {region} that offers {gpu.name} "
        "(-c az= prefers one)"
    )
    return (
        f"{chosen} in your account, or fails in one line. The zones: aws ec2 "
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
