"""The run controller's tick: read the whole run (observe.py), decide the next step (decide.py),
take it (act.py). EventBridge Scheduler runs it every minute whatever happens, and every trigger
runs it at once: S3's "Object Created" of a DONE.json, EC2's Spot warning and state changes,
the idle alarm's action, the hard cap's schedule. An event only brings the tick forward: its
content is logged and never read, so a missed, late, repeated or self-made event costs at most
one minute.

With no TrainStack and no orphan instance it reads the stack and the instances and ends.
Only boto3, the standard library and contract/: part of the run controller's Lambda asset.
"""

import act
import decide
import observe
from clients import log, now


def handler(event: dict, _context=None) -> dict:
    log("tick", trigger=trigger(event))
    at = now()
    snapshot = observe.observe(at)
    decision = decide.decide(snapshot, at)
    log("tick-decision", phase=decision["phase"], why=decision["why"],
        actions=[a["do"] for a in decision["actions"]])  # fmt: skip
    act.act(decision["actions"], snapshot, at)
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
