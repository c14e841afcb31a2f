"""What `horovod-fleet drill` reports once its run is over, and what `horovod-fleet runs` shows of
it: the drill's table (contract/drill_judge.py, the one the rehearsal prints), judged once more
from the run's records as they are at the end; the start-up timeline measured on the real
instances (DONE.json's `timeline`); and runs/<run>/drill.json, the same table kept in the bucket
(docs/contracts.md, "The drill's result").

The head judges each experiment live and writes its verdict into the experiment's record
(runs/<run>/drill/<experiment>.json). An experiment it had not judged when the run ended (the
run stopped at its hard cap, a head lost with no successor) is judged here with the same
function, from the records as they are now: one passes if every observation is there, and is
a FAIL once its bound has passed.
"""

from __future__ import annotations

import json

from contract import drill
from contract.drill_judge import DRILL, HEADER, PASS, Records, format_table, judge, row
from contract.runs import stamp_at
from watch.aws import RunStore
from watch.screen import drill_summary, phases_table

RESULT = "drill.json"  # runs/<run>/drill.json
RESULT_FORMAT = "horovod-fleet/drill/1"
# drill.json's key for each column of the judge's table.
ROW_KEYS = tuple(name.lower().replace(" ", "_") for name in HEADER)


def result_key(run: str) -> str:
    return f"runs/{run}/{RESULT}"


def keys_under(store: RunStore, prefix: str) -> list[str]:
    keys, token = [], None
    while True:
        page = store.s3.list_objects_v2(
            Bucket=store.bucket, Prefix=prefix, **({"ContinuationToken": token} if token else {})
        )
        keys += [entry["Key"] for entry in page.get("Contents", [])]
        token = page.get("NextContinuationToken")
        if not token:
            return keys


def read_run(store: RunStore, run: str) -> tuple[Records, dict[str, dict]]:
    """The run's records as the judge reads them (status.json, DONE.json, attempts.json,
    controller.json, every node's phases record) and each experiment's record, by name."""
    prefix = f"runs/{run}/"
    phases = {
        key.rsplit("/", 1)[1].removesuffix(".json"): record
        for key in keys_under(store, f"{prefix}phases/")
        if key.endswith(".json") and (record := store.read_json(key)) is not None
    }
    records = Records(
        status=store.read_json(f"{prefix}status.json"),
        done=store.read_json(f"{prefix}DONE.json"),
        attempts=store.read_json(f"{prefix}attempts.json"),
        controller=store.read_json(f"{prefix}controller.json"),
        phases=phases,
    )
    experiments = {}
    for key in keys_under(store, f"{prefix}{DRILL}"):
        record = store.read_json(key) if key.endswith(".json") else None
        if record and record.get("experiment"):
            experiments[record["experiment"]] = record
    return records, experiments


def judged(
    experiments: tuple[drill.Experiment, ...], records: dict[str, dict], run: Records, now: float
) -> dict[str, dict]:
    """Each experiment's record with the judge's last word on it (a record the head judged
    comes back as it is)."""
    return {e.name: judge(e, records[e.name], run, now) for e in experiments if e.name in records}


def result(
    run: str,
    experiments: tuple[drill.Experiment, ...],
    records: dict[str, dict],
    done: dict | None,
    now: float,
    **drill_facts,
) -> dict:
    """runs/<run>/drill.json: the table's rows, how many passed, the run's end and its
    start-up timeline; `drill_facts` says what was drilled (region, instance type, market)."""
    rows = [dict(zip(ROW_KEYS, row(e, records.get(e.name)), strict=True)) for e in experiments]
    failed = [r["experiment"] for r in rows if r["result"] != PASS]
    done = done or {}
    return {
        "format": RESULT_FORMAT,
        "run": run,
        "judged_at": stamp_at(now),
        **drill_facts,
        "run_status": done.get("status"),
        "attempt": done.get("attempt"),
        "passed": len(rows) - len(failed),
        "of": len(rows),
        "failed": failed,
        "rows": rows,
        "timeline": done.get("timeline"),
    }


def write_result(store: RunStore, document: dict) -> str:
    key = result_key(document["run"])
    store.s3.put_object(
        Bucket=store.bucket,
        Key=key,
        Body=json.dumps(document, indent=1).encode(),
        ContentType="application/json",
    )
    return f"s3://{store.bucket}/{key}"


def report(document: dict) -> str:
    """The table, the verdict, then the start-up timeline measured on the real instances."""
    rows = [tuple(r[k] for k in ROW_KEYS) for r in document["rows"]]
    run = document["run"]
    lines = [
        format_table(rows),
        "",
        f"drill {run}: {drill_summary(document)}; the run ended "
        f"{document.get('run_status') or 'without a DONE.json'}",
        "",
    ]
    timeline = phases_table(
        run, {"timeline": document.get("timeline"), "attempt": document.get("attempt")}
    )
    if timeline:
        lines.append(
            "The start-up on the real instances (DONE.json's timeline; the estimates are "
            "synthesis's):"
        )
        lines.append(timeline)
    else:
        lines.append(
            "No start-up timeline: the run wrote no DONE.json with one (its nodes never trained)"
        )
    return "\n".join(lines) + "\n"


def progress(records: Records, experiments: tuple[drill.Experiment, ...], mine: dict) -> str:
    """One line while the drill runs: the run's phase and epoch, each experiment's state."""
    status = records.status or {}
    where = status.get("phase") or "starting"
    epoch = (status.get("progress") or {}).get("epoch")
    if epoch:
        where += f", epoch {epoch}"
    states = []
    for experiment in experiments:
        record = mine.get(experiment.name) or {}
        state = record.get("verdict") or ("under way" if record.get("started_at") else "waiting")
        states.append(f"{experiment.name} {state}")
    return f"{where}; {', '.join(states)}"
