"""Every instance's logs, copied to s3://<bucket>/runs/<run>/logs/node-<index>/ (a node's) or
logs/head/ (the head's, with horovodrun's: the training's table)."""

from __future__ import annotations

from pathlib import Path

from bootstrap import aws, transfer
from bootstrap.node_config import TrainConfig


def log_prefix(cfg: TrainConfig) -> str:
    return "head" if cfg.is_head else f"node-{cfg.node_index}"


def upload_logs(s3, cfg: TrainConfig, policy: aws.RetryPolicy | None = None) -> None:
    logs = Path(cfg.log_dir)
    names = [p.name for p in logs.glob("*.log")] if logs.is_dir() else []
    transfer.upload(
        s3, cfg.bucket, f"{cfg.runs_prefix}logs/{log_prefix(cfg)}/", logs, names,
        f"uploading {logs}", policy,
    )  # fmt: skip
