"""`horovod-fleet hold` and `horovod-fleet release`: an operator's hold on the deployed run, so a
node can be looked at without the run controller replacing it.

The hold is a record, runs/<run>/hold.json (docs/contracts.md), naming TrainStack's id: the
controller honours it for that stack only, so a hold left behind never holds a later deployment
of the run. While it holds, the controller takes no action but the hard cap and a delete under
way (`cdk destroy`): no replacement, no relaunch, no DONE.json of its own, no idle delete, no
orphan of the run's stack ended. Its idle guard still counts, from the alarm: a fleet idle past
its window goes at the first tick after the release. A release keeps the record, `held` false,
with when and by whom. Both write only where the record is as they read it (a conditional
write), so two operators at once never lose each other's word.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone

from contract import names, runs
from contract.records import HOLD_FORMAT, Hold
from watch.aws import Fleet, RunStore, WatchError

# stacks/config.py's rule for a run name: the S3 prefix runs/<run>/ (docs/contracts.md).
RUN_NAME = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,38}[a-z0-9])?")
RUN_RULE = "1-40 lowercase letters, digits and inner hyphens, like resnet50-1"
# A stack in these is gone or going (a create rolled back, or left over: its instances are
# orphans the controller ends): there is no fleet to hold.
NOT_HOLDABLE = ("DELETE_IN_PROGRESS", "DELETE_FAILED", "DELETE_COMPLETE", "ROLLBACK_IN_PROGRESS",
                "ROLLBACK_COMPLETE", "ROLLBACK_FAILED")  # fmt: skip


def key(run: str) -> str:
    return runs.key(run, runs.HOLD)


def checked_run(run: str) -> str:
    if not RUN_NAME.fullmatch(run):
        raise WatchError(f"--run {run!r} is not a run name: {RUN_RULE}")
    return run


def deployed_run(fleet: Fleet) -> str | None:
    """The run TrainStack deploys: its output, or while it is created its stack-level tag."""
    return fleet.outputs.get(names.RUN_OUTPUT_KEY) or fleet.tags.get(names.RUN_TAG)


def hold(fleet: Fleet, store: RunStore, run: str | None, reason: str | None, by: str) -> str:
    """Hold the deployed run (`run`, when given, must be it); what was done, in one line."""
    deployed = deployed_run(fleet)
    run = checked_run(run) if run else deployed
    if fleet.stack_status is None or fleet.stack_status in NOT_HOLDABLE or not deployed:
        state = fleet.stack_status or "no TrainStack"
        raise WatchError(
            f"nothing to hold in {fleet.region}: {state} (a hold holds the fleet TrainStack runs)"
        )
    if run != deployed:
        raise WatchError(f"run {run!r} is not deployed: TrainStack runs {deployed!r}")
    current, etag = store.read_with_etag(key(run))
    if current and current.get("held") is True and current.get("stack_id") == fleet.stack_id:
        return (
            f"run {run} is already held, since {current.get('held_at')} by {current.get('held_by')}"
        )
    document: Hold = {
        "format": HOLD_FORMAT,
        "run": run,
        "stack_id": fleet.stack_id,
        "held": True,
        "held_at": stamp(),
        "held_by": by,
        "reason": reason,
    }
    if not store.put_json(key(run), document, etag):
        raise WatchError(f"s3://{store.bucket}/{key(run)} changed as it was written: try again")
    cap = fleet.outputs.get(names.DEADLINE_OUTPUT_KEY)
    return (
        f"run {run} held: the run controller takes no action on it but the hard cap"
        f"{f' (at {cap})' if cap else ''} and cdk destroy, and its idle guard still counts; "
        "`horovod-fleet release` hands it back"
    )


def release(fleet: Fleet, store: RunStore, run: str | None, by: str) -> str:
    """Release the run's hold (the deployed run's, unless `run`); what was done, in one line."""
    run = checked_run(run) if run else deployed_run(fleet)
    if not run:
        raise WatchError(f"no run: pass --run NAME (no TrainStack in {fleet.region})")
    current, etag = store.read_with_etag(key(run))
    if not current or current.get("held") is not True:
        return f"run {run} is not held: nothing changed"
    document = {**current, "held": False, "released_at": stamp(), "released_by": by}
    if not store.put_json(key(run), document, etag):
        raise WatchError(f"s3://{store.bucket}/{key(run)} changed as it was written: try again")
    return (
        f"run {run} released: the run controller looks after it again from its next tick "
        "(within a minute)"
    )


def stamp() -> str:
    return runs.stamp(datetime.now(timezone.utc))
