"""The drill's one judge (docs/contracts.md, "The drill's records"): from a run's records it says,
per experiment of contract/drill.py, whether each observation code was seen and when, pass or
FAIL, and the measured times (the fault, its detection, training again, the replacement joined).
The head judges each experiment live with it (bootstrap/head/drill.py), the rehearsal
(`python -m rehearsal --drill`) and `horovod-fleet drill` print its table.

Pure and incremental: `judge(experiment, record, records, now)` takes the experiment's record
(`runs/<run>/drill/<name>.json`, as the head wrote it so far) and the run's records as they are
now, and returns the record with what they show added. What was seen keeps the time it was
first seen, so a judge that reads the records every few seconds keeps a time series no single
record holds (training again after the fault). Decisions are made on the records' fields and
codes, never on a log line.

How each code is read (Ts: the experiment's start; a fault's end: Ts plus its longest action's
`duration`, Ts for an instant one):
- reset: an elastic reset at or after Ts that lost a node (status.json's, then DONE.json's
  `resets`).
- replacement_joined: a node the run controller launched at or after Ts (controller.json
  `replacements`, an instance launched) in the training: added by a reset after its launch, or
  its ranks' first step done (its phases/<node>.json, that instance's: a horovodrun started
  again on the nodes took it in).
- one_replacement_per_loss: never two instances launched for one lost instance (`replaces`)
  since Ts; seen at the first launch.
- one_attempt: the attempt under way at Ts never ended (attempts.json has no entry for it and
  status.json names no later one); seen once every other code is.
- tick_went_on: the controller launched no replacement while its EC2 calls were throttled (it
  could not act: the tick failed), and launched one after the throttle's end.
- training_again: rank 0 logged a step (status.json progress `updated_at`) after the fault's end.
- left_at_commit: a reset at or after Ts that lost a node with no step redone.
- new_head: the controller's relaunch for a later attempt brought the head back `replaced`
  (launched again from its template), and status.json of that attempt shows it training.
- capacity_wait_or_zone_move: the relaunch for a later attempt waited for capacity
  (controller.json `controller_state` WaitForCapacity) or went through on a later try.

The standard library only: part of the contract package every room imports.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from contract import drill, runs

DRILL = "drill/"  # runs/<run>/drill/<experiment>.json: each experiment's record
STOP = "stop.json"  # runs/<run>/stop.json: the agreed stop the head asks (docs/contracts.md)
RECORD_FORMAT = "horovod-fleet/drill-experiment/1"
STOP_FORMAT = "horovod-fleet/stop/1"
PASS, FAIL = "pass", "FAIL"
# FIS's experiment states that end an experiment before it played all its actions
# (botocore's FIS model, ExperimentStatus).
FIS_CUT_SHORT = ("stopped", "failed", "cancelled")
TIMES = ("fault", "detection", "training_again", "replacement_joined")
# Codes that hold unless something breaks them: seen once every other code is.
THROUGHOUT = (drill.ONE_ATTEMPT,)


def record_key(runs_prefix: str, name: str) -> str:
    """runs/<run>/drill/<name>.json, from node.json's `runs_prefix` (runs/<run>/)."""
    return f"{runs_prefix}{DRILL}{name}.json"


@dataclass(frozen=True)
class Records:
    """The run's records as they are now (None: absent): status.json, DONE.json, attempts.json,
    controller.json, and each node's start-up record (phases/<node>.json, by node)."""

    status: dict | None = None
    done: dict | None = None
    attempts: dict | None = None
    controller: dict | None = None
    phases: dict[str, dict] = field(default_factory=dict)


def experiment_named(name: str) -> drill.Experiment:
    """The experiment of contract/drill.py by name (node.json's plan names them)."""
    for experiment in drill.EXPERIMENTS:
        if experiment.name == name:
            return experiment
    raise drill.UnknownExperiment(
        f"unknown experiment {name!r}: allowed {', '.join(e.name for e in drill.EXPERIMENTS)}"
    )


def fault_s(experiment: drill.Experiment, *action_ids: str) -> int:
    """The longest `duration` of the experiment's actions (of `action_ids`, when given), in
    seconds: 0 when they are instant."""
    longest = 0
    for action in experiment.actions:
        if action_ids and action.action_id not in action_ids:
            continue
        for key, value in action.parameters:
            if key == "duration" and (m := drill.DURATION.match(value)):
                longest = max(longest, int(m[1]) * (60 if m[2] == "M" else 1))
    return longest


@dataclass
class Reading:
    """What one reading of the records found: codes seen (code -> when), codes broken (code ->
    why), and the times of the table."""

    seen: dict[str, float] = field(default_factory=dict)
    broken: dict[str, str] = field(default_factory=dict)
    times: dict[str, float] = field(default_factory=dict)


class Reader:
    """The records read for one experiment that started at `started` in attempt `attempt`."""

    def __init__(self, experiment: drill.Experiment, started: float, attempt: int, records):
        self.experiment, self.started, self.attempt = experiment, started, attempt
        self.records = records
        self.fault_end = started + fault_s(experiment)
        status = records.status or {}
        done = records.done or {}
        resets = list(status.get("resets") or [])
        if done.get("attempt") == status.get("attempt"):  # the attempt's final list
            resets += [r for r in done.get("resets") or [] if r not in resets]
        since = sorted(
            (r for r in resets if r.get("at") and runs.parse_stamp_s(r["at"]) >= started),
            key=lambda r: r["at"],
        )
        self.joins = since  # a node added comes in a reset of its own (a host update)
        self.resets = [r for r in since if r.get("lost")]  # the resets that lost a node
        controller = records.controller or {}
        self.replacements = sorted(
            (
                r
                for r in controller.get("replacements") or []
                if r.get("at") and runs.parse_stamp_s(r["at"]) >= started and r.get("instance_id")
            ),
            key=lambda r: r["at"],
        )

    def at(self, entry: dict) -> float:
        return runs.parse_stamp_s(entry["at"])

    def read(self) -> Reading:
        reading = Reading()
        for code in self.experiment.observe:
            found = getattr(self, code)()
            if isinstance(found, str):
                reading.broken[code] = found
            elif found is not None:
                reading.seen[code] = found
        reading.times = self.times(reading.seen)
        return reading

    # --- each observation code: its time, None (not seen), or why it is broken -------------

    def reset(self) -> float | None:
        return self.at(self.resets[0]) if self.resets else None

    def left_at_commit(self) -> float | str | None:
        for reset in self.resets:
            if reset.get("steps_redone") == 0:
                return self.at(reset)
        return None

    def replacement_joined(self) -> float | None:
        """A replacement in the training: added by a reset (a host update), or its ranks'
        first step done (its phases record: a horovodrun started again took it in)."""
        joined = []
        for replacement in self.replacements:
            launched, instance = self.at(replacement), replacement["instance_id"]
            for reset in self.joins:
                added = reset.get("added") or []
                if self.at(reset) >= launched and any(
                    a.get("instance_id") == instance for a in added
                ):
                    joined.append(self.at(reset))
            for record in self.records.phases.values():
                end = ((record.get("phases") or {}).get("first_step") or {}).get("end")
                if (
                    record.get("instance_id") == instance
                    and end
                    and runs.parse_stamp_s(end) >= launched
                ):
                    joined.append(runs.parse_stamp_s(end))
        return min(joined) if joined else None

    def one_replacement_per_loss(self) -> float | str | None:
        lost: dict[str, list[str]] = {}
        for replacement in self.replacements:
            lost.setdefault(str(replacement.get("replaces")), []).append(replacement["instance_id"])
        for instance, launched in lost.items():
            if len(set(launched)) > 1:
                return (
                    f"{len(set(launched))} instances launched for {instance}: {', '.join(launched)}"
                )
        return self.at(self.replacements[0]) if self.replacements else None

    def one_attempt(self) -> str | None:
        entries = (self.records.attempts or {}).get("attempts") or []
        ended = [e for e in entries if e.get("attempt") == self.attempt]
        if ended:
            entry = ended[0]
            return f"attempt {self.attempt} ended {entry.get('status')}: {entry.get('reason')}"
        later = (self.records.status or {}).get("attempt")
        if isinstance(later, int) and later > self.attempt:
            return f"attempt {later} is under way"
        return None  # seen once every other code is (judge)

    def tick_went_on(self) -> float | str | None:
        throttled_until = self.started + fault_s(self.experiment, drill.THROTTLE)
        for replacement in self.replacements:
            if self.at(replacement) < throttled_until:
                return (
                    f"a replacement was launched while the controller was throttled "
                    f"({replacement['instance_id']} at {replacement['at']})"
                )
        return self.at(self.replacements[0]) if self.replacements else None

    def training_again(self) -> float | None:
        return self.trained_since(self.fault_end)

    def trained_since(self, since: float, attempt: int | None = None) -> float | None:
        """When rank 0 last logged a step, if that was after `since` (in `attempt`)."""
        status = self.records.status or {}
        progress = status.get("progress") or {}
        if attempt is not None and status.get("attempt") != attempt:
            return None
        if status.get("phase") not in ("training", "evaluating") or not progress.get("updated_at"):
            return None
        logged = runs.parse_stamp_s(progress["updated_at"])
        return logged if logged >= since else None

    def later_relaunch(self) -> dict | None:
        relaunch = (self.records.controller or {}).get("relaunch") or {}
        attempt = relaunch.get("attempt")
        return relaunch if isinstance(attempt, int) and attempt > self.attempt else None

    def new_head(self) -> float | None:
        relaunch = self.later_relaunch()
        head = ((relaunch or {}).get("nodes") or {}).get("head") or {}
        if head.get("came_back") != "replaced":
            return None
        return self.trained_since(self.started, attempt=relaunch["attempt"])

    def capacity_wait_or_zone_move(self) -> float | None:
        controller = self.records.controller or {}
        waiting = controller.get("controller_state") == "WaitForCapacity"
        next_attempt = controller.get("attempt")
        if waiting and isinstance(next_attempt, int) and next_attempt > self.attempt:
            return runs.parse_stamp_s(controller["updated_at"])
        relaunch = self.later_relaunch()
        if relaunch and (relaunch.get("try") or 1) > 1 and relaunch.get("nodes"):
            status = self.records.status or {}
            if status.get("attempt") == relaunch["attempt"] and status.get("attempt_started_at"):
                return runs.parse_stamp_s(status["attempt_started_at"])
            return runs.parse_stamp_s(controller["updated_at"])
        return None

    # --- the table's times ------------------------------------------------------------------

    def times(self, seen: dict[str, float]) -> dict[str, float]:
        """The fault (Ts); its detection: the first of a reset, a replacement, the attempt's
        end; training again: a step after both the detection and the fault's end; the
        replacement joined: the node's, or the new head's."""
        found = {"fault": self.started}
        reacted = [self.at(r) for r in [*self.resets[:1], *self.replacements[:1]]]
        entries = (self.records.attempts or {}).get("attempts") or []
        ended = [e for e in entries if e.get("attempt") == self.attempt and e.get("ended_at")]
        reacted += [runs.parse_stamp_s(e["ended_at"]) for e in ended]
        done = self.records.done or {}
        if done.get("attempt") == self.attempt and done.get("status") != "succeeded":
            reacted += [runs.parse_stamp_s(done["finished_at"])] if done.get("finished_at") else []
        if reacted:
            found["detection"] = min(reacted)
        again = seen.get(drill.TRAINING_AGAIN) or seen.get(drill.NEW_HEAD)
        if again is None and (reacted or self.fault_end > self.started):
            again = self.trained_since(max(self.fault_end, found.get("detection", 0.0)))
        if again is not None:
            found["training_again"] = again
        joined = seen.get(drill.REPLACEMENT_JOINED) or seen.get(drill.NEW_HEAD)
        if joined is not None:
            found["replacement_joined"] = joined
        return found


def judge(experiment: drill.Experiment, record: dict, records: Records, now: float) -> dict:
    """The experiment's record with what the records show now: `observed` ({code: stamp}, the
    first time each was seen), `broken` ({code: why}), `times` ({TIMES: stamp}) and, once it
    is decided, `verdict` (PASS or FAIL), `judged_at` and `why`. A record already judged, or
    not started (no `started_at`), comes back as it is."""
    if record.get("verdict") or not record.get("started_at"):
        return record
    started = runs.parse_stamp_s(record["started_at"])
    reading = Reader(experiment, started, record.get("attempt") or 1, records).read()
    observed = dict(record.get("observed") or {})
    for code, at in sorted(reading.seen.items(), key=lambda item: item[1]):
        observed.setdefault(code, runs.stamp_at(at))
    broken = {**(record.get("broken") or {}), **reading.broken}
    times = dict(record.get("times") or {})
    for name, at in reading.times.items():
        times.setdefault(name, runs.stamp_at(at))
    updated = {**record, "observed": observed, "broken": broken, "times": times}
    missing = [c for c in experiment.observe if c not in observed and c not in THROUGHOUT]
    verdict, why = None, None
    if record.get("fis_state") in FIS_CUT_SHORT:
        verdict, why = FAIL, f"FIS ended the experiment {record['fis_state']}"
    elif broken:
        verdict, why = FAIL, "; ".join(f"not {code}: {text}" for code, text in broken.items())
    elif not missing:
        for code in experiment.observe:
            observed.setdefault(code, runs.stamp_at(now))  # held throughout
        verdict, why = PASS, "every observation seen"
    elif now > started + experiment.within_s:
        verdict = FAIL
        why = f"not seen within {experiment.within_s} s: {', '.join(missing)}"
    if verdict is not None:
        updated.update(verdict=verdict, judged_at=runs.stamp_at(now), why=why)
    return updated


# --- the table ------------------------------------------------------------------------------


def row(experiment: drill.Experiment, record: dict | None) -> tuple[str, ...]:
    """One line of the drill's table: experiment, FIS actions, expected, observed, times,
    result. An experiment never started, or not judged, is a FAIL."""
    expected = f"{experiment.expect} (within {experiment.within_s / 60:g} min)"
    actions = ", ".join(experiment.action_ids)
    if not record or not record.get("started_at"):
        return experiment.name, actions, expected, "never started", "-", FAIL
    started = runs.parse_stamp_s(record["started_at"])
    observed = record.get("observed") or {}
    parts = [
        f"{code} +{runs.parse_stamp_s(observed[code]) - started:.0f} s"
        if code in observed
        else f"{code} not seen"
        for code in experiment.observe
    ]
    parts += [f"broken {code}: {why}" for code, why in (record.get("broken") or {}).items()]
    if record.get("fis_state"):
        parts.append(f"FIS {record['fis_state']}")
    times = record.get("times") or {}
    shown = ", ".join(
        f"{name.replace('_', ' ')} +{runs.parse_stamp_s(times[name]) - started:.0f} s"
        if name in times
        else f"{name.replace('_', ' ')} -"
        for name in TIMES[1:]
    )
    shown = f"fault {record['started_at']}, {shown}"
    return (
        experiment.name,
        actions,
        expected,
        "; ".join(parts),
        shown,
        record.get("verdict") or FAIL,
    )


HEADER = ("experiment", "FIS actions", "expected", "observed", "times", "result")


def format_table(rows: list[tuple[str, ...]], width: int = 150) -> str:
    """The table as the fault rehearsal prints its own: columns padded, a cell over `width`
    characters clipped."""
    clipped = [
        tuple(cell if len(cell) <= width else cell[: width - 3] + "..." for cell in r) for r in rows
    ]
    widths = [max(len(r[i]) for r in [HEADER, *clipped]) for i in range(len(HEADER))]
    lines = [
        " | ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
        for r in [HEADER, tuple("-" * w for w in widths), *clipped]
    ]
    return "\n".join(lines)


def table(experiments: tuple[drill.Experiment, ...], records: dict[str, dict]) -> str:
    """The drill's table from each experiment's record (`records` by name)."""
    return format_table([row(e, records.get(e.name)) for e in experiments])


def passed(experiments: tuple[drill.Experiment, ...], records: dict[str, dict]) -> bool:
    return all((records.get(e.name) or {}).get("verdict") == PASS for e in experiments)
