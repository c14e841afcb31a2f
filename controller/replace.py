"""The run controller's replacement of an elastic fleet's lost nodes while its head trains on
(decide.py's under_way asks for it; act.py replace does it). Pure, as decide.py.
Only the standard library and contract/: part of the run controller's Lambda asset.
"""

import datetime

from contract.names import HEAD_NODE
from contract.runs import parse_stamp
from controller import judge, zones
from controller.actions import Action
from controller.ec2_fleet import LIVE_STATES
from controller.snapshot import Instance, Records, Settings, Stack


def replace_lost(
    stack: Stack,
    records: Records,
    settings: Settings,
    now: datetime.datetime,
    attempt: int,
    fleet: list[Instance],
    started: datetime.datetime,
) -> list[Action]:
    """Each node of the elastic fleet lost while its head trains (judge.lost_why) gets ONE
    new instance from the replacement template, in the fleet's zone and placement group:
    its instance terminated first, whatever its state (a stopped one would come back with
    a relaunch beside its replacement), then the replacement's launch (act.replace: one
    RunInstances whose ClientToken is made of the loss itself, the run, the attempt, the node
    and the instance it lost, so every tick that sees the same loss, two at once or one that
    died midway, asks for the same instance and gets it back), its assignment and tag. A
    replacement launched and assigned that EC2 does not list yet is launching, not lost
    (judge.launching). A node replaced `replacements_per_node` times in the attempt (EC2's
    refusals counted) is not replaced again, said in controller.json, and its instance is
    terminated all the same (the run cannot use it; it would bill to the end): the fleet
    trains on smaller, down to minNodes, below which the head ends the attempt."""
    actions: list[dict] = []
    limit = settings.get("replacements_per_node", 0)
    assignments = records.get("assignments") or []
    tries = [
        t
        for t in (records.get("controller") or {}).get("replacements") or []
        if t.get("stack_id") == stack["id"]
    ]
    beats = records.get("heartbeats") or {}
    timeout = datetime.timedelta(seconds=stack["heartbeat_timeout_s"])
    status = records.get("status") or {}
    fresh = status.get("updated_at") and now - parse_stamp(status["updated_at"]) <= timeout
    silent = set(status.get("nodes_silent") or []) if fresh else set()
    grace = datetime.timedelta(seconds=stack["startup_grace_s"])
    nodes = [n for n in fleet if n["state"] in LIVE_STATES and n["node"] != HEAD_NODE]
    zone = zones.try_order(stack["zones"], nodes[0]["zone"] if nodes else None)[0]
    unreplaced, lost, replacing, spent = {}, [], [], []
    for index in range(stack["nodes"]):
        assigned = {
            a["instance_id"]: a
            for a in assignments
            if a.get("node_index") == index and a.get("replacement")
        }
        if judge.launching(fleet, assigned, now):
            continue
        current = judge.serving(fleet, index, set(assigned))
        if current is not None and current["node"] is None:  # launched, tag not yet written
            launch = assigned[current["id"]]
            actions.append({"do": "tag", "id": current["id"], "node": index,
                                 "attempt": launch.get("attempt"), "number": launch["replacement"]})  # fmt: skip
        why = judge.lost_why(
            current, beats.get(str(index)), records.get("head_beat"), started, now,
            timeout, grace, str(index) in silent,
        )  # fmt: skip
        if why is None:
            continue
        lost.append(index)
        live = current is not None and current["state"] in LIVE_STATES
        number = max(judge.replacement_numbers(index, attempt, assignments, tries), default=0) + 1
        if number > limit:
            unreplaced[str(index)] = (
                f"node {index} lost ({why}) and not replaced again: replaced {limit} time(s) "
                f"in attempt {attempt}; the fleet trains on without it"
            )
            if live:
                spent.append({"do": "terminate", "ids": [current["id"]],
                              "why": f"node {index} is lost ({why}) past its replacements"})  # fmt: skip
            continue
        if live:
            why_gone = f"node {index} is lost: {why}; replaced"
            replacing.append({"do": "terminate", "ids": [current["id"]], "why": why_gone})
        replacing.append(
            {"do": "replace", "node": index, "attempt": attempt, "number": number,
             "zone": zone, "replaces": judge.last_served(fleet, index, assigned), "why": why}
        )  # fmt: skip
    # Fewer than minNodes left: the head ends the attempt (its driver's elastic timeout) and
    # the relaunch brings the whole fleet back; a replacement now would only bill.
    if stack["nodes"] - len(lost) >= stack["min_nodes"]:
        actions += replacing
    actions += spent
    noted = (records.get("controller") or {}).get("unreplaced") or {}
    if unreplaced and unreplaced != noted.get("nodes"):
        fields = {"unreplaced": {"stack_id": stack["id"], "attempt": attempt, "nodes": unreplaced}}
        actions.append({"do": "tell", "fields": fields})
    return actions
