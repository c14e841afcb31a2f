"""`python -m rehearsal --faults [--fault TEXT ...]`: the fault rehearsal.

After the rehearsal's setup (local S3, sample dataset, preprocessing) the local S3 is saved as
the snapshot "dataset converted"; when a chosen row starts later, a short run with a checkpoint
at each epoch is trained once and saved as "a run with checkpoints" (rehearsal/snapshots.py).
Each row then starts from its snapshot on a fleet deployed anew (every node's disks empty),
injects one fault, lets the run's attempts end, and is judged. So a row passes or fails alone,
and any subset of the rows, in any order, has the same outcomes.

The rows are data: rehearsal/fault_rows.py, their faults in rehearsal/fault_actions.py and what
their outcomes must show in rehearsal/fault_checks.py. This module runs and judges them.

Prints a table of fault, expected and observed outcome, pass or FAIL; exit 0 only if every row
chosen passes. `--fault TEXT` (repeatable) keeps the rows whose name contains TEXT; `--rows ci`
keeps CI's subset (the rows marked `in_ci`; CI has 40 minutes for every tier, and the other
rows run under `make test-all`).
"""

from __future__ import annotations

import re

from contract import runs
from rehearsal.common import RUN, StepFailed, say
from rehearsal.core import Rehearsal
from rehearsal.fault_actions import wait_for_fault_threads
from rehearsal.fault_row import CHECKPOINTED, DATASET, EVERY_EPOCH, Request, Row
from rehearsal.fault_rows import ROWS

CHECKPOINTED_EPOCHS = 2  # the run of that snapshot: a checkpoint after each of its epochs


def judge(rehearsal: Rehearsal, row: Row, done: dict | None) -> tuple[bool, str]:
    """Whether the row's outcome is the expected one, and what was observed, in one line."""
    if done is None:
        return False, "no DONE.json"
    seen = done["status"] + (f", epochs {done['epochs']}" if done["epochs"] else "")
    if done["status"] != "succeeded":
        # The step and what happened; the exception's type adds nothing to a table row.
        seen += ": " + re.sub(
            r"failed: \w+: (horovodrun exited \d+: )?", "failed: ", done["reason"]
        )
    expect = row.expect
    failed = [name for name, check in expect.checks.items() if not check(rehearsal, done)]
    ok = done["status"] == expect.status and expect.epochs in (None, done["epochs"])
    if failed:
        seen += f" (not: {', '.join(failed)})"
    return ok and not failed, seen


def prepare_start(rehearsal: Rehearsal, start: str) -> None:
    """The row's S3 snapshot, made on first use, and a fleet deployed anew."""
    if not (rehearsal.workdir / "snapshots" / start).is_dir():
        rehearsal.restore_snapshot(DATASET)
        rehearsal.renew_fleet()
        say(f"--- snapshot '{CHECKPOINTED}': {CHECKPOINTED_EPOCHS} epochs, a checkpoint each")
        rehearsal.train(CHECKPOINTED_EPOCHS, **EVERY_EPOCH)
        # What a deployment finds of an earlier one: its model, logs and key; not its end.
        ended = (runs.DONE, runs.ATTEMPTS, runs.STATUS, runs.CONTROLLER)
        rehearsal.save_snapshot(CHECKPOINTED, tuple(runs.key(RUN, name) for name in ended))
    rehearsal.restore_snapshot(start)
    rehearsal.renew_fleet()


def run_row(rehearsal: Rehearsal, row: Row) -> tuple[str, str, str, str]:
    """One row, from its snapshot to its verdict: (fault, expected, observed, pass|FAIL)."""
    if row.needs_hosts and rehearsal.fleet is None:
        return row.name, row.expected, "needs the namespaces (root): a host per node", "FAIL"
    nodes = rehearsal.args.nodes
    rehearsal.args.nodes = row.nodes or nodes  # the row's fleet (the namespaces are made for it)
    try:
        return judged_row(rehearsal, row)
    finally:
        rehearsal.args.nodes = nodes


def judged_row(rehearsal: Rehearsal, row: Row) -> tuple[str, str, str, str]:
    prepare_start(rehearsal, row.start)
    rehearsal.noted = {}
    rehearsal.watches.clear()
    if rehearsal.iam:
        rehearsal.iam.watches.clear()
    rehearsal.fault_threads.clear()
    rehearsal.entries = []
    when = row.fault.when
    if when is None:
        row.fault.what(rehearsal)
    elif isinstance(when, Request):
        rehearsal.iam.on_request(when.method, when.path, lambda: row.fault.what(rehearsal))
    else:
        rehearsal.watches.append(("head", when, lambda: row.fault.what(rehearsal)))
    refused_before = len(rehearsal.iam.refusals) if rehearsal.iam else 0
    overrides = dict(row.overrides)
    try:
        if row.max_restarts is None:
            rehearsal.train(row.epochs, **overrides)
        else:
            rehearsal.entries = rehearsal.train_under_controller(
                row.epochs, row.max_restarts, row.before_relaunch, **overrides
            )
    except StepFailed as exc:  # a node failed, as the fault may want
        say(f"the nodes: {exc}")
    ok, observed = judge(rehearsal, row, rehearsal.done_json())
    wait_for_fault_threads(rehearsal)
    if rehearsal.watches or (rehearsal.iam and rehearsal.iam.watches):
        return row.name, row.expected, "the fault was never injected", "FAIL"
    # A request a deployed role may not make fails on AWS, whatever the row's outcome.
    if refused := rehearsal.iam.refusals[refused_before:] if rehearsal.iam else []:
        return row.name, row.expected, f"IAM refused {len(refused)}: {refused[0]}", "FAIL"
    return row.name, row.expected, observed, "pass" if ok else "FAIL"


def chosen_rows(texts: list[str] | None, subset: str = "all") -> list[Row]:
    """The rows whose name contains one of `texts` (every row without any), of `subset`: "all",
    or "ci" (the rows marked in_ci)."""
    rows = [row for row in ROWS if subset == "all" or row.in_ci]
    return [row for row in rows if any(text in row.name for text in texts or [""])]


def run_faults(rehearsal: Rehearsal) -> int:
    rows = []
    chosen = chosen_rows(rehearsal.args.fault, rehearsal.args.rows)
    # One namespace per node of the largest row (a row with fewer uses the first ones).
    rehearsal.fleet_size = max([rehearsal.args.nodes, *(row.nodes or 0 for row in chosen)])
    try:
        setup = [
            ("local S3 endpoint", lambda: rehearsal.start_s3(sample=True)),
            ("sample dataset", rehearsal.make_sample),
            ("preprocessing node", rehearsal.preprocess),
            (f"snapshot '{DATASET}'", lambda: rehearsal.save_snapshot(DATASET)),
        ]
        for step, action in setup:
            rehearsal.step = step
            say(f"--- {step}")
            action()
        say(f"fault rows ({rehearsal.args.rows}): {', '.join(row.name for row in chosen)}")
        for row in chosen:
            rehearsal.step = f"fault: {row.name}"
            say(f"--- {rehearsal.step} (from '{row.start}'; expected: {row.expected})")
            try:
                rows.append(run_row(rehearsal, row))
            except (RuntimeError, OSError) as exc:  # this row's own; the next starts afresh
                rows.append((row.name, row.expected, f"the row broke: {exc}", "FAIL"))
    except (RuntimeError, OSError) as exc:
        rows.append((rehearsal.step, "the rehearsal runs", f"{exc}", "FAIL"))
    finally:
        rehearsal.keep_s3()
        rehearsal.close()
    print_table(rows)
    failed = sum(row[3] != "pass" for row in rows)
    say(
        f"fault rehearsal: {len(rows) - failed} of {len(rows)} passed; files in {rehearsal.workdir}"
    )
    return 1 if failed or not rows else 0


def print_table(rows: list[tuple[str, str, str, str]]) -> None:
    header = ("fault", "expected", "observed", "result")
    clipped = [
        tuple(cell if len(cell) <= 150 else cell[:147] + "..." for cell in row) for row in rows
    ]
    widths = [max(len(r[i]) for r in [header, *clipped]) for i in range(4)]
    for row in [header, tuple("-" * w for w in widths), *clipped]:
        print(" | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)), flush=True)
