"""DONE.json (docs/contracts.md), the record an attempt leaves: the head writes it last, also
on a failure, from this attempt's own figures (or a node, when it found the head lost).

One DONE.json per attempt: every node writes it with S3's conditional write (If-None-Match: *,
https://docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-writes.html), so when two
nodes race, the first record stays and the other answers 412 Precondition Failed. A record an
earlier attempt left (a redeploy of a finished run) is replaced only while it is unchanged
(If-Match: its ETag); a 409 ConditionalRequestConflict is retried, as the PutObject reference
says (https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutObject.html).
"""

from __future__ import annotations

import json
from pathlib import Path

from botocore.exceptions import ClientError

from bootstrap import aws
from bootstrap.lines import REASON_LIMIT, one_line, trim_reason
from bootstrap.node_config import TrainConfig
from bootstrap.records import allreduce_summary, goodput
from bootstrap.records import timeline as fleet_view
from bootstrap.records.files import this_attempts
from contract import runs
from contract.runs import parse_stamp_s, stamp_at


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
    written_by: str = "head",
    restarts: list[dict] | None = None,
    records: list[dict] | None = None,
    hosts: dict[str, list[dict]] | None = None,
) -> dict:
    """DONE.json per docs/contracts.md, every figure from this attempt: the trainer's when it
    wrote train.json / eval.json after outputs_since (when the restore was done: a restored file
    is new on disk but the previous attempt's), else the head's wall time and no epochs.
    `earlier` is the run controller's record of the attempts before this one (attempts.json),
    `steps` the seconds of each bootstrap step this attempt finished (its timeline), `cause` why
    it ended (contract/causes.py; None when it succeeded), `written_by` which node writes it,
    `restarts` the restarts in place of the writing node's bootstrap (bootstrap/node/attempt.py),
    `records` the phases records of this attempt's nodes (the fleet's view and goodput),
    `hosts` the instances the head's discovery saw, by address (naming the resets' hosts)."""
    succeeded = status == "succeeded"
    records = records or []
    earlier = earlier or []
    own = {
        "attempt": len(earlier) + 1,
        "status": status,
        "cause": cause,
        "reason": trim_reason(reason) if reason else None,
        **({"nodes": came_back(records)} if records else {}),
    }
    since = outputs_since or started
    evaluation = this_attempts(model_dir / "eval.json", since) if model_dir and succeeded else {}
    training = this_attempts(model_dir / "train.json", since) if model_dir else {}
    timeline = attempt_timeline(
        steps or {}, training, aws.s3_unreachable_s(started, now), records, cfg.startup_budget_s
    )
    figures = run_goodput(earlier, timeline, training, started, now)
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
        "attempt_started_at": stamp_at(started),
        "finished_at": stamp_at(now),
        "timeline": timeline,
        "resets": fleet_view.resets(training, records, hosts),
        **figures,
        "restarts": restarts or [],
        # The head's horovodrun restarts (bootstrap/head/head.py Head.start_again): the head adds
        # them to the record it writes.
        "training_restarts": [],
        "attempt": own["attempt"],
        "attempts": [
            *(
                {k: entry.get(k) for k in ("attempt", "status", "cause", "reason")}
                | ({"nodes": entry["nodes"]} if entry.get("nodes") else {})
                for entry in earlier
            ),
            own,
        ],
    }


def came_back(records: list[dict]) -> dict[str, dict]:
    """For every node of the attempt (its index, or "head"), from its phases record: its
    instance, how the run controller's relaunch brought it back (`came_back`: rebooted, started,
    replaced; null when it did not, as for the deployment's first attempt) and the bytes its
    data pull fetched (`pull_bytes`: 0 when it held the dataset whole; null when it pulls none,
    the head, or its pull has not ended)."""
    nodes = {}
    for record in records:
        pull = (record.get("phases") or {}).get("data_pull") or {}
        nodes[str(record.get("node"))] = {
            "instance_id": record.get("instance_id"),
            "came_back": record.get("came_back"),
            "pull_bytes": pull.get("bytes"),
        }
    return dict(sorted(nodes.items(), key=lambda item: (not item[0].isdigit(), item[0].zfill(6))))


def attempt_timeline(
    steps: dict[str, float],
    training: dict,
    s3_unreachable_s: float = 0.0,
    records: list[dict] | None = None,
    budget_s: dict | None = None,
) -> dict:
    """Where the attempt's time went: the bootstrap's steps (data pull, rendezvous, allreduce
    check, training, uploads, ...) and, from this attempt's train.json, the trainer's start-up
    (TensorFlow, the input pipeline, the first step's compilation), evaluation, checkpoints, the
    training steps themselves, and the time to the target; the seconds S3 did not answer this
    node (waiting on S3 is inside some step's seconds, or between steps); the fleet's view of
    the start-up (each phase's slowest node, from the nodes' phases records), this attempt's
    own lost seconds (goodput's buckets) and the estimate synthesis made of each phase."""
    records = records or []
    trainer = {}
    if training.get("duration_s") is not None:
        parts = {k: training.get(k) or 0.0 for k in ("startup_s", "evaluation_s", "checkpoint_s")}
        trainer = {**parts, "training_s": round(training["duration_s"] - sum(parts.values()), 1)}
        trainer["time_to_target_s"] = training.get("time_to_target_s")
    return {
        "steps_s": dict(steps),
        "trainer_s": trainer,
        "s3_unreachable_s": round(s3_unreachable_s, 1),
        "launched_at": fleet_view.stamp(fleet_view.launched_at(records)),
        "first_step_at": fleet_view.stamp(fleet_view.first_step_at(training, records)),
        "phases": fleet_view.fleet_phases(records),
        # The trainer's steps of this attempt: what goodput counts (and the run controller
        # copies into attempts.json for the next attempt's).
        "steps": {k: training.get(k) for k in ("start_step", "end_step", "step_s", "steps_redone")},
        "lost_s": goodput.attempt_lost(records, steps, training),
        "budget_s": budget_s,
    }


def run_goodput(
    earlier: list[dict], timeline: dict, training: dict, started: float, now: float
) -> dict:
    """DONE.json's goodput figures over the run: the earlier attempts as attempts.json holds
    them (an entry without the run controller's `launched_at` counts from its `started_at`),
    then this one (from its first launch, else its writer's start)."""
    attempts = goodput.from_entries(earlier)
    launched = timeline["launched_at"]
    first = timeline["first_step_at"]
    attempts.append(
        goodput.Attempt(
            ended_at=now,
            launched_at=parse_stamp_s(launched) if launched else started,
            first_step_at=parse_stamp_s(first) if first else None,
            start_step=training.get("start_step"),
            end_step=training.get("end_step"),
            step_s=training.get("step_s"),
            lost_s=timeline["lost_s"],
        )
    )
    return goodput.goodput(attempts, now)


def allreduce_busbw_gbps(check_log: Path) -> float | None:
    """The bus bandwidth the pre-training allreduce check measured (None: it did not run)."""
    try:
        summary = allreduce_summary.parse_summary(check_log.read_text(errors="replace"))
    except OSError:
        return None
    return summary["busbw_gbps"] if summary else None


def done_key(cfg: TrainConfig) -> str:
    return f"{cfg.runs_prefix}{runs.DONE}"


def read_done(s3, cfg: TrainConfig) -> dict | None:
    """DONE.json as it is in S3: {"doc", "body", "etag", "modified"}, or None while absent."""
    try:
        found = s3.get_object(Bucket=cfg.bucket, Key=done_key(cfg))
    except ClientError as exc:
        if exc.response["Error"]["Code"] in aws.ABSENT_KEY_CODES:
            return None
        raise
    body = found["Body"].read()
    try:
        doc = json.loads(body)
    except ValueError:
        doc = {}
    return {
        "doc": doc if isinstance(doc, dict) else {},
        "body": body,
        "etag": found["ETag"],
        "modified": found["LastModified"].timestamp(),
    }


def is_this_attempts(record: dict, started: float) -> bool:
    """Whether a DONE.json was written since this attempt began (an older one is an earlier
    attempt's); stamps and S3's LastModified have whole seconds."""
    return record["modified"] >= int(started)


def describe_record(cfg: TrainConfig, record: dict) -> str:
    doc = record["doc"]
    return (
        f"s3://{cfg.bucket}/{done_key(cfg)} already holds this attempt's record, written by "
        f"{doc.get('written_by') or 'an unknown writer'} (status {doc.get('status')}, cause "
        f"{doc.get('cause')})"
    )


# S3's answers to a conditional write that did not happen: the condition did not hold (412), the
# object If-Match named is gone, or a concurrent write to the key (409, retried).
NOT_WRITTEN = ("PreconditionFailed", "412", "NoSuchKey", "404", "ConditionalRequestConflict")
WRITE_TRIES = 5


class RecordTaken(RuntimeError):
    """This attempt's DONE.json was already written, by another node: it stands."""


def write_done(s3, cfg: TrainConfig, doc: dict, started: float) -> None:
    """Write DONE.json unless this attempt's record is already there (RecordTaken, naming who
    wrote it)."""
    body = json.dumps(doc, indent=2).encode()
    condition = {"IfNoneMatch": "*"}
    for _ in range(WRITE_TRIES):
        try:
            s3.put_object(
                Bucket=cfg.bucket, Key=done_key(cfg), Body=body,
                ContentType="application/json", **condition,
            )  # fmt: skip
            return
        except ClientError as exc:
            if exc.response["Error"]["Code"] not in NOT_WRITTEN:
                raise
        record = read_done(s3, cfg)
        if record is None:
            condition = {"IfNoneMatch": "*"}
        elif record["body"] == body:
            return  # this write landed; its answer was lost and the retry found it
        elif is_this_attempts(record, started):
            raise RecordTaken(f"{describe_record(cfg, record)}: not overwriting it")
        else:  # an earlier attempt's, replaced only as it was read
            condition = {"IfMatch": record["etag"]}
    raise RuntimeError(
        f"s3://{cfg.bucket}/{done_key(cfg)} changed under each of {WRITE_TRIES} conditional writes"
    )


def record_failure(s3, cfg: TrainConfig, doc: dict, started: float, log=aws.log) -> None:
    """write_done while reporting a failure: whatever happens is one line, never an error."""
    done = f"s3://{cfg.bucket}/{done_key(cfg)}"
    try:
        write_done(s3, cfg, doc, started)
        log(f"wrote {done} (status {doc['status']})")
    except RecordTaken as taken:
        log(str(taken))
    except Exception as exc:
        log(f"could not write {done}: {one_line(exc, REASON_LIMIT)}")


def clear_done(s3, cfg: TrainConfig, started: float) -> dict | None:
    """A rerun starts by removing the DONE.json an earlier attempt left, so nothing reacts to it
    (only as it was read: a record written meanwhile stays). Returns this attempt's record when
    one is there instead (a node found this head lost while systemd restarted it)."""
    while (record := read_done(s3, cfg)) is not None:
        if is_this_attempts(record, started):
            return record
        try:
            # Conditional deletes: https://docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-deletes.html
            s3.delete_object(Bucket=cfg.bucket, Key=done_key(cfg), IfMatch=record["etag"])
            return None
        except ClientError as exc:
            if exc.response["Error"]["Code"] not in NOT_WRITTEN:
                raise
    return None
