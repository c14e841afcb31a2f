"""What an attempt leaves on the record: its logs in S3, and DONE.json (docs/contracts.md), which
the leader writes last, also on a failure, from this attempt's own figures."""

from __future__ import annotations

import json
from pathlib import Path

from bootstrap import allreduce_check, aws
from bootstrap.failures import trim_reason
from bootstrap.node_config import TrainConfig
from bootstrap.rendezvous import utc_stamp


def upload_logs(s3, cfg: TrainConfig, policy: aws.RetryPolicy | None = None) -> None:
    logs = Path(cfg.log_dir)
    names = [p.name for p in logs.glob("*.log")] if logs.is_dir() else []
    aws.upload(
        s3, cfg.bucket, f"{cfg.runs_prefix}logs/node-{cfg.node_index}/", logs, names,
        f"uploading {logs}", policy,
    )  # fmt: skip


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def this_attempts(path: Path, started: float) -> dict:
    """A trainer output written by this attempt ({} for one a previous attempt left, restored
    from S3 with the checkpoints)."""
    try:
        if path.stat().st_mtime < started:
            return {}
    except OSError:
        return {}
    return read_json(path)


def done_document(
    cfg: TrainConfig,
    status: str,
    reason: str | None,
    model_dir: Path | None,
    now: float,
    started: float,
    outputs_since: float | None = None,
    earlier: list[dict] | None = None,
    steps: dict[str, float] | None = None,
    *,
    cause: str | None = None,
    written_by: str = "leader",
) -> dict:
    """DONE.json per docs/contracts.md, every figure from this attempt: the trainer's when it
    wrote train.json / eval.json after outputs_since (when the restore was done: a restored file
    is new on disk but the previous attempt's), else the leader's wall time and no epochs.
    `earlier` is the run controller's record of the attempts before this one (attempts.json),
    `steps` the seconds of each bootstrap step this attempt finished (its timeline), `cause` why
    it ended (bootstrap/causes.py; None when it succeeded), `written_by` which node writes it."""
    succeeded = status == "succeeded"
    earlier = earlier or []
    own = {
        "attempt": len(earlier) + 1,
        "status": status,
        "cause": cause,
        "reason": trim_reason(reason) if reason else None,
    }
    since = outputs_since or started
    evaluation = this_attempts(model_dir / "eval.json", since) if model_dir and succeeded else {}
    training = this_attempts(model_dir / "train.json", since) if model_dir else {}
    return {
        "run": cfg.run,
        "status": status,
        "cause": cause,
        "reason": trim_reason(reason) if reason else None,
        "written_by": written_by,
        "top1": evaluation.get("top1"),
        "top5": evaluation.get("top5"),
        "epochs": training.get("epochs", cfg.trainer.get("epochs") if succeeded else None),
        "duration_s": training.get("duration_s") or round(now - started, 1),
        "images_per_s": training.get("images_per_s") if succeeded else None,
        "end_to_end_images_per_s": training.get("end_to_end_images_per_s") if succeeded else None,
        "allreduce_busbw_gbps": allreduce_busbw_gbps(Path(cfg.log_dir) / "allreduce-check.log"),
        "target_top1": training.get("target_top1"),
        "reached_target_at_epoch": training.get("reached_target_at_epoch"),
        "time_to_target_s": training.get("time_to_target_s"),
        "finished_at": utc_stamp(now),
        "timeline": timeline(steps or {}, training),
        "attempt": own["attempt"],
        "attempts": [
            *(
                {k: entry.get(k) for k in ("attempt", "status", "cause", "reason")}
                for entry in earlier
            ),
            own,
        ],
    }


def timeline(steps: dict[str, float], training: dict) -> dict:
    """Where the attempt's time went: the bootstrap's steps (data pull, rendezvous, allreduce
    check, training, uploads, ...) and, from this attempt's train.json, the trainer's start-up
    (TensorFlow, the input pipeline, the first step's compilation), evaluation, checkpoints, the
    training steps themselves, and the time to the target."""
    trainer = {}
    if training.get("duration_s") is not None:
        parts = {k: training.get(k) or 0.0 for k in ("startup_s", "evaluation_s", "checkpoint_s")}
        trainer = {**parts, "training_s": round(training["duration_s"] - sum(parts.values()), 1)}
        trainer["time_to_target_s"] = training.get("time_to_target_s")
    return {"steps_s": dict(steps), "trainer_s": trainer}


def allreduce_busbw_gbps(check_log: Path) -> float | None:
    """The bus bandwidth the pre-training allreduce check measured (None: it did not run)."""
    try:
        summary = allreduce_check.parse_summary(check_log.read_text(errors="replace"))
    except OSError:
        return None
    return summary["busbw_gbps"] if summary else None


def write_done(s3, cfg: TrainConfig, doc: dict) -> None:
    s3.put_object(
        Bucket=cfg.bucket,
        Key=f"{cfg.runs_prefix}DONE.json",
        Body=json.dumps(doc, indent=2).encode(),
        ContentType="application/json",
    )


def clear_done(s3, cfg: TrainConfig) -> None:
    """A rerun starts by removing the previous attempt's DONE.json, so nothing reacts to it."""
    s3.delete_object(Bucket=cfg.bucket, Key=f"{cfg.runs_prefix}DONE.json")
