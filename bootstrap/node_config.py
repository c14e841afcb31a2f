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
  heartbeat_timeout_s (120), checkpoint_sync_s (300).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_PATH = "/etc/horovod-fleet/node.json"


class ConfigError(ValueError):
    """A bad node.json; str() is the one line the scripts print."""


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
class TrainConfig(Common):
    run: str
    node_index: int
    nodes: int
    gpus_per_node: int
    instance_type: str
    efa: bool
    dataset_prefix: str
    runs_prefix: str
    rendezvous_timeout_s: float
    trainer: dict[str, Any] = field(hash=False)
    metrics: dict[str, Any] = field(hash=False)
    instance_store: bool
    ssh_port: int
    authorized_keys_file: str
    network_interface: str | None
    heartbeat_timeout_s: float
    checkpoint_sync_s: float

    @property
    def is_leader(self) -> bool:
        return self.node_index == 0

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
    def __init__(self, doc: dict[str, Any]):
        self.doc = doc

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = _MISSING) -> Any:
        if key not in self.doc:
            if default is _MISSING:
                raise ConfigError(f"node.json: missing key '{key}'")
            return default
        value = self.doc[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        # bool is an int in Python; never accept true where a count is meant.
        if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
            names = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
            raise ConfigError(f"node.json: key '{key}' must be {names}, got {value!r}")
        return value

    def text(self, key: str, default: Any = _MISSING, nullable: bool = False) -> Any:
        value = self.get(key, (str, type(None)) if nullable else str, default)
        if value is not None and not value.strip():
            raise ConfigError(f"node.json: key '{key}' must not be empty")
        return value

    def number(self, key: str, default: Any = _MISSING, minimum: float = 0) -> Any:
        value = self.get(key, (int, float), default)
        if value < minimum:
            raise ConfigError(f"node.json: key '{key}' must be >= {minimum}, got {value!r}")
        return value

    def integer(self, key: str, default: Any = _MISSING, minimum: int = 0) -> int:
        value = self.get(key, int, default)
        if value < minimum:
            raise ConfigError(f"node.json: key '{key}' must be >= {minimum}, got {value!r}")
        return value

    def prefix(self, key: str) -> str:
        value = self.text(key)
        if not value.endswith("/") or value.startswith("/"):
            raise ConfigError(f"node.json: key '{key}' must look like 'name/', got {value!r}")
        return value


def _common(r: _Reader) -> dict[str, Any]:
    signal = r.get("signal", (dict, type(None)), None)
    if signal is not None:
        sr = _Reader(signal)
        signal = Signal(stack=sr.text("stack"), resource=sr.text("resource"))
    return {
        "role": r.text("role"),
        "region": r.text("region"),
        "bucket": r.text("bucket"),
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
    role = r.text("role")
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
    if role != "train":
        raise ConfigError(f"node.json: key 'role' must be 'preprocess' or 'train', got {role!r}")
    nodes = r.integer("nodes", minimum=1)
    index = r.integer("node_index")
    if index >= nodes:
        raise ConfigError(f"node.json: key 'node_index' must be < nodes ({nodes}), got {index}")
    run = r.text("run")
    runs_prefix = r.prefix("runs_prefix")
    if runs_prefix != f"runs/{run}/":
        raise ConfigError(
            f"node.json: key 'runs_prefix' must be 'runs/{run}/', got {runs_prefix!r}"
        )
    trainer = r.get("trainer", dict)
    for key in ("epochs", "batch_per_gpu", "arch", "image_size"):
        _Reader(trainer).get(key, (int, str))
    metrics = r.get("metrics", dict)
    _Reader(metrics).text("namespace")
    if not isinstance(metrics.get("dimension"), dict) or not metrics["dimension"]:
        raise ConfigError("node.json: key 'metrics.dimension' must be an object like {'Run': run}")
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
        trainer=trainer,
        metrics=metrics,
        instance_store=r.get("instance_store", bool, True),
        ssh_port=r.integer("ssh_port", 22, minimum=1),
        authorized_keys_file=r.text("authorized_keys_file", "/root/.ssh/authorized_keys"),
        network_interface=r.text("network_interface", None, nullable=True),
        heartbeat_timeout_s=r.number("heartbeat_timeout_s", 120, minimum=1),
        checkpoint_sync_s=r.number("checkpoint_sync_s", 300, minimum=1),
    )


def load(path: str | Path = DEFAULT_PATH) -> PreprocessConfig | TrainConfig:
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"node.json: cannot read {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"node.json: {path} is not JSON: {exc}") from None
    return parse(doc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m bootstrap.node_config")
    parser.add_argument("--node-json", default=DEFAULT_PATH)
    parser.add_argument("key")
    args = parser.parse_args(argv)
    try:
        cfg = load(args.node_json)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not hasattr(cfg, args.key):
        print(f"error: node.json has no key '{args.key}' for role {cfg.role}", file=sys.stderr)
        return 2
    value = getattr(cfg, args.key)
    print("" if value is None else str(value).lower() if isinstance(value, bool) else value)
    return 0


if __name__ == "__main__":
    sys.exit(main())
