"""node.json, parsed once into a frozen dataclass and validated at the edge.

`python3 -m bootstrap.node_config [--node-json /etc/horovod-fleet/node.json] KEY` prints one
validated value for the shell scripts ("" for null, true/false); it needs only the standard
library, so it works before anything is installed. A bad document ends with one line naming the key.

Keys beyond docs/contracts.md, all optional, with the values a real instance needs as defaults;
the rehearsal sets them to run without a volume, root paths, IMDS or CloudWatch:
  install (true), log_dir ("/var/log/horovod-fleet"), state_dir ("/var/lib/horovod-fleet"),
  ip / instance_id (null: ask IMDS), poll_interval_s (10),
  preprocess only: raw_wait_s (86400: how long to wait for the raw archives in S3),
  train only: instance_store (true: RAID0 the NVMe instance store at mount_point),
  ssh_port (22), authorized_keys_file ("/root/.ssh/authorized_keys"), network_interface (null),
  heartbeat_timeout_s (120), collective_timeout_s (120: how long a rank waits on a peer in a
  Gloo collective before the attempt fails, see docs/faults-and-recovery.md),
  checkpoint_sync_s (60: what a crash can lose on top of the epoch
  in progress, see docs/faults-and-recovery.md), status_every_s (15: how often the head rewrites status.json
  while the trainer runs),
  gpudirect (false; true: GPUDirect RDMA over EFA, so FI_EFA_USE_DEVICE_RDMA=1 and the allreduce
  check requires GDRDMA connections), allreduce_floor_gbps (0: no floor),
  benchmark (null: train; docs/contracts.md), cost and notify_topic_arn (null: status.json
  without prices, no notifications),
  spot_notice_file (null: ask IMDS for the Spot interruption notice when market is "spot"; a
  path: the notice is that file's JSON once it exists, which is how a rehearsal interrupts),
  min_nodes (nodes - 1, at least 1), reset_limit (null: none) and elastic_timeout_s (120): the
  head's elastic horovodrun (docs/contracts.md), which stacks/ writes into every node's node.json,
  launched_at (null: ask EC2's DescribeInstances when the instance was launched; a
  YYYY-MM-DDTHH:MM:SSZ stamp: that, which is how a rehearsal's node process says it started),
  startup_budget_s (null, or synthesis's estimate of each start-up phase in seconds, which
  DONE.json's timeline carries beside the measured ones: docs/contracts.md).
"""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bootstrap.cli import OneLineErrorParser, usage_error
from contract import causes, runs
from contract.fleet import default_min_nodes

DEFAULT_PATH = "/etc/horovod-fleet/node.json"

# trainer/config.py's ARCHS, mirrored: bootstrap runs before the trainer's dependencies are
# installed, so it never imports trainer/ (a test keeps the two equal).
TRAINER_ARCHS = ("resnet50", "resnet18")
TRAINER_RECIPES = ("goyal", "fast")  # trainer/recipes.py RECIPES
# S3's rules for bucket names: S3 refuses any other name, so one in node.json is a typo.
BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
REGION_NAME = re.compile(r"[a-z]{2}(-[a-z]+)+-\d+")
STAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


# Horovod's own 30 s made any pause of a rank over 30 s (a stopped process, a host or network
# hiccup) cost a whole attempt; a peer that is really gone costs this much waiting instead. Well
# under the progress watchdog's 10 minutes, so a timeout, which names the peer, ends it first.
# Whole seconds: Horovod reads the value as an integer.
COLLECTIVE_TIMEOUT_S = 120
# How long the head's elastic driver waits for enough slots (HOROVOD_ELASTIC_TIMEOUT); stacks/
# writes its own (stacks/train/stack.py ELASTIC_TIMEOUT_S says why).
ELASTIC_TIMEOUT_S = 120
ROLES = ("preprocess", "train", "head")


class ConfigError(ValueError):
    """A bad node.json; str() is the one line the scripts print."""

    cause = causes.CONFIG_INVALID


@dataclass(frozen=True)
class Signal:
    stack: str
    resource: str


@dataclass(frozen=True)
class Common:
    role: str
    region: str
    bucket: str
    log_group: str | None
    project: str
    signal: Signal | None
    mount_point: str
    install: bool
    log_dir: str
    state_dir: str
    ip: str | None
    instance_id: str | None
    poll_interval_s: float


@dataclass(frozen=True)
class PreprocessConfig(Common):
    raw_prefix: str
    output_prefix: str
    volume_id: str | None
    download_secret_arn: str | None
    raw_wait_s: float
    train_shards: int
    val_shards: int
    stop_when_done: bool


@dataclass(frozen=True)
class BenchmarkSize:
    nodes: int  # the first `nodes` nodes of the hostfile
    ranks: int  # spread evenly over them


@dataclass(frozen=True)
class Benchmark:
    """node.json `benchmark`: node 0 measures these sizes instead of training."""

    mode: str  # "synthetic" (generated images, copied host to device) or "data" (TFRecords)
    sizes: tuple[BenchmarkSize, ...]
    warmup_steps: int
    timed_steps: int


BENCHMARK_MODES = ("synthetic", "data")
# How the stacks buy the fleet (-c market): a Spot node watches for its interruption notice.
MARKETS = ("on-demand", "spot")


@dataclass(frozen=True)
class TrainConfig(Common):
    run: str
    # None: a node the run controller launched from the replacement template, which reads its
    # index at boot from its launch assignment (bootstrap/node/assignment.py, with_node_index).
    node_index: int | None
    nodes: int
    gpus_per_node: int
    instance_type: str
    efa: bool
    dataset_prefix: str
    runs_prefix: str
    rendezvous_timeout_s: float
    trainer: dict[str, Any] = field(hash=False)
    metrics: dict[str, Any] = field(hash=False)
    image: dict[str, str] = field(hash=False)
    instance_store: bool
    ssh_port: int
    authorized_keys_file: str
    network_interface: str | None
    heartbeat_timeout_s: float
    checkpoint_sync_s: float
    gpudirect: bool
    allreduce_floor_gbps: float
    benchmark: Benchmark | None
    # What status.json carries for the `horovod-fleet` command (docs/contracts.md): the price
    # and hard cap {"usd_per_hour", "prices_as_of", "max_hours"}, and the run's SNS topic.
    cost: dict[str, Any] | None = field(default=None, hash=False)
    notify_topic_arn: str | None = None
    status_every_s: float = 15.0
    market: str = "on-demand"
    spot_notice_file: str | None = None
    collective_timeout_s: int = COLLECTIVE_TIMEOUT_S
    # The head's elastic horovodrun: a reset trains on at least min_nodes nodes, an attempt
    # allows reset_limit resets (None: no limit), the driver waits elastic_timeout_s for slots.
    min_nodes: int = 1
    reset_limit: int | None = None
    elastic_timeout_s: float = ELASTIC_TIMEOUT_S
    launched_at: str | None = None
    startup_budget_s: dict[str, float] | None = field(default=None, hash=False)
    # node.json `drill` (docs/contracts.md): the head's schedule, read by bootstrap/head/drill.py.
    drill: dict[str, Any] | None = field(default=None, hash=False)

    @property
    def is_head(self) -> bool:
        """The fleet's head (role "head"): it runs horovodrun, no rank, and has no node index."""
        return self.role == "head"

    @property
    def node_name(self) -> str:
        """How the fleet's records name this instance: its node index, or "head"."""
        return "head" if self.is_head else str(self.node_index)

    @property
    def slots(self) -> int:
        # One Horovod rank per GPU; a CPU node (the rehearsal) runs one rank.
        return self.gpus_per_node or 1

    def trainer_flags(self) -> list[str]:
        """node.json `trainer` as trainer.train flags: batch_per_gpu is --batch-size, the
        rest map key_name -> --key-name; true is a bare flag, false/null are left out."""
        flags: list[str] = []
        for key, value in self.trainer.items():
            flag = "--batch-size" if key == "batch_per_gpu" else "--" + key.replace("_", "-")
            if value is True:
                flags.append(flag)
            elif value not in (False, None):
                flags += [flag, str(value)]
        return flags


_MISSING = object()


class _Reader:
    """Typed, checked access to one JSON object of node.json. `parent` is the object's own key,
    so a message names a nested key in full ('signal.stack'), not just its last part."""

    def __init__(self, doc: dict[str, Any], parent: str = ""):
        self.doc = doc
        self.parent = parent

    def name(self, key: str) -> str:
        return f"{self.parent}.{key}" if self.parent else key

    def fail(self, key: str, problem: str) -> ConfigError:
        return ConfigError(f"node.json: key '{self.name(key)}' {problem}")

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = _MISSING) -> Any:
        if key not in self.doc:
            if default is _MISSING:
                raise ConfigError(f"node.json: missing key '{self.name(key)}'")
            return default
        value = self.doc[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        # bool is an int in Python; never accept true where a count is meant.
        if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
            names = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
            raise self.fail(key, f"must be {names}, got {value!r}")
        return value

    def child(self, key: str, nullable: bool = False) -> _Reader | None:
        """A nested object (None for a null or absent nullable one)."""
        value = self.get(key, (dict, type(None)), None) if nullable else self.get(key, dict)
        return None if value is None else _Reader(value, self.name(key))

    def text(self, key: str, default: Any = _MISSING, nullable: bool = False) -> Any:
        value = self.get(key, (str, type(None)) if nullable else str, default)
        if value is not None and not value.strip():
            raise self.fail(key, "must not be empty")
        return value

    def number(self, key: str, default: Any = _MISSING, minimum: float = 0) -> Any:
        value = self.get(key, (int, float), default)
        # Python's json reads NaN and Infinity; NaN passes every comparison, inf never ends a wait.
        if not math.isfinite(value):
            raise self.fail(key, f"must be a finite number, got {value!r}")
        if value < minimum:
            raise self.fail(key, f"must be >= {minimum}, got {value!r}")
        return value

    def integer(
        self, key: str, default: Any = _MISSING, minimum: int = 0, maximum: int | None = None
    ) -> int:
        value = self.get(key, int, default)
        if value < minimum:
            raise self.fail(key, f"must be >= {minimum}, got {value!r}")
        if maximum is not None and value > maximum:
            raise self.fail(key, f"must be <= {maximum}, got {value!r}")
        return value

    def choice(self, key: str, allowed: tuple[str, ...], default: Any = _MISSING) -> str:
        value = self.text(key, default)
        if value not in allowed:
            raise self.fail(key, f"must be {' or '.join(map(repr, allowed))}, got {value!r}")
        return value

    def matching(self, key: str, pattern: re.Pattern, what: str) -> str:
        value = self.text(key)
        if not pattern.fullmatch(value):
            raise self.fail(key, f"must be {what}, got {value!r}")
        return value

    def prefix(self, key: str) -> str:
        value = self.text(key)
        if not value.endswith("/") or value.startswith("/"):
            raise self.fail(key, f"must look like 'name/', got {value!r}")
        return value


def _common(r: _Reader) -> dict[str, Any]:
    signal = r.child("signal", nullable=True)
    if signal is not None:
        signal = Signal(stack=signal.text("stack"), resource=signal.text("resource"))
    return {
        "role": r.text("role"),
        "region": r.matching("region", REGION_NAME, "an AWS region like 'us-east-1'"),
        "bucket": r.matching(
            "bucket", BUCKET_NAME, "an S3 bucket name: 3-63 lowercase letters, digits, '.' or '-'"
        ),
        "log_group": r.text("log_group", None, nullable=True),
        "project": r.text("project", "horovod-fleet"),
        "signal": signal,
        "mount_point": r.text("mount_point", "/data"),
        "install": r.get("install", bool, True),
        "log_dir": r.text("log_dir", "/var/log/horovod-fleet"),
        "state_dir": r.text("state_dir", "/var/lib/horovod-fleet"),
        "ip": r.text("ip", None, nullable=True),
        "instance_id": r.text("instance_id", None, nullable=True),
        "poll_interval_s": r.number("poll_interval_s", 10, minimum=0.1),
    }


def parse(doc: Any) -> PreprocessConfig | TrainConfig:
    """Validate a decoded node.json document; raises ConfigError naming the bad key."""
    if not isinstance(doc, dict):
        raise ConfigError("node.json: must be a JSON object")
    r = _Reader(doc)
    role = r.choice("role", ROLES)
    if role == "preprocess":
        return PreprocessConfig(
            **_common(r),
            raw_prefix=r.prefix("raw_prefix"),
            output_prefix=r.prefix("output_prefix"),
            volume_id=r.text("volume_id", nullable=True),
            download_secret_arn=r.text("download_secret_arn", None, nullable=True),
            raw_wait_s=r.number("raw_wait_s", 86400, minimum=0),
            train_shards=r.integer("train_shards", minimum=1),
            val_shards=r.integer("val_shards", minimum=1),
            stop_when_done=r.get("stop_when_done", bool),
        )
    nodes = r.integer("nodes", minimum=1)
    if role == "head" and "node_index" in doc:
        raise r.fail("node_index", "must be absent for the head, which is no node of the fleet")
    index = r.integer("node_index") if "node_index" in doc else None
    if index is not None:
        _check_index(r, index, nodes)
    run = r.text("run")
    runs_prefix = r.prefix("runs_prefix")
    if runs_prefix != runs.prefix(run):
        raise r.fail("runs_prefix", f"must be {runs.prefix(run)!r}, got {runs_prefix!r}")
    trainer = r.child("trainer")
    # The trainer's own limits, so a typo fails at boot, not after the rendezvous.
    if trainer.doc.get("epochs") is not None:  # null: the recipe's epochs
        trainer.integer("epochs", minimum=1)
    if trainer.doc.get("recipe") is not None:
        trainer.choice("recipe", TRAINER_RECIPES)
    trainer.integer("batch_per_gpu", minimum=1)
    trainer.integer("image_size", minimum=32)
    trainer.choice("arch", TRAINER_ARCHS)
    trainer.integer("eval_every", 1, minimum=1)
    image = r.child("image")
    for key in ("manifest", "ami", "tensorflow", "horovod"):
        image.text(key)
    metrics = r.child("metrics")
    metrics.text("namespace")
    if not isinstance(metrics.doc.get("dimension"), dict) or not metrics.doc["dimension"]:
        raise metrics.fail("dimension", "must be an object like {'Run': run}")
    return TrainConfig(
        **_common(r),
        run=run,
        node_index=index,
        nodes=nodes,
        gpus_per_node=r.integer("gpus_per_node"),
        instance_type=r.text("instance_type"),
        efa=r.get("efa", bool),
        dataset_prefix=r.prefix("dataset_prefix"),
        runs_prefix=runs_prefix,
        rendezvous_timeout_s=r.number("rendezvous_timeout_s", minimum=1),
        trainer=trainer.doc,
        metrics=metrics.doc,
        image=image.doc,
        instance_store=r.get("instance_store", bool, True),
        ssh_port=r.integer("ssh_port", 22, minimum=1, maximum=65535),
        authorized_keys_file=r.text("authorized_keys_file", "/root/.ssh/authorized_keys"),
        network_interface=r.text("network_interface", None, nullable=True),
        heartbeat_timeout_s=r.number("heartbeat_timeout_s", 120, minimum=1),
        checkpoint_sync_s=r.number("checkpoint_sync_s", 60, minimum=1),
        gpudirect=r.get("gpudirect", bool, False),
        allreduce_floor_gbps=r.number("allreduce_floor_gbps", 0, minimum=0),
        benchmark=_benchmark(r, nodes, r.integer("gpus_per_node")),
        cost=_cost(r),
        notify_topic_arn=r.text("notify_topic_arn", None, nullable=True),
        status_every_s=r.number("status_every_s", 15, minimum=1),
        market=r.choice("market", MARKETS, "on-demand"),
        spot_notice_file=r.text("spot_notice_file", None, nullable=True),
        collective_timeout_s=r.integer("collective_timeout_s", COLLECTIVE_TIMEOUT_S, minimum=1),
        min_nodes=r.integer("min_nodes", default_min_nodes(nodes), minimum=1, maximum=nodes),
        reset_limit=None if doc.get("reset_limit") is None else r.integer("reset_limit", minimum=1),
        elastic_timeout_s=r.number("elastic_timeout_s", ELASTIC_TIMEOUT_S, minimum=1),
        launched_at=r.matching("launched_at", STAMP, "a time like '2026-01-31T12:00:00Z'")
        if doc.get("launched_at") is not None
        else None,
        startup_budget_s=_budget(r),
        drill=None if doc.get("drill") is None else r.child("drill").doc,
    )


def _check_index(r: _Reader, index: int, nodes: int) -> None:
    if index >= nodes:
        raise r.fail("node_index", f"must be < nodes ({nodes}), got {index}")


def with_node_index(cfg: TrainConfig, index: Any, source: str) -> TrainConfig:
    """`cfg` as node `index`, which `source` (a launch assignment) named; checked as node.json's
    own `node_index` would be, the message naming `source`."""
    r = _Reader({"node_index": index})
    try:
        _check_index(r, r.integer("node_index"), cfg.nodes)
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("node.json", source, 1)) from None
    return replace(cfg, node_index=index)


def _budget(r: _Reader) -> dict[str, float] | None:
    budget = r.child("startup_budget_s", nullable=True)
    if budget is None:
        return None
    return {key: budget.number(key) for key in budget.doc}


def _cost(r: _Reader) -> dict[str, Any] | None:
    cost = r.child("cost", nullable=True)
    if cost is None:
        return None
    return {
        "usd_per_hour": cost.number("usd_per_hour", minimum=0),
        "prices_as_of": cost.text("prices_as_of"),
        "max_hours": cost.number("max_hours", minimum=0),
    }


def _benchmark(r: _Reader, nodes: int, gpus_per_node: int) -> Benchmark | None:
    """A size needs the nodes the fleet has and at most one rank per GPU; CPU nodes (the
    rehearsal) may run several ranks each."""
    b = r.child("benchmark", nullable=True)
    if b is None:
        return None
    sizes = b.get("sizes", list)
    if not sizes:
        raise b.fail("sizes", "must list at least one size")
    parsed = []
    for number, item in enumerate(sizes):
        if not isinstance(item, dict):
            raise b.fail(f"sizes[{number}]", f"must be an object, got {item!r}")
        size = _Reader(item, b.name(f"sizes[{number}]"))
        count = size.integer("nodes", minimum=1, maximum=nodes)
        ranks = size.integer("ranks", minimum=1)
        if ranks % count:
            raise size.fail("ranks", f"must be a multiple of nodes ({count}), got {ranks}")
        if gpus_per_node and ranks // count > gpus_per_node:
            raise size.fail(
                "ranks", f"must be at most {gpus_per_node} per node (one per GPU), got {ranks}"
            )
        parsed.append(BenchmarkSize(count, ranks))
    return Benchmark(
        mode=b.choice("mode", BENCHMARK_MODES),
        sizes=tuple(parsed),
        warmup_steps=b.integer("warmup_steps", minimum=1),
        timed_steps=b.integer("timed_steps", minimum=2),
    )


def load(path: str | Path = DEFAULT_PATH) -> PreprocessConfig | TrainConfig:
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"node.json: cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        byte = exc.object[exc.start]
        raise ConfigError(
            f"node.json: {path} is not UTF-8 text (byte 0x{byte:02x} at offset {exc.start})"
        ) from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"node.json: {path} is not JSON: {exc}") from None
    return parse(doc)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(prog="python3 -m bootstrap.node_config")
    parser.add_argument("--node-json", default=DEFAULT_PATH, help="the node's configuration")
    parser.add_argument("key")
    args = parser.parse_args(argv)
    try:
        cfg = load(args.node_json)
    except ConfigError as exc:
        return usage_error(str(exc))
    if not hasattr(cfg, args.key):
        return usage_error(f"node.json has no key '{args.key}' for role {cfg.role}")
    value = getattr(cfg, args.key)
    print("" if value is None else str(value).lower() if isinstance(value, bool) else value)
    return 0


if __name__ == "__main__":
    sys.exit(main())
