"""Every training node's logs, copied to s3://<bucket>/runs/<run>/logs/node-<index>/."""

from __future__ import annotations

from pathlib import Path

from bootstrap import aws, transfer
from bootstrap.node_config import TrainConfig


def upload_logs(s3, cfg: TrainConfig, policy: aws.RetryPolicy | None = None) -> None:
    logs = Path(cfg.log_dir)
    names = [p.name for p in logs.glob("*.log")] if logs.is_dir() else []
    transfer.upload(
        s3, cfg.bucket, f"{cfg.runs_prefix}logs/node-{cfg.node_index}/", logs, names,
        f"uploading {logs}", policy,
    )  # fmt: skip
