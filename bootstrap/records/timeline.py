"""The fleet's view of an attempt's start-up and resets, for DONE.json (docs/contracts.md,
"Start-up, resets and goodput"): pure functions of the nodes' phases records and the trainer's
train.json, so whichever instance writes DONE.json (the head, or a node that found it lost) builds the same view from the same documents.
"""

from __future__ import annotations

from bootstrap.records.phases import PHASES
from contract.runs import parse_stamp_s, stamp_at


def who(record: dict) -> str:
    """A node as DONE.json names it: `node 2 (i-0abc, 10.0.0.7)`, or `head (...)`."""
    node = record.get("node")
    name = "head" if node == "head" else f"node {node}"
    return f"{name} ({record.get('instance_id')}, {record.get('ip')})"


def _order(node: str) -> tuple[int, str]:
    return (int(node), "") if node.isdigit() else (1 << 30, node)


def fleet_phases(records: list[dict]) -> dict[str, dict]:
    """Every phase code with its slowest node and every node's seconds ({"s": None, ...} where
    no node ran it: a CPU fleet's allreduce check, a trainer that writes no startup.json)."""
    view: dict[str, dict] = {}
    for code in PHASES:
        ran = {r["node"]: r for r in records if code in (r.get("phases") or {})}
        by_node = {n: ran[n]["phases"][code]["s"] for n in sorted(ran, key=_order)}
        if not by_node:
            view[code] = {"s": None, "slowest": None, "node": None, "by_node": {}}
            continue
        slowest = max(by_node, key=lambda n: (by_node[n], -_order(n)[0]))
        entry = {
            "s": by_node[slowest],
            "slowest": who(ran[slowest]),
            "node": slowest,
            "by_node": by_node,
        }
        if code == "data_pull":
            entry["mb_per_s_by_node"] = {n: ran[n]["phases"][code].get("mb_per_s") for n in by_node}
        view[code] = entry
    return view


def launched_at(records: list[dict]) -> float | None:
    """The attempt's first launch: the earliest of its nodes'."""
    stamps = [parse_stamp_s(r["launched_at"]) for r in records if r.get("launched_at")]
    return min(stamps) if stamps else None


def first_step_at(training: dict, records: list[dict]) -> float | None:
    """Rank 0's first step's end: train.json's, else node 0's record's (the trainer wrote its
    startup.json but no train.json: it failed after its first step)."""
    if training.get("first_step_at"):
        return parse_stamp_s(training["first_step_at"])
    for record in records:
        step = (record.get("phases") or {}).get("first_step")
        if record.get("node") == "0" and step:
            return parse_stamp_s(step["end"])
    return None


def resets(
    training: dict, records: list[dict], hosts: dict[str, list[dict]] | None = None
) -> list[dict]:
    """The trainer's elastic resets (train.json `resets`, hosts as Horovod names them) with
    each host named as the node the head's discovery saw at that address when the reset came
    (`hosts`: address -> [{"node", "instance_id", "since"}], oldest first; a replacement may
    reuse a lost node's address), else as the node whose record has that address."""
    by_ip = {r.get("ip"): r for r in records}

    def nodes(addresses: list[str], at: str | None) -> list[dict]:
        named = []
        for host in addresses or []:
            seen = [s for s in (hosts or {}).get(host, []) if at is None or s["since"] <= at]
            record = seen[-1] if seen else by_ip.get(host, {})
            named.append(
                {"node": record.get("node"), "instance_id": record.get("instance_id"), "ip": host}
            )
        return named

    return [
        {
            "at": reset.get("at"),
            "lost": nodes(reset.get("hosts_lost"), reset.get("at")),
            "added": nodes(reset.get("hosts_added"), reset.get("at")),
            "ranks_before": reset.get("ranks_before"),
            "ranks_after": reset.get("ranks_after"),
            "recovery_s": reset.get("recovery_s"),
            "steps_redone": reset.get("steps_redone"),
        }
        for reset in training.get("resets") or []
    ]


def stamp(seconds: float | None) -> str | None:
    return stamp_at(seconds) if seconds is not None else None
