"""The run controller's recovery policy: when an attempt of a run ends, relaunch its fleet or let
the run end.

The workflow's Record step (steps.py) calls `end_attempt` for each ended attempt, then the
workflow (stacks/teardown/workflow.py) stops and starts the fleet's instances when the decision
is `relaunch` (in the rehearsal too: rehearsal/cloud.py runs the same state machine). Decisions
(docs/contracts.md, attempts.json), on DONE.json's `cause` (never on its reason, which is for
people): `relaunch` a failed or interrupted attempt that another one can get past, while
restarts remain and the hard cap leaves time for one;
`teardown` a finished run, or one that would fail the same way again; `stop` when restarts or
time are exhausted, or the stack is being deleted. Unknown causes are retried (as SkyPilot's
`max_restarts_on_errors` does): `maxRestarts` bounds what a deterministic one costs.
Only boto3 and the standard library: this file is part of the run controller's Lambda asset.
"""

import datetime

from clients import stamp
from records import FORMAT, key, read_json, update_controller, write_json

# The retry rule, keyed by DONE.json's `cause` (docs/contracts.md, "Causes"; the nodes write it,
# bootstrap/causes.py, and so does the run controller when it gives a relaunch up or writes the
# DONE.json of an attempt whose nodes could not). Another attempt on new
# instances cannot get past these: the same input, data, disk size or image fails the same way.
# Each names why, for attempts.json and the e-mail.
FINAL = {
    "trainer_input": "the trainer refused its input",
    "corrupt_shard": "a dataset shard in S3 is corrupt",
    "no_intact_checkpoint": "no checkpoint in S3 is intact",
    "disk_full": "the run does not fit the disk",
    "image_mismatch": "the node's image is not the one expected",
    "config_invalid": "the node's configuration is unusable",
    "no_capacity": "no zone had capacity for the fleet",
    "relaunch_refused": "EC2 refused the relaunch",
}
# Another attempt, on new hardware, may get past these. A cause not in either table (or a
# DONE.json without one) is `unknown`: retried, as SkyPilot's `max_restarts_on_errors` does.
RETRYABLE = (
    "node_lost", "nodes_missing", "node_unhealthy", "rank_killed", "collective_timeout",
    "stalled", "s3_unreachable", "interrupted", "corrupt_checkpoint", "unknown",
)  # fmt: skip
# A relaunch needs this much before the hard cap (boot, data pull, allreduce check, a first
# checkpoint): a shorter one would be cut off before it saved anything.
MIN_ATTEMPT = datetime.timedelta(minutes=30)


def final_cause(cause: str | None) -> str | None:
    """Why another attempt would fail the same way (DONE.json's `cause`), or None when it may
    not."""
    return FINAL.get(cause or "unknown")


def decide(
    done: dict,
    earlier: list[dict],
    *,
    max_restarts: int,
    now: datetime.datetime,
    deadline: datetime.datetime | None,
    deleting: bool,
) -> tuple[bool, str, str]:
    """(retryable, decision, why) for the attempt whose DONE.json is `done`."""
    if done.get("status") == "succeeded":
        return False, "teardown", "the run finished"
    if done.get("benchmark"):
        return False, "teardown", "a benchmark is not retried"
    if final := final_cause(done.get("cause")):
        return False, "teardown", f"not retryable: {final}"
    if deleting:
        return True, "stop", "the stack is being deleted"
    restarts = sum(entry.get("decision") == "relaunch" for entry in earlier)
    if restarts >= max_restarts:
        return True, "stop", f"restarts exhausted ({restarts} of maxRestarts {max_restarts})"
    if deadline is not None and now + MIN_ATTEMPT > deadline:
        return True, "stop", f"the hard cap at {stamp(deadline)} leaves no time for an attempt"
    return True, "relaunch", f"restart {restarts + 1} of {max_restarts}"


def end_attempt(
    s3,
    bucket: str,
    run: str,
    *,
    max_restarts: int,
    now: datetime.datetime,
    deadline: datetime.datetime | None = None,
    deleting: bool = False,
) -> dict | None:
    """Record the ended attempt in runs/<run>/attempts.json and return its entry; on `relaunch`
    remove DONE.json, which would end the next attempt's members as soon as they start.

    Idempotent: a DONE.json already recorded (same attempt) returns the recorded entry, so a
    retried event never counts an attempt twice. None when there is no DONE.json.
    """
    done = read_json(s3, bucket, key(run, "DONE.json"))
    if done is None:
        return None
    history = read_json(s3, bucket, key(run, "attempts.json")) or {}
    earlier = [e for e in history.get("attempts", []) if isinstance(e, dict)]
    number = done.get("attempt") or len(earlier) + 1
    if recorded := [e for e in earlier if e.get("attempt") == number]:
        return recorded[-1]
    retryable, decision, why = decide(
        done, earlier, max_restarts=max_restarts, now=now, deadline=deadline, deleting=deleting
    )
    status = read_json(s3, bucket, key(run, "status.json")) or {}
    entry = {
        "attempt": number,
        "started_at": status.get("attempt_started_at"),
        "ended_at": done.get("finished_at") or stamp(now),
        "status": done.get("status"),
        "cause": done.get("cause"),
        "reason": done.get("reason"),
        "epochs": done.get("epochs"),
        "retryable": retryable,
        "decision": decision,
        "why": why,
        "decided_at": stamp(now),
    }
    document = {**history, "format": FORMAT, "run": run, "max_restarts": max_restarts}
    document["attempts"] = [*earlier, entry]
    write_json(s3, bucket, key(run, "attempts.json"), document)
    if decision == "relaunch":
        s3.delete_object(Bucket=bucket, Key=key(run, "DONE.json"))
        update_controller(
            s3,
            bucket,
            run,
            at=stamp(now),
            phase="relaunching",
            attempt=number + 1,
            reason=f"{done.get('reason')} ({why})",
        )
    return entry
