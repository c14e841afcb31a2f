"""The run's records the run controller reads and writes in S3 (docs/contracts.md, "A run as it
goes"): DONE.json, attempts.json, controller.json and the launch assignments, and what it reads
of the nodes' (heartbeats, status.json, checkpoints, logs). Every write of the controller goes
through this module. status.json is the leader's alone: the controller only reads it, and says
what it does in its own controller.json (`update_controller`), which `horovod-fleet status`
shows beside it, so neither writer's document can overwrite the other's.

Failures are loud: only a missing key (404 NoSuchKey) reads as absent. The controller's role may
list the bucket without a prefix condition, so S3 answers a missing key with 404, not 403: "If
you have the s3:ListBucket permission on the bucket, Amazon S3 returns an HTTP status code 404
(Not Found) error. If you don't have the s3:ListBucket permission, Amazon S3 returns an HTTP
status code 403" (https://docs.aws.amazon.com/AmazonS3/latest/API/API_GetObject.html). So a 403
(a permission, a KMS key the role may not use) fails the tick or the step, never drops a record.

Records are rewritten only as they were read: If-Match on the ETag read, If-None-Match: * for one
that was not there (https://docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-writes.html).
A write that finds the record changed (412 Precondition Failed, or 409 ConditionalRequestConflict
for a concurrent one) reads it again and applies its change to what is there now.
Only boto3 and the standard library: part of the run controller's Lambda asset.
"""

import json
from collections.abc import Callable

from botocore.exceptions import ClientError

FORMAT = "horovod-fleet/attempts/1"
ABSENT_KEY_CODES = ("NoSuchKey", "404")
CHANGED_CODES = ("PreconditionFailed", "412", "ConditionalRequestConflict", "409")
# A record rewritten by this many writers at once, each one after the other, still converges.
WRITE_TRIES = 8


class RecordChanged(Exception):
    """A record kept changing under the controller's conditional writes."""


def key(run: str, name: str) -> str:
    return f"runs/{run}/{name}"


def code_of(error: ClientError) -> str:
    return error.response.get("Error", {}).get("Code", "")


def read(s3, bucket: str, name: str) -> tuple[dict | None, str | None]:
    """The JSON document at `name` and its ETag; (None, None) when there is no such key. A
    document that is not a JSON object is absent too, but keeps its ETag, so a write replaces
    exactly it."""
    try:
        got = s3.get_object(Bucket=bucket, Key=name)
    except ClientError as error:
        if code_of(error) in ABSENT_KEY_CODES:
            return None, None
        raise
    etag = got["ETag"]
    try:
        document = json.loads(got["Body"].read())
    except ValueError:
        return None, etag
    return (document if isinstance(document, dict) else None), etag


def read_json(s3, bucket: str, name: str) -> dict | None:
    return read(s3, bucket, name)[0]


def put(s3, bucket: str, name: str, document: dict, etag: str | None) -> bool:
    """Write `document` where the record is still as read (its `etag`; None: where there is
    none). False when it changed since."""
    condition = {"IfMatch": etag} if etag else {"IfNoneMatch": "*"}
    try:
        s3.put_object(
            Bucket=bucket,
            Key=name,
            Body=json.dumps(document, indent=1, default=str).encode(),
            ContentType="application/json",
            **condition,
        )
    except ClientError as error:
        # If-Match on a key deleted since answers 404.
        if code_of(error) in CHANGED_CODES or (etag and code_of(error) in ABSENT_KEY_CODES):
            return False
        raise
    return True


def update(s3, bucket: str, name: str, change: Callable[[dict | None], dict | None]) -> dict:
    """Apply `change` to the record as it is now (None: there is none) and write the result,
    conditionally; on a conflict, read it again and apply `change` again. `change` returning
    None (or the same document) writes nothing. Returns the record as written or found."""
    for _ in range(WRITE_TRIES):
        document, etag = read(s3, bucket, name)
        changed = change(None if document is None else json.loads(json.dumps(document)))
        if changed is None or changed == document:
            return document or {}
        if put(s3, bucket, name, changed, etag):
            return changed
    raise RecordChanged(f"s3://{bucket}/{name} changed under {WRITE_TRIES} conditional writes")


def attempts_document(s3, bucket: str, run: str) -> dict:
    return read_json(s3, bucket, key(run, "attempts.json")) or {}


def entries(document: dict) -> list[dict]:
    return [e for e in document.get("attempts", []) if isinstance(e, dict)]


def attempts(s3, bucket: str, run: str) -> list[dict]:
    """The run controller's record of the run's ended attempts (attempts.json)."""
    return entries(attempts_document(s3, bucket, run))


def append_attempt(s3, bucket: str, run: str, entry: dict, max_restarts: int) -> dict:
    """Add the ended attempt's entry, unless the attempt is recorded already (by another tick:
    its entry stands). Returns the attempt's entry as recorded."""

    def add(document: dict | None) -> dict | None:
        document = document or {}
        if any(e.get("attempt") == entry["attempt"] for e in entries(document)):
            return None
        return {
            **document,
            "format": FORMAT,
            "run": run,
            "max_restarts": max_restarts,
            "attempts": [*entries(document), entry],
        }

    written = update(s3, bucket, key(run, "attempts.json"), add)
    return next(e for e in entries(written) if e.get("attempt") == entry["attempt"])


def record_failure(s3, bucket: str, run: str, failure: dict) -> None:
    """Add the controller's own failure to attempts.json's `controller_failures`, once per
    execution (and per `final` verdict)."""

    def add(document: dict | None) -> dict | None:
        document = document or {"format": FORMAT, "run": run, "attempts": []}
        seen = document.get("controller_failures", [])
        same = ("execution", "final")
        if any(all(f.get(k) == failure.get(k) for k in same) for f in seen):
            return None
        return {**document, "controller_failures": [*seen, failure]}

    update(s3, bucket, key(run, "attempts.json"), add)


def update_controller(s3, bucket: str, run: str, *, at: str, **fields) -> dict:
    """Merge `fields` into controller.json, whose only writer is the run controller."""

    def merge(document: dict | None) -> dict:
        return {**(document or {}), **fields, "updated_at": at}

    return update(s3, bucket, key(run, "controller.json"), merge)


def write_done(
    s3,
    bucket: str,
    run: str,
    *,
    attempt: int,
    status: str,
    cause: str,
    reason: str,
    at: str,
    earlier: list[dict],
) -> bool:
    """The DONE.json of an attempt whose nodes could not write one (a fleet reclaimed or lost
    without notice, a fleet gone silent, a relaunch given up), only where none is: a leader's
    late one is never overwritten by this, and this one is the attempt's record when it comes
    first. False when one was there. `earlier`: attempts.json's entries."""
    before = [e for e in earlier if (e.get("attempt") or 0) < attempt]
    done = {
        "run": run,
        "status": status,
        "cause": cause,
        "reason": reason,
        "written_by": "controller",
        "attempt": attempt,
        "attempts": [
            *({k: e.get(k) for k in ("attempt", "status", "cause", "reason")} for e in before),
            {"attempt": attempt, "status": status, "cause": cause, "reason": reason},
        ],
        "finished_at": at,
    }
    return put(s3, bucket, key(run, "DONE.json"), done, None)


def delete_done(s3, bucket: str, run: str, etag: str) -> bool:
    """Remove DONE.json if it is still the one read (If-Match, https://docs.aws.amazon.com/AmazonS3/latest/API/API_DeleteObject.html):
    an ended attempt's, which would end the next attempt's members at once. False when it was
    gone or replaced."""
    try:
        s3.delete_object(Bucket=bucket, Key=key(run, "DONE.json"), IfMatch=etag)
    except ClientError as error:
        if code_of(error) in CHANGED_CODES or code_of(error) in ABSENT_KEY_CODES:
            return False
        raise
    return True


def write_launch(s3, bucket: str, run: str, instance_id: str, assignment: dict) -> None:
    """A launched node's assignment, runs/<run>/launches/<instance-id>.json: which node it is.
    The node waits for it at boot (bootstrap/node/assignment.py). Written whole, unconditionally:
    an instance id is launched once, and a retried step writes the same document again."""
    s3.put_object(
        Bucket=bucket,
        Key=key(run, f"launches/{instance_id}.json"),
        Body=json.dumps(assignment, indent=1).encode(),
        ContentType="application/json",
    )


def claim_launch(s3, bucket: str, run: str, instance_id: str, assignment: dict) -> dict:
    """A replacement's launch assignment, written only where there is none (If-None-Match: *):
    a tick that found an earlier tick's instance by its token keeps that tick's assignment, its
    replacement number with it. The assignment as it stands."""
    name = key(run, f"launches/{instance_id}.json")
    if put(s3, bucket, name, assignment, None):
        return assignment
    return read_json(s3, bucket, name) or assignment


def hold(s3, bucket: str, run: str) -> dict | None:
    """An operator's hold on the run (runs/<run>/hold.json, `horovod-fleet hold`); None when
    there is none. The controller only reads it (watch/hold.py writes it)."""
    return read_json(s3, bucket, key(run, "hold.json"))


def listed(s3, bucket: str, prefix: str) -> list[dict]:
    """Every object under `prefix`: its Key and LastModified."""
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return [o for p in pages for o in p.get("Contents", [])]


def heartbeats(s3, bucket: str, run: str) -> dict:
    """When each node last rewrote its registration (runs/<run>/nodes/<node>.json), by S3's own
    clock (its LastModified): a node's heartbeat, whatever its own clock says."""
    prefix = key(run, "nodes/")
    return {
        o["Key"][len(prefix) : -len(".json")]: o["LastModified"]
        for o in listed(s3, bucket, prefix)
        if o["Key"].endswith(".json")
    }


def last_modified(s3, bucket: str, name: str):
    """When `name` was last written, by S3's clock (its listing, as the heartbeats are read:
    the controller may list the bucket, not read every object); None when there is no such
    key."""
    return next((o["LastModified"] for o in listed(s3, bucket, name) if o["Key"] == name), None)


def said_since(s3, bucket: str, run: str, kind: str, since) -> list[dict]:
    """The nodes' own records of `kind` (runs/<run>/failures/: a node's failure; interruptions/:
    its Spot notice; docs/contracts.md) that S3 took at or after `since` (this attempt's: an
    earlier attempt's are history), each as written."""
    prefix = key(run, f"{kind}/")
    newer = [o for o in listed(s3, bucket, prefix) if since is None or o["LastModified"] >= since]
    found = [read_json(s3, bucket, o["Key"]) for o in newer if o["Key"].endswith(".json")]
    return [doc for doc in found if doc is not None]


def assignments(s3, bucket: str, run: str) -> list[dict]:
    """Every launch assignment of the run (runs/<run>/launches/*.json), as written."""
    prefix = key(run, "launches/")
    found = [read_json(s3, bucket, o["Key"]) for o in listed(s3, bucket, prefix)]
    return [a for a in found if a is not None]


def note_replacement(s3, bucket: str, run: str, entry: dict, at: str) -> dict:
    """Add one per-node replacement try to controller.json's `replacements` (its number once)."""

    def add(document: dict | None) -> dict | None:
        document = document or {}
        tries = document.get("replacements") or []
        same = ("stack_id", "attempt", "node", "number")
        if any(all(t.get(k) == entry.get(k) for k in same) for t in tries):
            return None
        return {**document, "replacements": [*tries, entry], "updated_at": at}

    return update(s3, bucket, key(run, "controller.json"), add)


def assigned(s3, bucket: str, run: str) -> set[str]:
    """The instances the controller gave a launch assignment."""
    prefix = key(run, "launches/")
    return {o["Key"][len(prefix) : -len(".json")] for o in listed(s3, bucket, prefix)}


def newest_checkpoint(s3, bucket: str, run: str):
    """When the newest checkpoint of the run reached S3 (its .index is written last)."""
    indexes = [
        o for o in listed(s3, bucket, key(run, "model/checkpoints/")) if o["Key"].endswith(".index")
    ]
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
