"""The run controller's recovery policy: when an attempt of a run ends, relaunch its fleet or let
the run end.

The tick (tick.py) records each ended attempt with `attempt_entry`, then starts the workflow
(stacks/teardown/workflow.py) that stops and starts the fleet's instances when the decision is
`relaunch` (in the rehearsal too: rehearsal/cloud.py runs the same tick and state machine). Decisions
(docs/contracts.md, attempts.json), on DONE.json's `cause` (never on its reason, which is for
people): `relaunch` a failed or interrupted attempt that another one can get past, while
restarts remain and the hard cap leaves time for one;
`teardown` a finished run, or one that would fail the same way again; `stop` when restarts or
time are exhausted, or the stack is being deleted. Unknown causes are retried (as SkyPilot's
`max_restarts_on_errors` does): `maxRestarts` bounds what a deterministic one costs.
Pure: the tick reads the world and writes the records (decide.py, act.py).
Only the standard library: this file is part of the run controller's Lambda asset.
"""

import datetime

from clients import stamp

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
# How each instance of the fleet comes back for the next attempt (docs/contracts.md, DONE.json's
# `attempts` entries' `came_back`; docs/faults-and-recovery.md, "Recovery"): rebooted in place
# (its instance store, addresses and billing period kept; no capacity asked for), stopped and
# started (EC2 puts it on a healthy host, with empty instance stores), or replaced by a new
# instance from its launch template.
REBOOTED, STARTED, REPLACED = "rebooted", "started", "replaced"
# A node's own failure with one of these causes (its runs/<run>/failures/<index>.json) says its
# instance is suspect (a GPU, EFA or boot check failed, its disk filled, its image is not the
# one expected): it does not come back in place. The other causes name no hardware: a node lost
# or silent, a stalled or timed-out collective, a killed rank, S3, a shutdown.
NAMING_CAUSES = frozenset({"node_unhealthy", "disk_full", "image_mismatch"})
# The states in which EC2 ended the instance: it cannot come back.
ENDED_STATES = ("shutting-down", "terminated")
# A relaunch needs this much before the hard cap (boot, data pull, allreduce check, a first
# checkpoint): a shorter one would be cut off before it saved anything.
MIN_ATTEMPT = datetime.timedelta(minutes=30)


def way_back(node: dict | None, check: dict | None, named: str | None) -> tuple[str, str]:
    """(how the instance `node` comes back, why), from EC2's own view of it (`node`: its state
    and market, ec2_fleet.nodes; `check`: its status checks and scheduled events,
    ec2_fleet.checks) and from what the ended attempt says of it (`named`: why a record of the
    attempt names it, or None). A node that runs, passes its checks, has no event scheduled and
    is not named is rebooted in place; one that is stopped, impaired, scheduled or named is
    stopped and started on demand, and replaced on Spot (a one-time Spot Instance cannot be
    stopped); one EC2 ended is replaced."""
    if node is None or node["state"] in ENDED_STATES:
        return REPLACED, "EC2 ended its instance" if node else "no instance serves it"
    check = check or {}
    trouble = [
        *([f"its instance is {node['state']}"] if node["state"] != "running" else []),
        *(f"EC2's {kind} status check is impaired" for kind in ("system", "instance")
          if check.get(kind) == "impaired"),
        *(f"EC2 scheduled {event}" for event in check.get("events") or []),
        *([named] if named else []),
    ]  # fmt: skip
    if not trouble:
        return REBOOTED, "it runs, passes EC2's status checks and is not named by the attempt"
    if node["spot"]:
        return REPLACED, "; ".join(trouble) + " (a Spot Instance cannot be stopped)"
    return STARTED, "; ".join(trouble)


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


# What the attempt's DONE.json says of its time (docs/contracts.md, "Start-up, resets and
# goodput"), kept in its attempts.json entry, where bootstrap/head/goodput.py reads the earlier
# attempts: a relaunch deletes the DONE.json. Its timeline's fields, and its steps' four.
TIMELINE_FIELDS = ("launched_at", "first_step_at", "lost_s")
STEPS_FIELDS = ("start_step", "end_step", "step_s", "steps_redone")


def attempt_entry(
    done: dict,
    earlier: list[dict],
    *,
    max_restarts: int,
    now: datetime.datetime,
    deadline: datetime.datetime | None,
    started_at: str | None,
    stack_id: str,
    deleting: bool = False,
) -> dict:
    """attempts.json's entry for the attempt whose DONE.json is `done` (docs/contracts.md):
    what ended it and the decision, made on its cause alone (`decide`). `earlier`: the entries
    recorded before it; `started_at`: status.json's `attempt_started_at`; `stack_id`: the
    TrainStack the attempt ran in, which the code guard reads."""
    retryable, decision, why = decide(
        done, earlier, max_restarts=max_restarts, now=now, deadline=deadline, deleting=deleting
    )
    timeline = done.get("timeline") or {}
    steps = timeline.get("steps") or {}
    kept = {k: timeline.get(k) for k in TIMELINE_FIELDS} | {k: steps.get(k) for k in STEPS_FIELDS}
    number = done.get("attempt") or len(earlier) + 1
    # How each node came back for the attempt and what its pull fetched: its own entry of
    # DONE.json's `attempts`, which later attempts' DONE.json list from here.
    own = [
        a for a in done.get("attempts") or [] if isinstance(a, dict) and a.get("attempt") == number
    ]
    kept["nodes"] = own[-1].get("nodes") if own else None
    return {
        "attempt": number,
        "started_at": started_at,
        "ended_at": done.get("finished_at") or stamp(now),
        "status": done.get("status"),
        "cause": done.get("cause"),
        "reason": done.get("reason"),
        "epochs": done.get("epochs"),
        "retryable": retryable,
        "decision": decision,
        "why": why,
        "decided_at": stamp(now),
        "stack_id": stack_id,
        **{k: v for k, v in kept.items() if v is not None},
    }
