"""The run controller's tick: read the world (observe.world), decide and take what the guards
decide (decide_guards.py: a delete under way, the hard cap, an operator's hold, the idle fleet),
then, when no guard owns the tick, read the run's records (observe.run_records), decide the next
step (decide.py) and take it (act.py). The guards are acted on before any record of the run is
read, so a record the controller cannot read never delays them; a read that failed is raised
once they acted, so the tick fails loudly (its error alarm) and the next one reads again.

EventBridge Scheduler runs it every minute whatever happens, and every trigger runs it at once:
S3's "Object Created" of a DONE.json, EC2's Spot warning and state changes, the idle alarm's
action, the hard cap's schedule. An event only brings the tick forward: its content is logged
and never read, so a missed, late, repeated or self-made event costs at most one minute. One
tick runs at a time (the function's reserved concurrency, run_controller.py); every action is
idempotent all the same (act.py), as a tick that died midway is followed by another.

With no TrainStack and no orphan instance it reads the stack and the instances and ends.
Only boto3, the standard library and contract/: part of the run controller's Lambda asset.
"""

from controller import act, decide, decide_guards, observe
from controller.clients import log, now


def handler(event: dict, _context=None) -> dict:
    log("tick", trigger=trigger(event))
    at = now()
    failed: list[Exception] = []
    snapshot = observe.world(at, failed)
    decision = decide_guards.guards(snapshot, at)
    act.act(decision["actions"], snapshot, at)
    if decision["phase"] is None and not failed:
        snapshot["records"] = observe.run_records(snapshot)
        then = decide.rest(snapshot, at)
        act.act(then["actions"], snapshot, at)
        decision = {**then, "actions": decision["actions"] + then["actions"]}
    elif decision["phase"] is None:
        decision = {**decision, "phase": "unread", "why": "a record of the run could not be read"}
    log("tick-decision", phase=decision["phase"], why=decision["why"],
        actions=[a["do"] for a in decision["actions"]])  # fmt: skip
    if failed:
        raise failed[0]
    return {
        "phase": decision["phase"],
        "why": decision["why"],
        "actions": [a["do"] for a in decision["actions"]],
    }


def trigger(event: dict) -> str:
    """What invoked the tick, for the log only."""
    if not isinstance(event, dict):
        return type(event).__name__
    detail = event.get("detail") if isinstance(event.get("detail"), dict) else {}
    what = (detail.get("object") or {}).get("key") or detail.get("instance-id") or ""
    alarm = (event.get("alarmData") or {}).get("alarmName", "")
    kind = event.get("detail-type") or event.get("trigger") or event.get("source") or "schedule"
    return " ".join(filter(None, [str(kind), str(what), str(alarm)]))[:300]
