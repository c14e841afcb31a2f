"""Goodput: the share of the run's wall-clock time spent in training steps whose result
survives, and where the rest went (docs/contracts.md, "Start-up, resets and goodput").

Pure functions of plain figures, so any writer of DONE.json can call them: this attempt's own
lost seconds from its nodes' phases records, its head's steps and its train.json
(attempt_lost), and the run's goodput over every attempt (goodput), the earlier ones as the run
controller copied them into attempts.json (Attempt.from_entry).

- productive: each attempt's surviving steps (from its start step to where the next attempt
  that trained resumed, or to its end step for the last) times its mean step time;
- redone: steps an attempt trained that a later attempt trained again (it resumed from an
  earlier checkpoint), and the steps its own elastic resets trained twice;
- capacity_wait: from an attempt's end to the next attempt's first launch;
- the attempt's own part (launch, boot, pull, checks, framework start, checkpoints,
  evaluation, recovery): its critical path, the node the fleet waited for last up to the
  rendezvous, then the head's steps and the trainer's;
- other: the rest, so that productive + every bucket = wall. Where the measured parts add up to
  more than the wall (overlapping phases, clocks a little apart), they are scaled down to fit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from contract.runs import parse_stamp_s

# Where the time that was not productive went (DONE.json goodput_s.lost), in this order.
BUCKETS = (
    "capacity_wait", "launch", "boot", "pull", "checks", "framework_start", "checkpoint",
    "evaluation", "recovery", "redone", "other",
)  # fmt: skip
# The buckets an attempt measures of itself (DONE.json timeline.lost_s).
OWN_BUCKETS = BUCKETS[1:-1]


@dataclass(frozen=True)
class Attempt:
    """One attempt's figures for goodput."""

    ended_at: float
    launched_at: float | None = None
    first_step_at: float | None = None
    start_step: int | None = None
    end_step: int | None = None
    step_s: float | None = None
    # Its own lost seconds (timeline.lost_s): its resets' redone steps included.
    lost_s: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_entry(cls, entry: dict) -> Attempt | None:
        """An attempts.json entry, with the figures the run controller copied from that
        attempt's DONE.json (None without an `ended_at`)."""
        if not entry.get("ended_at"):
            return None

        def stamp(key: str) -> float | None:
            return parse_stamp_s(entry[key]) if entry.get(key) else None

        return cls(
            ended_at=parse_stamp_s(entry["ended_at"]),
            launched_at=stamp("launched_at"),
            first_step_at=stamp("first_step_at"),
            start_step=entry.get("start_step"),
            end_step=entry.get("end_step"),
            step_s=entry.get("step_s"),
            lost_s={k: v for k, v in (entry.get("lost_s") or {}).items() if k in OWN_BUCKETS},
        )


def _end(phases: dict, code: str) -> float | None:
    return parse_stamp_s(phases[code]["end"]) if code in phases else None


def _most(records: list[dict], code: str) -> float:
    return max(
        ((r.get("phases") or {}).get(code, {}).get("s") or 0.0 for r in records), default=0.0
    )


def attempt_lost(records: list[dict], steps_s: dict[str, float], training: dict) -> dict:
    """This attempt's own lost seconds by bucket (OWN_BUCKETS). `records`: its nodes' phases
    records; `steps_s`: its head's bootstrap steps; `training`: its train.json ({} if none)."""
    lost = dict.fromkeys(OWN_BUCKETS, 0.0)
    by_node = {r.get("node"): r.get("phases") or {} for r in records}
    # The node the fleet waited for last: the one whose own shards (its registration) came last.
    critical = max(
        by_node,
        key=lambda n: _end(by_node[n], "own_shards") or _end(by_node[n], "health") or 0.0,
        default=None,
    )
    if critical is not None:
        phases = by_node[critical]

        def seconds(code: str) -> float:
            return phases.get(code, {}).get("s") or 0.0

        lost["launch"] += seconds("launch")
        lost["boot"] += seconds("boot") + seconds("image_check") + seconds("instance_store")
        lost["checks"] += seconds("health")
        lost["pull"] += seconds("own_shards")
        registered, met = _end(phases, "own_shards"), _end(by_node.get("0", {}), "rendezvous")
        if registered is not None and met is not None:
            lost["checks"] += max(0.0, met - registered)
    lost["checks"] += _most(records, "allreduce_check")
    lost["pull"] += steps_s.get("fleet shards", 0.0)
    step_s = training.get("step_s") or 0.0
    framework = (
        _most(records, "framework_start")
        or training.get("framework_start_s")
        or training.get("startup_s")
        or 0.0
    )
    first = _most(records, "first_step") or training.get("first_step_s") or 0.0
    lost["framework_start"] += framework + max(0.0, first - step_s)
    lost["checkpoint"] += (
        steps_s.get("restore checkpoints", 0.0)
        + steps_s.get("upload results", 0.0)
        + (training.get("checkpoint_s") or 0.0)
    )
    lost["evaluation"] += training.get("evaluation_s") or 0.0
    lost["recovery"] += sum(r.get("recovery_s") or 0.0 for r in training.get("resets") or [])
    lost["redone"] += (training.get("steps_redone") or 0) * step_s
    return {k: round(v, 1) for k, v in lost.items()}


def goodput(attempts: list[Attempt], finished_at: float) -> dict:
    """{"goodput", "runtime_goodput", "goodput_s"} over `attempts` (every attempt of the run,
    oldest first, the writing one last) to `finished_at`. Goodput is null when the run trained
    no step that survives, or its first launch is unknown."""
    lost = dict.fromkeys(BUCKETS, 0.0)
    productive = 0.0
    steps_kept = 0
    known_step_s = [a.step_s for a in attempts if a.step_s]
    for k, attempt in enumerate(attempts):
        later = attempts[k + 1 :]
        for bucket, seconds in attempt.lost_s.items():
            lost[bucket] += seconds
        if later and later[0].launched_at is not None:
            lost["capacity_wait"] += max(0.0, later[0].launched_at - attempt.ended_at)
        step_s = attempt.step_s or (known_step_s[0] if known_step_s else 0.0)
        start = _start_step(attempts, k)
        resumed = [a.start_step for a in later if a.start_step is not None]
        end = (
            attempt.end_step if attempt.end_step is not None else (resumed[0] if resumed else start)
        )
        kept_to = min([end, *resumed])
        kept = max(0, kept_to - start)
        productive += kept * step_s
        steps_kept += kept
        lost["redone"] += max(0, end - kept_to) * step_s
    first = attempts[0].launched_at if attempts else None
    firsts = [a.first_step_at for a in attempts if a.first_step_at is not None]
    wall = finished_at - first if first is not None else None
    runtime_wall = finished_at - min(firsts) if firsts else None
    if wall is None or wall <= 0 or not steps_kept:
        return {
            "goodput": None,
            "runtime_goodput": None,
            "goodput_s": _seconds(wall, runtime_wall, 0.0, lost),
        }
    productive = min(productive, wall)
    measured = sum(lost.values())
    room = wall - productive
    if measured > room:  # overlapping measurements: scaled to fit the wall
        lost = {k: v * room / measured for k, v in lost.items()}
    lost["other"] = wall - productive - sum(lost.values())
    return {
        "goodput": round(productive / wall, 4),
        "runtime_goodput": round(min(1.0, productive / runtime_wall), 4)
        if runtime_wall and runtime_wall > 0
        else None,
        "goodput_s": _seconds(wall, runtime_wall, productive, lost),
    }


def _start_step(attempts: list[Attempt], k: int) -> int:
    """Where attempt k started: its own figure, else where the attempt before it ended (the
    checkpoint it resumed from is no later), else 0."""
    attempt = attempts[k]
    if attempt.start_step is not None:
        return attempt.start_step
    for earlier in reversed(attempts[:k]):
        if earlier.end_step is not None:
            return earlier.end_step
        if earlier.start_step is not None:
            return earlier.start_step
    return 0


def _seconds(wall, runtime_wall, productive: float, lost: dict) -> dict:
    def one(value):
        return round(value, 1) if value is not None else None

    return {
        "wall_s": one(wall),
        "runtime_wall_s": one(runtime_wall),
        "productive_s": one(productive),
        "lost": {k: round(lost.get(k, 0.0), 1) for k in BUCKETS},
    }


def from_entries(entries: list[dict]) -> list[Attempt]:
    """attempts.json's entries as Attempts; an entry without the run controller's
    `launched_at` counts from its `started_at` (the attempt's first start on its head)."""
    attempts = []
    for entry in entries:
        if not entry.get("launched_at") and entry.get("started_at"):
            entry = {**entry, "launched_at": entry["started_at"]}
        if figures := Attempt.from_entry(entry):
            attempts.append(figures)
    return attempts


def live(
    earlier: list[Attempt],
    current: Attempt,
    progress: dict,
    global_batch: int,
) -> dict | None:
    """status.json's goodput while the trainer runs: `current` (this attempt, without its end
    step and step time) to its progress.json's global step, each step at the global batch over
    its global rate; None before the first timed log step (its `eta_s` is null until then: the
    first interval's rate includes the first step's compilation)."""
    rate, step = progress.get("images_per_s"), progress.get("global_step")
    if not rate or step is None or not global_batch or progress.get("eta_s") is None:
        return None
    now = current.ended_at
    so_far = Attempt(
        ended_at=now,
        launched_at=current.launched_at,
        first_step_at=current.first_step_at,
        start_step=current.start_step,
        end_step=step,
        step_s=global_batch / rate,
    )
    figures = goodput([*earlier, so_far], now)
    return {k: figures[k] for k in ("goodput", "runtime_goodput")}
