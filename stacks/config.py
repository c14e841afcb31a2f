"""The app's one configuration: built from CDK context in app.py, validated once, then frozen.

Every key is camelCase in context (`-c nodes=8`), with its default in cdk.json. Values from the
command line arrive as strings, values from cdk.json as JSON, so each parser accepts both.
A bad value raises ConfigError whose text is the single line app.py prints.
"""

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from contract import runs
from contract.fleet import default_min_nodes
from stacks import benchmark, drill_plan
from stacks.config_values import (
    CapacityReservation,
    ConfigError,
    Getter,
    Placement,
    benchmark_mode,
    boolean,
    burstable_type,
    capacity_reservation,
    gpu_type,
    integer,
    jit_proof_type,
    matching,
    number,
    one_of,
    optional,
    top1,
    zone_of,
)
from stacks.instance_types import (
    DEFAULT_FLEET_TYPE,
    DEFAULT_PROOF_TYPE,
    GPU_TYPES,
    BurstableType,
    GpuType,
    JitProofType,
)
from stacks.run_estimate import (
    MIN_CHECKPOINT_EVERY_S,
    RunPlan,
    checkpoint_every_s,
    run_plan,
)

# key -> meaning; the README's table and the unknown-key check both come from here.
KEYS: dict[str, str] = {
    "nodes": "training nodes in the fleet (1-64)",
    "instanceType": "GPU instance type of every training node",
    "region": "AWS region of every stack",
    "az": "availability zone (us-east-1a) or zone ID (use1-az4) of the fleet and preprocessing "
    "(empty: the first zone of the region that offers the type, found at deploy)",
    "vpcId": "deploy into this existing VPC instead of creating one (needs subnetId)",
    "subnetId": "the subnet of vpcId, in az, that reaches S3, SSM and CloudFormation",
    "ami": "bring your own training AMI (an ami- id); empty: the image ImageStack bakes",
    "imageTestInstanceType": "GPU instance type of the training image's GPU proof",
    "imageRevision": "bump to bake the training image again with unchanged files (new base, fixes)",
    "imageJitInstanceType": "H100/H200 type of the optional JIT proof that bakes a CUDA JIT cache",
    "datasetBucket": "use this existing bucket instead of creating DatasetStack",
    "datasetPrefix": "key prefix of the TFRecords in the bucket",
    "run": "run name: S3 prefix runs/<run>/ and the horovod-fleet:run tag",
    "recipe": "training recipe: goyal (linear LR scaling, 90 epochs) or fast (MLPerf's LARS)",
    "epochs": "training epochs (empty: the recipe's)",
    "batchPerGpu": "batch size per GPU, one Horovod rank per GPU (empty: the recipe's)",
    "arch": "model architecture",
    "imageSize": "training image size in pixels",
    "maxHours": "hard cap: the fleet is deleted this many hours after deploy",
    "maxRestarts": "relaunches of the fleet after a retryable failure (0: none)",
    "minNodes": "fewest nodes an elastic reset trains on before the attempt ends (empty: nodes - 1)",
    "checkpointEveryS": "seconds between S3 checkpoints (empty: a tenth of the estimate, 100-600)",
    "market": "on-demand, or spot: one-time Spot Instances, replaced when interrupted",
    "preprocessInstanceType": "t2/t3 type of the preprocessing node (unlimited CPU credits)",
    "dataVolumeGiB": "size of the preprocessing node's sc1 data volume",
    "budgetEmail": "e-mail address an AWS Budgets alert goes to (optional)",
    "notifyEmail": "e-mail address told when training starts, when a run ends, of every failure "
    "alarm and of the budget (optional)",
    "snapshotDataVolume": "snapshot the data volume once preprocessing has finished",
    "downloadSecretArn": "Secrets Manager secret with ImageNet download credentials (optional)",
    "evalEvery": "evaluate every N epochs (and after the last one)",
    "targetTop1": "stop the run at the first evaluation that reaches this top-1 (optional)",
    "capacityReservationId": "launch the fleet into this capacity reservation (optional)",
    "benchmark": "measure the fleet instead of training: false, true/synthetic or data",
    "drill": "rehearse the faults on AWS FIS with a cheap fleet before the first real run",
    "drillConfirmCost": "true: a drill may run on a P-family instanceType",
    "drillExperiments": "the drill's experiments to play, separated by commas (empty: all)",
    "drillPreprocess": "false: horovod-fleet drill converts the drill's dataset locally",
    "allowChange": "redeploy a run on its checkpoints with other training values (recipe, "
    "nodes, type, epochs, batch, arch, image size)",
}

MAX_NODES = 64
DEFAULT_NODES = 8  # -c nodes empty (a drill's: stacks/drill_plan.py DEFAULT_NODES)
DEFAULT_MAX_HOURS = 4.0  # a training run's hard cap when maxHours is empty (benchmark mode: 1)
MIN_DATA_VOLUME_GIB = 500  # the two ImageNet archives (~150 GB) plus the extracted images
MAX_DATA_VOLUME_GIB = 16384  # the sc1 maximum
ARCHS = ("resnet50", "resnet18")
# The trainer's --recipe values (trainer/recipes.py; docs/contracts.md, node.json `trainer`).
RECIPES = ("goyal", "fast")
# How the fleet's instances are bought (stacks/train/fleet.py; node.json `market`).
MARKETS = ("on-demand", "spot")
# Images per GPU when -c batchPerGpu is empty. goyal: NVIDIA's 256 per GPU. fast: 128, which
# puts 8 p4d nodes at a global batch of 8,192, where MLPerf's logged runs reached 75.9% soonest
# among 8k-16k (epoch 42 at 8,192, v1.0 Google tpu-v4-128-TF; 45 at 13,056; 47 at 16,384).
DEFAULT_BATCH_PER_GPU = {"goyal": 256, "fast": 128}
# node.json `trainer.data_wait_s` (the trainer's --data-wait-s, docs/contracts.md): how long a
# rank waits for its shard files. Set, the head starts training once every node holds its own
# shards and each node pulls the rest beside the training; 600 s is the trainer's own default
# (trainer/config.py DEFAULT_DATA_WAIT_S), past a whole pull of a node's share.
DATA_WAIT_S = 600
_REGION = re.compile(r"[a-z]{2}(-gov)?-[a-z]+-\d")
_RUN = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,38}[a-z0-9])?")
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_PREFIX = re.compile(r"(?:[A-Za-z0-9_.-]+/)+")
_EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[A-Za-z]{2,}")
_AMI_ID = re.compile(r"ami-[0-9a-f]{8,17}")
_VPC_ID = re.compile(r"vpc-[0-9a-f]{8,17}")
_SUBNET_ID = re.compile(r"subnet-[0-9a-f]{8,17}")
# The full ARN, with the six characters Secrets Manager appends: IAM matches a grant on a
# partial ARN against nothing.
_SECRET_ARN = re.compile(
    r"arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:\d{12}:secret:[A-Za-z0-9/_+=.@-]+-[A-Za-z0-9]{6}"
)
# An On-Demand Capacity Reservation, or with "block:" a Capacity Block for ML (market type
# capacity-block): the id alone does not say which.


def max_batch_per_gpu(gpu: GpuType, image_size: int) -> int:
    """The GPU's batch limit at 224 px, scaled by the pixels per image."""
    return max(1, gpu.max_batch_per_gpu * 224 * 224 // (image_size * image_size))


UNPLANNED = RunPlan(0)  # FleetConfig.plan until from_context resolves it


@dataclass(frozen=True)
class CheckpointPlan:
    """The trainer's checkpoint interval (node.json `trainer.checkpoint_every_s`; 0: none, as a
    benchmark keeps nothing) and the estimated seconds of training and evaluation (None: nothing
    estimated), from which it was taken unless -c checkpointEveryS chose it."""

    every_s: int
    training_s: float | None = None
    chosen: bool = False  # -c checkpointEveryS gave it


@dataclass(frozen=True)
class FleetConfig:
    """Everything the stacks need, as plain validated values."""

    region: str
    placement: Placement
    nodes: int
    gpu: GpuType
    ami: str | None
    image_test: GpuType
    image_revision: int
    dataset_bucket: str | None
    dataset_prefix: str
    run: str
    recipe: str
    epochs: int | None  # None: the recipe's (the trainer settles it by global batch)
    batch_per_gpu: int
    arch: str
    image_size: int
    max_hours: float
    max_restarts: int
    market: str  # "on-demand" or "spot" (MARKETS)
    preprocess: BurstableType
    data_volume_gib: int
    budget_email: str | None
    notify_email: str | None
    snapshot_data_volume: bool
    download_secret_arn: str | None
    eval_every: int
    target_top1: float | None
    benchmark: str | None  # None: train; "synthetic" or "data": benchmark mode
    capacity_reservation: "CapacityReservation | None" = None
    image_jit: JitProofType | None = None  # None: no JIT proof stage
    # The elastic fleet: a reset trains on at least this many nodes; fewer ends the attempt.
    min_nodes: int = 1
    # What the recipe makes of the fleet and the trainer's checkpoint interval, resolved once at
    # the end of from_context.
    plan: RunPlan = UNPLANNED
    checkpoint: CheckpointPlan = CheckpointPlan(0)
    # -c drill=true: the experiments TrainStack synthesizes and the head plays (None: no drill).
    drill: drill_plan.DrillPlan | None = None
    # -c allowChange: a redeploy of a run may change its training values (stacks/train/run_record.py).
    allow_change: bool = False
    # Every key of KEYS as the deploy got it (cdk.json's default or -c): runs/<run>/config.json.
    context: tuple[tuple[str, Any], ...] = ()

    @property
    def runs_prefix(self) -> str:
        return runs.prefix(self.run)

    @property
    def benchmark_plan(self) -> dict[str, Any] | None:
        """The node.json `benchmark` object: the sizes node 0 measures (None: a training run)."""
        if self.benchmark is None:
            return None
        return benchmark.plan(self.benchmark, self.nodes, self.gpu.gpus)

    @property
    def trainer(self) -> dict[str, Any]:
        """The node.json `trainer` object; bootstrap turns each key into a trainer flag."""
        return {
            "recipe": self.recipe,
            "epochs": self.epochs,
            "batch_per_gpu": self.batch_per_gpu,
            "arch": self.arch,
            "image_size": self.image_size,
            "eval_every": self.eval_every,
            "target_top1": self.target_top1,
            "data_wait_s": DATA_WAIT_S,
        } | ({"checkpoint_every_s": self.checkpoint.every_s} if self.checkpoint.every_s else {})

    @classmethod
    def from_context(cls, context: Mapping[str, Any]) -> "FleetConfig":
        """Validate every key; the first bad one raises ConfigError."""
        _reject_unknown_keys(context)
        get = Getter(context)
        region = get("region", matching(_REGION, "a region name such as us-east-1"))
        vpc_id = get("vpcId", optional(matching(_VPC_ID, "empty or a VPC id like vpc-0abc1234")))
        subnet_id = get(
            "subnetId",
            optional(matching(_SUBNET_ID, "empty or a subnet id like subnet-0abc1234")),
        )
        mode = get("benchmark", benchmark_mode)
        drilling = get("drill", boolean)
        recipe = get("recipe", one_of(RECIPES))
        default_max_hours = benchmark.MAX_HOURS if mode else DEFAULT_MAX_HOURS
        if (vpc_id is None) != (subnet_id is None):
            key, value = ("subnetId", subnet_id) if vpc_id is None else ("vpcId", vpc_id)
            raise ConfigError(key, value, "vpcId and subnetId are given together or not at all")
        config = cls(
            region=region,
            placement=Placement(
                az=get("az", optional(zone_of(region))) or f"{region}a",
                az_chosen=context.get("az") not in (None, ""),
                vpc_id=vpc_id,
                subnet_id=subnet_id,
            ),
            nodes=get("nodes", optional(integer(1, MAX_NODES)))
            or (drill_plan.DEFAULT_NODES if drilling else DEFAULT_NODES),
            gpu=get("instanceType", optional(gpu_type(DEFAULT_FLEET_TYPE)))
            or GPU_TYPES[drill_plan.DEFAULT_TYPE if drilling else DEFAULT_FLEET_TYPE],
            ami=get(
                "ami",
                optional(
                    matching(
                        _AMI_ID, "empty (the image ImageStack bakes) or an AMI id like ami-0abc1234"
                    )
                ),
            ),
            image_test=get("imageTestInstanceType", gpu_type(DEFAULT_PROOF_TYPE)),
            image_revision=get("imageRevision", integer(0, 100000)),
            dataset_bucket=get("datasetBucket", optional(matching(_BUCKET, "an S3 bucket name"))),
            dataset_prefix=get(
                "datasetPrefix", matching(_PREFIX, "a key prefix ending in '/', like tfrecords/")
            ),
            run=get(
                "run",
                matching(_RUN, "1-40 lowercase letters, digits and inner hyphens, like resnet50-1"),
            ),
            recipe=recipe,
            epochs=get("epochs", optional(integer(1, 1000))),
            batch_per_gpu=get("batchPerGpu", optional(integer(1, 4096)))
            or (drill_plan.BATCH_PER_GPU if drilling else DEFAULT_BATCH_PER_GPU[recipe]),
            arch=get("arch", one_of(ARCHS)),
            image_size=get("imageSize", integer(32, 1024)),
            max_hours=get("maxHours", optional(number(1, 168))) or default_max_hours,
            max_restarts=get("maxRestarts", integer(0, 20)),
            market=get("market", one_of(MARKETS)),
            preprocess=get("preprocessInstanceType", burstable_type),
            data_volume_gib=get("dataVolumeGiB", integer(MIN_DATA_VOLUME_GIB, MAX_DATA_VOLUME_GIB)),
            budget_email=get(
                "budgetEmail", optional(matching(_EMAIL, "empty or an e-mail address"))
            ),
            notify_email=get(
                "notifyEmail", optional(matching(_EMAIL, "empty or an e-mail address"))
            ),
            snapshot_data_volume=get("snapshotDataVolume", boolean),
            download_secret_arn=get(
                "downloadSecretArn",
                optional(
                    matching(
                        _SECRET_ARN,
                        "empty or a full Secrets Manager secret ARN, ending in the 6 random "
                        "characters after the name (arn:aws:secretsmanager:REGION:ACCOUNT:"
                        "secret:NAME-AbCdEf)",
                    )
                ),
            ),
            eval_every=get("evalEvery", integer(1, 1000)),
            target_top1=get("targetTop1", optional(top1)),
            capacity_reservation=get("capacityReservationId", optional(capacity_reservation)),
            benchmark=mode,
            image_jit=get("imageJitInstanceType", optional(jit_proof_type)),
        )
        nodes = config.nodes
        config = replace(
            config,
            min_nodes=get("minNodes", optional(integer(1, nodes))) or default_min_nodes(nodes),
            allow_change=get("allowChange", optional(boolean)) or False,
            context=tuple((key, context.get(key)) for key in KEYS),
        )
        try:  # -c drill=true: its plan, cap, epoch bound and dataset (stacks/drill_plan.py)
            config = drill_plan.settle(
                config,
                dict(context),
                drilling=drilling,
                confirmed=get("drillConfirmCost", boolean),
                preprocess=get("drillPreprocess", boolean),
                max_hours=get("maxHours", optional(number(1, 168))),
            )
        except drill_plan.Refused as refused:
            raise ConfigError(*refused.args) from None
        _refuse_conflicts(config, context)
        chosen = get("checkpointEveryS", optional(integer(MIN_CHECKPOINT_EVERY_S, 86400)))
        config = replace(
            config,
            plan=run_plan(
                config.gpu, config.nodes, recipe=config.recipe, batch_per_gpu=config.batch_per_gpu,
                epochs=config.epochs, image_size=config.image_size, eval_every=config.eval_every,
                arch=config.arch,
            ),
        )  # fmt: skip
        return replace(config, checkpoint=checkpoint_plan(config, chosen))


def _reject_unknown_keys(context: Mapping[str, Any]) -> None:
    # CDK's own keys contain ':' or '@' or '-'; a plain camelCase key is meant for this app,
    # and a typo such as `-c node=8` must not silently deploy the default fleet.
    for key in context:
        if re.fullmatch(r"[a-z][A-Za-z0-9]*", key) and key not in KEYS:
            close = difflib.get_close_matches(key, KEYS, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise ConfigError(key, context[key], f"{hint}known keys: {', '.join(KEYS)}")


def _refuse_conflicts(config: FleetConfig, context: Mapping[str, Any]) -> None:
    """The rules between keys, each valid alone: the first broken one raises ConfigError."""
    region = config.region
    if config.image_jit is not None and config.ami is not None:
        raise ConfigError(
            "imageJitInstanceType",
            context.get("imageJitInstanceType"),
            "empty with ami: the JIT proof is a stage of the image ImageStack bakes",
        )
    if config.market == "spot" and config.capacity_reservation is not None:
        raise ConfigError(
            "market",
            "spot",
            "on-demand with capacityReservationId: a reservation holds On-Demand capacity, "
            "and a Spot Instance cannot launch into it",
        )
    placement = config.placement
    if not placement.az_chosen and (placement.vpc_id or config.capacity_reservation):
        fixed_by = "subnetId" if placement.vpc_id else "capacityReservationId"
        raise ConfigError(
            "az",
            context.get("az"),
            f"the zone of {fixed_by}, which fixes the zone of the fleet: a zone of {region} "
            f"like {region}a, or its zone ID",
        )
    fits = max_batch_per_gpu(config.gpu, config.image_size)
    if config.batch_per_gpu > fits:
        raise ConfigError(
            "batchPerGpu",
            context.get("batchPerGpu"),
            f"at most {fits} on {config.gpu.name} ({config.gpu.gpu_model}) at "
            f"imageSize={config.image_size}: a larger batch does not fit the GPU's memory",
        )


def checkpoint_plan(config: FleetConfig, chosen: int | None) -> CheckpointPlan:
    """-c checkpointEveryS (`chosen`), else a tenth of the run plan's estimate (run_estimate.py)."""
    if config.benchmark:
        return CheckpointPlan(0)  # a benchmark trains nothing it keeps
    if config.drill:  # its epochs are a bound, not an estimate: the longest interval
        return CheckpointPlan(chosen or checkpoint_every_s(None), None, chosen is not None)
    training_s = config.plan.training_s
    return CheckpointPlan(chosen or checkpoint_every_s(training_s), training_s, chosen is not None)
