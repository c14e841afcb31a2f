"""The allreduce check's summary line (bootstrap/fleet/allreduce_check.py prints it): written
once, read back by the node's health check, the head's benchmark and DONE.json."""

from __future__ import annotations

import re

_SUMMARY = re.compile(
    r"allreduce check: (?P<ranks>\d+) ranks on (?P<nodes>\d+) nodes?, .*?"
    r"bus bandwidth (?P<bus>[\d.]+) GB/s"
)


def summary_line(ranks: int, nodes: int, bus: float, size_mib: int, rounds: int) -> str:
    return (
        f"allreduce check: {ranks} ranks on {nodes} node{'s' if nodes != 1 else ''}, "
        f"{size_mib} MiB x {rounds}: bus bandwidth {bus:.2f} GB/s"
    )


def parse_summary(log: str) -> dict | None:
    """{"ranks", "nodes", "busbw_gbps"} from the check's output, None if it has no summary."""
    matches = list(_SUMMARY.finditer(log))
    if not matches:
        return None
    last = matches[-1]
    return {
        "ranks": int(last["ranks"]),
        "nodes": int(last["nodes"]),
        "busbw_gbps": float(last["bus"]),
    }
