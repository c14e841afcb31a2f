"""The app's one configuration: built from CDK context in app.py, validated once, then frozen.

Every key is camelCase in context (`-c nodes=8`), with its default in cdk.json. Values from the
command line arrive as strings, values from cdk.json as JSON, so each parser accepts both.
A bad value raises ConfigError whose text is the single line app.py prints.
"""

import difflib
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from stacks import benchmark
from stacks.instance_types import (
    BURSTABLE_TYPES,
    DEFAULT_FLEET_TYPE,
    DEFAULT_PROOF_TYPE,
    GPU_TYPES,
    JIT_PROOF_TYPES,
    RETIRED_FAMILIES,
    UNDRIVABLE_FAMILIES,
    BurstableType,
    GpuType,
    JitProofType,
)
from stacks.run_estimate import MIN_CHECKPOINT_EVERY_S

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
    "allowChange": "redeploy a run on its checkpoints with other training values (recipe, "
    "nodes, type, epochs, batch, arch, image size)",
}

MAX_NODES = 64
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
_INSTANCE_TYPE = re.compile(r"([a-z]+)(\d+)([a-z0-9-]*)\.([a-z0-9]+)")
# An On-Demand Capacity Reservation, or with "block:" a Capacity Block for ML (market type
# capacity-block): the id alone does not say which.
_CAPACITY_RESERVATION = re.compile(r"(block:)?cr-[0-9a-f]{17}")


def max_batch_per_gpu(gpu: GpuType, image_size: int) -> int:
    """The GPU's batch limit at 224 px, scaled by the pixels per image."""
    return max(1, gpu.max_batch_per_gpu * 224 * 224 // (image_size * image_size))


class ConfigError(ValueError):
    """A bad context value; str() is one line naming the key, the value and what is allowed."""

    def __init__(self, key: str, value: Any, allowed: str) -> None:
        super().__init__(f"error: context key {key}={value!r} is invalid; allowed: {allowed}")


@dataclass(frozen=True)
class FleetConfig:
    """Everything the stacks need, as plain validated values."""

    region: str
    # The preferred zone; when not chosen (az empty), the region's first zone by name, which
    # synthesis names where it needs one, and the deploy answers the zone that offers the type.
    az: str
    nodes: int
    gpu: GpuType
    vpc_id: str | None
    subnet_id: str | None
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
    # Seconds between the trainer's checkpoints (None: from the run's estimate, run_estimate.py).
    checkpoint_every_s: int | None = None
    # False: -c az was empty, so the deploy-time zone answers take the region's first zone that
    # offers the type (stacks/train/stack.py, stacks/preprocess/stack.py), whatever `az` says.
    az_chosen: bool = True
    # -c allowChange: a redeploy of a run may change its training values (stacks/train/run_record.py).
    allow_change: bool = False
    # Every key of KEYS as the deploy got it (cdk.json's default or -c): runs/<run>/config.json.
    context: tuple[tuple[str, Any], ...] = ()

    @property
    def runs_prefix(self) -> str:
        return f"runs/{self.run}/"

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
        }

    @classmethod
    def from_context(cls, context: Mapping[str, Any]) -> "FleetConfig":
        """Validate every key; the first bad one raises ConfigError."""
        _reject_unknown_keys(context)
        get = _Getter(context)
        region = get("region", _matching(_REGION, "a region name such as us-east-1"))
        vpc_id = get("vpcId", _optional(_matching(_VPC_ID, "empty or a VPC id like vpc-0abc1234")))
        subnet_id = get(
            "subnetId",
            _optional(_matching(_SUBNET_ID, "empty or a subnet id like subnet-0abc1234")),
        )
        mode = get("benchmark", _benchmark_mode)
        recipe = get("recipe", _one_of(RECIPES))
        default_max_hours = benchmark.MAX_HOURS if mode else DEFAULT_MAX_HOURS
        if (vpc_id is None) != (subnet_id is None):
            key, value = ("subnetId", subnet_id) if vpc_id is None else ("vpcId", vpc_id)
            raise ConfigError(key, value, "vpcId and subnetId are given together or not at all")
        config = cls(
            region=region,
            az=get("az", _optional(_zone_of(region))) or f"{region}a",
            nodes=get("nodes", _integer(1, MAX_NODES)),
            gpu=get("instanceType", _gpu_type(DEFAULT_FLEET_TYPE)),
            vpc_id=vpc_id,
            subnet_id=subnet_id,
            ami=get(
                "ami",
                _optional(
                    _matching(
                        _AMI_ID, "empty (the image ImageStack bakes) or an AMI id like ami-0abc1234"
                    )
                ),
            ),
            image_test=get("imageTestInstanceType", _gpu_type(DEFAULT_PROOF_TYPE)),
            image_revision=get("imageRevision", _integer(0, 100000)),
            dataset_bucket=get("datasetBucket", _optional(_matching(_BUCKET, "an S3 bucket name"))),
            dataset_prefix=get(
                "datasetPrefix", _matching(_PREFIX, "a key prefix ending in '/', like tfrecords/")
            ),
            run=get(
                "run",
                _matching(
                    _RUN, "1-40 lowercase letters, digits and inner hyphens, like resnet50-1"
                ),
            ),
            recipe=recipe,
            epochs=get("epochs", _optional(_integer(1, 1000))),
            batch_per_gpu=get("batchPerGpu", _optional(_integer(1, 4096)))
            or DEFAULT_BATCH_PER_GPU[recipe],
            arch=get("arch", _one_of(ARCHS)),
            image_size=get("imageSize", _integer(32, 1024)),
            max_hours=get("maxHours", _optional(_number(1, 168))) or default_max_hours,
            max_restarts=get("maxRestarts", _integer(0, 20)),
            market=get("market", _one_of(MARKETS)),
            preprocess=get("preprocessInstanceType", _burstable_type),
            data_volume_gib=get(
                "dataVolumeGiB", _integer(MIN_DATA_VOLUME_GIB, MAX_DATA_VOLUME_GIB)
            ),
            budget_email=get(
                "budgetEmail", _optional(_matching(_EMAIL, "empty or an e-mail address"))
            ),
            notify_email=get(
                "notifyEmail", _optional(_matching(_EMAIL, "empty or an e-mail address"))
            ),
            snapshot_data_volume=get("snapshotDataVolume", _boolean),
            download_secret_arn=get(
                "downloadSecretArn",
                _optional(
                    _matching(
                        _SECRET_ARN,
                        "empty or a full Secrets Manager secret ARN, ending in the 6 random "
                        "characters after the name (arn:aws:secretsmanager:REGION:ACCOUNT:"
                        "secret:NAME-AbCdEf)",
                    )
                ),
            ),
            eval_every=get("evalEvery", _integer(1, 1000)),
            target_top1=get("targetTop1", _optional(_top1)),
            capacity_reservation=get("capacityReservationId", _optional(_capacity_reservation)),
            benchmark=mode,
            image_jit=get("imageJitInstanceType", _optional(_jit_proof_type)),
            checkpoint_every_s=get(
                "checkpointEveryS", _optional(_integer(MIN_CHECKPOINT_EVERY_S, 86400))
            ),
        )
        nodes = config.nodes
        config = replace(
            config,
            min_nodes=get("minNodes", _optional(_integer(1, nodes))) or max(1, nodes - 1),
            az_chosen=context.get("az") not in (None, ""),
            allow_change=get("allowChange", _optional(_boolean)) or False,
            context=tuple((key, context.get(key)) for key in KEYS),
        )
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
        if not config.az_chosen and (config.vpc_id or config.capacity_reservation):
            fixed_by = "subnetId" if config.vpc_id else "capacityReservationId"
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
        return config


Parser = Callable[[Any], Any]


class _Getter:
    """Applies a parser to one context value and turns its complaint into a ConfigError."""

    def __init__(self, context: Mapping[str, Any]) -> None:
        self._context = context

    def __call__(self, key: str, parse: Parser) -> Any:
        value = self._context.get(key)
        try:
            return parse(value)
        except _Invalid as invalid:
            raise ConfigError(key, value, str(invalid)) from None


class _Invalid(ValueError):
    """Raised by a parser with the text that says what is allowed."""


def _reject_unknown_keys(context: Mapping[str, Any]) -> None:
    # CDK's own keys contain ':' or '@' or '-'; a plain camelCase key is meant for this app,
    # and a typo such as `-c node=8` must not silently deploy the default fleet.
    for key in context:
        if re.fullmatch(r"[a-z][A-Za-z0-9]*", key) and key not in KEYS:
            close = difflib.get_close_matches(key, KEYS, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise ConfigError(key, context[key], f"{hint}known keys: {', '.join(KEYS)}")


def _integer(low: int, high: int) -> Parser:
    allowed = f"an integer from {low} to {high}"

    def parse(value: Any) -> int:
        if isinstance(value, bool):
            raise _Invalid(allowed)
        if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
            value = int(value)
        if not isinstance(value, int) or not low <= value <= high:
            raise _Invalid(allowed)
        return value

    return parse


def _number(low: float, high: float) -> Parser:
    allowed = f"a number of hours from {low:g} to {high:g}"

    def parse(value: Any) -> float:
        if isinstance(value, bool):
            raise _Invalid(allowed)
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise _Invalid(allowed) from None
        if not math.isfinite(number) or not low <= number <= high:
            raise _Invalid(allowed)
        return number

    return parse


def _top1(value: Any) -> float:
    allowed = "empty (train every epoch) or a top-1 accuracy in (0, 1], like 0.759"
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        raise _Invalid(allowed) from None
    if not 0 < number <= 1:  # nan fails too
        raise _Invalid(allowed)
    return number


def _boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise _Invalid("true or false")


def _benchmark_mode(value: Any) -> str | None:
    if isinstance(value, bool):
        value = str(value).lower()
    if isinstance(value, str) and value.strip().lower() in benchmark.MODES:
        return benchmark.MODES[value.strip().lower()]
    raise _Invalid(
        "false, true (or synthetic: generated images through the host-to-device copy) "
        "or data (the local TFRecords)"
    )


def _matching(pattern: re.Pattern[str], allowed: str) -> Parser:
    def parse(value: Any) -> str:
        if not isinstance(value, str) or not pattern.fullmatch(value) or ".." in value:
            raise _Invalid(allowed)
        return value

    return parse


def _optional(parse: Parser) -> Parser:
    def parse_optional(value: Any) -> Any:
        return None if value is None or value == "" else parse(value)

    return parse_optional


def _one_of(choices: tuple[str, ...]) -> Parser:
    def parse(value: Any) -> str:
        if value not in choices:
            raise _Invalid(" or ".join(choices))
        return value

    return parse


# The zones of the regions that sell p4d and p5, by their letters: as many as the region has AZ
# IDs (use1-az1 to use1-az6 in us-east-1), from AWS's list of Availability Zones,
# https://docs.aws.amazon.com/global-infrastructure/latest/regions/aws-availability-zones.html.
# Other regions are checked by shape only; CloudFormation names a zone they lack at deploy.
ZONE_LETTERS: dict[str, str] = {"us-east-1": "abcdef", "us-east-2": "abc", "us-west-2": "abcd"}
# ... and the prefix of their zone IDs (AZ IDs): the region code shortened to its letters and
# number, then -az and a number (same page: euw1-az1 to euw1-az3 in eu-west-1), numbered from 1
# to as many as the region has zones (use1-az1 to use1-az6). A zone ID is the same physical
# zone in every account, while a zone name may be a different zone in each account,
# https://docs.aws.amazon.com/global-infrastructure/latest/regions/az-ids.html. The zone check
# turns an ID into this account's zone name at deploy (DescribeAvailabilityZones).
ZONE_ID_PREFIXES: dict[str, str] = {"us-east-1": "use1", "us-east-2": "use2", "us-west-2": "usw2"}
_ZONE_ID = re.compile(r"([a-z]+\d+)-az(\d+)")


def is_zone_id(az: str) -> bool:
    """`use1-az4` (a zone ID), not `us-east-1d` (a zone name)."""
    return _ZONE_ID.fullmatch(az) is not None


def _zone_of(region: str) -> Parser:
    letters = ZONE_LETTERS.get(region)
    prefix = ZONE_ID_PREFIXES.get(region)
    if letters and prefix:
        allowed = (
            f"a zone of region {region} ({region}{letters[0]} to {region}{letters[-1]}) "
            f"or its zone ID ({prefix}-az1 to {prefix}-az{len(letters)})"
        )
    else:  # by shape: the region's name and a letter, or a zone ID like the region's
        allowed = (
            f"a zone of region {region}, like {region}a, or its zone ID "
            "(<region prefix>-az<number>, as use1-az4 is in us-east-1)"
        )

    def parse(value: Any) -> str:
        if not isinstance(value, str):
            raise _Invalid(allowed)
        name = re.fullmatch(re.escape(region) + r"[a-z]", value)
        if name and (letters is None or value[-1] in letters):
            return value
        zone_id = _ZONE_ID.fullmatch(value)
        if zone_id and prefix is not None:
            if zone_id.group(1) == prefix and 1 <= int(zone_id.group(2)) <= len(letters or ""):
                return value
        elif zone_id:  # a region outside the tables: the prefix starts and ends as it does
            zone_prefix, number = zone_id.group(1), int(zone_id.group(2))
            ends = region.rsplit("-", 1)[-1]
            if zone_prefix.startswith(region[:2]) and zone_prefix.endswith(ends) and number >= 1:
                return value
        raise _Invalid(allowed)

    return parse


def _gpu_type(successor: str) -> Parser:
    """A type of GPU_TYPES; a retired or undrivable one is named as such, with what to use."""

    def parse(value: Any) -> GpuType:
        if isinstance(value, str) and value in GPU_TYPES:
            return GPU_TYPES[value]
        shape = _INSTANCE_TYPE.fullmatch(value) if isinstance(value, str) else None
        family = shape and shape.group(1) + shape.group(2)
        if family in RETIRED_FAMILIES:
            raise _Invalid(f"a type AWS still sells: {RETIRED_FAMILIES[family]}; use {successor}")
        if family in UNDRIVABLE_FAMILIES:
            raise _Invalid(f"a type this image can drive: {UNDRIVABLE_FAMILIES[family]}")
        known = ", ".join(GPU_TYPES)
        if shape and shape.group(1) not in ("p", "g"):
            raise _Invalid(f"a GPU instance type ({value} has no GPU): {known}")
        raise _Invalid(f"a known GPU instance type: {known}")

    return parse


def _jit_proof_type(value: Any) -> JitProofType:
    if isinstance(value, str) and value in JIT_PROOF_TYPES:
        return JIT_PROOF_TYPES[value]
    raise _Invalid(
        "empty (no JIT proof) or a type whose GPUs TensorFlow 2.15.1 JIT-compiles for "
        f"(H100, H200: compute capability 9.0): {', '.join(JIT_PROOF_TYPES)}"
    )


def _burstable_type(value: Any) -> BurstableType:
    if isinstance(value, str) and value in BURSTABLE_TYPES:
        return BURSTABLE_TYPES[value]
    raise _Invalid(f"a t2/t3 instance type: {', '.join(BURSTABLE_TYPES)}")


@dataclass(frozen=True)
class CapacityReservation:
    """Where the fleet launches: an On-Demand Capacity Reservation or a Capacity Block for ML."""

    id: str
    block: bool


def _capacity_reservation(value: Any) -> CapacityReservation:
    if not isinstance(value, str) or not _CAPACITY_RESERVATION.fullmatch(value):
        raise _Invalid(
            "empty, an On-Demand Capacity Reservation id like cr-0123456789abcdef0, or "
            "block:cr-0123456789abcdef0 for a Capacity Block for ML"
        )
    return CapacityReservation(id=value.removeprefix("block:"), block=value.startswith("block:"))
