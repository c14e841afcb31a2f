"""The fault rehearsal's rows as data (ROWS), grouped by family: S3, ranks, nodes, elastic, disk,
Spot.

Each row names the snapshot it starts from, its fault (rehearsal/fault_actions.py) and when it
strikes, and what its outcome must be (rehearsal/fault_checks.py); rehearsal/faults.py runs them.
docs/rehearsal.md's table is `markdown_table()` (a test keeps the two equal). Rows with
`max_restarts` play the deployed fleet: after each attempt the run controller's state machine
runs (rehearsal/cloud.py), and the nodes its relaunch brought back boot again
(rehearsal/attempts.py `relaunch`).
"""

from __future__ import annotations

from rehearsal.fault_row import Row
from rehearsal.fault_rows_fleet import ELASTIC_ROWS, NODE_ROWS, RANK_ROWS, SPOT_ROWS
from rehearsal.fault_rows_storage import DISK_ROWS, S3_ROWS

ROWS = S3_ROWS + RANK_ROWS + NODE_ROWS + ELASTIC_ROWS + DISK_ROWS + SPOT_ROWS


def markdown_table(rows: list[Row] = ROWS) -> str:
    """docs/rehearsal.md's table of the rows."""
    lines = [
        "| family | fault | starts from | expected outcome | in CI |",
        "| --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {r.family} | {r.name} | {r.start} | {r.expected} | {'yes' if r.in_ci else ''} |"
        for r in rows
    ]
    return "\n".join(lines) + "\n"
