"""The run's records the run controller reads and writes in S3 (docs/contracts.md, "A run as it
goes"): DONE.json, attempts.json, controller.json and the launch assignments. Every write of the controller goes
through this module. status.json is the leader's alone: the controller only reads it, and says
what it does in its own controller.json (`update_controller`), which `horovod-fleet status`
shows beside it, so neither writer's document can overwrite the other's.
Only boto3 and the standard library: part of the run controller's Lambda asset.
"""

import json

from botocore.exceptions import ClientError

FORMAT = "horovod-fleet/attempts/1"
# How S3 answers a read of a missing key: 404, or 403 to a role whose ListBucket is
# prefix-conditioned (https://docs.aws.amazon.com/AmazonS3/latest/API/API_GetObject.html).
ABSENT_KEY_CODES = ("NoSuchKey", "404", "AccessDenied", "403")
# A conditional write (If-None-Match: *) that finds the key there: 412. A concurrent conditional
# write of the same key may get 409, and the object is there either way.
# https://docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-writes.html
EXISTS_CODES = ("PreconditionFailed", "412", "ConditionalRequestConflict", "409")


def key(run: str, name: str) -> str:
    return f"runs/{run}/{name}"


def read_json(s3, bucket: str, name: str) -> dict | None:
    try:
        body = s3.get_object(Bucket=bucket, Key=name)["Body"].read()
    except ClientError as error:
        if error.response["Error"].get("Code") in ABSENT_KEY_CODES:
            return None
        raise
    try:
        document = json.loads(body)
    except ValueError:
        return None
    return document if isinstance(document, dict) else None


def write_json(s3, bucket: str, name: str, document: dict, *, only_new: bool = False) -> bool:
    """Put `document`; with `only_new`, only where nothing is yet (If-None-Match: *). False when
    something was there."""
    condition = {"IfNoneMatch": "*"} if only_new else {}
    try:
        s3.put_object(
            Bucket=bucket,
            Key=name,
            Body=json.dumps(document, indent=1).encode(),
            ContentType="application/json",
            **condition,
        )
    except ClientError as error:
        if only_new and error.response["Error"].get("Code") in EXISTS_CODES:
            return False
        raise
    return True


def attempts(s3, bucket: str, run: str) -> list[dict]:
    """The run controller's record of the run's ended attempts (attempts.json)."""
    history = read_json(s3, bucket, key(run, "attempts.json")) or {}
    return [entry for entry in history.get("attempts", []) if isinstance(entry, dict)]


def current_attempt(s3, bucket: str, run: str) -> int:
    """The attempt under way: one more than the ended ones (a node reads it the same way)."""
    return max((e.get("attempt") or 0 for e in attempts(s3, bucket, run)), default=0) + 1


def update_controller(s3, bucket: str, run: str, *, at: str, **fields) -> dict:
    """Merge `fields` into controller.json, whose only writer is the run controller."""
    name = key(run, "controller.json")
    document = read_json(s3, bucket, name) or {}
    document.update(updated_at=at, **fields)
    write_json(s3, bucket, name, document)
    return document


def write_done(
    s3, bucket: str, run: str, *, attempt: int, status: str, cause: str, reason: str, at: str
) -> bool:
    """The DONE.json of an attempt whose nodes could not write one (a fleet reclaimed or lost
    without notice, a relaunch given up), only where none is: a leader's late one is never
    overwritten by this, and this one is the attempt's record when it comes first. False when
    one was there."""
    earlier = [e for e in attempts(s3, bucket, run) if (e.get("attempt") or 0) < attempt]
    done = {
        "run": run,
        "status": status,
        "cause": cause,
        "reason": reason,
        "written_by": "controller",
        "attempt": attempt,
        "attempts": [
            *({k: e.get(k) for k in ("attempt", "status", "cause", "reason")} for e in earlier),
            {"attempt": attempt, "status": status, "cause": cause, "reason": reason},
        ],
        "finished_at": at,
    }
    return write_json(s3, bucket, key(run, "DONE.json"), done, only_new=True)


def write_launch(s3, bucket: str, run: str, instance_id: str, assignment: dict) -> None:
    """A launched node's assignment, runs/<run>/launches/<instance-id>.json: which node it is.
    The node waits for it at boot (bootstrap/node/assignment.py); the same assignment written
    again by a retried step is the same document."""
    write_json(s3, bucket, key(run, f"launches/{instance_id}.json"), assignment)


def record_failure(s3, bucket: str, run: str, failure: dict) -> None:
    """Add the controller's own failure to attempts.json's `controller_failures`."""
    name = key(run, "attempts.json")
    history = read_json(s3, bucket, name) or {"format": FORMAT, "run": run, "attempts": []}
    history["controller_failures"] = [*history.get("controller_failures", []), failure]
    write_json(s3, bucket, name, history)


def newest_checkpoint(s3, bucket: str, run: str):
    """When the newest checkpoint of the run reached S3 (its .index is written last)."""
    pages = s3.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=key(run, "model/checkpoints/")
    )
    indexes = [o for p in pages for o in p.get("Contents", []) if o["Key"].endswith(".index")]
    return max((o["LastModified"] for o in indexes), default=None)


def missing_results(s3, bucket: str, run: str) -> list[str]:
    """What of the run's results (contracts.md) is not in S3 yet.

    A run whose DONE.json reports failure, or an interruption (its node was shut down and
    flushed what it had), may have ended before its first checkpoint, and a benchmark
    (DONE.json `benchmark` set) never writes one: their logs are all there is to keep, so
    waiting for a checkpoint would bill until the cap.
    """
    done = read_json(s3, bucket, key(run, "DONE.json")) or {}
    need_checkpoint = (
        newest_checkpoint(s3, bucket, run) is None
        and done.get("status") not in ("failed", "interrupted")
        and not done.get("benchmark")
    )
    logs = s3.list_objects_v2(Bucket=bucket, Prefix=key(run, "logs/"), MaxKeys=1)
    missing = [key(run, "model/checkpoints/*.index")] if need_checkpoint else []
    return missing + ([] if logs.get("KeyCount") else [key(run, "logs/")])
